#include "trainer/state_io.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"
#include "memory/shapes.h"

namespace weft::trainer {

namespace {

using checkpoint::OptimState;
using checkpoint::optim_state_name;

std::string lora_text(const LoraSpec& l) {
  if (!l.enabled()) return "with every weight trainable (no LoRA)";
  return fmt::format("with LoRA rank {}, alpha {}, dropout {}, targets {}", l.rank, l.alpha, l.dropout,
                     l.targets_text());
}

bool is_vocab_param(const ParamSpec& p) {
  return p.name == checkpoint::hf_param_name(ParamKind::embed_tokens) ||
         p.name == checkpoint::hf_param_name(ParamKind::lm_head);
}

// This rank's block of parameter p from stored tensor t. The embedding and
// head of a padded vocabulary (ModelSpec::padded_vocab) hold rows past the
// stored V: padding, zero in the weights and in Adam's moments.
void slice_into(const checkpoint::TensorRef& t, float* dst, const ParamSpec& p) {
  const int64_t stored =
      is_vocab_param(p) ? std::clamp<int64_t>(t.shape[0] - p.row_begin, 0, p.local_rows) : p.local_rows;
  if (stored > 0) checkpoint::tensor_read_f32_block(t, p.row_begin, stored, p.col_begin, p.local_cols, dst);
  std::fill(dst + stored * p.local_cols, dst + p.local_rows * p.local_cols, 0.0f);
}

// Weights a run starts from must be finite: a NaN or infinity would train
// NaN from the first step and be written into every checkpoint. `rows` x
// `cols` read from (row0, col0) of tensor `name` of `source`.
void require_finite(const float* w, int64_t rows, int64_t cols, int64_t row0, int64_t col0, const std::string& name,
                    const std::string& source) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      if (const float x = w[r * cols + c]; !std::isfinite(x))
        throw InputError(fmt::format("{}: tensor {} holds {} at [{}, {}]; the weights a run starts from must be "
                                     "finite",
                                     source, name, x, row0 + r, col0 + c));
}

}  // namespace

namespace {

// The full tensor of parameter p from every tp rank's shard of `local`.
void gather_tp(parallel::Comm& tp, const ParamSpec& p, const float* local, float* full) {
  const int64_t n = p.local_elements(), t = tp.size();
  if (p.shard == ShardDim::none || t == 1) {
    std::memcpy(full, local, size_t(n) * sizeof(float));
    return;
  }
  if (p.shard == ShardDim::rows) {  // row blocks concatenate into the full tensor
    tp.all_gather(local, full, n);
    return;
  }
  std::vector<float> blocks(size_t(n * t));  // (t, rows, cols / t) -> (rows, cols)
  tp.all_gather(local, blocks.data(), n);
  for (int64_t r = 0; r < t; ++r)
    for (int64_t i = 0; i < p.rows; ++i)
      std::memcpy(full + i * p.cols + r * p.local_cols, blocks.data() + r * n + i * p.local_cols,
                  size_t(p.local_cols) * sizeof(float));
}

// The stage's state with every ep rank's experts (ep rank 0 of the first ep
// group, tp rank 0): `mine` is its own (stage_full_state), the others'
// arrive over the ep group; the result is in the order of the stage's
// specs without expert parallelism.
template <typename Elem, typename G>
std::vector<float> with_every_expert(LlamaStage<Elem, G>& stage, const parallel::ProcessGroups& g,
                                     std::vector<float> mine) {
  const ModelSpec& m = stage.model();
  const Layout& l = stage.layout();
  const memory::StagePlan& plan = stage.plan();
  // Where each parameter's three tensors start in each rank's state, by name.
  std::map<std::string, std::pair<int64_t, int64_t>> at;  // name -> (ep rank, position)
  std::vector<std::vector<float>> theirs(size_t(l.ep));
  for (int64_t r = 0; r < l.ep; ++r) {
    int64_t pos = 0;
    for (const auto& p : stage_params(m, l, plan, 0, r).specs) {
      if (r == 0 || p.expert >= 0) at.emplace(p.name, std::pair{r, pos});
      pos += 3 * p.rows * p.cols;
    }
    if (r > 0) {
      theirs[size_t(r)].resize(size_t(pos));
      g.ep->recv(theirs[size_t(r)].data(), pos, r, 7001);
    }
  }
  theirs[0] = std::move(mine);
  Layout whole = l;
  whole.ep = 1;
  std::vector<float> out;
  for (const auto& p : stage_params(m, whole, plan, 0).specs) {
    const auto [r, pos] = at.at(p.name);
    const float* src = theirs[size_t(r)].data() + pos;
    out.insert(out.end(), src, src + 3 * p.rows * p.cols);
  }
  return out;
}

// A stage's weights, Adam m and v as full tensors, back to back in the order
// of its param specs, into `out` (whose storage a caller may reuse from save
// to save: no fresh pages to fault in).
template <typename Elem, typename G>
void stage_full_state(LlamaStage<Elem, G>& stage, Optimizer<Elem, G>& opt, std::vector<float>& out) {
  // Where this rank holds its whole fp32 state in host memory (the CPU
  // trainer without ZeRO), it is read in place; otherwise gathered first.
  const float *w = nullptr, *m = nullptr, *v = nullptr;
  std::vector<float> wb, mb, vb;
  if constexpr (std::is_same_v<Elem, float> && std::is_same_v<G, float>) opt.host_views(w, m, v);
  if (!w) {
    opt.weights_full(wb);
    opt.state_full(mb, vb);
    w = wb.data();
    m = mb.data();
    v = vb.data();
  }
  int64_t total = 0;
  for (const auto& p : stage.params().specs) total += 3 * p.rows * p.cols;
  out.resize(static_cast<size_t>(total));
  float* dst = out.data();
  auto& tp = *stage.groups().host_groups().tp;
  for (const auto& p : stage.params().specs) {
    const float* parts[] = {w + p.offset, m + p.offset, v + p.offset};
    for (const float* src : parts) {
      gather_tp(tp, p, src, dst);
      dst += p.rows * p.cols;
    }
  }
}

}  // namespace

void state_write(SaveJob& job) { checkpoint::save_checkpoint(job.dir, job.model, job.state, job.manifest); }

template <typename Elem, typename G>
void state_save(const std::string& dir, LlamaStage<Elem, G>& stage, Optimizer<Elem, G>& opt,
                const SaveInfo& info) {
  if (std::unique_ptr<SaveJob> job = state_gather(dir, stage, opt, info)) state_write(*job);
  stage.groups().host_groups().world->barrier();
}

template <typename Elem, typename G>
std::unique_ptr<SaveJob> state_gather(const std::string& dir, LlamaStage<Elem, G>& stage, Optimizer<Elem, G>& opt,
                                      const SaveInfo& info, std::unique_ptr<SaveJob> reuse) {
  // Every tp rank takes part in the gathers; the first tp/cp/dp rank of each
  // stage sends its stage to world rank 0 over the pp group, which writes
  // (cp ranks hold the same weights and, gathered, the same state).
  // All of it in host memory, over the host groups.
  const auto& g = stage.groups().host_groups();
  const ModelSpec& m = stage.model();
  const Layout& l = stage.layout();
  const bool leader = g.tp_rank() == 0 && g.dp_rank() == 0 && g.cp_rank() == 0;
  const bool writer = leader && g.pp_rank() == 0;
  // World rank 0 gathers straight into the job's first stage (a reused
  // job's storage when given); the other ranks into a buffer of their own
  // kept from save to save.
  std::unique_ptr<SaveJob> job = writer ? (reuse ? std::move(reuse) : std::make_unique<SaveJob>()) : nullptr;
  static thread_local std::vector<float> own;
  if (job) job->stages.resize(size_t(l.pp));
  std::vector<float>& mine = job ? job->stages[0] : own;
  stage_full_state(stage, opt, mine);
  // Expert parallelism: the first ep group's other ranks hold the rest of
  // the stage's experts; their tp rank 0 (under epfold every rank of it,
  // the tp ranks holding other experts) sends its state to the leader,
  // which puts every expert in its place.
  if (g.ep && (g.tp_rank() == 0 || l.ep_fold) && g.edp->rank() == 0) {
    if (g.ep->rank() > 0)
      g.ep->send(mine.data(), int64_t(mine.size()), 0, 7001);
    else
      mine = with_every_expert(stage, g, std::move(mine));
  }
  // Delayed FP8 scaling's history travels after the stage's tensors.
  const std::vector<float> history = stage.fp8_history();
  mine.insert(mine.end(), history.begin(), history.end());
  const int64_t history_per_block = history.empty() ? 0 : int64_t(history.size()) / stage.plan().layers;
  if (leader && g.pp_rank() > 0) g.pp->send(mine.data(), int64_t(mine.size()), 0, 7000);
  if (!writer) return nullptr;
  job->dir = dir;
  job->model.clear();
  job->state.clear();
  std::vector<std::vector<float>>& stages = job->stages;
  std::vector<StageParams> specs(size_t(l.pp));
  RunSpec run{.seq = 1, .global_batch = l.mb * l.dp, .precision = Precision::fp32, .lora = stage.plan().lora};
  Layout whole = l;  // every expert of each stage
  whole.ep = 1;
  for (int64_t s = 0; s < l.pp; ++s) {
    specs[size_t(s)] = stage_params(m, whole, memory::stage_plan(m, run, l, s), 0);
    if (s == 0) continue;
    int64_t n = history_per_block * memory::stage_plan(m, run, l, s).layers;
    for (const auto& p : specs[size_t(s)].specs) n += 3 * p.rows * p.cols;
    stages[size_t(s)].resize(size_t(n));
    g.pp->recv(stages[size_t(s)].data(), n, s, 7000);
  }
  std::vector<checkpoint::TensorRef>& model = job->model;
  std::vector<checkpoint::TensorRef>& state = job->state;
  // (layers, slots, history) in global layer order, gathered from the stages'
  // blocks (memory::fp8_delayed_slots_per_block).
  std::vector<float>& history_full = job->history;
  history_full.resize(size_t(history_per_block * m.layers));
  for (int64_t s = 0; s < l.pp; ++s) {
    const float* src = stages[size_t(s)].data();
    for (const auto& p : specs[size_t(s)].specs) {
      const int64_t n = p.rows * p.cols;
      auto shape = p.shape();
      // A padded vocabulary's rows past V are stored nowhere: the files
      // hold the model's V rows, whatever tp padded them for.
      if (is_vocab_param(p)) shape[0] = m.vocab;
      // A tied head on the last stage is a copy of the embedding: stored once.
      const bool dup = s > 0 && p.name == checkpoint::hf_param_name(ParamKind::embed_tokens);
      if (!dup) {
        model.push_back({p.name, checkpoint::DType::F32, shape, src});
        state.push_back({optim_state_name(OptimState::exp_avg, p.name), checkpoint::DType::F32, shape, src + n});
        state.push_back({optim_state_name(OptimState::exp_avg_sq, p.name), checkpoint::DType::F32, shape, src + 2 * n});
      }
      src += 3 * n;
    }
    for (int64_t c = 0; c < l.vpp && history_per_block > 0; ++c)
      for (int64_t i = 0, n = l.chunk_layers(m, s, c); i < n; ++i, src += history_per_block)
        std::copy(src, src + history_per_block,
                  history_full.begin() + memory::global_layer(m, l, s, c, i) * history_per_block);
  }
  if (history_per_block > 0)
    state.push_back({checkpoint::kFp8HistoryTensor, checkpoint::DType::F32,
                     {m.layers, history_per_block / kFp8DelayedHistory, kFp8DelayedHistory}, history_full.data()});
  checkpoint::Manifest& man = job->manifest;
  man = checkpoint::Manifest{};
  man.step = info.step;
  man.data_position = info.data_position;
  man.rng_state = {info.seed};
  const auto& c = opt.config();
  man.optimizer = {"adamw", info.lr, c.beta1, c.beta2, c.eps, c.weight_decay, c.clip, opt.updates()};
  man.layout = l;
  man.model = m;
  man.run = info.run;
  man.run["nonfinite_total"] = opt.nonfinite_total();
  if (history_per_block > 0) man.run["fp8_history_len"] = stage.fp8_history_len();
  man.bos_token_id = info.bos_token_id;
  man.eos_token_id = info.eos_token_id;
  return job;
}

template <typename Elem, typename G>
void state_load(const checkpoint::Checkpoint& ck, LlamaStage<Elem, G>& stage,
                std::type_identity_t<Optimizer<Elem, G>>* optim) {
  checkpoint::check_compatible(ck.manifest, stage.model(), ck.dir);
  // LoRA: the checkpoint holds the adapters, and says which base model they
  // adapt; the stage's LoRA settings must be the checkpoint's.
  const LoraSpec& lora = stage.params().lora;
  const nlohmann::json recorded = ck.manifest.run.contains("lora") ? ck.manifest.run.at("lora") : nlohmann::json();
  const LoraSpec theirs = recorded.is_object() ? recorded.get<LoraSpec>() : LoraSpec{};
  if (!(theirs == lora))
    throw InputError(fmt::format("checkpoint {} was trained {}, this run asks for {}; LoRA settings cannot change "
                                 "within a run (weft export --merge folds adapters into a model to start from)",
                                 ck.dir, lora_text(theirs), lora_text(lora)));
  if (lora.enabled()) lora_base_load(recorded.value("base", nlohmann::json()), stage, ck.dir);
  std::vector<float> w(size_t(stage.param_elements())), m(w.size()), v(w.size());
  for (const auto& p : stage.params().specs) {
    slice_into(ck.model.at(p.name), w.data() + p.offset, p);
    if (!optim) continue;
    slice_into(ck.optimizer.at(optim_state_name(OptimState::exp_avg, p.name)), m.data() + p.offset, p);
    slice_into(ck.optimizer.at(optim_state_name(OptimState::exp_avg_sq, p.name)), v.data() + p.offset, p);
  }
  if (!optim) {
    stage.set_weights(w);
    return;
  }
  optim->weights_set(w);
  optim->state_set(m, v);
  // Delayed FP8 scaling picks up its history where the checkpoint left it
  // (a checkpoint without one, from another recipe, starts it afresh).
  if (const auto* h = ck.optimizer.find(checkpoint::kFp8HistoryTensor); h && !stage.fp8_history().empty()) {
    const ModelSpec& model = stage.model();
    const Layout& l = stage.layout();
    const int64_t per_block = h->elements() / model.layers, blocks = stage.plan().layers, s = stage.plan().stage;
    // (checkpoint.cpp checked its shape against the model's slots: the
    // stage's, whatever its layout.)
    WEFT_ASSERT(per_block * blocks == int64_t(stage.fp8_history().size()));
    std::vector<float> full(size_t(h->elements())), mine(size_t(per_block * blocks));
    std::memcpy(full.data(), h->data, size_t(h->bytes()));  // F32, checked when the checkpoint was opened
    for (int64_t c = 0, b = 0; c < l.vpp; ++c)
      for (int64_t i = 0, n = l.chunk_layers(model, s, c); i < n; ++i, ++b) {
        const int64_t g = memory::global_layer(model, l, s, c, i);
        std::copy(full.begin() + g * per_block, full.begin() + (g + 1) * per_block, mine.begin() + b * per_block);
      }
    stage.fp8_history_set(mine, ck.manifest.run.value("fp8_history_len", int64_t{0}));
  }
  optim->restore(ck.manifest.optimizer.step, ck.manifest.run.value("nonfinite_total", int64_t{0}));
}

namespace {

// The mean of the rows of a stored (rows, cols) tensor, accumulated in fp64:
// (cols).
std::vector<float> mean_row(const checkpoint::TensorRef& t) {
  const int64_t rows = t.shape[0], cols = t.shape[1];
  std::vector<double> sum(static_cast<size_t>(cols), 0.0);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    checkpoint::tensor_read_f32_block(t, r, 1, 0, cols, row.data());
    for (int64_t c = 0; c < cols; ++c) sum[size_t(c)] += row[size_t(c)];
  }
  std::vector<float> mean(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) mean[size_t(c)] = float(sum[size_t(c)] / double(rows));
  return mean;
}

// This rank's slices of the model parameters `specs` from pretrained
// weights, in the flat layout their offsets give (elements long).
std::vector<float> read_pretrained(const checkpoint::Pretrained& src, const std::vector<ParamSpec>& specs,
                                   int64_t elements, int64_t run_vocab) {
  const int64_t V = src.model.vocab;
  std::vector<float> w(static_cast<size_t>(elements));
  for (const auto& p : specs) {
    const checkpoint::TensorRef& t = src.param(p.name);
    float* dst = w.data() + p.offset;
    // Only the embedding and the head have vocabulary rows beyond V, and tp
    // splits them by rows: this rank's block may lie past V or straddle it.
    const int64_t stored = is_vocab_param(p) ? std::clamp<int64_t>(V - p.row_begin, 0, p.local_rows) : p.local_rows;
    if (stored > 0) checkpoint::tensor_read_f32_block(t, p.row_begin, stored, p.col_begin, p.local_cols, dst);
    require_finite(dst, stored, p.local_cols, p.row_begin, p.col_begin, p.name, "--init " + src.dir);
    if (stored == p.local_rows) continue;
    // Rows up to the run's V (--vocab) start as the mean row; rows past it
    // pad the vocabulary for tp (ModelSpec::padded_vocab) and stay zero.
    const int64_t real = std::clamp<int64_t>(run_vocab - p.row_begin, stored, p.local_rows);
    const std::vector<float> mean = real > stored ? mean_row(t) : std::vector<float>();
    for (int64_t r = stored; r < real; ++r)
      std::copy_n(mean.data() + p.col_begin, p.local_cols, dst + r * p.local_cols);
    std::fill(dst + real * p.local_cols, dst + p.local_rows * p.local_cols, 0.0f);
  }
  return w;
}

}  // namespace

template <typename Elem, typename G>
void state_init(const checkpoint::Pretrained& src, LlamaStage<Elem, G>& stage, Optimizer<Elem, G>& optim) {
  checkpoint::pretrained_check(src.model, stage.model(), src.dir);
  const StageParams& sp = stage.params();
  if (sp.lora.enabled()) {  // the base model, frozen; the adapters keep their start
    stage.set_frozen_weights(read_pretrained(src, sp.frozen, sp.frozen_elements, stage.model().vocab));
    return;
  }
  optim.weights_set(read_pretrained(src, sp.specs, sp.elements, stage.model().vocab));
}

template <typename Elem, typename G>
void state_lora_init(const checkpoint::PeftAdapter& src, LlamaStage<Elem, G>& stage, Optimizer<Elem, G>& optim) {
  const StageParams& sp = stage.params();
  LoraSpec want = sp.lora, have = src.lora;
  have.dropout = want.dropout;
  if (!(want == have)) {
    const auto gate_up = [](const LoraSpec& l) {
      return l.gate_up_rank > 0 ? fmt::format(", the experts' gate_up rank {}", l.gate_up_rank) : std::string();
    };
    throw InputError(fmt::format("--lora-init {}: the adapters are rank {}, alpha {}, targets {}{}; this run asks "
                                 "for rank {}, alpha {}, targets {}{} (--lora, --lora-alpha, --lora-targets{})",
                                 src.dir, have.rank, have.alpha, have.targets_text(), gate_up(have), want.rank,
                                 want.alpha, want.targets_text(), gate_up(want),
                                 have.gate_up_rank != want.gate_up_rank ? ", --lora-gate-up-rank" : ""));
  }
  std::vector<float> w(static_cast<size_t>(sp.elements));
  for (const auto& p : sp.specs) {
    slice_into(src.tensor(p.name), w.data() + p.offset, p);
    require_finite(w.data() + p.offset, p.local_rows, p.local_cols, p.row_begin, p.col_begin, p.name,
                   "--lora-init " + src.dir);
  }
  optim.weights_set(w);
}

nlohmann::json lora_base_record(const checkpoint::Pretrained* src, uint64_t seed) {
  if (!src) return {{"source", "random"}, {"seed", seed}};
  std::error_code ec;
  const std::string path = std::filesystem::absolute(src->dir, ec).lexically_normal().string();
  return {{"source", "pretrained"}, {"path", ec ? src->dir : path}, {"hash", checkpoint::pretrained_hash(*src)}};
}

std::optional<checkpoint::Pretrained> lora_base_open(const nlohmann::json& base, const std::string& where) {
  const std::string source = base.is_object() ? base.value("source", std::string()) : std::string();
  if (source == "random") return std::nullopt;
  if (source != "pretrained" || !base.contains("path") || !base.contains("hash"))
    throw FileFormatError(fmt::format("{}: a LoRA checkpoint must record its base model (run.lora.base: "
                                      "{{\"source\": \"pretrained\", \"path\", \"hash\"}} or "
                                      "{{\"source\": \"random\", \"seed\"}}), got {}",
                                      where, base.dump()));
  const std::string path = base.at("path").get<std::string>(), want = base.at("hash").get<std::string>();
  checkpoint::Pretrained src = checkpoint::pretrained_open(path);
  const std::string have = checkpoint::pretrained_hash(src);
  if (have != want)
    throw InputError(fmt::format("{}: its LoRA adapters were trained on the base model in '{}' with hash {}, "
                                 "but that folder now hashes to {}: its weights changed since; restore them, "
                                 "or start a new run with --init",
                                 where, path, want, have));
  return src;
}

template <typename Elem, typename G>
void lora_base_load(const nlohmann::json& base, LlamaStage<Elem, G>& stage, const std::string& where) {
  const std::optional<checkpoint::Pretrained> src = lora_base_open(base, where);
  if (!src) {
    stage.init_weights(base.value("seed", uint64_t{0}), {}, LlamaStage<Elem, G>::InitWhat::frozen);
    return;
  }
  checkpoint::pretrained_check(src->model, stage.model(), src->dir);
  const StageParams& sp = stage.params();
  stage.set_frozen_weights(read_pretrained(*src, sp.frozen, sp.frozen_elements, stage.model().vocab));
}

// The stage types a run trains: CPU fp32, and bf16 with fp32 or bf16 gradients.
#define WEFT_STATE_IO(E, G)                                                                          \
  template void state_save(const std::string&, LlamaStage<E, G>&, Optimizer<E, G>&, const SaveInfo&); \
  template std::unique_ptr<SaveJob> state_gather(const std::string&, LlamaStage<E, G>&, Optimizer<E, G>&,  \
                                                 const SaveInfo&, std::unique_ptr<SaveJob>);               \
  template void state_load<E, G>(const checkpoint::Checkpoint&, LlamaStage<E, G>&, Optimizer<E, G>*); \
  template void state_init(const checkpoint::Pretrained&, LlamaStage<E, G>&, Optimizer<E, G>&);     \
  template void lora_base_load(const nlohmann::json&, LlamaStage<E, G>&, const std::string&);       \
  template void state_lora_init(const checkpoint::PeftAdapter&, LlamaStage<E, G>&, Optimizer<E, G>&);
WEFT_STATE_IO(float, float)
WEFT_STATE_IO(kernels::bf16, float)
WEFT_STATE_IO(kernels::bf16, kernels::bf16)
#undef WEFT_STATE_IO

}  // namespace weft::trainer
