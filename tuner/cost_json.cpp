// The cost model's constants and a prediction's breakdown as JSON: device
// profiles (tuner/device_profile.h), tuning reports and the dry-run's JSON.
// A profile written before a constant existed reads as that constant's
// default (or, for cudnn_efficiency and attention_t_half, as profiles of
// that time priced it).
#include <nlohmann/json.hpp>

#include "tuner/cost.h"

namespace weft::tuner {

void to_json(nlohmann::json& j, const CostConstants& k) {
  j = nlohmann::json{{"gemm_efficiency", k.gemm_efficiency},
                     {"gemm_tile_m", k.gemm_tile_m},
                     {"gemm_tile_n", k.gemm_tile_n},
                     {"gemm_k_half", k.gemm_k_half},
                     {"flash_efficiency", k.flash_efficiency},
                     {"cudnn_efficiency", k.cudnn_efficiency},
                     {"attention_t_half", k.attention_t_half},
                     {"memory_efficiency", k.memory_efficiency},
                     {"intra_efficiency", k.intra_efficiency},
                     {"inter_efficiency", k.inter_efficiency},
                     {"launch_overhead", k.launch_overhead},
                     {"dp_overlap", k.dp_overlap},
                     {"tp_overlap", k.tp_overlap},
                     {"overlap_cost", k.overlap_cost},
                     {"fp8_gemm_efficiency", k.fp8_gemm_efficiency},
                     {"fp8_k_half", k.fp8_k_half},
                     {"expert_gemm_efficiency", k.expert_gemm_efficiency},
                     {"fp8_expert_gemm_efficiency", k.fp8_expert_gemm_efficiency},
                     {"dispatch_efficiency", k.dispatch_efficiency}};
}

void from_json(const nlohmann::json& j, CostConstants& k) {
  auto get = [&](const char* key, double& v) {
    if (j.contains(key)) v = j[key].get<double>();
  };
  get("gemm_efficiency", k.gemm_efficiency);
  get("gemm_tile_m", k.gemm_tile_m);
  get("gemm_tile_n", k.gemm_tile_n);
  get("gemm_k_half", k.gemm_k_half);
  get("flash_efficiency", k.flash_efficiency);
  // Profiles written before cuDNN's attention had a constant of its own
  // priced it as flash.
  k.cudnn_efficiency = j.contains("cudnn_efficiency") ? j["cudnn_efficiency"].get<double>() : k.flash_efficiency;
  k.attention_t_half = 0;  // profiles written before it priced attention alike at every length
  get("attention_t_half", k.attention_t_half);
  get("memory_efficiency", k.memory_efficiency);
  get("intra_efficiency", k.intra_efficiency);
  get("inter_efficiency", k.inter_efficiency);
  get("launch_overhead", k.launch_overhead);
  get("dp_overlap", k.dp_overlap);
  get("tp_overlap", k.tp_overlap);
  get("overlap_cost", k.overlap_cost);
  get("fp8_gemm_efficiency", k.fp8_gemm_efficiency);
  get("fp8_k_half", k.fp8_k_half);
  get("expert_gemm_efficiency", k.expert_gemm_efficiency);
  get("fp8_expert_gemm_efficiency", k.fp8_expert_gemm_efficiency);
  get("dispatch_efficiency", k.dispatch_efficiency);
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
