#include "memory/shapes.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"
#include "core/pipeline_schedule.h"
#include "core/units.h"
#include "memory/dense_split.h"
#include "memory/shapes_detail.h"

namespace weft::memory {

using detail::block_param_elements;
using detail::ceil_div;
using detail::Dims;
using detail::dims;
using detail::kFp32;
using detail::kInt32;

const char* to_string(Category c) {
  switch (c) {
    case Category::weights: return "weights";
    case Category::grads: return "grads";
    case Category::optimizer: return "optimizer";
    case Category::activations: return "activations";
    case Category::logits: return "logits";
    case Category::workspace: return "workspace";
    case Category::comm: return "comm";
    case Category::overhead: return "overhead";
  }
  return "?";
}

namespace {

// cuBLASLt workspace weft hands to every GEMM on a GPU (32 MiB is what cuBLAS
// recommends for Hopper, plus 256 bytes to align it; kernels/gemm/gemm.cu);
// CPU GEMMs need none.
constexpr int64_t kGpuGemmWorkspace = 32 * MiB + 256;
// The fixed part of the cudnn attention's workspace bound: what its graphs
// let a cuDNN engine take for itself (kernels/attention/attention_cudnn.h).
constexpr int64_t kCudnnEngineAllowance = 16 * MiB;

// The largest tensor a layout's table holds is mb x seq x (the widest of
// C, F/tp, V/tp, (H + 2 H_kv) D / tp) elements, or the materialized scores
// mb x H/tp x seq x seq; the byte counts of the table and the workspaces
// multiply these by at most 64 (fp32, several buffers, rounding). Sizes a
// 64-bit count cannot hold are bad input, found here once instead of as
// overflow in every product below.
void check_representable(const ModelSpec& m, const RunSpec& run, const Layout& l) {
  using Wide = __int128;
  const Wide widest = std::max<Wide>({m.hidden, m.intermediate, m.padded_vocab(l.tp), Wide(m.heads + 2 * m.kv_heads) * m.head_dim});
  const Wide rows = Wide(l.mb) * run.seq;
  const Wide scores = rows * m.heads * run.seq;
  const Wide limit = Wide(std::numeric_limits<int64_t>::max()) / 64;
  if (rows * widest > limit || scores > limit)
    throw InputError(fmt::format(
        "micro-batch {} x sequence {} makes tensors of more than 2^57 elements ({} x {} x {}{}), past what "
        "64-bit sizes hold; use a shorter --seq or a smaller micro-batch",
        l.mb, run.seq, l.mb, run.seq, int64_t(widest), rows * widest > limit ? "" : " (attention scores)"));
}

// The attention calls of a layout, for their CPU score tiles: the query rows
// and keys of the largest call and how many (batch, kv head) items it has.
// Without context parallelism one call of T against T; the ring calls a
// chunk (T / 2 cp) against a chunk; all-gather a chunk against the keys up to
// its end (at most the whole sequence); all-to-all the whole sequence on
// H_kv / cp kv heads.
struct AttentionCall {
  int64_t rows, keys, kv_heads;
};
AttentionCall attention_call(const Dims& d, const Layout& l) {
  if (d.cp == 1) return {d.T, d.T, d.Kl};
  const int64_t chunk = d.Tfull / (2 * d.cp);
  switch (l.cp_comm) {
    case CpComm::ring: return {chunk, chunk, d.Kl};
    case CpComm::allgather: return {chunk, d.Tfull, d.Kl};
    case CpComm::a2a: return {d.Tfull, d.Tfull, d.Kl / d.cp};
  }
  return {d.T, d.T, d.Kl};
}

// The materialized attention's saved probabilities, elements: (B, H/tp, T, T)
// without context parallelism; with all-gather each of the two chunks
// against its key prefix, c (o + c) for a chunk at o, which sums to
// c^2 (2 cp + 1) on every rank; with all-to-all the whole sequence on
// H / tp / cp heads. (The ring refuses materialized: core/layout.)
int64_t attention_probs(const Dims& d, const Layout& l) {
  if (d.cp == 1) return d.B * d.Hl * d.T * d.T;
  const int64_t chunk = d.Tfull / (2 * d.cp);
  if (l.cp_comm == CpComm::a2a) return d.B * (d.Hl / d.cp) * d.Tfull * d.Tfull;
  return d.B * d.Hl * chunk * chunk * (2 * d.cp + 1);
}

// Elements of a kernel workspace piece: kernels start every piece on a
// 64-byte boundary, so a piece of n elements takes n rounded up to 64 bytes.
int64_t piece(int64_t n, int64_t element_bytes) {
  return ceil_div(n * element_bytes, 64) * 64 / element_bytes;
}

// Saved tensors of a block's norm: the fused kernel keeps its input and the
// per-row 1/rms; the unfused composition also keeps the fp32 normalised x
// for its separate backward ops (which read the input in its own type: no
// fp32 copy of it is kept, in bf16 either).
void norm_saved(const Dims& d, const Layout& l, const char* input, const char* rstd,
                const char* normed, std::vector<TensorShape>& out) {
  out.push_back({input, Category::activations, d.B * d.Tsp * d.C, d.a, 1});
  out.push_back({rstd, Category::activations, d.B * d.Tsp, kFp32, 1});
  if (l.norm == NormKind::unfused)
    out.push_back({normed, Category::activations, d.B * d.Tsp * d.C, kFp32, 1});
}

// On a GPU the kernels run one at a time on the stage's stream and share one
// workspace, as large as the largest of them needs: the scratch() of each
// family's .cu file for this stage's shapes (tests/unit/test_gpu_workspace
// checks every one against it in CUDA builds). Bytes.
int64_t gpu_kernel_scratch(const Dims& d, const Layout& l) {
  auto bytes = [](int64_t n) { return ceil_div(n, 64) * 64; };
  const int64_t rows = d.B * d.T, norm_rows = d.B * d.Tsp;
  int64_t need = 0;
  // attention.cu: flash keeps delta = rowsum(dO * O) and an fp32 dQ; the
  // materialized backward dP, fp32 dK and dV, and its batched-GEMM pointers;
  // cudnn the bound of attention_cudnn.h: the frontend's fp32 row sums and
  // dQ, plus the engine allowance (16 MiB, and fp32 dK and dV at the kv heads
  // or 4 bytes a query head's element, the larger, in the backward, which is
  // the larger direction).
  // Sized for the largest attention call of the layout (context
  // parallelism's calls differ from the rank's T rows; attention_call).
  const AttentionCall call = attention_call(d, l);
  const int64_t heads = d.Hl * call.kv_heads / d.Kl;
  const int64_t q_rows = d.B * call.rows, k_rows = d.B * call.keys;
  const int64_t pointers = bytes(9 * d.B * heads * 8);
  switch (l.attention) {
    case AttentionKind::flash:
      need = bytes(d.B * heads * call.rows * 4) + bytes(q_rows * heads * d.D * 4);
      break;
    case AttentionKind::materialized:
      need = bytes(d.B * heads * call.rows * call.keys * 2) + 2 * bytes(k_rows * call.kv_heads * d.D * 4) + pointers;
      break;
    case AttentionKind::cudnn:
      need = bytes(d.B * heads * call.rows * 4) + bytes(q_rows * heads * d.D * 4) + kCudnnEngineAllowance +
             std::max(2 * bytes(k_rows * call.kv_heads * d.D * 4), bytes(k_rows * heads * d.D * 4));
      // Blocks whose backward accumulates (the ring's dq, dk and dv; the
      // all-gather's dk and dv over its key prefix): the bf16 gradients cuDNN
      // writes before they are added in; and their lse rows packed.
      if (d.cp > 1 && l.cp_comm == CpComm::ring)
        need += bytes(q_rows * heads * d.D * 2) + 2 * bytes(k_rows * call.kv_heads * d.D * 2) +
                bytes(d.B * heads * call.rows * 4);
      else if (d.cp > 1 && l.cp_comm == CpComm::allgather)
        need += 2 * bytes(k_rows * call.kv_heads * d.D * 2) + bytes(d.B * heads * call.rows * 4);
      break;
  }
  // rmsnorm.cu: up to 512 partial dweight rows; the unfused backward adds
  // g (rows, C) and mean(g * x_hat) (rows).
  int64_t norm = bytes(std::min<int64_t>(norm_rows, 512) * d.C * 4);
  if (l.norm == NormKind::unfused) norm += bytes(norm_rows * d.C * 4) + bytes(norm_rows * 4);
  need = std::max(need, norm);
  // embedding.cu: the id check, two key and two value arrays and CUB's sort.
  need = std::max(need, 64 + 4 * bytes(rows * 4) + bytes((int64_t{64} << 10) + 8 * rows));
  // rope.cu: the cos and sin tables.
  need = std::max(need, 2 * bytes(d.T * (d.D / 2) * 4));
  return need;
}

}  // namespace

namespace detail {

Dims dims(const ModelSpec& m, const RunSpec& run, const Layout& l) {
  check_representable(m, run, l);
  const int64_t t = l.tp, T = run.seq / std::max<int64_t>(l.cp, 1);
  return Dims{l.mb,     T,           l.sp ? T / t : T,
              m.hidden, m.heads / t, m.kv_heads / t,
              m.head_dim, m.intermediate / t, m.padded_vocab(t) / t,
              run.compute_bytes(), run.seq, std::max<int64_t>(l.cp, 1)};
}

}  // namespace detail

void check_sizes(const ModelSpec& m, const RunSpec& run, const Layout& l) { check_representable(m, run, l); }

StagePlan stage_plan(const ModelSpec& m, const RunSpec& run, const Layout& l, int64_t stage) {
  StagePlan p;
  p.stage = stage;
  p.layers = l.stage_layers(m, stage);
  p.checkpointed = l.checkpointed_layers(m, stage);
  p.slot_layers = l.max_chunk_layers(m, stage);
  p.slot_checkpointed = l.chunk_checkpointed(m, stage);
  p.in_flight_chunks = pipeline_max_in_flight(l.pp, l.vpp, l.micro_batches(run), stage);
  p.has_embedding = stage == 0;
  p.has_head = stage == l.pp - 1;
  p.lora = run.lora;
  if (!m.moe.enabled()) {
    p.slot_ffn[int(SlotFfn::dense)] = {p.slot_layers, p.slot_checkpointed};
    return p;
  }
  if (m.moe_layers() == m.layers) {  // every layer an MoE one (Mixtral, Scout)
    p.moe_layers = p.layers;
    p.slot_ffn[int(SlotFfn::moe)] = {p.slot_layers, p.slot_checkpointed};
    return p;
  }
  // Each chunk's first model layer and its layers, found once (the planner
  // plans every stage of every candidate).
  std::vector<std::pair<int64_t, int64_t>> chunks(static_cast<size_t>(l.vpp));
  for (int64_t c = 0; c < l.vpp; ++c) {
    chunks[size_t(c)] = {global_layer(m, l, stage, c, 0), l.chunk_layers(m, stage, c)};
    for (int64_t i = 0; i < chunks[size_t(c)].second; ++i)
      p.moe_layers += m.moe_layer(chunks[size_t(c)].first + i) ? 1 : 0;
  }
  for (int64_t i = 0; i < p.slot_layers; ++i) {
    bool dense = false, moe = false;  // slot_ffn's answer, from the chunks above
    for (const auto& [first, n] : chunks)
      if (i < n) {
        const bool here = m.moe_layer(first + i);
        moe = moe || here;
        dense = dense || !here;
      }
    SlotPositions& s = p.slot_ffn[int(dense && moe ? SlotFfn::both : moe ? SlotFfn::moe : SlotFfn::dense)];
    ++s.positions;
    s.checkpointed += i < p.slot_checkpointed ? 1 : 0;
  }
  return p;
}

namespace {

bool lora_frees_act(const RunSpec& run) { return run.lora.enabled() && !run.lora.targets_linear(Linear::down); }

}  // namespace

void block_saved_shapes(const ModelSpec& m, const RunSpec& run, const Layout& l, Checkpointing mode,
                        const Fp8SavedInputs& fp8, std::vector<TensorShape>& out, SlotFfn ffn) {
  const Dims d = dims(m, run, l);
  const bool full = mode == Checkpointing::full;
  const bool dense = ffn != SlotFfn::moe, moe = ffn != SlotFfn::dense;
  // The router's statistics outlive every mode's recompute: the balancing
  // loss of the micro-batch reads every MoE layer's.
  if (moe) out.push_back({"layer.moe.stats", Category::activations, 2 * m.moe.experts, 8, 1});
  // The block input doubles as the attention norm's input; every mode keeps it.
  if (full) {
    out.push_back({"layer.attn_norm.input", Category::activations, d.B * d.Tsp * d.C, d.a, 1});
    return;
  }
  norm_saved(d, l, "layer.attn_norm.input", "layer.attn_norm.rstd", "layer.attn_norm.normed_fp32", out);
  if (fp8.qkv)
    out.push_back({"layer.attn_norm.output_fp8", Category::activations, fp8_saved_bytes(d.B * d.Tsp * d.C), 1, 1});
  else
    out.push_back({"layer.attn_norm.output", Category::activations, d.B * d.Tsp * d.C, d.a, 1});
  // q and k after RoPE, v: the inputs of the attention backward.
  out.push_back({"layer.attn.q", Category::activations, d.B * d.T * d.Hl * d.D, d.a, 1});
  out.push_back({"layer.attn.k", Category::activations, d.B * d.T * d.Kl * d.D, d.a, 1});
  out.push_back({"layer.attn.v", Category::activations, d.B * d.T * d.Kl * d.D, d.a, 1});
  // The norm of each head's queries and keys (Qwen3's before RoPE, Llama
  // 4's L2 norm after it, in its RoPE layers): its inputs and 1/rms per row
  // and head, for its backward.
  if (m.attention.qk_norm != QkNorm::none) {
    out.push_back({"layer.attn.q_raw", Category::activations, d.B * d.T * d.Hl * d.D, d.a, 1});
    out.push_back({"layer.attn.q_rstd", Category::activations, d.B * d.T * d.Hl, kFp32, 1});
    out.push_back({"layer.attn.k_raw", Category::activations, d.B * d.T * d.Kl * d.D, d.a, 1});
    out.push_back({"layer.attn.k_rstd", Category::activations, d.B * d.T * d.Kl, kFp32, 1});
  }
  if (mode != Checkpointing::selective) {
    // The attention output feeds o_proj's weight gradient and the flash
    // backward's rowsum(dO * O); flash keeps the log-sum-exp per row (cudnn
    // too: cuDNN's softmax stats, the same quantity), the materialized
    // variant the T x T probabilities.
    out.push_back({"layer.attn.out", Category::activations, d.B * d.T * d.Hl * d.D, d.a, 1});
    if (l.attention != AttentionKind::materialized)
      out.push_back({"layer.attn.lse", Category::activations, d.B * d.Hl * d.T, kFp32, 1});
    else
      out.push_back({"layer.attn.probs", Category::activations, attention_probs(d, l), d.a, 1});
  }
  if (mode == Checkpointing::ffn) {
    out.push_back({"layer.mlp_norm.input", Category::activations, d.B * d.Tsp * d.C, d.a, 1});
    return;
  }
  norm_saved(d, l, "layer.mlp_norm.input", "layer.mlp_norm.rstd", "layer.mlp_norm.normed_fp32", out);
  if (fp8.gate_up)
    out.push_back({"layer.mlp_norm.output_fp8", Category::activations, fp8_saved_bytes(d.B * d.Tsp * d.C), 1, 1});
  else
    out.push_back({"layer.mlp_norm.output", Category::activations, d.B * d.Tsp * d.C, d.a, 1});
  if (dense) {
    out.push_back({"layer.mlp.gate", Category::activations, d.B * d.T * d.Fl, d.a, 1});
    out.push_back({"layer.mlp.up", Category::activations, d.B * d.T * d.Fl, d.a, 1});
    // The SwiGLU output feeds only down_proj's weight gradient (and its
    // adapters'): a frozen down_proj without adapters (LoRA) needs it in the
    // forward alone, in scratch.mlp_act.
    if (fp8.down)
      out.push_back({"layer.mlp.act_fp8", Category::activations, fp8_saved_bytes(d.B * d.T * d.Fl), 1, 1});
    else if (!lora_frees_act(run))
      out.push_back({"layer.mlp.act", Category::activations, d.B * d.T * d.Fl, d.a, 1});
  }
  if (moe) detail::moe_saved_shapes(m, l, d, out);
}

std::vector<TensorShape> stage_shapes(const ModelSpec& m, const RunSpec& run, const Layout& l,
                                      const DeviceSpec& device, const StagePlan& plan) {
  std::vector<TensorShape> out;
  stage_shapes(m, run, l, device, plan, out);
  return out;
}

namespace {

// The table's first part: weights, gradients and optimizer state.
void state_shapes(const ModelSpec& m, const RunSpec& run, const Layout& l, const StagePlan& plan, const Dims& d,
                  int64_t psi, std::vector<TensorShape>& out) {
  const bool bf16 = run.precision == Precision::bf16;

  // Parameters live in flat buffers so that ZeRO can shard and gather them as
  // one range; ZeRO-1 shards the optimizer state over dp, ZeRO-2 also the
  // gradients, ZeRO-3 also the weights. In bf16 the weights are the bf16
  // compute copy and the optimizer keeps an fp32 master; in fp32 the weights
  // are the master.
  const int64_t ways = l.zero_shards();  // dp x cp, or the hybrid shard group
  const int64_t shard = ceil_div(psi, ways);
  out.push_back({"weights.flat", Category::weights, l.zero >= 3 ? shard : psi, d.a, 1});
  // LoRA: the base model's weights, frozen, in the compute type (bf16 on a
  // GPU: no fp32 master, no gradient, no optimizer state), whole on every
  // dp rank; only the adapters above are sharded.
  const bool lora = plan.lora.enabled();
  if (lora) out.push_back({"weights.frozen", Category::weights, stage_frozen_elements(m, l, plan), d.a, 1});
  // Gradients (and every buffer they are reduced through) are fp32 or, with
  // grad:bf16, bf16: 2 + 2 + 12 / dp bytes per parameter under ZeRO-1.
  const int64_t g = l.grad_bytes();
  out.push_back({"grads.flat", Category::grads, l.zero >= 2 ? shard : psi, g, 1});
  // Under expert parallelism the ep replicas of a shard also split its dense
  // elements' state (dense_split.h): every rank keeps the most any keeps.
  const int64_t opt = dense_split(l) ? dense_split_state_elements(m, l, plan, psi) : l.zero >= 1 ? shard : psi;
  if (bf16) out.push_back({"optimizer.master", Category::optimizer, opt, kFp32, 1});
  out.push_back({"optimizer.adam_m", Category::optimizer, opt, kFp32, 1});
  out.push_back({"optimizer.adam_v", Category::optimizer, opt, kFp32, 1});

}

// The rest: activations, logits, scratch, the kernels', FP8's and the
// collectives' buffers, the runtime.
void other_shapes(const ModelSpec& m, const RunSpec& run, const Layout& l, const DeviceSpec& device,
                  const StagePlan& plan, const Dims& d, int64_t psi, std::vector<TensorShape>& out) {
  const bool lora = plan.lora.enabled();
  // Saved activations: a slot per chunk-micro-batch in flight, each for the
  // stage's largest chunk (layers / vpp blocks of an even split); with ckpt@K
  // the first K / vpp blocks of each chunk use the mode. A slot position
  // keeps its FFN's tensors: a dense block's, an MoE block's, or either's
  // (SlotFfn), so a tensor's count sums over the kinds of position whose
  // lists hold it.
  const int64_t chunks = plan.in_flight_chunks;
  const Fp8SavedInputs fp8 = fp8_saved_inputs(m, run, l, plan);
  struct Saved {
    TensorShape shape;
    int64_t layers = 0;     // slot positions keeping it
    bool rebuilt = false;   // a checkpointed position rebuilds it
  };
  thread_local std::vector<Saved> saved;
  thread_local std::vector<TensorShape> kept, ckpt;
  saved.clear();
  const int kinds = int(std::count_if(plan.slot_ffn.begin(), plan.slot_ffn.end(),
                                      [](const SlotPositions& p) { return p.positions > 0; }));
  for (int kind = 0; kind < 3; ++kind) {
    const SlotPositions& pos = plan.slot_ffn[size_t(kind)];
    if (pos.positions == 0) continue;
    const int64_t n_ckpt = pos.checkpointed, n_keep = pos.positions - n_ckpt;
    kept.clear();
    ckpt.clear();
    block_saved_shapes(m, run, l, Checkpointing::none, fp8, kept, SlotFfn(kind));
    if (n_ckpt > 0) block_saved_shapes(m, run, l, l.ckpt, fp8, ckpt, SlotFfn(kind));
    // What a checkpointing mode keeps is a subsequence of what no
    // checkpointing keeps, in the same order (block_saved_shapes), so one
    // walk over both tells which of the kept tensors the mode keeps too.
    size_t next_ckpt = 0;
    for (const auto& t : kept) {
      const bool in_ckpt = next_ckpt < ckpt.size() && std::strcmp(ckpt[next_ckpt].name, t.name) == 0;
      if (in_ckpt) ++next_ckpt;
      // (One kind of position, a dense model's: every name is new.)
      auto it = kinds == 1 ? saved.end()
                           : std::find_if(saved.begin(), saved.end(),
                                          [&](const Saved& x) { return std::strcmp(x.shape.name, t.name) == 0; });
      if (it == saved.end()) it = saved.insert(saved.end(), Saved{t});
      it->layers += n_keep + (in_ckpt ? n_ckpt : 0);
      // One block's dropped tensors are rebuilt at a time during the
      // backward (an FP8 input is rebuilt in the compute type, into its
      // scratch below).
      it->rebuilt = it->rebuilt || (n_ckpt > 0 && !in_ckpt && !(fp8.any() && fp8_saved_name(t.name)));
    }
    WEFT_ASSERT(next_ckpt == ckpt.size());
  }
  for (const auto& x : saved) {
    const int64_t count = chunks * x.layers + (x.rebuilt ? 1 : 0);
    if (count > 0) out.push_back({x.shape.name, x.shape.category, x.shape.elements, x.shape.element_bytes, count});
  }
  if (plan.has_embedding)
    out.push_back({"embedding.tokens", Category::activations, d.B * d.T, kInt32, chunks});

  if (plan.has_head) {
    // The last virtual stage runs each micro-batch's backward right after its
    // forward (pipeline_schedule), so one micro-batch of head state is live.
    norm_saved(d, l, "final_norm.input", "final_norm.rstd", "final_norm.normed_fp32", out);
    out.push_back({"final_norm.output", Category::activations, d.B * d.Tsp * d.C, d.a, 1});
    // Vocab-parallel loss: the logits of this rank's vocab shard in the
    // compute type (the loss reads them in fp32 and never stores an fp32
    // copy), overwritten in place by their gradient; per-token max and
    // sum-exp for the reduction over tp; the loss per token and the targets.
    // On a GPU the per-token losses of a step's micro-batches add up on the
    // device, read once per step.
    out.push_back({"head.logits", Category::logits, d.B * d.T * d.Vl, d.a, 1});
    out.push_back({"loss.row_max", Category::logits, d.B * d.T, kFp32, 1});
    out.push_back({"loss.row_sumexp", Category::logits, d.B * d.T, kFp32, 1});
    out.push_back({"loss.per_token", Category::logits, d.B * d.T, kFp32, 1});
    out.push_back({"loss.targets", Category::logits, d.B * d.T, kInt32, 1});
    if (device.kind == DeviceKind::gpu)
      out.push_back({"loss.step_sum", Category::logits, d.B * d.T, kFp32, 1});
  }

  // LoRA: a targeted layer's h = drop(x) A^T and the gradient g = s dY B
  // (rows, r), and with dropout the dropped input drop(x) (rows, the widest
  // targeted K); the backward rebuilds h and drop(x) from the input every
  // linear layer saves anyway (B x T x r x 2 flops per element of A: an r-th
  // of the base GEMM's), so LoRA saves no activations of its own.
  if (lora) {
    out.push_back({"scratch.lora", Category::workspace, d.B * d.T * plan.lora.rank, d.a, 2});
    if (plan.lora.dropout > 0) {
      int64_t widest = 0;
      for (int i = 0; i < kLinears; ++i)
        if (plan.lora.targets_linear(Linear(i))) widest = std::max(widest, linear_shape(m, l, Linear(i)).K);
      out.push_back({"scratch.lora_dropped", Category::workspace, d.B * d.T * widest, d.a, 1});
    }
  }

  // Scratch of one block's forward and backward, reused by every block.
  out.push_back({"scratch.d_residual", Category::workspace, d.B * d.Tsp * d.C, d.a, 1});
  out.push_back({"scratch.d_norm", Category::workspace, d.B * d.T * d.C, d.a, 1});
  out.push_back({"scratch.linear_out", Category::workspace, d.B * d.T * d.C, d.a, 1});
  out.push_back({"scratch.d_qkv", Category::workspace, d.B * d.T * (d.Hl + 2 * d.Kl) * d.D, d.a, 1});
  out.push_back({"scratch.d_attn_out", Category::workspace, d.B * d.T * d.Hl * d.D, d.a, 1});
  // The dense FFN's (and the shared expert's) gradients of SwiGLU's output
  // and inputs.
  const bool dense_ffn = plan.layers > plan.moe_layers;
  const int64_t shared_width = plan.moe_layers > 0 ? m.moe.shared_intermediate / l.tp : 0;
  const int64_t ffn_width = std::max(dense_ffn ? d.Fl : 0, shared_width);
  if (ffn_width > 0) out.push_back({"scratch.d_mlp", Category::workspace, d.B * d.T * ffn_width, d.a, 3});
  if (plan.moe_layers > 0) detail::moe_scratch_shapes(m, l, plan.lora, d, out);
  // Llama 4's L2 norm of queries and keys: the RMSNorm kernel with a weight
  // of ones.
  if (m.attention.qk_norm == QkNorm::l2) out.push_back({"scratch.qk_ones", Category::workspace, d.D, d.a, 1});
  // The compute-type copies of the GEMM inputs kept in FP8: each block's
  // forward writes one here before quantising it, and a block rebuilding it
  // in its backward too.
  if (fp8.qkv) out.push_back({"scratch.attn_norm_out", Category::workspace, d.B * d.Tsp * d.C, d.a, 1});
  if (fp8.gate_up) out.push_back({"scratch.mlp_norm_out", Category::workspace, d.B * d.Tsp * d.C, d.a, 1});
  if (lora_frees_act(run) || fp8.down)
    out.push_back({"scratch.mlp_act", Category::workspace, d.B * d.T * d.Fl, d.a, 1});
  // Kernel workspaces (their workspace_bytes; the trainer checks they fit).
  if (device.kind == DeviceKind::cpu) {
    // Attention's forward and backward share fp32 score tiles
    // (kernels/attention/attention_cpu.cpp): per (batch, kv head), tiles of
    // (min(32, T) x T), one 64-byte piece each; flash takes 1 forward and 2
    // backward (P, dP), materialized none forward (its scores go into the
    // saved probs) and 1 backward (dP). In elements rounded to 16, a double
    // run's 8-byte tiles fit too. (cudnn never runs on a CPU; sized as flash.)
    const int64_t tiles = l.attention == AttentionKind::materialized ? 1 : 2;
    const AttentionCall call = attention_call(d, l);
    const int64_t tile = piece(std::min<int64_t>(32, call.rows) * call.keys, kFp32);
    out.push_back({"scratch.attn_tiles", Category::workspace, d.B * call.kv_heads * tiles * tile, kFp32, 1});
    if (l.norm == NormKind::unfused)  // g = dy * w and mean(g * x_hat) of the unfused backward
      out.push_back({"scratch.norm_unfused", Category::workspace,
                     piece(d.B * d.Tsp * d.C, kFp32) + piece(d.B * d.Tsp, kFp32), kFp32, 1});
    // RoPE's cos and sin tables, (T, D/2) each.
    out.push_back({"scratch.rope_table", Category::workspace, 2 * piece(d.T * (d.D / 2), kFp32), kFp32, 1});
    // The permute's running count per expert (kernels/moe/moe_cpu.cpp).
    if (plan.moe_layers > 0)
      out.push_back({"scratch.moe_kernels", Category::workspace, ceil_div(m.moe.experts * 8, 64) * 64, 1, 1});
  } else {
    int64_t kernels = gpu_kernel_scratch(d, l);
    if (plan.moe_layers > 0) {
      // moe.cu's permute: each chunk of 1,024 choices' counts per expert
      // (int32), and the experts' totals (int64), each piece 64-byte aligned.
      const int64_t E = m.moe.experts, choices = detail::routed_token_rows(l, d) * m.moe.top_k;
      kernels = std::max(kernels, ceil_div(4 * E * ceil_div(choices, 1024), 64) * 64 + ceil_div(8 * E, 64) * 64);
    }
    out.push_back({"scratch.kernels", Category::workspace, kernels, 1, 1});
  }
  // The gradient norm's per-chunk partial sums (one double per 2^14
  // elements, kernels/elementwise's kSumChunk), added in a fixed order.
  out.push_back({"scratch.grad_norm", Category::workspace, piece(ceil_div(psi, int64_t{1} << 14), 8), 8, 1});
  // On a GPU the three sums (tp-sharded, tp-replicated parameters, and the
  // routed experts' under ep) stay on the device.
  if (device.kind == DeviceKind::gpu) out.push_back({"scratch.grad_norm_sum", Category::workspace, 3, 8, 1});
  if (device.kind == DeviceKind::gpu) {
    // An MoE block's grouped GEMMs (kernels/gemm/gemm.h) also stage three
    // device pointer arrays there, each 256-byte aligned, for at most 2 E
    // entries (the gate's and the up's of each expert's run of rows), 2 E tp
    // under an expert tp degree with sp (a run from each tp rank).
    const int64_t runs = m.moe.experts * (l.sp && l.etp > 1 ? l.tp : 1);
    const int64_t grouped = plan.moe_layers > 0 ? 3 * ceil_div(2 * runs * 8, 256) * 256 : 0;
    out.push_back({"scratch.gemm", Category::workspace, kGpuGemmWorkspace + grouped, 1, 1});
  }

  fp8_buffer_shapes(m, run, l, device, plan, d, out);
  comm_buffer_shapes(m, l, plan, d, out);

  if (device.runtime_overhead_bytes > 0)
    out.push_back({"runtime", Category::overhead, device.runtime_overhead_bytes, 1, 1});
  // NCCL's own buffers and handles on a GPU of several ranks, outside the
  // arena: stated, not measured (no multi-GPU run has been measured yet).
  // Ranks that share a GPU run no NCCL: their tensors are staged through
  // pinned host memory (host_staging_bytes), which is not the device's.
  if (device.kind == DeviceKind::gpu && l.world() > 1 && device.shared_by == 1)
    out.push_back({"runtime.nccl", Category::overhead, kNcclRuntimeBytes, 1, 1});
}

}  // namespace

void stage_shapes(const ModelSpec& m, const RunSpec& run, const Layout& l, const DeviceSpec& device,
                  const StagePlan& plan, std::vector<TensorShape>& out) {
  out.clear();
  out.reserve(48);
  const Dims d = dims(m, run, l);
  const int64_t psi = stage_param_elements(m, l, plan);
  state_shapes(m, run, l, plan, d, psi, out);
  other_shapes(m, run, l, device, plan, d, psi, out);
}

void stage_other_shapes(const ModelSpec& m, const RunSpec& run, const Layout& l, const DeviceSpec& device,
                        const StagePlan& plan, std::vector<TensorShape>& out) {
  out.clear();
  out.reserve(48);
  other_shapes(m, run, l, device, plan, dims(m, run, l), stage_param_elements(m, l, plan), out);
}

int64_t stage_state_bytes(const ModelSpec& m, const RunSpec& run, const Layout& l, const DeviceSpec& device,
                          const StagePlan& plan) {
  thread_local std::vector<TensorShape> part;
  part.clear();
  const Dims d = dims(m, run, l);
  const int64_t psi = stage_param_elements(m, l, plan);
  state_shapes(m, run, l, plan, d, psi, part);
  // FP8's weight copies and scaling state are the only weights, gradients
  // or optimizer state past the first part (MemoryBounds.StateBytesAreTheTables
  // holds the two equal over layouts of every kind).
  if (l.fp8 != Fp8Recipe::off) fp8_buffer_shapes(m, run, l, device, plan, d, part);
  int64_t sum = 0;
  for (const auto& t : part)
    if (t.category == Category::weights || t.category == Category::grads || t.category == Category::optimizer)
      sum += t.bytes();
  return sum;
}

std::array<int64_t, kCategories> sum_by_category(const std::vector<TensorShape>& shapes) {
  std::array<int64_t, kCategories> sum{};
  for (const auto& t : shapes) sum[static_cast<int>(t.category)] += t.bytes();
  return sum;
}

}  // namespace weft::memory
