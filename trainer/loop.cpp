#include "trainer/loop.h"

#include <array>
#include <omp.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/flops.h"
#include "core/json_io.h"
#include "core/stop.h"
#include "core/pipeline_schedule.h"
#include "core/units.h"
#include "kernels/fp8/fp8_ops.h"
#include "kernels/attention/attention.h"
#include "kernels/gemm/blas_core.h"
#include "memory/device.h"
#include "memory/estimate.h"
#include "memory/host_usage.h"
#include "memory/shapes.h"
#include "trainer/parallel/device_comm.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/moe_record.h"
#include "data/corpus.h"
#include "data/loader.h"
#include "data/token_data.h"
#include "trainer/loop_text.h"
#include "trainer/profile.h"
#include "trainer/run_folder.h"
#include "trainer/run_state.h"

extern "C" void openblas_set_num_threads(int);

namespace weft::trainer {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

void set_threads(int64_t threads) {
  kernels::blas_core();  // before other threads start: it may set OPENBLAS_CORETYPE
  // Ranks sharing a node share its cores: by default each takes its part, as
  // oversubscribed threads would slow every rank and blur the tuner's timings.
  int local_ranks = 1;
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* e = std::getenv(v); e && std::atoi(e) > 0) {
      local_ranks = std::atoi(e);
      break;
    }
  const int n = threads > 0 ? int(threads) : std::max(1, omp_get_num_procs() / local_ranks);
  omp_set_num_threads(n);
  // The kernels parallelise over rows themselves; BLAS threads inside an
  // OpenMP region would oversubscribe, so BLAS gets the same count and the
  // model never calls it from inside a parallel region.
  openblas_set_num_threads(n);
}

namespace {

// Runs `f` on this rank; if it throws here or on any other rank, every rank
// throws: this one its own error, the others an Others naming the step.
template <typename Others = Error, typename F>
void on_every_rank(const TrainConfig& c, const char* what, F&& f) {
  std::exception_ptr mine;
  try {
    f();
  } catch (...) {
    mine = std::current_exception();
  }
  int32_t failed = mine ? 1 : 0;
  if (c.groups) c.groups->host_groups().world->all_reduce(&failed, 1, parallel::ReduceOp::max);
  if (mine) std::rethrow_exception(mine);
  if (failed) throw Others(fmt::format("another rank failed while {} (its own message says why)", what));
}

// The run itself, on the CPU (float) or the current GPU (bf16), with
// gradients in G (fp32, or bf16 under grad:bf16).
template <typename Elem, typename G>
TrainReport train_on(const TrainConfig& c, std::FILE* log, bool rank0, int64_t world,
                     data::TokenData data) {
  // On a GPU the driver's count of used memory before the run, so the run's
  // own share (arena, CUDA context, cuBLAS and NCCL workspaces) can be shown.
  using R = Run<Elem, G>;
  const int64_t device_before = R::kDevice ? memory::device_memory().used() : 0;
  // On the CPU the kernel's count of resident memory: its high-water mark
  // restarts here, so its growth is what this run added.
  // Memory freed before the run (a tuning's trials) goes back to the system
  // first: reused, it would not show as growth.
  if (!R::kDevice) memory::host_trim();
  const bool host_peak = !R::kDevice && memory::host_peak_reset();
  const int64_t host_before = host_peak ? memory::host_usage().rss : 0;
  // On a GPU the rank's predicted memory is reserved before the run builds
  // anything: a device too small fails here, on every rank together and
  // before any collective, with the sizes named.
  std::unique_ptr<memory::Arena> reserved;
  if constexpr (R::kDevice) {
    reserved = std::make_unique<memory::Arena>(memory::device_allocator());
    on_every_rank<memory::OutOfMemory>(c, "reserving its predicted memory", [&] {
      reserved->reserve(arena_reservation(c, c.groups ? c.groups->world->rank() : 0, world, kArenaSlack));
    });
  }
  // Building the run and opening the checkpoint communicate nothing, and
  // either may fail on one rank alone (host memory, a file one node lacks):
  // the ranks agree before the first collective, so none waits for a peer
  // that has given up.
  std::string resume = c.resume_from;
  const std::string ckpt_root = c.ckpt_dir.empty() ? c.out_dir + "/checkpoints" : c.ckpt_dir;
  if (resume.empty() && c.resume) resume = checkpoint::resume_checkpoint(ckpt_root).value_or("");
  const bool resume_newest = c.resume_from.empty() && !resume.empty();
  std::optional<R> built;
  std::optional<checkpoint::Checkpoint> ck;
  std::optional<checkpoint::Pretrained> init;
  on_every_rank(c, "building the run", [&] {
    built.emplace(c, std::move(data), reserved.get());
    if (!resume.empty()) {
      try {
        ck.emplace(built->open(resume));
      } catch (const FileFormatError& e) {
        // A checksum that does not match, found only now that the files are
        // read: the same refusal as a file of the wrong size, with the
        // intact checkpoint to give --resume-from.
        if (!resume_newest) throw;
        throw checkpoint::resume_damaged(ckpt_root, resume, e.what());
      }
    }
    else if (!c.init.empty()) init.emplace(built->open_init(c.init));
  });
  // Only now that every input has been checked: a run refused above leaves
  // no trace in its folder.
  fs::create_directories(c.out_dir);
  R& run = *built;
  TrainReport report;
  report.baseline = data::token_data_baseline(run.data);
  memory::MemoryOptions all;
  all.all_stages = true;
  const auto mem = memory::estimate(c.model, c.run, c.layout, c.device, all);
  report.predicted = mem.stages[size_t(run.groups.pp_rank())].bytes;

  int64_t done = 0;
  std::vector<RunChange> changes;
  const bool resumed = ck.has_value();
  if (ck) {
    done = run.load(*ck);
    fmt::print(log, "resumed from {} at step {}{}{}\n", resume, done,
               c.init.empty() ? "" : " (--init applies to a run without checkpoints)",
               c.lora_init.empty() ? "" : " (--lora-init applies to a run without checkpoints: the adapters are the "
                                          "checkpoint's)");
    changes = resume_changes(ck->manifest, c, resume, run.data.path);
    if (!changes.empty()) fmt::print(log, "changed from the checkpoint: {}\n", resume_changes_text(changes));
    ck.reset();  // the stage holds its copy; unmap the files
  } else if (init) {
    run.init_from(*init);
    const int64_t V = init->model.vocab, Vp = c.model.vocab;
    fmt::print(log, "initialised from {}: step 0, fresh optimizer state and data position{}\n",
               init->describe(),
               Vp > V ? fmt::format("; vocabulary enlarged from {} to {} by --vocab, rows {}..{} of the embedding{} "
                                    "start as the mean of the pretrained rows",
                                    V, Vp, V, Vp - 1, c.model.tied_embeddings ? " (tied head)" : " and head")
                      : "");
    init.reset();  // the stage holds its copy; unmap the files
  } else {
    run.init(c.seed);
  }
  if (!resumed && !c.lora_init.empty()) {
    state_lora_init(checkpoint::peft_open(c.lora_init, c.model), run.stage, run.optim);
    fmt::print(log, "LoRA adapters from {}\n", c.lora_init);
  }
  // The count restarts once the run is built and loaded: the checkpoint's or
  // the pretrained files' pages, mapped while loading, are not the run's.
  // Checkpoint saves (whole-tensor copies for the files) are left out the
  // same way; host_peak_seen keeps the high-water mark from before each.
  int64_t host_peak_seen = 0;
  auto host_count_restart = [&] {
    if (!host_peak) return;
    memory::host_trim();
    memory::host_peak_reset();
  };
  host_count_restart();
  // A periodic save writes in the background unless asked not to; the
  // final one is written before the run returns. The stall (what training
  // waits for: the gather, and the write when synchronous) goes to the
  // metrics.
  auto save = [&](int64_t step, double lr_now, bool final) {
    if (host_peak) {
      host_peak_seen = std::max(host_peak_seen, memory::host_usage().peak);
      memory::host_peak_reset();
    }
    const bool async = c.async_checkpoints && !final;
    const auto t0 = std::chrono::steady_clock::now();
    const std::string dir = run.save(step, lr_now, async);
    if (final) run.wait_saves();
    const double stall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rank0)
      run.emit(nlohmann::json{{"kind", "checkpoint"}, {"step", step}, {"dir", dir}, {"async", async},
                              {"stall_s", stall}});
    if (host_peak)
      report.independent_save = std::max(report.independent_save, memory::host_usage().peak - host_before);
    host_count_restart();
    return dir;
  };
  if (resumed && done >= c.steps) {
    // A relaunched job that already finished: say so and touch nothing.
    fmt::print(log, "nothing to train: {} is at step {} and --steps is {}; give a larger --steps to go on\n",
               resume, done, c.steps);
    report.first_step = done + 1;
    report.last_step = done;
    report.nothing_to_do = true;
    report.val_loss = std::numeric_limits<double>::quiet_NaN();
    return report;
  }
  if (rank0) {
    const fs::path metrics_path = fs::path(c.out_dir) / "metrics.jsonl";
    // A resume from before the end of an earlier launch (--resume-from an
    // older checkpoint) trains those steps again: their earlier records
    // leave the file, kept whole beside it, so that no step is said twice.
    std::optional<SupersededMetrics> superseded;
    if (resumed) superseded = metrics_supersede_after(metrics_path.string(), done);
    if (superseded)
      fmt::print(log, "metrics.jsonl: {} records of {} from an earlier launch are superseded by this "
                      "resume at step {}; the file as it was is kept as {}\n",
                 superseded->records,
                 superseded->first_step == superseded->last_step
                     ? fmt::format("step {}", superseded->first_step)
                     : fmt::format("steps {}..{}", superseded->first_step, superseded->last_step),
                 done, superseded->kept);
    run.metrics.open(metrics_path, std::ios::app);
    // Every launch starts with a header: a resumed run's records follow
    // their own, so the file tells the launches apart.
    auto header = detail::metrics_header(c, world, done, resumed ? resume : std::string(), run.data.path, changes);
    if (superseded)
      header["superseded"] = {{"first_step", superseded->first_step},
                              {"last_step", superseded->last_step},
                              {"records", superseded->records},
                              {"kept", superseded->kept}};
    if (c.metrics_sink) c.metrics_sink->launch(resumed ? done : 0);
    run.emit(header);
  }

  const double peak = c.device.peak_flops(to_string(c.run.precision));
  const double flops_per_step = model_flops_per_step(c.model, c.run);
  fmt::print(log, "training {} on {} x {} ({}), layout {}\n", c.model.summary(), world,
             c.device.summary(), to_string(c.run.precision), c.layout.to_string());
  if (const int64_t V = c.model.vocab, Vp = c.model.padded_vocab(c.layout.tp); Vp > V)
    fmt::print(log, "vocabulary padded from {} to {} for tp={} (a multiple of {} x tp): rows {}..{} of the embedding "
                    "and head are zero, masked out of the loss, and left out of checkpoints and exports\n",
               V, Vp, c.layout.tp, kVocabPadMultiple, V, Vp - 1);
  if (c.layout.uneven()) {
    std::vector<int64_t> per_stage;
    for (int64_t s = 0; s < c.layout.pp; ++s) per_stage.push_back(c.layout.stage_layers(c.model, s));
    fmt::print(log, "pipeline split {}: stages hold {} layers (the first also the embedding, the last the head)\n",
               split_text(c.layout.split), fmt::join(per_stage, ", "));
  }
  if (!c.comm.empty()) fmt::print(log, "comm {}: {}\n", c.comm, c.comm_why);
  if (c.device.kind == DeviceKind::cpu && !kernels::blas_core().note.empty())
    fmt::print(log, "GEMMs: {}\n", kernels::blas_core().note);
  if (const std::string bf16 = memory::fp8_bf16_gemms_text(c.model, c.run, c.layout); !bf16.empty())
    fmt::print(log, "FP8 GEMMs ({}): {}\n", gemm_precision_text(c.layout), bf16);
  if (c.run.lora.enabled()) fmt::print(log, "{}; the base model frozen\n", lora_summary(c.model, c.run.lora));
  fmt::print(log, "data {}: {} train tokens, {} samples of {} tokens per step; unigram baseline "
                  "{:.4f} nats/token\n",
             run.data.path, run.data.train->size(), c.run.global_batch, c.run.seq, report.baseline);
  fmt::print(log, "MFU is against the stated peak of {:.1f} GFLOP/s ({}), of {}\n", peak / 1e9,
             c.device.kind == DeviceKind::cpu ? "cores x clock x fp32 FMA lanes" : "dense bf16",
             c.run.lora.enabled() ? std::string("4N + the adapters' FLOPs (no weight gradients of frozen weights)")
                                  : mfu_flops_text(c.model));
  fmt::print(log, "{}", detail::data_repeat_note(*run.loader, c.run, c.steps));

  report.first_step = done + 1;
  double window_time = 0, window_comm = 0;
  int64_t window_steps = 0;
  double lr = 0;
  const auto t_start = Clock::now();
  double train_time = 0;
  std::array<int64_t, 3> window_fp8{};  // FP8 values, overflows, underflows since the last record
  for (int64_t step = done + 1; step <= c.steps; ++step) {
    // Every rank stops at the same step: the signal may reach them apart.
    int32_t stop = c.stop && c.stop->load() ? 1 : 0;
    run.groups.host_groups().world->all_reduce(&stop, 1, parallel::ReduceOp::max);
    if (stop) {
      report.interrupted = true;
      break;
    }
    const auto t0 = Clock::now();
    const double comm0 = c.watchdog ? c.watchdog->comm_seconds() : 0.0;
    const double loss = run.step_loss(step - 1);
    if (!run.overflow.empty()) {  // every rank: agreed in step_loss
      report.error = fmt::format("step {}: {}", step, run.overflow);
      break;
    }
    for (int i = 0; i < 3; ++i)
      window_fp8[size_t(i)] += std::array<int64_t, 3>{run.fp8.values, run.fp8.overflow, run.fp8.underflow}[size_t(i)];
    StepStats s;
    {
      parallel::CommWatchdog::Waiting w(R::kDevice ? c.watchdog : nullptr, R::kGpuWait);
      s = run.optim.step(step, loss);
      // The host waits once per step (the loss and the gradient norm above
      // already did): the update belongs to this step's time.
      memory::synchronize(run.stage.stream());
    }
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    window_comm += c.watchdog ? c.watchdog->comm_seconds() - comm0 : 0.0;
    lr = s.lr;
    window_time += dt;
    ++window_steps;
    train_time += dt;
    report.losses.push_back(loss);
    report.last_step = step;
    if (step % c.log_every == 0 || step == c.steps || step == done + 1) {
      const double sps = window_steps / window_time;
      const double tps = sps * double(c.run.tokens_per_step());
      const double fps = sps * flops_per_step;
      const double comm = window_comm / window_steps;  // rank 0's seconds in communication per step
      // FP8 health: values quantised since the last record, and how many of
      // them overflowed (clamped to the format's max) or underflowed (became
      // zero), summed over the ranks that quantised them.
      nlohmann::json fp8_health;
      std::string fp8_text;
      if (c.layout.fp8 != Fp8Recipe::off) {
        run.groups.host_groups().world->all_reduce(window_fp8.data(), 3);
        fp8_health = {{"values", window_fp8[0]}, {"overflow", window_fp8[1]}, {"underflow", window_fp8[2]}};
        fp8_text = fmt::format(" | fp8 over {} under {} of {}", window_fp8[1], window_fp8[2], window_fp8[0]);
      }
      window_fp8 = {};
      // An MoE model's balancing loss (its coefficient included), beside the
      // token loss, and its experts' loads, peaks and drops (moe_record).
      const bool aux = c.model.moe.aux_loss_coef > 0;
      MoeRecord moe;
      if (c.model.moe.enabled())
        moe = moe_record(c, *run.groups.host_groups().world, run.expert_load, run.expert_dropped,
                         run.dispatch_peaks, run.received_peak);
      fmt::print(log,
                 "step {:>5}/{} | loss {:.4f}{}{} | lr {:.2e} | grad norm {:.3f} | {:.0f} tok/s | "
                 "{:.2f} TFLOP/s/dev | MFU {:.1f}% | peak mem {}{}{}{}\n",
                 step, c.steps, loss, aux ? fmt::format(" | aux {:.4f}", run.aux_loss) : "", moe.text, s.lr,
                 s.grad_norm, tps, fps / double(world) / 1e12, 100 * mfu(fps, world, peak),
                 format_bytes(double(run.arena.peak_total())),
                 c.watchdog ? fmt::format(" | comm {}/step", format_seconds(comm)) : "", fp8_text,
                 s.skipped ? " | SKIPPED (non-finite)" : "");
      std::fflush(log);
      nlohmann::json record{{"kind", "train"},      {"step", step},         {"loss", loss},
                                    {"lr", s.lr},           {"grad_norm", s.grad_norm},
                                    {"tokens_per_s", tps},  {"tflops_per_device", fps / double(world) / 1e12},
                                    {"mfu", mfu(fps, world, peak)}, {"peak_bytes", run.arena.peak_total()},
                                    {"skipped", s.skipped},
                                    {"step_s", window_time / window_steps},
                                    {"comm_s", window_comm / window_steps}};
      if (!fp8_health.is_null()) record["fp8"] = fp8_health;
      if (aux) record["aux_loss"] = run.aux_loss;
      if (!moe.expert_load.is_null()) record["expert_load"] = moe.expert_load;
      run.emit(record);
      window_time = 0;
      window_comm = 0;
      window_steps = 0;
    }
    if (c.eval_every > 0 && step % c.eval_every == 0 && step != c.steps) {
      const double v = run.validation_loss();
      if (!run.overflow.empty()) {  // the step's update stands, and its checkpoint follows
        report.error = fmt::format("the validation after step {}: {}", step, run.overflow);
        break;
      }
      if (std::isnan(v) && c.stop && c.stop->load()) continue;  // stopped midway: the next step stops
      fmt::print(log, "step {:>5} | validation loss {:.4f} (unigram baseline {:.4f})\n", step, v,
                 report.baseline);
      run.emit(nlohmann::json{{"kind", "val"}, {"step", step}, {"val_loss", v}});
    }
    if (c.checkpoints && c.ckpt_every > 0 && step % c.ckpt_every == 0 && step != c.steps)
      report.checkpoint = save(step, lr, false);
    if (c.on_step) c.on_step(step, c.steps);
  }
  (void)t_start;
  // --steps 0 with --init: the loaded model itself, as a step-0 checkpoint
  // to evaluate or export.
  const bool trained = report.last_step > 0 && report.last_step >= report.first_step;
  const bool imported = c.steps == 0 && !run.init_dir.empty() && !resumed;
  if (c.checkpoints && (trained || imported)) {
    report.checkpoint = save(report.last_step, lr, true);
    fmt::print(log, "{}checkpoint {}\n", report.interrupted || !report.error.empty() ? "stopped early; " : "",
               report.checkpoint);
  }
  run.wait_saves();  // a periodic save still in flight (when no final one followed)
  // A stopped run skips the final validation (it may take minutes); one
  // stopped midway through it reads NaN.
  const bool stopped = report.interrupted || !report.error.empty();
  report.val_loss = stopped ? std::numeric_limits<double>::quiet_NaN() : run.validation_loss();
  if (!stopped && !run.overflow.empty()) report.error = "the final validation: " + run.overflow;
  const int64_t ran = report.last_step - report.first_step + 1;
  report.tokens_per_second = ran > 0 ? double(ran * c.run.tokens_per_step()) / train_time : 0;
  report.seconds = train_time;
  if (!std::isnan(report.val_loss)) {
    fmt::print(log, "validation loss {:.4f} nats/token vs unigram baseline {:.4f} ({:+.1f}%)\n",
               report.val_loss, report.baseline, 100 * (report.val_loss - report.baseline) / report.baseline);
    run.emit(nlohmann::json{{"kind", "val"},
                            {"step", report.last_step},
                            {"val_loss", report.val_loss},
                            {"baseline", report.baseline},
                            {"final", true}});
  } else if (report.interrupted) {
    fmt::print(log, "final validation skipped: stopped by {}\n", stop_signal_name());
  } else if (stopped) {
    fmt::print(log, "final validation skipped: the run stopped on an error\n");
  }
  report.measured = run.arena.peaks();
  if (host_peak)
    report.independent =
        std::max<int64_t>(0, std::max(host_peak_seen, memory::host_usage().peak) - host_before);
  if constexpr (R::kDevice) {
    // The runtime's share is what the driver counts beyond the arena; the
    // memory model's "overhead" category predicts it.
    // NVML's count of this process includes the CUDA context; where NVML
    // cannot say, the driver's used memory since the run began does not
    // (the context existed before it).
    const int64_t process = memory::device_process_bytes();
    const int64_t used = process >= 0 ? process : memory::device_memory().used() - device_before;
    report.independent_what = process >= 0 ? "device memory of this process, NVML (the CUDA context included)"
                                            : "device memory in use since the run began, cudaMemGetInfo (the "
                                              "CUDA context, created before it, not included)";
    const int64_t arena = run.arena.reserved() > 0 ? run.arena.reserved() : run.arena.in_use_total();
    report.measured[size_t(memory::Category::overhead)] = std::max<int64_t>(0, used - arena);
    report.independent = std::max<int64_t>(0, used);
    fmt::print(log, "device memory: {} ({}), arena peak {}\n", format_bytes(double(used)), report.independent_what,
               format_bytes(double(run.arena.peak_total())));
  }
  fmt::print(log, "{}", detail::memory_table(report, c.device));
  // Every rank records its measured peaks beside the memory model's
  // prediction for its stage, so multi-rank runs can be checked stage by stage.
  nlohmann::json mj{{"rank", run.groups.world->rank()}, {"pp_rank", run.groups.pp_rank()},
                    {"tp_rank", run.groups.tp_rank()}, {"dp_rank", run.groups.dp_rank()},
                    {"layout", c.layout.to_string()}};
  for (auto cat : memory::kAllCategories) {
    mj["measured"][memory::to_string(cat)] = report.measured[size_t(cat)];
    mj["predicted"][memory::to_string(cat)] = report.predicted[size_t(cat)];
  }
  if (report.independent > 0)
    mj["independent"] = {{"bytes", report.independent},
                         {"what", R::kDevice ? report.independent_what.c_str() : detail::kHostIndependent}};
  if (report.independent_save > 0) mj["independent_saving"] = report.independent_save;
  // The device arena's one reservation (the model's bytes and their slack),
  // so a check outside the process can tell it from the runtime's share.
  if (run.arena.reserved() > 0) mj["arena_reserved"] = run.arena.reserved();
  // Ranks sharing a GPU stage their messages through pinned host memory.
  if (c.device.shared_by > 1) {
    const int64_t model = memory::host_staging_bytes(c.model, c.run, c.layout, c.device, run.groups.pp_rank());
    const int64_t held = parallel::device_comm_staging_peak();
    fmt::print(log, "  {:<12} {:>12} {:>12} {:>+8.2f}%   (pinned host memory the MPI device communicator staged "
                    "through; not the device's)\n",
               "host staging", format_bytes(double(held)), format_bytes(double(model)),
               model > 0 ? 100.0 * double(held - model) / double(model) : 0.0);
    mj["host_staging"] = {{"measured", held}, {"predicted", model}};
  }
  run.emit(nlohmann::json{{"kind", "end"},
                          {"last_step", report.last_step},
                          {"steps_run", std::max<int64_t>(0, ran)},
                          {"interrupted", report.interrupted},
                          {"signal", report.interrupted ? stop_signal_name() : ""},
                          {"seconds", train_time},
                          {"tokens", std::max<int64_t>(0, ran) * c.run.tokens_per_step()},
                          {"tokens_per_s", report.tokens_per_second},
                          {"checkpoint", report.checkpoint},
                          {"error", report.error}});
  file_write_atomic((fs::path(c.out_dir) / "memory" / fmt::format("rank{}.json", run.groups.world->rank())).string(),
                    mj.dump(1) + "\n");
  return report;
}

}  // namespace

TrainReport train(const TrainConfig& c, std::FILE* log_all) {
  validate_config(c);
  const int64_t world = c.groups ? c.groups->world->size() : 1;
  c.layout.validate(c.model, c.run, world);
  check_trainable(c.layout, c.device.kind);
  require_moe_layout(c.model, c.run, c.layout, c.device);
  const bool rank0 = !c.groups || c.groups->world->rank() == 0;
  // Only world rank 0 reports; the others write their progress nowhere.
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> devnull(std::fopen("/dev/null", "w"), &std::fclose);
  std::FILE* log = rank0 ? log_all : devnull.get();
  set_threads(c.threads);

  const bool gpu = c.device.kind == DeviceKind::gpu;
  data::TokenData data = data::token_data_open(data::data_spec_or_corpus(c.data));
  if (!c.data_checked) data::token_data_validate(data, c.model.vocab, c.run.seq);
  if (gpu && c.layout.grad == GradPrecision::bf16)
    return train_on<kernels::bf16, kernels::bf16>(c, log, rank0, world, std::move(data));
  if (gpu) return train_on<kernels::bf16, float>(c, log, rank0, world, std::move(data));
  return train_on<float, float>(c, log, rank0, world, std::move(data));
}


}  // namespace weft::trainer
