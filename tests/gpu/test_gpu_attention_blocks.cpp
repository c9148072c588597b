// attention on CUDA over blocks of the sequence (context parallelism; flash
// every block, cudnn those causal to their end and the fully visible ones):
// each kind of block against the CPU at fp64 on that block, and the ring's
// blocks, merged and accumulated, against whole-sequence attention.
// The tolerance rule is test_gpu_attention.cpp's, stated at its top.
#include "tests/gpu/attention_gpu_util.h"

namespace weft::kernels::test {
namespace {

// Context parallelism calls flash on blocks: T queries at q_offset against Tk
// keys at k_offset, inside larger tensors (batch row strides), the backward
// adding into dq, dk and dv. The blocks below live in the whole (B, T, ...)
// tensors of a case, at their positions, so B > 1 exercises the strides.

// One block, in sequence positions: queries [qo, qo + tq), keys [ko, ko + tk).
struct SeqBlock {
  const char* name;
  int64_t qo, tq, ko, tk;
};

// Whether every row of (values, ref) that ref holds -inf holds -inf too, and
// the rest as a vector each, for the rule's norms.
struct FiniteSplit {
  int64_t mismatched_inf = 0;
  std::vector<float> got;
  std::vector<double> ref;
};
FiniteSplit split_inf(const std::vector<float>& got, const std::vector<double>& ref) {
  FiniteSplit s;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i]) || std::isinf(got[i])) {
      s.mismatched_inf += !(ref[i] == -INFINITY && got[i] == -INFINITY);
    } else {
      s.got.push_back(got[i]);
      s.ref.push_back(ref[i]);
    }
  }
  return s;
}

// The block's results: forward out and lse (B, H, T of the case, only the
// block's rows written), backward dq, dk, dv (whole-tensor sized, the
// block's rows only).
template <typename R>
struct BlockResult {
  std::vector<R> out, lse, dq, dk, dv;
};

// The CPU at fp64 on one block of the case's (rounded) inputs: the oracle.
// The backward takes the block's own out and lse, which is what a block's
// gradient is given only that block's keys.
BlockResult<double> cpu_block(const AttentionCase& c, const SeqBlock& s, const Inputs& in) {
  const AttentionIndex at{c};
  std::vector<double> q(in.q.begin(), in.q.end()), k(in.k.begin(), in.k.end()), v(in.v.begin(), in.v.end());
  std::vector<double> dout(in.dout.begin(), in.dout.end());
  BlockResult<double> r;
  r.out.assign(q.size(), 0);
  r.lse.assign(c.B * c.H * c.T, 0);
  r.dq.assign(q.size(), 0);
  r.dk.assign(k.size(), 0);
  r.dv.assign(v.size(), 0);
  run_or_throw(AttentionForwardParams<double>{
      .kind = AttentionKind::flash, .B = c.B, .T = s.tq, .H = c.H, .H_kv = c.H_kv, .D = c.D,
      .q = q.data() + at.q(0, s.qo, 0), .k = k.data() + at.kv(0, s.ko, 0), .v = v.data() + at.kv(0, s.ko, 0),
      .out = r.out.data() + at.q(0, s.qo, 0), .lse = r.lse.data() + s.qo, .Tk = s.tk, .q_offset = s.qo,
      .k_offset = s.ko, .q_batch_rows = c.T, .kv_batch_rows = c.T, .lse_batch_rows = c.T});
  run_or_throw(AttentionBackwardParams<double>{
      .kind = AttentionKind::flash, .B = c.B, .T = s.tq, .H = c.H, .H_kv = c.H_kv, .D = c.D,
      .q = q.data() + at.q(0, s.qo, 0), .k = k.data() + at.kv(0, s.ko, 0), .v = v.data() + at.kv(0, s.ko, 0),
      .out = r.out.data() + at.q(0, s.qo, 0), .lse = r.lse.data() + s.qo,
      .dout = dout.data() + at.q(0, s.qo, 0), .dq = r.dq.data() + at.q(0, s.qo, 0),
      .dk = r.dk.data() + at.kv(0, s.ko, 0), .dv = r.dv.data() + at.kv(0, s.ko, 0), .Tk = s.tk,
      .q_offset = s.qo, .k_offset = s.ko, .q_batch_rows = c.T, .kv_batch_rows = c.T, .lse_batch_rows = c.T});
  return r;
}

// The rows of a whole (B, T, heads, D) tensor, or (B, H, T) lse, that a block
// covers, as one vector, for comparisons that leave the rest out.
template <typename V>
V rows_of(const V& x, int64_t B, int64_t T, int64_t width, int64_t t0, int64_t n) {
  V r;
  for (int64_t b = 0; b < B; ++b)
    r.insert(r.end(), x.begin() + (b * T + t0) * width, x.begin() + (b * T + t0 + n) * width);
  return r;
}

struct BlockDevice {
  DeviceBuffer out, lse, dq, dk, dv, ws;
};

AttentionForwardParams<bf16> block_forward(const AttentionCase& c, const SeqBlock& s, const DeviceInputs& in,
                                           bf16* out, float* lse, AttentionKind kind = AttentionKind::flash) {
  const AttentionIndex at{c};
  return {.kind = kind, .B = c.B, .T = s.tq, .H = c.H, .H_kv = c.H_kv, .D = c.D,
          .q = in.q.as<bf16>() + at.q(0, s.qo, 0), .k = in.k.as<bf16>() + at.kv(0, s.ko, 0),
          .v = in.v.as<bf16>() + at.kv(0, s.ko, 0), .out = out + at.q(0, s.qo, 0), .lse = lse + s.qo,
          .Tk = s.tk, .q_offset = s.qo, .k_offset = s.ko, .q_batch_rows = c.T, .kv_batch_rows = c.T,
          .lse_batch_rows = c.T};
}

AttentionBackwardParams<bf16> block_backward(const AttentionCase& c, const SeqBlock& s, const DeviceInputs& in,
                                             const bf16* out, const float* lse, bf16* dq, bf16* dk, bf16* dv,
                                             Write write, AttentionKind kind = AttentionKind::flash) {
  const AttentionIndex at{c};
  return {.kind = kind, .B = c.B, .T = s.tq, .H = c.H, .H_kv = c.H_kv, .D = c.D,
          .q = in.q.as<bf16>() + at.q(0, s.qo, 0), .k = in.k.as<bf16>() + at.kv(0, s.ko, 0),
          .v = in.v.as<bf16>() + at.kv(0, s.ko, 0), .out = out + at.q(0, s.qo, 0), .lse = lse + s.qo,
          .dout = in.dout.as<bf16>() + at.q(0, s.qo, 0), .dq = dq + at.q(0, s.qo, 0),
          .dk = dk + at.kv(0, s.ko, 0), .dv = dv + at.kv(0, s.ko, 0), .Tk = s.tk, .q_offset = s.qo,
          .k_offset = s.ko, .q_batch_rows = c.T, .kv_batch_rows = c.T, .lse_batch_rows = c.T,
          .dq_write = write, .dkv_write = write};
}

template <typename P>
void launch_on_gpu(const P& p, const char* what) {
  ASSERT_TRUE(supports(p, Backend::cuda)) << what;
  const int64_t bytes = workspace_bytes(p, Backend::cuda);
  DeviceBuffer ws(bytes);
  status_check(launch(p, Workspace{ws.as<void>(), bytes}, Stream{Backend::cuda, test_stream()}), what);
  cuda_ok(cudaStreamSynchronize(test_stream()), what);
  cuda_ok(cudaGetLastError(), what);
}

// Every kind of block a context-parallel layout calls, against the CPU at
// fp64 on the same block. The bound of each field is the rule's bound for the
// whole sequence of the same inputs (the naive bf16 implementation's error
// there, times kBf16Multiple): a block computes the same rows with fewer keys.
void blocks_match_the_cpu(AttentionKind kind, const std::vector<SeqBlock>& blocks) {
  const std::vector<AttentionCase> cases = {{"b2_t200_h4_kv2_d64", 2, 200, 4, 2, 64},
                                            {"b1_t200_h4_kv1_d128", 1, 200, 4, 1, 128},
                                            {"b2_t200_h4_kv4_d128", 2, 200, 4, 4, 128}};
  for (const AttentionCase& c : cases) {
    SCOPED_TRACE(c.name);
    Rng rng;
    SCOPED_TRACE(rng.trace());
    const auto [in, ref, naive] = prepare(c, rng);
    const DeviceInputs dev(c, in.bq, in.bk, in.bv, in.bdout);
    const int64_t nq = c.B * c.T * c.H * c.D, nkv = c.B * c.T * c.H_kv * c.D, nrow = c.B * c.H * c.T;
    for (const SeqBlock& s : blocks) {
      SCOPED_TRACE(s.name);
      const BlockResult<double> want = cpu_block(c, s, in);
      DeviceBuffer out(nq * 2), lse(nrow * 4), dq(nq * 2), dk(nkv * 2), dv(nkv * 2);
      launch_on_gpu(block_forward(c, s, dev, out.as<bf16>(), lse.as<float>(), kind), "block forward");
      const auto g_out = rows_of(to_float(out.download<bf16>(nq)), c.B, c.T, c.H * c.D, s.qo, s.tq);
      const auto w_out = rows_of(want.out, c.B, c.T, c.H * c.D, s.qo, s.tq);
      EXPECT_EQ(non_finite(g_out), 0) << "out";
      EXPECT_LE(rel_diff(g_out, std::vector<float>(w_out.begin(), w_out.end()), w_out),
                bound_of(naive.out, ref.out))
          << "out";
      const auto g_lse = rows_of(lse.download<float>(nrow), c.B * c.H, c.T, 1, s.qo, s.tq);
      const auto w_lse = rows_of(want.lse, c.B * c.H, c.T, 1, s.qo, s.tq);
      const FiniteSplit l = split_inf(g_lse, w_lse);
      EXPECT_EQ(l.mismatched_inf, 0) << "lse: rows that see no key must hold -inf, and only they";
      if (!l.ref.empty()) {
        EXPECT_LE(rel_l2(l.got, l.ref), bound_of(naive.lse, ref.lse)) << "lse";
      }
      // A row that sees no key has out exactly 0.
      for (int64_t b = 0; b < c.B; ++b)
        for (int64_t h = 0; h < c.H; ++h)
          for (int64_t i = 0; i < s.tq; ++i)
            if (want.lse[(b * c.H + h) * c.T + s.qo + i] == -INFINITY) {
              for (int64_t d = 0; d < c.D; ++d)
                ASSERT_EQ(g_out[((b * s.tq + i) * c.H + h) * c.D + d], 0.0f) << "out of a row that sees no key";
            }

      // Backward, given the oracle's out and lse, overwriting.
      DeviceBuffer r_out(nq * 2), r_lse(nrow * 4);
      {
        std::vector<float> wo(want.out.begin(), want.out.end()), wl(want.lse.begin(), want.lse.end());
        r_out.upload(to_bf16(wo));
        r_lse.upload(wl);
      }
      launch_on_gpu(block_backward(c, s, dev, r_out.as<bf16>(), r_lse.as<float>(), dq.as<bf16>(), dk.as<bf16>(),
                                   dv.as<bf16>(), Write::overwrite, kind),
                    "block backward");
      struct Grad {
        const char* name;
        DeviceBuffer* buf;
        const std::vector<double>* want;
        int64_t n, width, t0, rows;
        const std::vector<float>* naive;
        const std::vector<double>* ref;
      };
      const Grad grads[] = {{"dq", &dq, &want.dq, nq, c.H * c.D, s.qo, s.tq, &naive.dq, &ref.dq},
                            {"dk", &dk, &want.dk, nkv, c.H_kv * c.D, s.ko, s.tk, &naive.dk, &ref.dk},
                            {"dv", &dv, &want.dv, nkv, c.H_kv * c.D, s.ko, s.tk, &naive.dv, &ref.dv}};
      std::vector<std::vector<float>> once;
      for (const Grad& gr : grads) {
        const auto got = rows_of(to_float(gr.buf->download<bf16>(gr.n)), c.B, c.T, gr.width, gr.t0, gr.rows);
        const auto w = rows_of(*gr.want, c.B, c.T, gr.width, gr.t0, gr.rows);
        EXPECT_EQ(non_finite(got), 0) << gr.name;
        EXPECT_LE(rel_diff(got, std::vector<float>(w.begin(), w.end()), w), bound_of(*gr.naive, *gr.ref))
            << gr.name;
        once.push_back(to_float(gr.buf->download<bf16>(gr.n)));
      }
      // Accumulating twice onto what the overwrite left gives three times it
      // (up to rounding each sum once); regions outside the block stay as
      // they were, bit for bit.
      for (int rep = 0; rep < 2; ++rep)
        launch_on_gpu(block_backward(c, s, dev, r_out.as<bf16>(), r_lse.as<float>(), dq.as<bf16>(),
                                     dk.as<bf16>(), dv.as<bf16>(), Write::accumulate, kind),
                      "block backward, accumulating");
      for (size_t i = 0; i < std::size(grads); ++i) {
        const Grad& gr = grads[i];
        SCOPED_TRACE(gr.name);
        const auto all = to_float(gr.buf->download<bf16>(gr.n));
        const auto got = rows_of(all, c.B, c.T, gr.width, gr.t0, gr.rows);
        const auto base = rows_of(once[i], c.B, c.T, gr.width, gr.t0, gr.rows);
        std::vector<float> thrice(base.size());
        std::vector<double> thrice_ref(base.size());
        for (size_t j = 0; j < base.size(); ++j) thrice[j] = 3 * base[j], thrice_ref[j] = 3 * double(base[j]);
        EXPECT_LE(rel_diff(got, thrice, thrice_ref), 2 * kBf16Roundoff) << "accumulated three times";
        for (int64_t b = 0; b < c.B; ++b)
          for (int64_t t = 0; t < c.T; ++t) {
            if (t >= gr.t0 && t < gr.t0 + gr.rows) continue;
            for (int64_t e = 0; e < gr.width; ++e)
              ASSERT_TRUE(std::isnan(all[(b * c.T + t) * gr.width + e])) << "wrote outside the block";
          }
      }
    }
  }
}

TEST(GpuAttentionBlocks, FlashBlocksMatchTheCpu) {
  blocks_match_the_cpu(AttentionKind::flash, {
                                                 {"diagonal", 37, 90, 37, 90},
                                                 {"diagonal_tile_aligned", 64, 128, 64, 128},
                                                 {"off_diagonal_fully_visible", 130, 60, 10, 100},
                                                 {"partly_visible_tk_gt_t", 100, 50, 60, 120},
                                                 {"fully_masked", 0, 50, 100, 60},
                                                 {"some_rows_see_nothing", 20, 100, 70, 80},
                                                 {"prefix_of_keys", 150, 30, 0, 180},
                                                 {"one_query_one_key", 5, 1, 5, 1},
                                             });
}

// cudnn's blocks: causal to their end (the ring's diagonal, the all-gather's
// chunk against its key prefix) and fully visible (the ring's earlier keys),
// written in place and accumulated through the workspace.
TEST(GpuAttentionBlocks, CudnnBlocksMatchTheCpu) {
  if (!attention_available(AttentionKind::cudnn, Backend::cuda)) GTEST_SKIP() << "built without the cuDNN frontend";
  blocks_match_the_cpu(AttentionKind::cudnn, {
                                                 {"diagonal", 40, 88, 40, 88},
                                                 {"diagonal_tile_aligned", 64, 128, 64, 128},
                                                 {"off_diagonal_fully_visible", 132, 60, 12, 100},
                                                 {"keys_just_before", 104, 48, 8, 96},
                                                 {"prefix_of_keys", 152, 48, 0, 200},
                                                 {"prefix_from_the_first_key", 0, 64, 0, 64},
                                             });
}

// Blocks of the sequence on CUDA: flash takes every one, cudnn those causal
// to their end and the fully visible ones, materialized none.
TEST(GpuAttentionBlocks, WhichKindsTakeWhichBlocks) {
  DeviceBuffer buf(1 << 20);
  bf16* t = buf.as<bf16>();
  float* f = buf.as<float>();
  // Queries [12, 20) against keys [0, 16): some keys after some queries, and
  // the prefix ends inside them.
  AttentionForwardParams<bf16> fwd{.kind = AttentionKind::flash, .B = 1, .T = 8, .H = 4, .H_kv = 2, .D = 64,
                                   .q = t, .k = t, .v = t, .out = t, .lse = f, .probs = t,
                                   .Tk = 16, .q_offset = 12, .k_offset = 0};
  AttentionBackwardParams<bf16> bwd{.kind = AttentionKind::flash, .B = 1, .T = 8, .H = 4, .H_kv = 2, .D = 64,
                                    .q = t, .k = t, .v = t, .out = t, .lse = f, .probs = t, .dout = t,
                                    .dq = t, .dk = t, .dv = t, .Tk = 16, .q_offset = 12, .k_offset = 0,
                                    .dq_write = Write::accumulate, .dkv_write = Write::accumulate};
  ASSERT_TRUE(attention_is_block(fwd));
  ASSERT_TRUE(attention_is_block(bwd));
  EXPECT_TRUE(supports(fwd, Backend::cuda));
  EXPECT_TRUE(supports(bwd, Backend::cuda));
  EXPECT_EQ(workspace_bytes(fwd, Backend::cuda), 0);
  for (AttentionKind kind : {AttentionKind::materialized, AttentionKind::cudnn}) {
    auto f2 = fwd;
    f2.kind = kind;
    auto b2 = bwd;
    b2.kind = kind;
    EXPECT_FALSE(supports(f2, Backend::cuda)) << to_string(kind);
    EXPECT_FALSE(supports(b2, Backend::cuda)) << to_string(kind);
    EXPECT_EQ(launch(f2, Workspace{}, Stream{Backend::cuda, test_stream()}), Status::unsupported) << to_string(kind);
  }
  if (!attention_available(AttentionKind::cudnn, Backend::cuda)) return;
  // Queries [8, 16) against the prefix [0, 16): causal to its end; and
  // against [0, 8): every key visible. cudnn takes both; accumulating, its
  // backward's workspace holds the gradients it writes before adding them.
  for (int64_t tk : {16, 8}) {
    auto f2 = fwd;
    f2.kind = AttentionKind::cudnn;
    f2.Tk = tk;
    f2.q_offset = 8;
    auto b2 = bwd;
    b2.kind = AttentionKind::cudnn;
    b2.Tk = tk;
    b2.q_offset = 8;
    EXPECT_TRUE(supports(f2, Backend::cuda)) << tk;
    EXPECT_TRUE(supports(b2, Backend::cuda)) << tk;
    auto b3 = b2;
    b3.dq_write = b3.dkv_write = Write::overwrite;
    EXPECT_EQ(workspace_bytes(b2, Backend::cuda) - workspace_bytes(b3, Backend::cuda),
              (8 * 4 * 64 * 2 + 63) / 64 * 64 + 2 * ((tk * 2 * 64 * 2 + 63) / 64 * 64));
    auto m2 = f2;
    m2.kind = AttentionKind::materialized;
    EXPECT_FALSE(supports(m2, Backend::cuda)) << tk;
  }
}

// A block whose keys all follow its queries: out 0, lse -inf, and its
// backward adds exactly nothing to gradients that already hold values.
TEST(GpuAttentionBlocks, FullyMaskedBlockAddsNothing) {
  const AttentionCase c{"b2_t160_h4_kv2_d64", 2, 160, 4, 2, 64};
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const Inputs in = draw(c, rng);
  const DeviceInputs dev(c, in.bq, in.bk, in.bv, in.bdout);
  const int64_t nq = c.B * c.T * c.H * c.D, nkv = c.B * c.T * c.H_kv * c.D, nrow = c.B * c.H * c.T;
  const SeqBlock s{"keys_after_queries", 0, 70, 80, 80};
  DeviceBuffer out(nq * 2), lse(nrow * 4), dq(nq * 2), dk(nkv * 2), dv(nkv * 2);
  launch_on_gpu(block_forward(c, s, dev, out.as<bf16>(), lse.as<float>()), "forward");
  const auto o = rows_of(to_float(out.download<bf16>(nq)), c.B, c.T, c.H * c.D, s.qo, s.tq);
  for (float x : o) ASSERT_EQ(x, 0.0f);
  const auto l = rows_of(lse.download<float>(nrow), c.B * c.H, c.T, 1, s.qo, s.tq);
  for (float x : l) ASSERT_EQ(x, -INFINITY);
  const auto g0 = to_bf16(rng.uniform<float>(nq)), k0 = to_bf16(rng.uniform<float>(nkv)),
             v0 = to_bf16(rng.uniform<float>(nkv));
  dq.upload(g0);
  dk.upload(k0);
  dv.upload(v0);
  launch_on_gpu(block_backward(c, s, dev, out.as<bf16>(), lse.as<float>(), dq.as<bf16>(), dk.as<bf16>(),
                               dv.as<bf16>(), Write::accumulate),
                "backward");
  EXPECT_EQ(to_float(dq.download<bf16>(nq)), to_float(g0));
  EXPECT_EQ(to_float(dk.download<bf16>(nkv)), to_float(k0));
  EXPECT_EQ(to_float(dv.download<bf16>(nkv)), to_float(v0));
}

// The ring of trainer/model/llama_context.cpp on one device: the sequence in
// 2 cp chunks of c, rank r holding chunks r and 2 cp - 1 - r (rows of its
// local (B, 2c, ...) tensors); at step s it computes on rank (r - s) mod cp's
// K/V, skipping chunk pairs whose keys all follow the queries, and merges
// each block's out and lse into its own through attention_merge. The
// backward accumulates every pair's dq into the rank's and dk, dv into the
// key owner's. Put back in sequence order, the results are whole-sequence
// attention, held to the file's rule against the fp64 reference.
struct RingCase {
  const char* name;
  int64_t B, cp, c, H, H_kv, D;
};

void ring_merges_to_the_whole(AttentionKind kind, const std::vector<RingCase>& rings) {
  for (const RingCase& rc : rings) {
    SCOPED_TRACE(rc.name);
    const int64_t cp = rc.cp, c = rc.c, Tl = 2 * c;
    const AttentionCase whole{rc.name, rc.B, 2 * cp * c, rc.H, rc.H_kv, rc.D};
    Rng rng;
    SCOPED_TRACE(rng.trace());
    const auto [in, ref, naive] = prepare(whole, rng);
    const AttentionCase local{rc.name, rc.B, Tl, rc.H, rc.H_kv, rc.D};
    auto chunk_offset = [&](int64_t r, int64_t k) { return (k == 0 ? r : 2 * cp - 1 - r) * c; };
    // Whole (B, T, w) rows <-> rank r's local (B, 2c, w) rows.
    auto to_local = [&](const auto& x, int64_t w, int64_t r) {
      std::remove_cvref_t<decltype(x)> y(size_t(rc.B * Tl * w));
      for (int64_t b = 0; b < rc.B; ++b)
        for (int64_t k = 0; k < 2; ++k)
          std::copy_n(x.begin() + (b * whole.T + chunk_offset(r, k)) * w, c * w, y.begin() + (b * Tl + k * c) * w);
      return y;
    };
    // nb sequences of rows: B, or B H for lse.
    auto to_whole = [&](const std::vector<float>& y, std::vector<float>& x, int64_t w, int64_t r, int64_t nb) {
      for (int64_t b = 0; b < nb; ++b)
        for (int64_t k = 0; k < 2; ++k)
          std::copy_n(y.begin() + (b * Tl + k * c) * w, c * w, x.begin() + (b * whole.T + chunk_offset(r, k)) * w);
    };
    const int64_t wq = rc.H * rc.D, wkv = rc.H_kv * rc.D;
    const int64_t nq = rc.B * Tl * wq, nkv = rc.B * Tl * wkv, nrow = rc.B * rc.H * Tl;
    std::vector<std::unique_ptr<DeviceInputs>> dev;
    std::vector<std::unique_ptr<DeviceBuffer>> out, lse, dq, dk, dv;
    for (int64_t r = 0; r < cp; ++r) {
      dev.push_back(std::make_unique<DeviceInputs>(local, to_local(in.bq, wq, r), to_local(in.bk, wkv, r),
                                                   to_local(in.bv, wkv, r), to_local(in.bdout, wq, r)));
      out.push_back(std::make_unique<DeviceBuffer>(nq * 2));
      lse.push_back(std::make_unique<DeviceBuffer>(nrow * 4));
      dq.push_back(std::make_unique<DeviceBuffer>(nq * 2));
      dk.push_back(std::make_unique<DeviceBuffer>(nkv * 2));
      dv.push_back(std::make_unique<DeviceBuffer>(nkv * 2));
      out[r]->upload(std::vector<bf16>(size_t(nq), float_to_bf16(0.0f)));
      lse[r]->upload(std::vector<float>(size_t(nrow), -INFINITY));
      for (auto* g : {dq[r].get(), dk[r].get(), dv[r].get()})
        g->upload(std::vector<bf16>(size_t(g->bytes() / 2), float_to_bf16(0.0f)));
    }
    // Every (rank r, ring step s, query chunk qc, key chunk kc of the block
    // of rank src = r - s) whose keys are not all after its queries, in the
    // trainer's order.
    auto each_block = [&](const auto& visit) {
      for (int64_t r = 0; r < cp; ++r)
        for (int64_t s = 0; s < cp; ++s) {
          const int64_t src = (r - s + cp) % cp;
          for (int64_t qc = 0; qc < 2; ++qc)
            for (int64_t kc = 0; kc < 2; ++kc) {
              const int64_t qo = chunk_offset(r, qc), ko = chunk_offset(src, kc);
              if (ko <= qo) visit(r, src, qc, kc, qo, ko);
            }
        }
    };
    DeviceBuffer part_out(nq * 2), part_lse(nrow * 4);
    each_block([&](int64_t r, int64_t src, int64_t qc, int64_t kc, int64_t qo, int64_t ko) {
      launch_on_gpu(AttentionForwardParams<bf16>{
                        .kind = kind, .B = rc.B, .T = c, .H = rc.H, .H_kv = rc.H_kv,
                        .D = rc.D, .q = dev[r]->q.as<bf16>() + qc * c * wq,
                        .k = dev[src]->k.as<bf16>() + kc * c * wkv, .v = dev[src]->v.as<bf16>() + kc * c * wkv,
                        .out = part_out.as<bf16>() + qc * c * wq, .lse = part_lse.as<float>() + qc * c,
                        .Tk = c, .q_offset = qo, .k_offset = ko, .q_batch_rows = Tl, .kv_batch_rows = Tl,
                        .lse_batch_rows = Tl},
                    "ring block forward");
      const AttentionMergeParams<bf16> merge{.B = rc.B, .T = c, .H = rc.H, .D = rc.D,
                                             .out = out[r]->as<bf16>() + qc * c * wq,
                                             .lse = lse[r]->as<float>() + qc * c,
                                             .part_out = part_out.as<bf16>() + qc * c * wq,
                                             .part_lse = part_lse.as<float>() + qc * c,
                                             .q_batch_rows = Tl, .lse_batch_rows = Tl};
      ASSERT_TRUE(supports(merge, Backend::cuda));
      const int64_t mb = workspace_bytes(merge, Backend::cuda);
      DeviceBuffer mws(mb);
      status_check(launch(merge, Workspace{mws.as<void>(), mb}, Stream{Backend::cuda, test_stream()}),
                   "attention_merge");
      cuda_ok(cudaStreamSynchronize(test_stream()), "attention_merge");
    });
    each_block([&](int64_t r, int64_t src, int64_t qc, int64_t kc, int64_t qo, int64_t ko) {
      launch_on_gpu(AttentionBackwardParams<bf16>{
                        .kind = kind, .B = rc.B, .T = c, .H = rc.H, .H_kv = rc.H_kv,
                        .D = rc.D, .q = dev[r]->q.as<bf16>() + qc * c * wq,
                        .k = dev[src]->k.as<bf16>() + kc * c * wkv, .v = dev[src]->v.as<bf16>() + kc * c * wkv,
                        .out = out[r]->as<bf16>() + qc * c * wq, .lse = lse[r]->as<float>() + qc * c,
                        .dout = dev[r]->dout.as<bf16>() + qc * c * wq, .dq = dq[r]->as<bf16>() + qc * c * wq,
                        .dk = dk[src]->as<bf16>() + kc * c * wkv, .dv = dv[src]->as<bf16>() + kc * c * wkv,
                        .Tk = c, .q_offset = qo, .k_offset = ko, .q_batch_rows = Tl, .kv_batch_rows = Tl,
                        .lse_batch_rows = Tl, .dq_write = Write::accumulate, .dkv_write = Write::accumulate},
                    "ring block backward");
    });
    Result<float> got;
    got.out.assign(ref.out.size(), NAN);
    got.lse.assign(ref.lse.size(), NAN);
    got.dq.assign(ref.dq.size(), NAN);
    got.dk.assign(ref.dk.size(), NAN);
    got.dv.assign(ref.dv.size(), NAN);
    for (int64_t r = 0; r < cp; ++r) {
      to_whole(to_float(out[r]->download<bf16>(nq)), got.out, wq, r, rc.B);
      to_whole(to_float(dq[r]->download<bf16>(nq)), got.dq, wq, r, rc.B);
      to_whole(to_float(dk[r]->download<bf16>(nkv)), got.dk, wkv, r, rc.B);
      to_whole(to_float(dv[r]->download<bf16>(nkv)), got.dv, wkv, r, rc.B);
      to_whole(lse[r]->download<float>(nrow), got.lse, 1, r, rc.B * rc.H);
    }
    for (const Field& f : kFields) {
      SCOPED_TRACE(f.name);
      const std::vector<double>& r = ref.*f.ref;
      EXPECT_EQ(non_finite(got.*f.member), 0) << "left elements unwritten or non-finite";
      const double e = rel_l2(got.*f.member, r), bound = bound_of(naive.*f.member, r);
      EXPECT_LE(e, bound) << "ring vs fp64: error " << e << ", naive bf16 error " << rel_l2(naive.*f.member, r);
    }
  }
}

TEST(GpuAttentionBlocks, RingMergesToTheWhole) {
  ring_merges_to_the_whole(AttentionKind::flash, {{"cp2_c70_b2_h4_kv2_d64", 2, 2, 70, 4, 2, 64},
                                                  {"cp3_c48_b1_h4_kv1_d128", 1, 3, 48, 4, 1, 128},
                                                  {"cp2_c64_b1_h4_kv4_d128", 1, 2, 64, 4, 4, 128},
                                                  {"cp4_c33_b2_h8_kv2_d64", 2, 4, 33, 8, 2, 64}});
}

// The same ring with cuDNN's blocks (chunks of a multiple of 4 rows, so that
// each chunk's lse starts on 16 bytes, as cuDNN takes it).
TEST(GpuAttentionBlocks, CudnnRingMergesToTheWhole) {
  if (!attention_available(AttentionKind::cudnn, Backend::cuda)) GTEST_SKIP() << "built without the cuDNN frontend";
  ring_merges_to_the_whole(AttentionKind::cudnn, {{"cp2_c72_b2_h4_kv2_d64", 2, 2, 72, 4, 2, 64},
                                                  {"cp3_c48_b1_h4_kv1_d128", 1, 3, 48, 4, 1, 128},
                                                  {"cp4_c36_b2_h8_kv2_d64", 2, 4, 36, 8, 2, 64}});
}

}  // namespace
}  // namespace weft::kernels::test
