// The GPU shape table's shared kernel workspace (memory/shapes.cpp,
// scratch.kernels) against what each CUDA kernel family asks for, on the
// shapes the trainer launches, for several layouts. workspace_bytes only
// reads the params, so this runs in CUDA builds without a GPU; the pointers
// are placeholders that are never dereferenced.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/device_spec.h"
#include "core/model_spec.h"
#include "kernels/attention/attention.h"
#include "kernels/cross_entropy/cross_entropy.h"
#include "kernels/embedding/embedding.h"
#include "kernels/gemm/gemm.h"
#include "kernels/moe/moe.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "memory/shapes.h"

namespace weft {
namespace {

using kernels::Backend;
using kernels::bf16;

int64_t table_bytes(const std::vector<memory::TensorShape>& shapes, const std::string& name) {
  for (const auto& t : shapes)
    if (name == t.name) return t.elements * t.element_bytes;
  return 0;
}

class GpuWorkspace : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuWorkspace, EveryKernelFitsTheTable) {
  const ModelSpec m = model_preset("llama3.2-1b");
  const RunSpec run{2048, 16, Precision::bf16};
  const Layout l = Layout::parse(GetParam());
  const DeviceSpec dev = device_preset("h100");
  const auto shapes = memory::stage_shapes(m, run, l, dev, memory::stage_plan(m, run, l, 0));
  const int64_t have = table_bytes(shapes, "scratch.kernels");
  ASSERT_GT(have, 0);
  // Placeholders, 256-byte aligned as the arena's are.
  auto* e = reinterpret_cast<bf16*>(uintptr_t{1} << 20);
  auto* f = reinterpret_cast<float*>(uintptr_t{2} << 20);
  auto* ids = reinterpret_cast<int32_t*>(uintptr_t{3} << 20);
  const int64_t B = l.mb, T = run.seq, C = m.hidden, D = m.head_dim, H = m.heads / l.tp,
                K = m.kv_heads / l.tp, V = m.vocab / l.tp, rows = B * T, norm_rows = l.sp ? rows / l.tp : rows;
  auto fits = [&](int64_t need, const char* op) {
    EXPECT_GT(need, 0) << op << ": the CUDA backend refused the params";
    EXPECT_LE(need, have) << op;
  };
  const bool mat = l.attention == AttentionKind::materialized;
  const kernels::AttentionBackwardParams<bf16> ab{.kind = l.attention, .B = B, .T = T, .H = H, .H_kv = K,
                                                  .D = D, .q = e, .k = e, .v = e, .out = e,
                                                  .lse = mat ? nullptr : f, .probs = mat ? e : nullptr,
                                                  .dout = e, .dq = e, .dk = e, .dv = e};
  const kernels::AttentionForwardParams<bf16> af{.kind = l.attention, .B = B, .T = T, .H = H, .H_kv = K,
                                                 .D = D, .q = e, .k = e, .v = e, .out = e,
                                                 .lse = mat ? nullptr : f, .probs = mat ? e : nullptr};
  // A CUDA build without the cuDNN frontend has no cudnn kind to size (the
  // memory model still covers it).
  if (kernels::attention_available(l.attention, Backend::cuda)) {
    fits(kernels::workspace_bytes(ab, Backend::cuda), "attention backward");
    // Flash's forward needs no workspace; the others do.
    if (l.attention != AttentionKind::flash) fits(kernels::workspace_bytes(af, Backend::cuda), "attention forward");
  } else {
    EXPECT_EQ(l.attention, AttentionKind::cudnn);
  }
  // The kernels that write gradients, in the layout's gradient type (the
  // <bf16, bf16> forms under grad:bf16).
  auto gradient_kernels_fit = [&]<typename G>(G* g) {
    if (l.norm == NormKind::fused) {
      const kernels::RmsnormBackwardParams<bf16, G> rb{.rows = norm_rows, .C = C, .x = e, .weight = e,
                                                       .rstd = f, .dy = e, .dx = e, .dweight = g};
      fits(kernels::workspace_bytes(rb, Backend::cuda), "rmsnorm backward");
    } else {
      const kernels::RmsnormUnfusedBackwardParams<bf16, G> rb{.rows = norm_rows, .C = C, .x_hat = f,
                                                              .rstd = f, .weight = e, .dy = e, .dx = e,
                                                              .dweight = g};
      fits(kernels::workspace_bytes(rb, Backend::cuda), "rmsnorm unfused backward");
    }
    const kernels::EmbeddingBackwardParams<bf16, G> eb{.rows = rows, .C = C, .V = m.vocab, .vocab_start = 0,
                                                       .V_local = V, .tokens = ids, .dout = e, .dtable = g};
    fits(kernels::workspace_bytes(eb, Backend::cuda), "embedding backward");
    // GEMMs take the cuBLASLt workspace, scratch.gemm.
    const auto wgrad = kernels::linear_wgrad_gemm(rows, C, m.intermediate / l.tp, e, e, g);
    const int64_t need = kernels::workspace_bytes(wgrad, Backend::cuda);
    EXPECT_GT(need, 0);
    EXPECT_LE(need, table_bytes(shapes, "scratch.gemm"));
  };
  if (l.grad == GradPrecision::bf16)
    gradient_kernels_fit(e);
  else
    gradient_kernels_fit(f);
  const kernels::RopeParams<bf16> rope{.B = B, .T = T, .H = H, .H_kv = K, .D = D, .q = e, .k = e};
  fits(kernels::workspace_bytes(rope, Backend::cuda), "rope");
  const kernels::CrossEntropyLossGradParams<bf16> ce{.rows = rows, .V = m.vocab, .V_local = V, .logits = e,
                                                     .targets = ids, .row_max = f, .sum_exp = f, .loss = f};
  fits(kernels::workspace_bytes(ce, Backend::cuda), "cross entropy");
}

// An MoE model's permute and its experts' grouped GEMMs fit too: on
// Qwen3-30B-A3B (128 experts, top-8), and on a narrow model with so many
// experts and choices that the permute's counts are the largest workspace
// of the stage.
TEST(GpuWorkspaceMoe, PermuteFitsTheTable) {
  ModelSpec many = model_preset("tiny-moe");
  many.moe.experts = 8192;  // the permute takes at most 12,288
  many.moe.top_k = 32;
  for (const auto& [m, seq] :
       {std::pair{model_preset("qwen3-30b-a3b"), int64_t{4096}}, std::pair{many, int64_t{8192}}}) {
    const RunSpec run{seq, 16, Precision::bf16};
    const DeviceSpec dev = device_preset("h100");
    for (const char* text : {"tp1-pp1-dp1-mb1", "tp2-pp1-dp1-mb2-sp", "tp2-pp1-dp1-mb2-sp-etp2"}) {
      const Layout l = Layout::parse(text);
      const auto shapes = memory::stage_shapes(m, run, l, dev, memory::stage_plan(m, run, l, 0));
      auto* e = reinterpret_cast<bf16*>(uintptr_t{1} << 20);
      auto* f = reinterpret_cast<float*>(uintptr_t{2} << 20);
      // (every rank routes its own rows)
      const int64_t rows = l.mb * run.seq / (l.sp ? l.tp : 1);
      const kernels::MoePermuteParams<bf16> p{.rows = rows, .C = m.hidden, .experts = m.moe.experts,
                                              .top_k = m.moe.top_k, .expert_of = reinterpret_cast<int32_t*>(f),
                                              .weights = f, .x = e, .out = e,
                                              .offsets = reinterpret_cast<int64_t*>(f),
                                              .position = reinterpret_cast<int64_t*>(f)};
      const int64_t need = kernels::workspace_bytes(p, Backend::cuda);
      EXPECT_GT(need, 0) << text;
      EXPECT_LE(need, table_bytes(shapes, "scratch.kernels")) << m.name << " " << text;
      // The experts' grouped GEMMs: at most two entries per expert (the
      // gate's and the up's of each run of rows), from each tp rank under
      // an expert tp degree with sp, in scratch.gemm.
      const std::vector<kernels::GemmParams<bf16>> gemms(
          size_t(2 * m.moe.experts * (l.sp && l.etp > 1 ? l.tp : 1)),
          kernels::linear_forward_gemm<bf16>(1, m.hidden, 16, e, e, e));
      const int64_t grouped = kernels::workspace_bytes(
          kernels::GroupedGemmParams<bf16>{.gemms = gemms.data(), .count = int64_t(gemms.size())}, Backend::cuda);
      EXPECT_GT(grouped, 0) << text;
      EXPECT_LE(grouped, table_bytes(shapes, "scratch.gemm")) << m.name << " " << text;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, GpuWorkspace,
                         ::testing::Values("tp1-pp1-dp1-mb1", "tp1-pp1-dp1-mb4-attn:materialized",
                                           "tp1-pp1-dp1-mb2-norm:unfused", "tp2-pp1-dp1-mb1-sp",
                                           "tp1-pp1-dp1-mb1-ckpt:full-attn:materialized-norm:unfused",
                                           "tp1-pp1-dp1-mb4-attn:cudnn", "tp2-pp1-dp1-mb1-sp-attn:cudnn",
                                           "tp1-pp1-dp1-mb1-grad:bf16", "tp2-pp1-dp1-mb2-sp-norm:unfused-grad:bf16"));

// Under context parallelism the attention calls are the transport's
// (trainer/model/llama_context.cpp): the ring's chunk blocks, diagonal and
// fully visible, accumulating their gradients; the all-gather's query chunk
// against its key prefix (the longest: the whole sequence), accumulating dK
// and dV; all-to-all's whole sequence on H / cp heads. Each fits the table.
TEST(GpuWorkspaceCp, EveryAttentionCallFitsTheTable) {
  const ModelSpec m = model_preset("llama3.2-1b");
  const RunSpec run{2048, 16, Precision::bf16};
  auto* e = reinterpret_cast<bf16*>(uintptr_t{1} << 20);
  auto* f = reinterpret_cast<float*>(uintptr_t{2} << 20);
  for (const char* text : {"tp1-cp2-pp1-dp1-mb1-attn:cudnn-cp:ring", "tp1-cp4-pp1-dp1-mb2-attn:cudnn-cp:allgather",
                           "tp1-cp2-pp1-dp1-mb1-attn:cudnn-cp:a2a", "tp2-cp2-pp1-dp1-mb1-sp-attn:cudnn-cp:ring",
                           "tp1-cp2-pp1-dp1-mb1-attn:flash-cp:ring", "tp1-cp4-pp1-dp1-mb1-attn:flash-cp:allgather",
                           "tp1-cp2-pp1-dp1-mb1-attn:materialized-cp:a2a"}) {
    SCOPED_TRACE(text);
    const Layout l = Layout::parse(text);
    if (!kernels::attention_available(l.attention, Backend::cuda)) continue;
    const auto shapes = memory::stage_shapes(m, run, l, device_preset("h100"), memory::stage_plan(m, run, l, 0));
    const int64_t have = table_bytes(shapes, "scratch.kernels");
    const int64_t B = l.mb, Tf = run.seq, cp = l.cp, c = Tf / (2 * cp), Tl = 2 * c, D = m.head_dim;
    const int64_t H = m.heads / l.tp, K = m.kv_heads / l.tp;
    const bool mat = l.attention == AttentionKind::materialized;
    struct Call {
      int64_t T, Tk, qo, ko, q_rows, kv_rows, heads, kv_heads;
      kernels::Write dq, dkv;
    };
    std::vector<Call> calls;
    using kernels::Write;
    switch (l.cp_comm) {
      case CpComm::ring:
        calls.push_back({c, c, 3 * c, 3 * c, Tl, Tl, H, K, Write::accumulate, Write::accumulate});
        calls.push_back({c, c, 3 * c, 0, Tl, Tl, H, K, Write::accumulate, Write::accumulate});
        break;
      case CpComm::allgather:
        calls.push_back({c, Tf, Tf - c, 0, Tl, Tf, H, K, Write::overwrite, Write::accumulate});
        calls.push_back({c, c, 0, 0, Tl, Tf, H, K, Write::overwrite, Write::accumulate});
        break;
      case CpComm::a2a:
        calls.push_back({Tf, Tf, 0, 0, 0, 0, H / cp, K / cp, Write::overwrite, Write::overwrite});
        break;
    }
    for (const Call& k : calls) {
      const kernels::AttentionBackwardParams<bf16> ab{
          .kind = l.attention, .B = B, .T = k.T, .H = k.heads, .H_kv = k.kv_heads, .D = D, .q = e, .k = e, .v = e,
          .out = e, .lse = mat ? nullptr : f, .probs = mat ? e : nullptr, .dout = e, .dq = e, .dk = e, .dv = e,
          .Tk = k.Tk, .q_offset = k.qo, .k_offset = k.ko, .q_batch_rows = k.q_rows, .kv_batch_rows = k.kv_rows,
          .lse_batch_rows = k.q_rows, .dq_write = k.dq, .dkv_write = k.dkv};
      ASSERT_TRUE(kernels::supports(ab, Backend::cuda)) << "T " << k.T << " Tk " << k.Tk << " at " << k.qo;
      const int64_t need = kernels::workspace_bytes(ab, Backend::cuda);
      EXPECT_GT(need, 0);
      EXPECT_LE(need, have) << "T " << k.T << " Tk " << k.Tk;
      const kernels::AttentionForwardParams<bf16> af{
          .kind = l.attention, .B = B, .T = k.T, .H = k.heads, .H_kv = k.kv_heads, .D = D, .q = e, .k = e,
          .v = e, .out = e, .lse = mat ? nullptr : f, .probs = mat ? e : nullptr, .Tk = k.Tk, .q_offset = k.qo,
          .k_offset = k.ko, .q_batch_rows = k.q_rows, .kv_batch_rows = k.kv_rows, .lse_batch_rows = k.q_rows};
      ASSERT_TRUE(kernels::supports(af, Backend::cuda));
      EXPECT_LE(kernels::workspace_bytes(af, Backend::cuda), have);
    }
  }
}

}  // namespace
}  // namespace weft
