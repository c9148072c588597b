#include "trainer/loop.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/flops.h"
#include "core/json_io.h"
#include "core/pipeline_schedule.h"
#include "core/units.h"
#include "memory/estimate.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/data/corpus.h"
#include "trainer/data/loader.h"
#include "trainer/data/token_data.h"
#include "trainer/state_io.h"

extern "C" void openblas_set_num_threads(int);

namespace weft::trainer {

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

void set_threads(int64_t threads) {
  const int n = threads > 0 ? int(threads) : omp_get_num_procs();
  omp_set_num_threads(n);
  // The kernels parallelise over rows themselves; BLAS threads inside an
  // OpenMP region would oversubscribe, so BLAS gets the same count and the
  // model never calls it from inside a parallel region.
  openblas_set_num_threads(n);
}

// One training run's state on this rank.
struct Run {
  const TrainConfig& c;
  memory::Arena arena;
  parallel::ProcessGroups own_groups;
  parallel::ProcessGroups& groups;
  LlamaStage<float> stage;
  Optimizer<float> optim;
  data::TokenData data;
  std::unique_ptr<data::Loader> loader, val_loader;
  std::ofstream metrics;
  std::vector<int32_t> tokens, targets;
  std::unique_ptr<parallel::CommRequest> send_act, send_grad;

  Run(const TrainConfig& cfg, data::TokenData d)
      : c(cfg), own_groups(cfg.groups ? parallel::ProcessGroups{} : parallel::single_process_groups()),
        groups(cfg.groups ? *cfg.groups : own_groups),
        stage(cfg.model, cfg.run, cfg.layout, groups.pp_rank(), cfg.device, arena, groups),
        optim(stage, cfg.optim), data(std::move(d)) {
    loader = std::make_unique<data::Loader>(*data.train, c.run.seq, c.seed);
    if (data.val) val_loader = std::make_unique<data::Loader>(data::validation_loader(*data.val, c.run.seq));
    const int64_t rows = c.layout.mb * c.run.seq;
    tokens.resize(size_t(rows));
    targets.resize(size_t(rows));
  }

  bool first() const { return stage.plan().has_embedding; }
  bool last() const { return stage.plan().has_head; }
  int64_t act_count() const { return stage.boundary_elements(); }

  // Micro-batch j of this dp replica reads global samples
  // first_sample + dp_rank * (global_batch / dp) + j * mb + [0, mb): the
  // global batch is the same whatever the layout.
  double micro_forward(int64_t first_sample, int64_t j, int64_t slot, double scale, int64_t chunk) {
    const int64_t per_replica = c.run.global_batch / c.layout.dp;
    loader->batch(first_sample + groups.dp_rank() * per_replica + j * c.layout.mb, c.layout.mb,
                  tokens.data(), targets.data());
    return stage.forward(slot, tokens.data(), targets.data(), scale, chunk);
  }

  // Message tags: micro-batch, the receiver's model chunk, and the direction.
  int64_t tag(int64_t mb, int64_t chunk, int dir) const { return 2 * (mb * c.layout.vpp + chunk) + dir; }

  // One optimizer step's forward and backward over the global batch's
  // samples, following this stage's (interleaved) 1F1B schedule; gradients
  // end up summed over the data-parallel replicas. Returns the step's mean loss.
  double step_loss(int64_t step0) {
    const int64_t gb = c.run.global_batch, m = c.layout.micro_batches(c.run);
    const int64_t pp_size = c.layout.pp, s = groups.pp_rank();
    const double scale = 1.0 / double(gb * c.run.seq);
    auto& pp = *groups.pp;
    // Activation slots: a chunk-micro-batch takes one from its forward (or the
    // receive before it) to its backward; the schedule never holds more than
    // the memory model's in-flight count.
    std::vector<int64_t> free_slots;
    for (int64_t i = stage.plan().in_flight_chunks - 1; i >= 0; --i) free_slots.push_back(i);
    std::map<std::pair<int64_t, int64_t>, int64_t> slot_of;
    auto slot_for = [&](int64_t mb, int64_t chunk) {
      auto [it, fresh] = slot_of.try_emplace({mb, chunk}, -1);
      if (fresh) {
        WEFT_ASSERT(!free_slots.empty());
        it->second = free_slots.back();
        free_slots.pop_back();
      }
      return it->second;
    };
    stage.zero_grads();
    double loss = 0;
    for (const PipeOp& op : pipeline_schedule(pp_size, c.layout.vpp, m, s)) {
      const int64_t mb = op.micro_batch, ch = op.chunk;
      switch (op.kind) {
        case PipeOpKind::recv_forward:
          pp.recv(stage.stage_input(slot_for(mb, ch)), act_count(), op.peer, tag(mb, ch, 0));
          break;
        case PipeOpKind::forward:
          if (send_act) send_act->wait();  // the output buffer is about to be rewritten
          loss += micro_forward(step0 * gb, mb, slot_for(mb, ch), scale, ch);
          break;
        case PipeOpKind::send_forward:
          send_act = pp.isend(stage.stage_output(), act_count(), op.peer,
                              tag(mb, s == pp_size - 1 ? ch + 1 : ch, 0));
          break;
        case PipeOpKind::recv_backward:
          pp.recv(stage.output_grad(), act_count(), op.peer, tag(mb, ch, 1));
          break;
        case PipeOpKind::backward: {
          if (send_grad) send_grad->wait();
          const auto it = slot_of.find({mb, ch});
          WEFT_ASSERT(it != slot_of.end());
          stage.backward(it->second, ch);
          free_slots.push_back(it->second);
          slot_of.erase(it);
          break;
        }
        case PipeOpKind::send_backward:
          send_grad = pp.isend(stage.input_grad(), act_count(), op.peer,
                               tag(mb, s == 0 ? ch - 1 : ch, 1));
          break;
      }
    }
    if (send_act) send_act->wait();
    if (send_grad) send_grad->wait();
    send_act.reset();
    send_grad.reset();
    stage.sync_tied_grads();
    stage.reduce_replicated_grads();
    optim.reduce_grads();
    // The logging all-reduce: only the last stage holds losses, split over tp
    // (each rank the rows whose target is in its vocab shard) and dp.
    groups.world->all_reduce(&loss, 1);
    return loss * scale;
  }

  // Mean loss over the first eval_samples validation samples, spread over the
  // dp replicas and walked forward through the pipeline.
  double validation_loss() {
    if (!val_loader) return std::numeric_limits<double>::quiet_NaN();
    const int64_t mb = c.layout.mb, dp = c.layout.dp;
    const int64_t rounds = std::max<int64_t>(1, c.eval_samples / (mb * dp));
    auto& pp = *groups.pp;
    const int64_t s = groups.pp_rank();
    double loss = 0;
    const int64_t pp_size = c.layout.pp, vpp = c.layout.vpp;
    for (int64_t j = 0; j < rounds; ++j) {
      // Walk the virtual stages in order; this rank runs those it holds.
      for (int64_t v = 0; v < pp_size * vpp; ++v) {
        if (v % pp_size != s) continue;
        if (v > 0) pp.recv(stage.stage_input(0), act_count(), (s + pp_size - 1) % pp_size, 2 * (j * pp_size * vpp + v));
        val_loader->batch(groups.dp_rank() * rounds * mb + j * mb, mb, tokens.data(), targets.data());
        loss += stage.forward(0, tokens.data(), targets.data(), 0.0, v / pp_size);
        if (v + 1 < pp_size * vpp)
          pp.send(stage.stage_output(), act_count(), (s + 1) % pp_size, 2 * (j * pp_size * vpp + v + 1));
      }
    }
    groups.world->all_reduce(&loss, 1);
    return loss / double(rounds * mb * dp * c.run.seq);
  }

  std::string save(int64_t step, double lr) {
    SaveInfo info;
    info.step = step;
    info.data_position = step * c.run.global_batch;
    info.seed = c.seed;
    info.lr = lr;
    info.run = {{"seq", c.run.seq},
                {"global_batch", c.run.global_batch},
                {"precision", to_string(c.run.precision)},
                {"seed", c.seed},
                {"optim", c.optim}};
    if (data.meta.is_object() && data.meta.contains("tokenizer")) info.run["tokenizer"] = data.meta["tokenizer"];
    const std::string dir =
        (fs::path(c.ckpt_dir.empty() ? c.out_dir + "/checkpoints" : c.ckpt_dir) /
         checkpoint::checkpoint_dir_name(step)).string();
    state_save(dir, stage, optim, info);
    return dir;
  }

  // Loads weights, optimizer state and counters; returns the completed step.
  int64_t load(const std::string& dir) {
    const auto ck = checkpoint::load_checkpoint(dir);
    checkpoint::check_compatible(ck.manifest, c.model, dir);
    const auto& run = ck.manifest.run;
    if (run.value("seq", c.run.seq) != c.run.seq ||
        run.value("global_batch", c.run.global_batch) != c.run.global_batch)
      throw InputError(fmt::format(
          "checkpoint {} was trained with seq {} and global batch {}, this run asks for seq {} "
          "and global batch {}; resume with the same values",
          dir, run.value("seq", int64_t{0}), run.value("global_batch", int64_t{0}), c.run.seq,
          c.run.global_batch));
    state_load(ck, stage, &optim);
    return ck.manifest.step;
  }
};

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
  return s;
}

}  // namespace

void check_trainable(const Layout& l, const ModelSpec& m) {
  auto no = [&](const char* what) {
    throw LayoutError(fmt::format("layout {}: {} is not supported by the trainer yet (the memory and "
                                  "cost models and `weft tune --dry-run` cover it)",
                                  l.to_string(), what));
  };
  if (l.zero >= 3 && l.dp > 1) no("ZeRO-3 parameter sharding");
  if (l.zero == 2 && l.dp > 1 && m.tied_embeddings) no("ZeRO-2 with tied embeddings");
}

TrainReport train(const TrainConfig& c, std::FILE* log_all) {
  c.model.validate();
  c.run.validate();
  c.optim.validate();
  const int64_t world = c.groups ? c.groups->world->size() : 1;
  c.layout.validate(c.model, c.run, world);
  check_trainable(c.layout, c.model);
  const bool rank0 = !c.groups || c.groups->world->rank() == 0;
  // Only world rank 0 reports; the others write their progress nowhere.
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> devnull(std::fopen("/dev/null", "w"), &std::fclose);
  std::FILE* log = rank0 ? log_all : devnull.get();
  if (c.steps < 1) throw InputError(fmt::format("--steps {} must be at least 1", c.steps));
  if (c.run.precision != Precision::fp32)
    throw InputError("the CPU trainer runs in fp32; pass --precision fp32 (bf16 needs a GPU)");
  if (c.log_every < 1) throw InputError(fmt::format("--log-every {} must be at least 1", c.log_every));
  set_threads(c.threads);

  const std::string data_path = c.data.empty() ? data::default_corpus_dir() : c.data;
  data::TokenData data = data::token_data_open(data_path);
  data::token_data_validate(data, c.model.vocab, c.run.seq);
  fs::create_directories(c.out_dir);

  Run run(c, std::move(data));
  TrainReport report;
  report.baseline = data::token_data_baseline(run.data);
  memory::MemoryOptions all;
  all.all_stages = true;
  const auto mem = memory::estimate(c.model, c.run, c.layout, c.device, all);
  report.predicted = mem.stages[size_t(run.groups.pp_rank())].bytes;

  int64_t done = 0;
  std::string resume = c.resume_from;
  if (resume.empty() && c.resume)
    resume = checkpoint::latest_checkpoint(c.ckpt_dir.empty() ? c.out_dir + "/checkpoints" : c.ckpt_dir)
                 .value_or("");
  if (!resume.empty()) {
    done = run.load(resume);
    fmt::print(log, "resumed from {} at step {}\n", resume, done);
  } else {
    run.stage.init_weights(c.seed);
  }
  if (rank0) run.metrics.open(fs::path(c.out_dir) / "metrics.jsonl", std::ios::app);

  const double peak = c.device.peak_flops(to_string(c.run.precision));
  const double flops_per_step = model_flops_per_step(c.model, c.run);
  fmt::print(log, "training {} on {} x {} ({}), layout {}\n", c.model.summary(), world,
             c.device.summary(), to_string(c.run.precision), c.layout.to_string());
  fmt::print(log, "data {}: {} train tokens, {} samples of {} tokens per step; unigram baseline "
                  "{:.4f} nats/token\n",
             data_path, run.data.train->size(), c.run.global_batch, c.run.seq, report.baseline);
  fmt::print(log, "MFU is against the stated peak of {:.1f} GFLOP/s ({})\n", peak / 1e9,
             c.device.kind == DeviceKind::cpu ? "cores x clock x fp32 FMA lanes" : "dense bf16");

  report.first_step = done + 1;
  double window_time = 0, window_comm = 0;
  int64_t window_steps = 0;
  double lr = 0;
  const auto t_start = Clock::now();
  double train_time = 0;
  for (int64_t step = done + 1; step <= c.steps; ++step) {
    // Every rank stops at the same step: the signal may reach them apart.
    int32_t stop = c.stop && c.stop->load() ? 1 : 0;
    run.groups.world->all_reduce(&stop, 1, parallel::ReduceOp::max);
    if (stop) {
      report.interrupted = true;
      break;
    }
    const auto t0 = Clock::now();
    const double comm0 = c.watchdog ? c.watchdog->comm_seconds() : 0.0;
    const double loss = run.step_loss(step - 1);
    const StepStats s = run.optim.step(step, loss);
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
      fmt::print(log,
                 "step {:>5}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tok/s | "
                 "{:.2f} TFLOP/s | MFU {:.1f}% | peak mem {}{}{}\n",
                 step, c.steps, loss, s.lr, s.grad_norm, tps, fps / 1e12, 100 * mfu(fps, world, peak),
                 format_bytes(double(run.arena.peak_total())),
                 c.watchdog ? fmt::format(" | comm {}/step", format_seconds(comm)) : "",
                 s.skipped ? " | SKIPPED (non-finite)" : "");
      std::fflush(log);
      run.metrics << nlohmann::json{{"step", step},         {"loss", loss},
                                    {"lr", s.lr},           {"grad_norm", s.grad_norm},
                                    {"tokens_per_s", tps},  {"tflops", fps / 1e12},
                                    {"mfu", mfu(fps, world, peak)}, {"peak_bytes", run.arena.peak_total()},
                                    {"skipped", s.skipped},
                                    {"step_s", window_time / window_steps},
                                    {"comm_s", window_comm / window_steps}}
                         .dump()
                  << "\n";
      run.metrics.flush();
      window_time = 0;
      window_comm = 0;
      window_steps = 0;
    }
    if (c.eval_every > 0 && step % c.eval_every == 0 && step != c.steps) {
      const double v = run.validation_loss();
      fmt::print(log, "step {:>5} | validation loss {:.4f} (unigram baseline {:.4f})\n", step, v,
                 report.baseline);
      run.metrics << nlohmann::json{{"step", step}, {"val_loss", v}}.dump() << "\n";
    }
    if (c.ckpt_every > 0 && step % c.ckpt_every == 0 && step != c.steps) report.checkpoint = run.save(step, lr);
  }
  (void)t_start;
  if (report.last_step > 0 && report.last_step >= report.first_step) {
    report.checkpoint = run.save(report.last_step, lr);
    fmt::print(log, "{}checkpoint {}\n", report.interrupted ? "stopped early; " : "", report.checkpoint);
  }
  report.val_loss = run.validation_loss();
  const int64_t ran = report.last_step - report.first_step + 1;
  report.tokens_per_second = ran > 0 ? double(ran * c.run.tokens_per_step()) / train_time : 0;
  fmt::print(log, "validation loss {:.4f} nats/token vs unigram baseline {:.4f} ({:+.1f}%)\n",
             report.val_loss, report.baseline, 100 * (report.val_loss - report.baseline) / report.baseline);
  run.metrics << nlohmann::json{{"step", report.last_step}, {"val_loss", report.val_loss},
                                {"baseline", report.baseline}}
                     .dump()
              << "\n";
  report.measured = run.arena.peaks();
  fmt::print(log, "{}", memory_table(report, c.device));
  // Every rank records its measured peaks beside the memory model's
  // prediction for its stage, so multi-rank runs can be checked stage by stage.
  nlohmann::json mj{{"rank", run.groups.world->rank()}, {"pp_rank", run.groups.pp_rank()},
                    {"tp_rank", run.groups.tp_rank()}, {"dp_rank", run.groups.dp_rank()},
                    {"layout", c.layout.to_string()}};
  for (auto cat : memory::kAllCategories) {
    mj["measured"][memory::to_string(cat)] = report.measured[size_t(cat)];
    mj["predicted"][memory::to_string(cat)] = report.predicted[size_t(cat)];
  }
  file_write_atomic((fs::path(c.out_dir) / "memory" / fmt::format("rank{}.json", run.groups.world->rank())).string(),
                    mj.dump(1) + "\n");
  return report;
}

}  // namespace weft::trainer
