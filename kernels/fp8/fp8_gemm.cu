// The FP8 GEMM on CUDA through cuBLASLt (kernels/fp8/fp8_ops.h): FP8 A and
// B with per-tensor scale_invs in device memory, or block scaling's tiles
// (Fp8Tiles: cuBLASLt's VEC128_32F and BLK128x128_32F scale modes, read
// from the arrays the block cast wrote), fp32 accumulation and fp32
// alpha/beta, C in bf16 (Fp8GemmParams<bf16>: forward, dgrad) or fp32
// (Fp8GemmAccParams<bf16>: wgrad into the main gradients, beta = 1).
//
// As in kernels/gemm/gemm.cu, row-major C (m, n) is cuBLASLt's column-major
// (n, m), so its A is weft's B and the reverse. Weft's A (m, k) and B (n, k)
// with k contiguous are then cuBLASLt's column-major A (k, n) used
// transposed and B (k, m) used as is: the "TN" form, the only one Hopper's
// FP8 kernels take. The scale_invs follow the swap: cuBLASLt's A scale is
// b_scale_inv. cuBLASLt multiplies the fp32 product by alpha and by both
// scales (device pointers read when the kernel runs, so the scales a
// scale-update kernel wrote moments before apply without a host sync).
//
// Plans (descriptors and the heuristic's algorithm) are cached per thread
// as gemm.cu does, keyed by everything the heuristic reads; the scale
// pointers change from call to call and are set on the cached descriptor
// just before each cublasLtMatmul, which reads them at the call.
//
// What this backend supports (check): sm_89 or newer (FP8 tensor cores);
// n and k multiples of 16, m too under tiles (a tensor-scaled product takes
// any m: PyTorch's scaled GEMM relaxed the same rule on cuBLASLt); lda, ldb
// and ldc's row bytes multiples of 16 and every pointer 16-byte aligned
// (cuBLASLt's FP8 requirements, kept here so supports() answers before a
// launch fails). k = 0 is C = beta C through the bf16 gemm's path, which
// reads neither operand.
#include <map>
#include <tuple>
#include <unordered_map>

#include "kernels/cuda_common.cuh"
#include "kernels/fp8/fp8_check.h"
#include "kernels/fp8/fp8_ops.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm_lt.cuh"

namespace weft::kernels {
namespace {

// What both params structs describe, C's type aside.
struct Fp8GemmView {
  int64_t m, n, k;
  float alpha, beta;
  const void* a;  // (m, k)
  int64_t lda;
  Fp8Format a_format;
  const float* a_scale_inv;
  Fp8Tiles a_tiles;
  const void* b;  // (n, k)
  int64_t ldb;
  Fp8Format b_format;
  const float* b_scale_inv;
  Fp8Tiles b_tiles;
  void* c;  // (m, n); bf16 or fp32
  int64_t ldc;
  Fp8Accumulation accumulation;
  cudaDataType_t c_type;
  int64_t c_bytes;  // of one element
};

template <typename P>
Fp8GemmView view(const P& p, cudaDataType_t c_type, int64_t c_bytes) {
  return {p.m,       p.n,         p.k,       float(p.alpha), float(p.beta),  p.a,
          p.lda,     p.a_format,  p.a_scale_inv, p.a_tiles,  p.b,            p.ldb,
          p.b_format, p.b_scale_inv, p.b_tiles, p.c,          p.ldc,          p.accumulation,
          c_type,    c_bytes};
}
Fp8GemmView view(const Fp8GemmParams<bf16>& p) { return view(p, CUDA_R_16BF, 2); }
Fp8GemmView view(const Fp8GemmAccParams<bf16>& p) { return view(p, CUDA_R_32F, 4); }

cudaDataType_t lt_type(Fp8Format f) { return f == Fp8Format::e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }

// Whether the current device has FP8 tensor cores (compute capability 8.9
// or newer), asked once per device and thread. No device: false.
bool device_has_fp8() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  static thread_local std::unordered_map<int, bool> known;
  if (auto it = known.find(device); it != known.end()) return it->second;
  int major = 0, minor = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return known[device] = major * 10 + minor >= 89;
}

Status view_check(const Fp8GemmView& p, Status rules) {
  if (rules != Status::ok) return rules;
  if (p.m == 0 || p.n == 0 || p.k == 0) return Status::ok;
  // m (the rows of A and C) is free under per-tensor scales: cuBLASLt's FP8
  // kernels ask only that the k-contiguous rows and C's rows be 16-byte
  // multiples; block-scaled products keep whole 16-row groups.
  if ((p.a_tiles != Fp8Tiles::tensor && p.m % 16) || p.n % 16 || p.k % 16 || p.lda % 16 || p.ldb % 16 ||
      (p.ldc * p.c_bytes) % 16)
    return Status::unsupported;
  if (!gpu::aligned16(p.a) || !gpu::aligned16(p.b) || !gpu::aligned16(p.c)) return Status::unsupported;
  // Block-scaled kernels: whole 128-wide runs of k, scale arrays read in place.
  if (p.a_tiles != Fp8Tiles::tensor &&
      (p.k % 128 || !gpu::aligned16(p.a_scale_inv) || !gpu::aligned16(p.b_scale_inv)))
    return Status::unsupported;
  return device_has_fp8() ? Status::ok : Status::unsupported;
}

using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, int, int, int,
                           uint32_t, uint32_t, uint32_t, int64_t>;

// cuBLASLt's scale mode for an operand's tiles (Fp8Tiles' layouts are its).
int32_t lt_scale_mode(Fp8Tiles t) {
  switch (t) {
    case Fp8Tiles::row128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case Fp8Tiles::block128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    case Fp8Tiles::tensor: break;
  }
  return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A, B, C (= D)
  cublasLtMatmulAlgo_t algo{};
  bool found = false;
};

std::map<PlanKey, Plan>& thread_plans() {
  static thread_local auto* plans = new std::map<PlanKey, Plan>;
  return *plans;
}

void set_scales(cublasLtMatmulDesc_t op, const Fp8GemmView& p) {
  const void* lt_a_scale = p.b_scale_inv;  // cuBLASLt's A is weft's B
  const void* lt_b_scale = p.a_scale_inv;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &lt_a_scale,
                                              sizeof lt_a_scale));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &lt_b_scale,
                                              sizeof lt_b_scale));
}

Plan& plan_for(cublasLtHandle_t handle, int device, const Fp8GemmView& p, int64_t ws_bytes) {
  const uint32_t align_a = gpu::lt_alignment(p.b), align_b = gpu::lt_alignment(p.a);
  const uint32_t align_c = gpu::lt_alignment(p.c);
  const PlanKey key{device,
                    p.m,
                    p.n,
                    p.k,
                    p.lda,
                    p.ldb,
                    p.ldc,
                    int(p.a_format),
                    int(p.b_format),
                    int(p.c_type),
                    int(p.accumulation),
                    int(p.a_tiles),
                    int(p.b_tiles),
                    align_a,
                    align_b,
                    align_c,
                    ws_bytes};
  auto& plans = thread_plans();
  if (auto it = plans.find(key); it != plans.end()) return it->second;

  Plan plan;
  const cublasOperation_t op_a = CUBLAS_OP_T, op_b = CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  const int8_t fast = p.accumulation == Fp8Accumulation::fast ? 1 : 0;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
  if (p.a_tiles != Fp8Tiles::tensor) {
    // cuBLASLt's A is weft's B: its scale mode is b_tiles'.
    const int32_t mode_a = lt_scale_mode(p.b_tiles), mode_b = lt_scale_mode(p.a_tiles);
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof mode_a));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof mode_b));
  }
  set_scales(plan.op, p);
  // Column-major: cuBLASLt's A is weft's B as (k, n), its B weft's A as (k, m), C weft's C as (n, m).
  plan.a = gpu::lt_layout(lt_type(p.b_format), p.k, p.n, p.ldb);
  plan.b = gpu::lt_layout(lt_type(p.a_format), p.k, p.m, p.lda);
  plan.c = gpu::lt_layout(p.c_type, p.n, p.m, p.ldc);

  plan.found =
      gpu::lt_pick(handle, plan.op, plan.a, plan.b, plan.c, ws_bytes, align_a, align_b, align_c, &plan.algo);
  return plans.emplace(key, plan).first->second;
}

Status run_view(const Fp8GemmView& p, Workspace ws, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return Status::ok;
  if (p.k == 0) {
    // C = beta C: the bf16 gemm's k = 0 path, which reads no operand.
    const Stream s = make_cuda_stream(stream);
    if (p.c_type == CUDA_R_16BF)
      return launch(GemmParams<bf16>{.m = p.m,
                                     .n = p.n,
                                     .k = 0,
                                     .alpha = p.alpha,
                                     .beta = p.beta,
                                     .lda = 1,
                                     .ldb = p.n,
                                     .c = static_cast<bf16*>(p.c),
                                     .ldc = p.ldc},
                    Workspace{}, s);
    return launch(GemmAccParams<bf16>{.m = p.m,
                                      .n = p.n,
                                      .k = 0,
                                      .alpha = p.alpha,
                                      .beta = p.beta,
                                      .lda = 1,
                                      .ldb = p.n,
                                      .c = static_cast<float*>(p.c),
                                      .ldc = p.ldc},
                  Workspace{}, s);
  }
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const cublasLtHandle_t handle = gpu::lt_handle(device);
  gpu::LtScratch scratch = gpu::lt_scratch(ws);
  // cuBLASLt refuses FP8 scales that are not 16-byte aligned (an H200 with
  // cuBLAS 13 answered NOT_SUPPORTED to a heuristic's own plan when a scale
  // sat 4 bytes into an array): such scales are copied, in stream order, to
  // the last 256 bytes of the scratch. The trainer's scaling table keeps
  // each scale_inv on a 16-byte boundary (memory::kFp8ScaleInvStride), so
  // its GEMMs copy nothing.
  Fp8GemmView staged_view = p;
  const auto aligned16 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  if (p.a_tiles == Fp8Tiles::tensor && (!aligned16(p.a_scale_inv) || !aligned16(p.b_scale_inv))) {
    constexpr int64_t kScaleBytes = 256;
    if (scratch.bytes < 2 * kScaleBytes) return Status::unsupported;
    scratch.bytes -= kScaleBytes;
    float* staged = reinterpret_cast<float*>(static_cast<char*>(scratch.data) + scratch.bytes);
    CUDA_CHECK(cudaMemcpyAsync(staged, p.a_scale_inv, sizeof(float), cudaMemcpyDeviceToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(staged + 4, p.b_scale_inv, sizeof(float), cudaMemcpyDeviceToDevice, stream));
    staged_view.a_scale_inv = staged;
    staged_view.b_scale_inv = staged + 4;
  }
  Plan& plan = plan_for(handle, device, staged_view, scratch.bytes);
  if (!plan.found) return Status::unsupported;
  set_scales(plan.op, staged_view);
  const cublasStatus_t status = cublasLtMatmul(handle, plan.op, &p.alpha, p.b, plan.a, p.a, plan.b, &p.beta, p.c,
                                               plan.c, p.c, plan.c, &plan.algo, scratch.data,
                                               size_t(scratch.bytes), stream);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED)
    throw std::runtime_error(
        "cuBLASLt refused the FP8 GEMM its own heuristic chose: m " + std::to_string(p.m) + " n " +
        std::to_string(p.n) + " k " + std::to_string(p.k) + " lda " + std::to_string(p.lda) + " ldb " +
        std::to_string(p.ldb) + " ldc " + std::to_string(p.ldc) + ", a " + to_string(p.a_format) + " b " +
        to_string(p.b_format) + ", C " + (p.c_type == CUDA_R_32F ? "fp32" : "bf16") + " beta " +
        std::to_string(p.beta) + ", alignment a/b/c " + std::to_string(gpu::lt_alignment(p.a)) + "/" +
        std::to_string(gpu::lt_alignment(p.b)) + "/" + std::to_string(gpu::lt_alignment(p.c)) + " bytes, " +
        "workspace " + std::to_string(scratch.bytes) + " bytes at alignment " +
        std::to_string(gpu::lt_alignment(scratch.data)) + ", " + to_string(p.accumulation) + " accumulation, scales " +
        to_string(p.a_tiles) + "/" + to_string(p.b_tiles));
  CUBLAS_CHECK(status);
  WEFT_LAUNCH_CHECK(stream, "cublasLtMatmul (fp8)");
  return Status::ok;
}

int64_t scratch_view(const Fp8GemmView& p) {
  return p.m == 0 || p.n == 0 || p.k == 0 ? 0 : gpu::kLtWorkspace + gpu::kLtAlign;
}

Status check(const Fp8GemmParams<bf16>& p) { return view_check(view(p), fp8_detail::params_check(p)); }
Status check(const Fp8GemmAccParams<bf16>& p) { return view_check(view(p), fp8_detail::params_check(p)); }
int64_t scratch(const Fp8GemmParams<bf16>& p) { return scratch_view(view(p)); }
int64_t scratch(const Fp8GemmAccParams<bf16>& p) { return scratch_view(view(p)); }
Status run(const Fp8GemmParams<bf16>& p, Workspace ws, cudaStream_t stream) {
  return run_view(view(p), ws, stream);
}
Status run(const Fp8GemmAccParams<bf16>& p, Workspace ws, cudaStream_t stream) {
  return run_view(view(p), ws, stream);
}

}  // namespace

WEFT_CUDA_INSTANTIATE(Fp8GemmParams)
WEFT_CUDA_INSTANTIATE(Fp8GemmAccParams)

bool fp8_gemm_available(Backend backend, std::string* device) {
  if (backend == Backend::cpu) {
    if (device) *device = "the CPU";
    return true;
  }
  int id = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&id) != cudaSuccess || cudaGetDeviceProperties(&prop, id) != cudaSuccess) {
    (void)cudaGetLastError();
    if (device) *device = "no CUDA device";
    return false;
  }
  if (device) *device = std::string(prop.name) + " (compute capability " + std::to_string(prop.major) + "." +
                        std::to_string(prop.minor) + ")";
  return device_has_fp8();
}

}  // namespace weft::kernels
