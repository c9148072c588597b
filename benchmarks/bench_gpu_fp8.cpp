// The FP8 cases of bench_gpu_kernels (kernels/fp8): its GEMMs beside bf16
// ones at Llama 3 8B's linear shapes, and the cast with its transpose.
#include <memory>
#include <vector>

#include "benchmarks/gpu_bench.h"
#include "kernels/fp8/fp8_ops.h"
#include "kernels/gemm/gemm.h"

namespace weft::bench {

// FP8 GEMMs (kernels/fp8) beside bf16 ones of the same product, at Llama 3
// 8B's linear shapes (C 4096, F 14336, 8 kv heads of 128: qkv out 6144) over
// 8192 tokens: the forward with fast accumulation, dgrad and wgrad split (the
// public recipes' choice), wgrad into fp32 with beta = 1. Each reports its
// TFLOP/s, the bf16 GEMM's (kernels/gemm on the same operands' bf16 forms
// in the same NT layout, timed in the same run) and the speedup. The FP8 operands are codes cast by
// Fp8CastParams from random bf16 values, so they are realistic codes, not
// random bytes (which include NaNs). Devices without FP8 tensor cores (before
// sm_89) skip these. And the cast itself, with its transpose: GB/s over bf16
// read and two sets of codes written.
void register_fp8() {
  constexpr int64_t kC8 = 4096, kF8 = 14336, kQkv8 = 6144;
  struct Shape {
    const char* name;
    int64_t m, n, k;
    Fp8Format fa;
    Fp8Accumulation acc;
    bool fp32_c;
  };
  constexpr Fp8Format kE4 = Fp8Format::e4m3, kE5 = Fp8Format::e5m2;
  constexpr Fp8Accumulation kFast = Fp8Accumulation::fast, kSplit = Fp8Accumulation::split;
  for (const Shape& s : {Shape{"fp8_gemm/forward_qkv_8192x6144x4096", kRows, kQkv8, kC8, kE4, kFast, false},
                         Shape{"fp8_gemm/forward_o_8192x4096x4096", kRows, kC8, kC8, kE4, kFast, false},
                         Shape{"fp8_gemm/forward_gate_up_8192x28672x4096", kRows, 2 * kF8, kC8, kE4, kFast, false},
                         Shape{"fp8_gemm/forward_down_8192x4096x14336", kRows, kC8, kF8, kE4, kFast, false},
                         Shape{"fp8_gemm/dgrad_down_8192x14336x4096", kRows, kF8, kC8, kE5, kSplit, false},
                         Shape{"fp8_gemm/wgrad_down_fp32C_4096x14336x8192", kC8, kF8, kRows, kE5, kSplit, true}}) {
    add(s.name, [s](benchmark::State& state) {
      std::vector<std::shared_ptr<void>> keep;
      // bf16 operands A (m, k) and B (n, k), and their codes.
      auto* a = random_array<bf16>(keep, s.m * s.k);
      auto* b = random_array<bf16>(keep, s.n * s.k);
      auto* one = random_array<float>(keep, 1, 1.0, 1.0);  // the scales and scale_invs: exactly 1
      auto codes = [&](const bf16* x, int64_t n, Fp8Format f) {
        auto q = std::make_shared<DeviceArray<Fp8>>(n);
        keep.push_back(q);
        const Fp8CastParams<bf16> p{.rows = 1, .cols = n, .format = f, .x = x, .scale = one->data(),
                                    .out = q->data()};
        status_check(launch(p, Workspace{}, make_cuda_stream(stream())), "fp8 cast");
        return q->data();
      };
      const Fp8* qa = codes(a->data(), s.m * s.k, s.fa);
      const Fp8* qb = codes(b->data(), s.n * s.k, Fp8Format::e4m3);
      CUDA_CHECK(cudaStreamSynchronize(stream()));
      const double flops = 2.0 * double(s.m) * double(s.n) * double(s.k);
      double bf16_ms = 0;
      if (s.fp32_c) {
        auto* c = random_array<float>(keep, s.m * s.n);
        const Fp8GemmAccParams<bf16> p{.m = s.m, .n = s.n, .k = s.k, .beta = 1.0f, .a = qa, .lda = s.k,
                                       .a_format = s.fa, .a_scale_inv = one->data(), .b = qb, .ldb = s.k,
                                       .b_scale_inv = one->data(), .c = c->data(), .ldc = s.n,
                                       .accumulation = s.acc};
        if (!supports(p, Backend::cuda)) return state.SkipWithError("no FP8 GEMM on this device");
        const GemmAccParams<bf16> ref{.trans_a = Trans::no, .trans_b = Trans::yes, .m = s.m, .n = s.n,
                                      .k = s.k, .beta = 1.0f, .a = a->data(), .lda = s.k, .b = b->data(),
                                      .ldb = s.k, .c = c->data(), .ldc = s.n};
        bf16_ms = median_ms(op_of(ref, keep), 10);
        run(state, op_of(p, keep), 0, flops);
      } else {
        auto* c = random_array<bf16>(keep, s.m * s.n);
        const Fp8GemmParams<bf16> p{.m = s.m, .n = s.n, .k = s.k, .a = qa, .lda = s.k, .a_format = s.fa,
                                    .a_scale_inv = one->data(), .b = qb, .ldb = s.k,
                                    .b_scale_inv = one->data(), .c = c->data(), .ldc = s.n,
                                    .accumulation = s.acc};
        if (!supports(p, Backend::cuda)) return state.SkipWithError("no FP8 GEMM on this device");
        const GemmParams<bf16> ref{.trans_a = Trans::no, .trans_b = Trans::yes, .m = s.m, .n = s.n,
                                   .k = s.k, .a = a->data(), .lda = s.k, .b = b->data(), .ldb = s.k,
                                   .c = c->data(), .ldc = s.n};
        bf16_ms = median_ms(op_of(ref, keep), 10);
        run(state, op_of(p, keep), 0, flops);
      }
      const double bf16_tflops = flops / (bf16_ms * 1e-3) / 1e12;
      state.counters["bf16_TFLOP/s"] = bf16_tflops;
      state.counters["speedup_vs_bf16"] = state.counters["TFLOP/s"] / bf16_tflops;
    });
  }
  // Block scaling (fp8:blockwise): cuBLASLt's block-scaled GEMMs on codes
  // and tile scales from the block cast, beside the bf16 GEMM; split
  // accumulation throughout (no fast block-scaled kernels).
  for (const Shape& s : {Shape{"fp8_block_gemm/forward_gate_up_8192x28672x4096", kRows, 2 * kF8, kC8, kE4, kSplit, false},
                         Shape{"fp8_block_gemm/wgrad_down_4096x14336x8192", kC8, kF8, kRows, kE4, kSplit, false}}) {
    add(s.name, [s](benchmark::State& state) {
      std::vector<std::shared_ptr<void>> keep;
      auto* a = random_array<bf16>(keep, s.m * s.k);
      auto* b = random_array<bf16>(keep, s.n * s.k);
      // The forward's B is a weight (128 x 128 blocks); the weight
      // gradient's operands both take 1 x 128 tiles down the tokens.
      const bool weight = s.m == kRows;
      const Fp8Tiles ta = Fp8Tiles::row128, tb = weight ? Fp8Tiles::block128 : Fp8Tiles::row128;
      auto cast = [&](const bf16* x, int64_t rows, Fp8Tiles tiles, float** scales) {
        auto q = std::make_shared<DeviceArray<Fp8>>(rows * s.k);
        auto sc = std::make_shared<DeviceArray<float>>(fp8_tile_scales(tiles, rows, s.k));
        keep.push_back(q);
        keep.push_back(sc);
        const Fp8BlockCastParams<bf16> p{.rows = rows, .cols = s.k, .tiles = tiles, .x = x, .out = q->data(),
                                         .scale_inv = sc->data()};
        status_check(launch(p, Workspace{}, make_cuda_stream(stream())), "fp8 block cast");
        *scales = sc->data();
        return q->data();
      };
      float *sa = nullptr, *sb = nullptr;
      const Fp8* qa = cast(a->data(), s.m, ta, &sa);
      const Fp8* qb = cast(b->data(), s.n, tb, &sb);
      CUDA_CHECK(cudaStreamSynchronize(stream()));
      const double flops = 2.0 * double(s.m) * double(s.n) * double(s.k);
      auto* c = random_array<bf16>(keep, s.m * s.n);
      const Fp8GemmParams<bf16> p{.m = s.m, .n = s.n, .k = s.k, .a = qa, .lda = s.k, .a_scale_inv = sa,
                                  .a_tiles = ta, .b = qb, .ldb = s.k, .b_scale_inv = sb, .b_tiles = tb,
                                  .c = c->data(), .ldc = s.n, .accumulation = s.acc};
      if (!supports(p, Backend::cuda)) return state.SkipWithError("no block-scaled FP8 GEMM on this device");
      const GemmParams<bf16> ref{.trans_a = Trans::no, .trans_b = Trans::yes, .m = s.m, .n = s.n, .k = s.k,
                                 .a = a->data(), .lda = s.k, .b = b->data(), .ldb = s.k, .c = c->data(),
                                 .ldc = s.n};
      const double bf16_ms = median_ms(op_of(ref, keep), 10);
      run(state, op_of(p, keep), 0, flops);
      const double bf16_tflops = flops / (bf16_ms * 1e-3) / 1e12;
      state.counters["bf16_TFLOP/s"] = bf16_tflops;
      state.counters["speedup_vs_bf16"] = state.counters["TFLOP/s"] / bf16_tflops;
    });
  }
  // The block cast with its transpose: bf16 read, two sets of codes and
  // their 1 x 128 tile scales written.
  add("fp8_block_cast/e4m3_1x128_with_transpose_8192x4096", [](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    auto* x = random_array<bf16>(keep, kRows * kC);
    auto out = std::make_shared<DeviceArray<Fp8>>(kRows * kC);
    auto out_t = std::make_shared<DeviceArray<Fp8>>(kRows * kC);
    auto sc = std::make_shared<DeviceArray<float>>(2 * kRows * kC / 128);
    for (const auto& k : {std::shared_ptr<void>(out), std::shared_ptr<void>(out_t), std::shared_ptr<void>(sc)})
      keep.push_back(k);
    const Fp8BlockCastParams<bf16> p{.rows = kRows, .cols = kC, .tiles = Fp8Tiles::row128, .x = x->data(),
                                     .out = out->data(), .scale_inv = sc->data(), .out_t = out_t->data(),
                                     .scale_inv_t = sc->data() + kRows * kC / 128};
    run(state, op_of(p, keep), double(kRows * kC) * (2 + 1 + 1) + 2.0 * kRows * kC / 128 * 4, 0);
  });
  add("fp8_cast/e4m3_with_transpose_8192x4096", [](benchmark::State& state) {
    std::vector<std::shared_ptr<void>> keep;
    auto* x = random_array<bf16>(keep, kRows * kC);
    auto* scale = random_array<float>(keep, 1, 1.0, 1.0);  // [1, 1): exactly 1
    auto* amax = random_array<float>(keep, 1);
    auto out = std::make_shared<DeviceArray<Fp8>>(kRows * kC);
    auto out_t = std::make_shared<DeviceArray<Fp8>>(kRows * kC);
    keep.push_back(out);
    keep.push_back(out_t);
    const Fp8CastParams<bf16> p{.rows = kRows, .cols = kC, .x = x->data(), .scale = scale->data(),
                                .out = out->data(), .out_t = out_t->data(), .amax = amax->data()};
    run(state, op_of(p, keep), double(kRows * kC) * (2 + 1 + 1), 0);
  });
}

}  // namespace weft::bench
