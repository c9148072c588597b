#include "trainer/loop_text.h"

#include <ctime>

#include <fmt/format.h>

#include "core/flops.h"
#include "core/units.h"
#include "memory/shapes.h"
#include "trainer/build_info.h"

namespace weft::trainer::detail {

nlohmann::json metrics_header(const TrainConfig& c, int64_t world, int64_t done, const std::string& resumed_from,
                              const std::string& data, const std::vector<RunChange>& changes) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char start[32];
  std::strftime(start, sizeof start, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return {{"kind", "run"},
          {"weft_version", WEFT_VERSION},
          {"commit", build_commit()},
          {"start", start},
          {"model", c.model},
          {"layout", c.layout.to_string()},
          // Which GEMMs an FP8 layout leaves in bf16, and why (null: none, or no FP8).
          {"fp8_bf16_gemms", memory::fp8_bf16_gemms_text(c.model, c.run, c.layout).empty()
                                 ? nlohmann::json()
                                 : nlohmann::json(memory::fp8_bf16_gemms_text(c.model, c.run, c.layout))},
          {"run", c.run},
          // Trainable against total parameters (LoRA trains the adapters alone).
          {"params", {{"total", c.model.param_count()},
                      {"trainable", c.run.lora.enabled() ? lora_params(c.model, c.run.lora) : c.model.param_count()}}},
          {"device", c.device.summary()},
          {"world", world},
          // How the ranks' tensors travel: NCCL, MPI through host memory for
          // ranks that share a GPU, or MPI on the CPU's own memory.
          {"comm", world > 1 || !c.comm.empty()
                       ? nlohmann::json{{"backend", c.comm.empty() ? std::string("mpi-host") : c.comm},
                                        {"why", c.comm.empty() ? std::string("the CPU: MPI on host memory")
                                                               : c.comm_why},
                                        {"ranks_per_device", c.device.shared_by}}
                       : nlohmann::json()},
          {"peak_flops", c.device.peak_flops(to_string(c.run.precision))},  // per device, what MFU is against
          // The N of MFU's 6N: every parameter but the input embedding.
          {"mfu_params", c.model.flop_params()},
          {"seed", c.seed},
          {"steps", c.steps},
          {"first_step", done + 1},
          {"resumed_from", resumed_from.empty() ? nlohmann::json() : nlohmann::json(resumed_from)},
          {"changed", resume_changes_json(changes)},
          {"init", c.init.empty() ? nlohmann::json() : nlohmann::json(c.init)},
          {"model_from", c.model_from.empty() ? nlohmann::json() : nlohmann::json(c.model_from)},
          // Where this launch's weights come from: the checkpoint it resumes,
          // pretrained weights (--init), or a random initialisation.
          {"weights", !resumed_from.empty() ? nlohmann::json{{"source", "checkpoint"}, {"path", resumed_from}}
                      : !c.init.empty()     ? nlohmann::json{{"source", "pretrained"}, {"path", c.init}}
                                            : nlohmann::json{{"source", "random"}, {"seed", c.seed}}},
          {"data", data},
          {"optim", c.optim}};
}


std::string data_repeat_note(const data::Loader& loader, const RunSpec& run, int64_t steps) {
  const int64_t windows = loader.windows(), samples = steps * run.global_batch;
  if (windows < run.global_batch)
    return fmt::format("warning: the training data holds {} windows of {} tokens, fewer than the {} sequences of one "
                       "step: every step repeats samples, and the model will memorise them rather than learn; "
                       "give more data, a shorter --seq or a smaller --global-batch\n",
                       windows, run.seq + 1, run.global_batch);
  if (samples <= 0 || loader.epoch(samples - 1) == 0) return {};
  return fmt::format("note: {} steps of {} sequences read the training data's {} windows {:.2f} times; samples "
                     "repeat from step {} on (each epoch in a new order)\n",
                     steps, run.global_batch, windows, double(samples) / double(windows),
                     windows / run.global_batch + 1);
}

std::string memory_table(const TrainReport& r, const DeviceSpec& d) {
  std::string s = fmt::format("memory per category (this rank, {}): measured peak vs memory model\n",
                              d.name);
  int64_t mt = 0, pt = 0;
  for (auto cat : memory::kAllCategories) {
    const int64_t m = r.measured[size_t(cat)], p = r.predicted[size_t(cat)];
    mt += m;
    pt += p;
    if (m == 0 && p == 0) continue;
    s += fmt::format("  {:<12} {:>12} {:>12} {:>+8.2f}%\n", memory::to_string(cat),
                     format_bytes(double(m)), format_bytes(double(p)),
                     p > 0 ? 100.0 * double(m - p) / double(p) : 0.0);
  }
  s += fmt::format("  {:<12} {:>12} {:>12} {:>+8.2f}%\n", "total", format_bytes(double(mt)),
                   format_bytes(double(pt)), pt > 0 ? 100.0 * double(mt - pt) / double(pt) : 0.0);
  // The rows above are the arena the model sized, so they agree by
  // construction; this one is counted by the kernel or the driver.
  if (r.independent > 0)
    s += fmt::format("  {:<12} {:>12} {:>12} {:>+8.2f}%   ({})\n", "independent", format_bytes(double(r.independent)),
                     format_bytes(double(pt)), pt > 0 ? 100.0 * double(r.independent - pt) / double(pt) : 0.0,
                     d.kind == DeviceKind::cpu ? kHostIndependent : r.independent_what.c_str());
  if (r.independent_save > 0)
    s += fmt::format("  {:<12} {:>12} {:>12}            (the same while a checkpoint is written: its whole "
                     "tensors, gathered for the files, are outside the memory model)\n",
                     "saving", format_bytes(double(r.independent_save)), "");
  return s;
}

}  // namespace weft::trainer::detail
