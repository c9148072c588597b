// bench_gpu_kernels: the CUDA kernel families other than attention
// (bench_gpu_attention has those), bf16 with fp32 main gradients, master
// weights and Adam moments (as bf16 training keeps them), at the sizes of a
// Llama-7B micro-batch of 8192 tokens (C 4096, F 11008, V 32000, H 32, D 128);
// the FP8 GEMMs beside bf16 ones at Llama 3 8B's linear shapes (register_fp8,
// in bench_gpu_fp8.cpp; the shared helpers are in gpu_bench.h).
//
// Each benchmark reports what it achieved beside the ceiling measured at the
// start of the same run on the same device:
//   memory-bound families: GB/s over the bytes the kernel must move (each
//     input read once, each output written once; the unfused rmsnorm counts
//     the fp32 intermediates its design writes and reads back), against a
//     device-to-device cudaMemcpy of 1 GiB (bytes read plus bytes written);
//   gemm: TFLOP/s (2 m n k per product), against an 8192 x 8192 x 8192 bf16
//     product through the same cuBLASLt path; and beside its peer, cuBLAS's
//     own best for the same shape (every algorithm cuBLASLt's heuristic
//     offers, each timed), as pct_of_cublas_best (the target: at least 95).
// Time comes from CUDA events around each launch (manual time), after a
// warm-up launch that takes module loading and cuBLASLt's plan out of the
// numbers. Inputs are random, never zeros. Buffers exceed the L2 cache, so
// repeated launches read DRAM. Without a CUDA device it says so and exits 0.
//
//   bench_gpu_kernels [--benchmark_filter=rmsnorm] [--benchmark_format=json] ...
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "benchmarks/gpu_bench.h"
#include "kernels/adamw/adamw.h"
#include "kernels/cross_entropy/cross_entropy.h"
#include "kernels/cuda_check.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/embedding/embedding.h"
#include "kernels/gemm/gemm.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/swiglu/swiglu.h"

namespace weft::bench {

// The ceilings every benchmark reports against, measured before any runs.
Ceilings measure_ceilings() {
  Ceilings c;
  {
    const int64_t bytes = int64_t{1} << 30;
    DeviceArray<char> src(bytes), dst(bytes);
    CUDA_CHECK(cudaMemset(src.data(), 1, size_t(bytes)));
    const double ms = median_ms(
        [&] { CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), size_t(bytes), cudaMemcpyDeviceToDevice, stream())); },
        20);
    c.copy_gbps = 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
  }
  {
    const int64_t n = 8192;
    std::vector<std::shared_ptr<void>> keep;
    auto* a = random_array<bf16>(keep, n * n);
    auto* b = random_array<bf16>(keep, n * n);
    auto* out = random_array<bf16>(keep, n * n);
    const GemmParams<bf16> p{.m = n, .n = n, .k = n, .a = a->data(), .lda = n, .b = b->data(),
                             .ldb = n, .c = out->data(), .ldc = n};
    const double ms = median_ms(op_of(p, keep), 20);
    c.gemm_tflops = 2.0 * double(n) * double(n) * double(n) / (ms * 1e-3) / 1e12;
  }
  return c;
}


// cuBLAS's own best for a product (the peer of weft's gemm, which takes
// cuBLASLt's first heuristic answer): every algorithm the heuristic offers
// for the same layouts and workspace (up to 16), each timed on the same
// buffers; the fastest one's median milliseconds (0 when none ran).
// Row-major C (m, n) = op(A) op(B) is column-major C^T = op(B)^T op(A)^T,
// so cuBLASLt's A is weft's B and its B is weft's A, as in kernels/gemm.
double cublas_best_ms(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, const bf16* a, int64_t lda,
                      const bf16* b, int64_t ldb, void* c, cudaDataType_t c_type, int64_t ldc, float beta,
                      int* candidates) {
  static cublasLtHandle_t handle = [] {
    cublasLtHandle_t h = nullptr;
    CUBLAS_CHECK(cublasLtCreate(&h));
    return h;
  }();
  constexpr int64_t kWorkspace = int64_t{32} << 20;  // weft's cuBLASLt workspace
  DeviceArray<std::byte> ws(kWorkspace);
  const cublasOperation_t op_a = tb == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = ta == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtMatmulDesc_t op = nullptr;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  CUBLAS_CHECK(tb == Trans::no ? cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, uint64_t(n), uint64_t(k), ldb)
                               : cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, uint64_t(k), uint64_t(n), ldb));
  CUBLAS_CHECK(ta == Trans::no ? cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, uint64_t(k), uint64_t(m), lda)
                               : cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, uint64_t(m), uint64_t(k), lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, c_type, uint64_t(n), uint64_t(m), ldc));
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t max_ws = uint64_t(kWorkspace);
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws,
                                                    sizeof max_ws));
  cublasLtMatmulHeuristicResult_t results[16] = {};
  int found = 0;
  CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, op, la, lb, lc, lc, pref, 16, results, &found));
  const float alpha = 1.0f;
  double best = 0;
  *candidates = 0;
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    const cublasLtMatmulAlgo_t* algo = &results[i].algo;
    bool ok = true;
    const double ms = median_ms(
        [&] {
          if (!ok) return;
          ok = cublasLtMatmul(handle, op, &alpha, b, la, a, lb, &beta, c, lc, c, lc, algo, ws.data(),
                              size_t(kWorkspace), stream()) == CUBLAS_STATUS_SUCCESS;
        },
        10);
    if (!ok) continue;
    ++*candidates;
    if (best == 0 || ms < best) best = ms;
  }
  CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
  CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
  CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lc));
  CUBLAS_CHECK(cublasLtMatmulDescDestroy(op));
  return best;
}

void register_gemm() {
  struct Shape {
    const char* name;
    Trans ta, tb;
    int64_t m, n, k;
  };
  // Forward y = x W^T (NT), dgrad dx = dy W (NN), wgrad dW += dy^T x (TN, into fp32).
  for (const Shape& s : {Shape{"gemm/forward_q_8192x4096x4096", Trans::no, Trans::yes, kRows, kC, kC},
                         Shape{"gemm/forward_up_8192x11008x4096", Trans::no, Trans::yes, kRows, kF, kC},
                         Shape{"gemm/dgrad_down_8192x11008x4096", Trans::no, Trans::no, kRows, kF, kC},
                         Shape{"gemm/wgrad_down_fp32C_4096x11008x8192", Trans::yes, Trans::no, kC, kF, kRows}}) {
    add(s.name, [s](benchmark::State& state) {
      std::vector<std::shared_ptr<void>> keep;
      const int64_t a_cols = s.ta == Trans::no ? s.k : s.m, b_cols = s.tb == Trans::no ? s.n : s.k;
      auto* a = random_array<bf16>(keep, s.m * s.k);
      auto* b = random_array<bf16>(keep, s.k * s.n);
      const double flops = 2.0 * double(s.m) * double(s.n) * double(s.k);
      // The peer: cuBLAS's best algorithm for the same product, timed in the
      // same run on the same buffers.
      int candidates = 0;
      double best_ms = 0;
      if (s.ta == Trans::yes) {
        auto* c = random_array<float>(keep, s.m * s.n);
        const GemmAccParams<bf16> p{.trans_a = s.ta, .trans_b = s.tb, .m = s.m, .n = s.n, .k = s.k,
                                    .beta = 1.0f, .a = a->data(), .lda = a_cols, .b = b->data(),
                                    .ldb = b_cols, .c = c->data(), .ldc = s.n};
        best_ms = cublas_best_ms(s.ta, s.tb, s.m, s.n, s.k, a->data(), a_cols, b->data(), b_cols, c->data(),
                                 CUDA_R_32F, s.n, 1.0f, &candidates);
        run(state, op_of(p, keep), 0, flops);
      } else {
        auto* c = random_array<bf16>(keep, s.m * s.n);
        const GemmParams<bf16> p{.trans_a = s.ta, .trans_b = s.tb, .m = s.m, .n = s.n, .k = s.k,
                                 .a = a->data(), .lda = a_cols, .b = b->data(), .ldb = b_cols,
                                 .c = c->data(), .ldc = s.n};
        best_ms = cublas_best_ms(s.ta, s.tb, s.m, s.n, s.k, a->data(), a_cols, b->data(), b_cols, c->data(),
                                 CUDA_R_16BF, s.n, 0.0f, &candidates);
        run(state, op_of(p, keep), 0, flops);
      }
      if (best_ms > 0) {
        const double best = flops / (best_ms * 1e-3) / 1e12;
        state.counters["cublas_best_TFLOP/s"] = best;
        state.counters["pct_of_cublas_best"] = 100.0 * state.counters["TFLOP/s"] / best;
        state.counters["cublas_candidates"] = candidates;
      }
    });
  }
}


void register_rmsnorm() {
  const double n = double(kRows * kC);
  add("rmsnorm/fused_forward_residual_8192x4096", [n](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    auto* x = random_array<bf16>(keep, kRows * kC);
    auto* res = random_array<bf16>(keep, kRows * kC);
    auto* sum = random_array<bf16>(keep, kRows * kC);
    auto* y = random_array<bf16>(keep, kRows * kC);
    auto* w = random_array<bf16>(keep, kC, 0.5, 1.5);
    auto* rstd = random_array<float>(keep, kRows);
    const RmsnormForwardParams<bf16> p{kRows, kC, 1e-6, x->data(), res->data(), sum->data(),
                                       w->data(), y->data(), rstd->data()};
    run(state, op_of(p, keep), 2.0 * 4 * n + 4.0 * kRows, 0);  // x, residual in; sum, y out
  });
  add("rmsnorm/fused_backward_8192x4096", [n](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    auto* x = random_array<bf16>(keep, kRows * kC);
    auto* dy = random_array<bf16>(keep, kRows * kC);
    auto* dx = random_array<bf16>(keep, kRows * kC);
    auto* w = random_array<bf16>(keep, kC, 0.5, 1.5);
    auto* dw = random_array<float>(keep, kC);
    auto* rstd = random_array<float>(keep, kRows, 0.5, 2.0);
    const RmsnormBackwardParams<bf16> p{kRows, kC, x->data(), w->data(), rstd->data(), dy->data(),
                                        dx->data(), Write::overwrite, dw->data()};
    // x, dy in; dx out; the fp32 dweight read and written.
    run(state, op_of(p, keep), 2.0 * 3 * n + 4.0 * kRows + 8.0 * kC, 0);
  });
  add("rmsnorm/unfused_forward_8192x4096", [n](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    auto* x = random_array<bf16>(keep, kRows * kC);
    auto* y = random_array<bf16>(keep, kRows * kC);
    auto* w = random_array<bf16>(keep, kC, 0.5, 1.5);
    auto* rstd = random_array<float>(keep, kRows);
    auto* x_hat = random_array<float>(keep, kRows * kC);
    const RmsnormUnfusedForwardParams<bf16> p{kRows, kC, 1e-6, x->data(), w->data(), y->data(),
                                              rstd->data(), x_hat->data()};
    // x read twice, x_hat written then read (fp32), y written.
    run(state, op_of(p, keep), 2.0 * 2 * n + 4.0 * 2 * n + 2.0 * n, 0);
  });
  add("rmsnorm/unfused_backward_8192x4096", [n](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    auto* x_hat = random_array<float>(keep, kRows * kC);
    auto* dy = random_array<bf16>(keep, kRows * kC);
    auto* dx = random_array<bf16>(keep, kRows * kC);
    auto* w = random_array<bf16>(keep, kC, 0.5, 1.5);
    auto* dw = random_array<float>(keep, kC);
    auto* rstd = random_array<float>(keep, kRows, 0.5, 2.0);
    const RmsnormUnfusedBackwardParams<bf16> p{kRows, kC, x_hat->data(), rstd->data(), w->data(),
                                               dy->data(), dx->data(), Write::overwrite, dw->data()};
    // dy twice, x_hat three times (fp32), g written and read twice (fp32), dx written, the
    // fp32 dweight read and written.
    run(state, op_of(p, keep), 2.0 * 2 * n + 4.0 * 3 * n + 4.0 * 3 * n + 2.0 * n + 8.0 * kC, 0);
  });
}

void register_rope_swiglu() {
  add("rope/forward_b4_t2048_h32_kv32_d128", [](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    const int64_t n = kB * kT * kH * kD;
    auto* q = random_array<bf16>(keep, n);
    auto* k = random_array<bf16>(keep, n);
    const RopeParams<bf16> p{.direction = RopeDirection::forward, .B = kB, .T = kT, .H = kH, .H_kv = kH,
                             .D = kD, .theta = 10000.0, .q = q->data(), .k = k->data()};
    run(state, op_of(p, keep), 2.0 * 2 * 2 * double(n), 0);  // q and k read and written
  });
  add("swiglu/forward_8192x11008", [](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    const int64_t n = kRows * kF;
    auto* gate = random_array<bf16>(keep, n, -4.0, 4.0);
    auto* up = random_array<bf16>(keep, n);
    auto* act = random_array<bf16>(keep, n);
    run(state, op_of(SwigluForwardParams<bf16>{kRows, kF, gate->data(), up->data(), act->data()}, keep),
        2.0 * 3 * double(n), 0);
  });
  add("swiglu/backward_8192x11008", [](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    const int64_t n = kRows * kF;
    auto* gate = random_array<bf16>(keep, n, -4.0, 4.0);
    auto* up = random_array<bf16>(keep, n);
    auto* dact = random_array<bf16>(keep, n);
    auto* dgate = random_array<bf16>(keep, n);
    auto* dup = random_array<bf16>(keep, n);
    run(state,
        op_of(SwigluBackwardParams<bf16>{kRows, kF, gate->data(), up->data(), dact->data(),
                                         dgate->data(), dup->data()},
              keep),
        2.0 * 5 * double(n), 0);
  });
}

void register_embedding_cross_entropy() {
  static std::vector<int32_t> tokens = [] {
    std::mt19937 gen(7);
    // Zipf-like: frequent tokens repeat, as in text.
    std::vector<int32_t> t(kRows);
    for (int32_t& v : t) v = int32_t(std::min<double>(kV - 1, std::pow(double(gen() % 100000) / 100000.0, 3.0) * kV));
    return t;
  }();
  const double distinct = double(std::set<int32_t>(tokens.begin(), tokens.end()).size());
  add("embedding/forward_8192x4096_v32000", [](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    auto d_tokens = std::make_shared<DeviceArray<int32_t>>(kRows);
    CUDA_CHECK(cudaMemcpy(d_tokens->data(), tokens.data(), kRows * sizeof(int32_t), cudaMemcpyHostToDevice));
    keep.push_back(d_tokens);
    auto* table = random_array<bf16>(keep, kV * kC);
    auto* out = random_array<bf16>(keep, kRows * kC);
    run(state,
        op_of(EmbeddingForwardParams<bf16>{kRows, kC, kV, 0, kV, d_tokens->data(), table->data(), out->data()},
              keep),
        2.0 * 2 * double(kRows * kC) + 4.0 * kRows, 0);
  });
  add("embedding/backward_8192x4096_v32000", [distinct](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    auto d_tokens = std::make_shared<DeviceArray<int32_t>>(kRows);
    CUDA_CHECK(cudaMemcpy(d_tokens->data(), tokens.data(), kRows * sizeof(int32_t), cudaMemcpyHostToDevice));
    keep.push_back(d_tokens);
    auto* dout = random_array<bf16>(keep, kRows * kC);
    auto* dtable = random_array<float>(keep, kV * kC);
    // dout read; the distinct tokens' fp32 table-gradient rows read and written.
    run(state,
        op_of(EmbeddingBackwardParams<bf16>{kRows, kC, kV, 0, kV, d_tokens->data(), dout->data(),
                                            dtable->data()},
              keep),
        2.0 * double(kRows * kC) + 4.0 * 2 * distinct * kC + 4.0 * kRows, 0);
  });

  const double logits_bytes = 2.0 * double(kRows * kV);
  add("cross_entropy/max_8192x32000", [logits_bytes](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    auto* logits = random_array<bf16>(keep, kRows * kV, -8.0, 8.0);
    auto* m = random_array<float>(keep, kRows);
    run(state, op_of(CrossEntropyMaxParams<bf16>{kRows, kV, logits->data(), m->data()}, keep), logits_bytes, 0);
  });
  add("cross_entropy/sum_exp_8192x32000", [logits_bytes](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    auto* logits = random_array<bf16>(keep, kRows * kV, -8.0, 8.0);
    auto* m = random_array<float>(keep, kRows, 8.0, 8.0);
    auto* s = random_array<float>(keep, kRows);
    run(state, op_of(CrossEntropySumExpParams<bf16>{kRows, kV, logits->data(), m->data(), s->data()}, keep),
        logits_bytes, 0);
  });
  add("cross_entropy/loss_grad_8192x32000", [logits_bytes](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    auto* logits = random_array<bf16>(keep, kRows * kV, -8.0, 8.0);
    auto* m = random_array<float>(keep, kRows, 8.0, 8.0);
    auto* s = random_array<float>(keep, kRows, 1000.0, 2000.0);
    auto* loss = random_array<float>(keep, kRows);
    auto d_targets = std::make_shared<DeviceArray<int32_t>>(kRows);
    CUDA_CHECK(cudaMemcpy(d_targets->data(), tokens.data(), kRows * sizeof(int32_t), cudaMemcpyHostToDevice));
    keep.push_back(d_targets);
    // Repeated launches keep overwriting the logits with gradients, which are
    // valid logits too: the work per launch is the same.
    run(state,
        op_of(CrossEntropyLossGradParams<bf16>{kRows, kV, 0, kV, logits->data(), d_targets->data(),
                                               m->data(), s->data(), loss->data(), 1.0 / kRows},
              keep),
        2.0 * logits_bytes, 0);
  });
}

void register_adamw_elementwise() {
  add("adamw/64_tensors_of_4M", [](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    constexpr int64_t kTensors = 64, kEach = int64_t{1} << 22;
    std::vector<AdamwTensor<bf16>> tensors;
    for (int64_t i = 0; i < kTensors; ++i)
      tensors.push_back({.param = random_array<bf16>(keep, kEach)->data(),
                         .master = random_array<float>(keep, kEach)->data(),
                         .grad = random_array<float>(keep, kEach, -0.01, 0.01)->data(),
                         .m = random_array<float>(keep, kEach, -0.01, 0.01)->data(),
                         .v = random_array<float>(keep, kEach, 0.0, 1e-4)->data(),
                         .n = kEach,
                         .decay = i % 2 ? WeightDecay::skip : WeightDecay::apply});
    auto shared = std::make_shared<std::vector<AdamwTensor<bf16>>>(std::move(tensors));
    keep.push_back(shared);
    const AdamwParams<bf16> p{.tensors = *shared, .step = 10, .lr = 1e-4};
    // Per element: bf16 param written (2), fp32 master, m and v read and
    // written (3 x 8), fp32 grad read (4).
    constexpr double kBytesPerElement = 2.0 + 3 * 8.0 + 4.0;
    run(state, op_of(p, keep), kBytesPerElement * double(kTensors * kEach), 0);
  });
  constexpr int64_t n = int64_t{1} << 28;
  const double e = double(n);
  add("elementwise/add_256M", [e](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    auto* a = random_array<bf16>(keep, n);
    auto* b = random_array<bf16>(keep, n);
    auto* out = random_array<bf16>(keep, n);
    run(state, op_of(AddParams<bf16>{n, a->data(), b->data(), out->data()}, keep), 6.0 * e, 0);
  });
  add("elementwise/axpy_256M", [e](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    auto* x = random_array<bf16>(keep, n);
    auto* y = random_array<bf16>(keep, n);
    run(state, op_of(AxpyParams<bf16>{n, 1e-3, x->data(), y->data()}, keep), 6.0 * e, 0);
  });
  add("elementwise/scale_256M", [e](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    auto* x = random_array<bf16>(keep, n);
    run(state, op_of(ScaleParams<bf16>{n, 1.0, x->data(), x->data()}, keep), 4.0 * e, 0);
  });
  add("elementwise/fill_256M", [e](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    auto* x = random_array<bf16>(keep, n);
    run(state, op_of(FillParams<bf16>{n, 0.0, x->data()}, keep), 2.0 * e, 0);
  });
  add("elementwise/sum_squares_256M", [e](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    auto* x = random_array<bf16>(keep, n);
    auto* sum = random_array<double>(keep, 1);
    run(state, op_of(SumSquaresParams<bf16>{n, x->data(), sum->data()}, keep), 2.0 * e, 0);
  });
  // The fp32 forms, on bf16 training's main gradients.
  add("elementwise/axpy_fp32_256M", [e](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    auto* x = random_array<float>(keep, n);
    auto* y = random_array<float>(keep, n);
    run(state, op_of(AxpyParams<float>{n, 1e-3, x->data(), y->data()}, keep), 12.0 * e, 0);
  });
  add("elementwise/scale_fp32_256M", [e](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    auto* x = random_array<float>(keep, n);
    run(state, op_of(ScaleParams<float>{n, 1.0, x->data(), x->data()}, keep), 8.0 * e, 0);
  });
  add("elementwise/fill_fp32_256M", [e](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    auto* x = random_array<float>(keep, n);
    run(state, op_of(FillParams<float>{n, 0.0, x->data()}, keep), 4.0 * e, 0);
  });
  add("elementwise/sum_squares_fp32_256M", [e](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    auto* x = random_array<float>(keep, n);
    auto* sum = random_array<double>(keep, 1);
    run(state, op_of(SumSquaresParams<float>{n, x->data(), sum->data()}, keep), 4.0 * e, 0);
  });
  add("elementwise/widen_accumulate_256M", [e](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    auto* x = random_array<bf16>(keep, n);
    auto* out = random_array<float>(keep, n);
    run(state, op_of(WidenParams<bf16>{n, x->data(), out->data(), Write::accumulate}, keep), 10.0 * e, 0);
  });
  add("elementwise/narrow_256M", [e](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    auto* x = random_array<float>(keep, n);
    auto* out = random_array<bf16>(keep, n);
    run(state, op_of(NarrowParams<bf16>{n, x->data(), out->data()}, keep), 6.0 * e, 0);
  });
}

}  // namespace weft::bench

int main(int argc, char** argv) {
  using namespace weft::bench;
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::printf("bench_gpu_kernels: no CUDA device (%s); nothing to measure\n",
                status != cudaSuccess ? cudaGetErrorString(status) : "none found");
    return 0;
  }
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  g_ceilings = measure_ceilings();
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  std::printf("ceilings measured now: device-to-device copy %.0f GB/s (read + write), "
              "bf16 GEMM 8192^3 through cuBLASLt %.0f TFLOP/s\n",
              g_ceilings.copy_gbps, g_ceilings.gemm_tflops);
  register_gemm();
  register_fp8();
  register_rmsnorm();
  register_rope_swiglu();
  register_embedding_cross_entropy();
  register_adamw_elementwise();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
