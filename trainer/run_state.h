// The state of one training run on one rank, shared by the training loop and
// the tuner's profiler: the model stage and its arena, the optimizer, the data
// loaders, and one optimizer step's pipelined forward and backward. Internal to
// trainer/.
#pragma once

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/hash.h"
#include "core/pipeline_schedule.h"
#include "memory/arena.h"
#include "memory/device.h"
#include "trainer/checkpoint/checkpoint.h"
#include "data/loader.h"
#include "data/token_data.h"
#include "trainer/loop.h"
#include "trainer/resume_check.h"
#include "trainer/async_save.h"
#include "trainer/state_io.h"

namespace weft::trainer {

namespace fs = std::filesystem;

// One training run's state on this rank: Run<float> on the CPU, Run<bf16> on
// the current CUDA device (its own stream, tensors in device memory), with
// fp32 gradients or, as Run<bf16, bf16>, bf16 ones (grad:bf16).
template <typename Elem, typename G = kernels::Acc<Elem>>
struct Run {
  static constexpr bool kDevice = std::is_same_v<Elem, kernels::bf16>;
  // How the watchdog names the host's waits for the GPU.
  static constexpr const char* kGpuWait = "a wait for the GPU (the step's kernels and NCCL operations)";
  const TrainConfig& c;
  // The run's stream: the one its device (NCCL) groups order their work
  // after, even the legacy default stream (null), or else its own.
  bool device_groups = c.groups && c.groups->host;
  memory::OwnedStream own_stream{kDevice && !device_groups ? kernels::Backend::cuda : kernels::Backend::cpu};
  kernels::Stream stream = kDevice && device_groups ? kernels::Stream{kernels::Backend::cuda, c.groups->cuda_stream}
                                                    : own_stream.get();
  std::unique_ptr<memory::Arena> own_arena;
  memory::Arena& arena;  // own_arena, or one the caller reserved up front
  parallel::ProcessGroups own_groups;
  parallel::ProcessGroups& groups;
  LlamaStage<Elem, G> stage;
  Optimizer<Elem, G> optim;
  data::TokenData data;
  std::unique_ptr<data::Loader> loader, val_loader;
  std::ofstream metrics;
  // One metrics.jsonl record, flushed, and the same to c.metrics_sink; a
  // no-op where the file is not open (every rank but world rank 0).
  void emit(const nlohmann::json& r) {
    if (!metrics.is_open()) return;
    metrics << r.dump() << "\n";
    metrics.flush();
    if (c.metrics_sink) c.metrics_sink->record(r);
  }
  // The micro-batch's samples (mb, T) as the loader reads them, and this
  // rank's rows of them (the same under cp 1; chunks cp_rank and
  // 2 cp - 1 - cp_rank of each under context parallelism).
  std::vector<int32_t> tokens, targets, local_tokens, local_targets;
  std::unique_ptr<parallel::CommRequest> send_act, send_grad;
  std::unique_ptr<parallel::CommRequest> send_stats, send_totals;  // an MoE model's statistics (step_loss)
  // The last step's FP8 quantisation counts on this rank (Layout::fp8).
  typename LlamaStage<Elem, G>::Fp8Counts fp8;
  // Where the run's weights started (--init's folder; empty: from the seed)
  // and the tokenizer's ids the model was pretrained with (-1: unknown),
  // carried from --init or a resumed checkpoint into the checkpoints this run
  // writes, and from there into `weft export`'s config.json.
  std::string init_dir;
  int64_t bos_token_id = -1, eos_token_id = -1;
  // LoRA: the base model the adapters adapt (state_io.h's lora_base_record).
  nlohmann::json lora_base;
  AsyncSaver saver;  // world rank 0's checkpoint writer

  Run(const TrainConfig& cfg, data::TokenData d, memory::Arena* external = nullptr)
      : c(cfg),
        own_arena(external ? nullptr
                           : std::make_unique<memory::Arena>(kDevice ? memory::device_allocator()
                                                                     : memory::host_allocator())),
        arena(external ? *external : *own_arena), own_groups(cfg.groups ? parallel::ProcessGroups{} : parallel::single_process_groups()),
        groups(cfg.groups ? *cfg.groups : own_groups),
        stage(cfg.model, cfg.run, cfg.layout, groups.pp_rank(), cfg.device, arena, groups, stream),
        optim(stage, cfg.optim), data(std::move(d)) {
    loader = std::make_unique<data::Loader>(*data.train, c.run.seq, c.seed);
    if (data.val) val_loader = std::make_unique<data::Loader>(data::validation_loader(*data.val, c.run.seq));
    const int64_t rows = c.layout.mb * c.run.seq;
    tokens.resize(size_t(rows));
    targets.resize(size_t(rows));
    local_tokens.resize(size_t(rows / c.layout.cp));
    local_targets.resize(size_t(rows / c.layout.cp));
  }

  // Loads samples first .. first + mb - 1 and hands this rank's rows of
  // them (inputs and their targets alike, so a chunk's border keeps its
  // next-token target) to the stage's forward.
  void forward_samples(const data::Loader& from, int64_t first, int64_t slot, double scale, int64_t chunk) {
    from.batch(first, c.layout.mb, tokens.data(), targets.data());
    const int32_t* tok = tokens.data();
    const int32_t* tgt = targets.data();
    if (c.layout.cp > 1) {
      const int64_t T = c.run.seq, cp = c.layout.cp, piece = T / (2 * cp), r = groups.cp_rank();
      for (int64_t s = 0; s < c.layout.mb; ++s)
        for (int64_t k = 0; k < 2; ++k) {
          const int64_t from_row = s * T + (k == 0 ? r : 2 * cp - 1 - r) * piece;
          const int64_t to_row = s * (T / cp) + k * piece;
          std::copy_n(tokens.data() + from_row, piece, local_tokens.data() + to_row);
          std::copy_n(targets.data() + from_row, piece, local_targets.data() + to_row);
        }
      tok = local_tokens.data();
      tgt = local_targets.data();
    }
    stage.set_samples(slot, first);
    stage.forward(slot, tok, tgt, scale, chunk);
  }

  // A fresh model from the seed (layout-independent).
  void init(uint64_t seed) {
    stage.init_weights(seed, [this] {
      if (c.watchdog) c.watchdog->progress();
    });
    optim.reset_master();
    if (c.run.lora.enabled()) lora_base = lora_base_record(nullptr, seed);
  }

  bool first() const { return stage.plan().has_embedding; }
  bool last() const { return stage.plan().has_head; }
  int64_t act_count() const { return stage.boundary_elements(); }

  // Micro-batch j of this dp replica reads global samples
  // first_sample + dp_rank * (global_batch / dp) + j * mb + [0, mb): the
  // global batch is the same whatever the layout.
  void micro_forward(int64_t first_sample, int64_t j, int64_t slot, double scale, int64_t chunk) {
    const int64_t per_replica = c.run.global_batch / c.layout.dp;
    forward_samples(*loader, first_sample + groups.dp_rank() * per_replica + j * c.layout.mb, slot, scale, chunk);
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
    // An MoE model's global balancing loss needs the micro-batch's router
    // statistics from every stage: they follow the activations and the
    // gradients on the same peers and tags (LlamaStage::moe_stats_travel).
    const bool stats = stage.moe_stats_travel();
    const int64_t n_stats = stats ? stage.moe_stats_count() : 0;
    auto& host_pp = *groups.host_groups().pp;
    stage.zero_grads();
    stage.fp8_step_begin();
    // LoRA dropout draws a fresh mask every step, the same under any layout.
    stage.lora_dropout(true, splitmix64(c.seed ^ splitmix64(uint64_t(step0) + 1)));
    for (const PipeOp& op : pipeline_schedule(pp_size, c.layout.vpp, m, s)) {
      const int64_t mb = op.micro_batch, ch = op.chunk;
      switch (op.kind) {
        case PipeOpKind::recv_forward:
          pp.recv(stage.stage_input(slot_for(mb, ch), ch), act_count(), op.peer, tag(mb, ch, 0));
          if (stats) host_pp.recv(stage.moe_stats_in(slot_for(mb, ch)), n_stats, op.peer, tag(mb, ch, 0));
          break;
        case PipeOpKind::forward:
          if (send_act) send_act->wait();  // the output buffer is about to be rewritten
          if (send_stats) send_stats->wait();
          micro_forward(step0 * gb, mb, slot_for(mb, ch), scale, ch);
          break;
        case PipeOpKind::send_forward:
          send_act = pp.isend(stage.stage_output(), act_count(), op.peer,
                              tag(mb, s == pp_size - 1 ? ch + 1 : ch, 0));
          if (stats)
            send_stats = host_pp.isend(stage.moe_stats_out(), n_stats, op.peer,
                                       tag(mb, s == pp_size - 1 ? ch + 1 : ch, 0));
          break;
        case PipeOpKind::recv_backward: {
          pp.recv(stage.output_grad(), act_count(), op.peer, tag(mb, ch, 1));
          const auto it = slot_of.find({mb, ch});
          WEFT_ASSERT(it != slot_of.end());
          if (stats) host_pp.recv(stage.moe_totals(it->second), n_stats, op.peer, tag(mb, ch, 1));
          break;
        }
        case PipeOpKind::backward: {
          if (send_grad) send_grad->wait();
          if (send_totals) send_totals->wait();
          const auto it = slot_of.find({mb, ch});
          WEFT_ASSERT(it != slot_of.end());
          // Micro-batches run in order within a chunk, so the last one's
          // backward leaves the chunk's gradients complete.
          stage.backward(it->second, ch, mb == m - 1);
          free_slots.push_back(it->second);
          slot_of.erase(it);
          break;
        }
        case PipeOpKind::send_backward:
          send_grad = pp.isend(stage.input_grad(), act_count(), op.peer,
                               tag(mb, s == 0 ? ch - 1 : ch, 1));
          if (stats)
            send_totals = host_pp.isend(stage.moe_totals_out(), n_stats, op.peer, tag(mb, s == 0 ? ch - 1 : ch, 1));
          break;
      }
    }
    if (send_act) send_act->wait();
    if (send_grad) send_grad->wait();
    if (send_stats) send_stats->wait();
    if (send_totals) send_totals->wait();
    send_act.reset();
    send_grad.reset();
    send_stats.reset();
    send_totals.reset();
    stage.lora_dropout(false);
    stage.finish_dp_reduction();
    stage.sync_tied_grads();
    stage.reduce_replicated_grads();
    optim.reduce_grads();
    // An MoE overflow: the step is left without its update, the FP8 amax
    // history as it was (LlamaStage::take_moe_overflow).
    overflow = agreed_overflow();
    fp8 = stage.fp8_step_end(overflow.empty());
    // The logging all-reduce: only the last stage holds losses, split over tp
    // (each rank the rows whose target is in its vocab shard) and dp.
    double loss = 0;
    {
      parallel::CommWatchdog::Waiting w(kDevice ? c.watchdog : nullptr, kGpuWait);
      loss = stage.take_loss();
    }
    groups.host_groups().world->all_reduce(&loss, 1);
    // The balancing loss the same way (each stage its layers', on tp rank 0).
    double aux = stage.take_aux_loss();
    groups.host_groups().world->all_reduce(&aux, 1);
    aux_loss = aux * scale;
    stage.take_expert_load(expert_load);
    const std::vector<double> peaks = stage.take_dispatch_peaks();
    dispatch_peaks.resize(std::max(dispatch_peaks.size(), peaks.size()), 0.0);
    for (size_t d = 0; d < peaks.size(); ++d) dispatch_peaks[d] = std::max(dispatch_peaks[d], peaks[d]);
    stage.take_dropped(expert_dropped);
    received_peak = std::max(received_peak, stage.take_received_peak());
    return loss * scale;
  }
  // Under expert parallelism, the ranks' overflows of the last step (or
  // validation) agreed over the world: the error text of the lowest world
  // rank's first, the same on every rank; empty where none overflowed (and
  // without ep, with no message exchanged).
  std::string agreed_overflow() {
    if (c.layout.ep <= 1) return {};
    auto& world = *groups.host_groups().world;
    const auto mine = stage.take_moe_overflow();
    const int64_t n = world.size();
    int64_t from = mine ? n - world.rank() : 0;  // (the lowest rank: the largest n - rank)
    world.all_reduce(&from, 1, parallel::ReduceOp::max);
    if (from == 0) return {};
    std::array<int64_t, 2> o{0, 0};
    if (world.rank() == n - from) o = {mine->layer, mine->rows};
    world.all_reduce(o.data(), 2);
    return stage.moe_overflow_text({.layer = o[0], .rows = o[1]});
  }
  // The last step's (or validation's) agreed MoE overflow; empty: none.
  std::string overflow;
  // The last step's mean balancing loss (MoE models; 0 otherwise).
  double aux_loss = 0;
  // MoE models: this rank's expert loads since the last logged record,
  // (model layers) x E (LlamaStage::take_expert_load).
  std::vector<int64_t> expert_load;
  // The most uneven dispatches since then, this rank's, (E + 1)
  // (LlamaStage::take_dispatch_peaks).
  std::vector<double> dispatch_peaks;
  // With a capacity, the choices each layer dropped since then, (model
  // layers) (LlamaStage::take_dropped).
  std::vector<int64_t> expert_dropped;
  // Under ep, the most rows an ep rank's experts received in one
  // micro-batch since then, over the balanced rows x k (LlamaStage::
  // take_received_peak).
  double received_peak = 0;

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
      // A stop request ends validation on every rank at the same sample
      // (the signal may reach them apart): the result is then NaN.
      int32_t stop = c.stop && c.stop->load() ? 1 : 0;
      groups.host_groups().world->all_reduce(&stop, 1, parallel::ReduceOp::max);
      if (stop) return std::numeric_limits<double>::quiet_NaN();
      // Walk the virtual stages in order; this rank runs those it holds.
      for (int64_t v = 0; v < pp_size * vpp; ++v) {
        if (v % pp_size != s) continue;
        if (v > 0) pp.recv(stage.stage_input(0, v / pp_size), act_count(), (s + pp_size - 1) % pp_size, 2 * (j * pp_size * vpp + v));
        forward_samples(*val_loader, groups.dp_rank() * rounds * mb + j * mb, 0, 0.0, v / pp_size);
        loss += stage.take_loss();
        if (v + 1 < pp_size * vpp)
          pp.send(stage.stage_output(), act_count(), (s + 1) % pp_size, 2 * (j * pp_size * vpp + v + 1));
      }
    }
    groups.host_groups().world->all_reduce(&loss, 1);
    // Routed past the receive buffers: no loss to report (the caller stops).
    overflow = agreed_overflow();
    if (!overflow.empty()) return std::numeric_limits<double>::quiet_NaN();
    return loss / double(rounds * mb * dp * c.run.seq);
  }

  // Saves a checkpoint of the state after `step`; `async`: the files are
  // written while training goes on (AsyncSaver).
  std::string save(int64_t step, double lr, bool async = false) {
    SaveInfo info;
    info.step = step;
    info.data_position = step * c.run.global_batch;
    info.seed = c.seed;
    info.lr = lr;
    // Built apart and moved in: assigned straight from the braced list, the
    // member's first value (an empty object) was never freed in clang 14
    // builds (LeakSanitizer, 48 bytes per checkpoint).
    nlohmann::json run{{"seq", c.run.seq},
                       {"global_batch", c.run.global_batch},
                       {"precision", to_string(c.run.precision)},
                       {"seed", c.seed},
                       {"optim", c.optim},
                       {"data", data.path}};
    info.run = std::move(run);
    if (data.meta.is_object() && data.meta.contains("tokenizer")) info.run["tokenizer"] = data.meta["tokenizer"];
    if (!init_dir.empty()) info.run["init"] = init_dir;
    if (c.run.lora.enabled()) {
      info.run["lora"] = c.run.lora;
      info.run["lora"]["base"] = lora_base;
    }
    info.bos_token_id = bos_token_id;
    info.eos_token_id = eos_token_id;
    const std::string dir =
        (fs::path(c.ckpt_dir.empty() ? c.out_dir + "/checkpoints" : c.ckpt_dir) /
         checkpoint::checkpoint_dir_name(step)).string();
    // Every rank gathers (a collective); world rank 0 writes, now or on the
    // writer thread, and marks the folder latest once it is complete.
    std::unique_ptr<SaveJob> job = state_gather(dir, stage, optim, info, saver.take_spare());
    WEFT_ASSERT((job != nullptr) == (groups.world->rank() == 0));
    if (job) {
      auto mark = [root = fs::path(dir).parent_path().string(), name = fs::path(dir).filename().string()] {
        checkpoint::mark_latest(root, name);
      };
      if (async) {
        saver.submit(std::move(job), std::move(mark));
      } else {
        saver.wait();
        state_write(*job);
        mark();
        saver.give_spare(std::move(job));
      }
    }
    groups.host_groups().world->barrier();
    return dir;
  }

  // Waits for a checkpoint still being written (rank 0); rethrows its error.
  // Then frees the buffers kept for the next save: after the final one there
  // is none, and they would stay resident for the rest of the run.
  void wait_saves() {
    saver.wait();
    (void)saver.take_spare();
  }

  // Maps and validates checkpoint `dir` for this run, communicating nothing.
  checkpoint::Checkpoint open(const std::string& dir) const {
    auto ck = checkpoint::load_checkpoint(dir);
    checkpoint::check_compatible(ck.manifest, c.model, dir);
    resume_changes_check(resume_changes(ck.manifest, c, dir, data.path), c.changes, dir);
    return ck;
  }

  // Loads weights, optimizer state and counters; returns the completed step.
  int64_t load(const checkpoint::Checkpoint& ck) {
    state_load(ck, stage, &optim);
    init_dir = ck.manifest.run.value("init", std::string());
    if (c.run.lora.enabled()) lora_base = ck.manifest.run.at("lora").at("base");
    bos_token_id = ck.manifest.bos_token_id;
    eos_token_id = ck.manifest.eos_token_id;
    return ck.manifest.step;
  }

  // Maps and validates pretrained weights (--init) for this run's model,
  // communicating nothing.
  checkpoint::Pretrained open_init(const std::string& dir) const {
    auto p = checkpoint::pretrained_open(dir);
    checkpoint::pretrained_check(p.model, c.model, dir);
    return p;
  }

  // Starts the run from pretrained weights: step 0, a fresh optimizer.
  void init_from(const checkpoint::Pretrained& p) {
    if (c.run.lora.enabled()) {  // the adapters from the seed, the frozen base from the folder
      stage.init_weights(c.seed, [this] {
        if (c.watchdog) c.watchdog->progress();
      }, LlamaStage<Elem, G>::InitWhat::trainable);
      optim.reset_master();
      lora_base = lora_base_record(&p, c.seed);
    }
    state_init(p, stage, optim);
    init_dir = p.dir;
    bos_token_id = p.bos_token_id;
    eos_token_id = p.eos_token_id;
  }
};

}  // namespace weft::trainer
