// The cost model's constants and a prediction's breakdown as JSON: device
// profiles (tuner/device_profile.h), tuning reports and the dry-run's JSON.
// A profile written before a constant existed reads as that constant's
// default (or, for cudnn_efficiency and attention_t_half, as profiles of
// that time priced it).
#include <utility>

#include <nlohmann/json.hpp>

#include "tuner/cost.h"

namespace weft::tuner {

namespace {

// Every constant a profile holds, by its name in the file.
constexpr std::pair<const char*, double CostConstants::*> kConstants[] = {
    {"gemm_efficiency", &CostConstants::gemm_efficiency},
    {"gemm_tile_m", &CostConstants::gemm_tile_m},
    {"gemm_tile_n", &CostConstants::gemm_tile_n},
    {"gemm_k_half", &CostConstants::gemm_k_half},
    {"flash_efficiency", &CostConstants::flash_efficiency},
    {"cudnn_efficiency", &CostConstants::cudnn_efficiency},
    {"attention_t_half", &CostConstants::attention_t_half},
    {"memory_efficiency", &CostConstants::memory_efficiency},
    {"intra_efficiency", &CostConstants::intra_efficiency},
    {"inter_efficiency", &CostConstants::inter_efficiency},
    {"launch_overhead", &CostConstants::launch_overhead},
    {"dp_overlap", &CostConstants::dp_overlap},
    {"tp_overlap", &CostConstants::tp_overlap},
    {"overlap_cost", &CostConstants::overlap_cost},
    {"fp8_gemm_efficiency", &CostConstants::fp8_gemm_efficiency},
    {"fp8_k_half", &CostConstants::fp8_k_half},
    {"expert_gemm_efficiency", &CostConstants::expert_gemm_efficiency},
    {"fp8_expert_gemm_efficiency", &CostConstants::fp8_expert_gemm_efficiency},
    {"dispatch_efficiency", &CostConstants::dispatch_efficiency},
};

}  // namespace

void to_json(nlohmann::json& j, const CostConstants& k) {
  j = nlohmann::json::object();
  for (const auto& [name, field] : kConstants) j[name] = k.*field;
}

void from_json(const nlohmann::json& j, CostConstants& k) {
  // Profiles written before attention_t_half priced attention alike at
  // every length, and before cuDNN's attention had a constant of its own
  // priced it as flash.
  k.attention_t_half = 0;
  for (const auto& [name, field] : kConstants)
    if (j.contains(name)) k.*field = j[name].get<double>();
  if (!j.contains("cudnn_efficiency")) k.cudnn_efficiency = k.flash_efficiency;
}

void to_json(nlohmann::json& j, const CostBreakdown& b) {
  j = nlohmann::json{{"compute_s", b.compute},     {"recompute_s", b.recompute},
                     {"tp_comm_s", b.tp_comm},     {"cp_comm_s", b.cp_comm},
                     {"pp_bubble_s", b.pp_bubble},
                     {"pp_p2p_s", b.pp_p2p},       {"dp_comm_s", b.dp_comm},
                     {"optimizer_s", b.optimizer}, {"step_s", b.step},
                     {"tokens_per_s", b.tokens_per_second},
                     {"model_flops_per_gpu", b.model_flops_per_gpu},
                     {"mfu", b.mfu},               {"peak_flops", b.peak_flops}};
  if (b.fp8_peak_flops > 0) {
    j["fp8_peak_flops"] = b.fp8_peak_flops;
    j["fp8_peak_utilization"] = b.fp8_peak_utilization;
  }
}

}  // namespace weft::tuner
