// gemm on CUDA through cuBLASLt: bf16 A and B, fp32 accumulation and fp32
// alpha/beta, C in bf16 (GemmParams<bf16>) or fp32 (GemmAccParams<bf16>,
// weight gradients accumulating into fp32 main gradients).
//
// cuBLASLt is column-major, weft row-major. A row-major (m, n) C is the
// column-major (n, m) matrix C^T = op(B)^T op(A)^T, so the call swaps the
// operands (cuBLASLt's A is weft's B and the reverse) and keeps each one's
// transpose flag; no data moves. Strided batches map onto the layouts' batch
// count and strides, so a batch is one cuBLASLt call.
//
// cuBLASLt picks a kernel by heuristic for the shape, the leading dimensions
// and the pointers' alignment. That query costs tens of microseconds, so each
// thread keeps a plan per (device, shape, alignment) with its descriptors and
// chosen algorithm, and a repeated GEMM (every step repeats every shape)
// costs one cublasLtMatmul call. The alignment is part of the key because a
// kernel chosen for 16-byte aligned operands must not see a less aligned one.
//
// With beta = 0, C is not read (cuBLAS's documented contract, so NaN there
// does not propagate); k = 0 is done here as C = beta * C, which cuBLASLt
// does not accept.
#include <climits>
#include <map>
#include <tuple>
#include <unordered_map>

#include "kernels/cuda_common.cuh"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm_check.h"
#include "kernels/gemm/gemm_lt.cuh"

namespace weft::kernels {
namespace {

using gpu::kLtAlign;
using gpu::kLtWorkspace;

// What both params structs describe, C's type aside.
struct GemmView {
  Trans trans_a, trans_b;
  int64_t m, n, k;
  float alpha, beta;
  const void* a;  // (m, k), or (k, m) when trans_a; bf16
  int64_t lda;
  const void* b;  // (k, n), or (n, k) when trans_b; bf16
  int64_t ldb;
  void* c;  // (m, n); bf16 or fp32
  int64_t ldc;
  int64_t batch, stride_a, stride_b, stride_c;
  cudaDataType_t c_type;
  int64_t c_bytes;  // of one element
};

template <typename P>
GemmView view(const P& p, cudaDataType_t c_type, int64_t c_bytes) {
  return {p.trans_a, p.trans_b, p.m, p.n, p.k, float(p.alpha), float(p.beta),
          p.a, p.lda, p.b, p.ldb, p.c, p.ldc, p.batch, p.stride_a, p.stride_b, p.stride_c,
          c_type, c_bytes};
}

GemmView view(const GemmParams<bf16>& p) { return view(p, CUDA_R_16BF, 2); }
GemmView view(const GemmAccParams<bf16>& p) { return view(p, CUDA_R_32F, 4); }

using PlanKey = std::tuple<int, int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int64_t, int64_t, int64_t, int64_t, int, uint32_t, uint32_t, uint32_t,
                           int64_t>;

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A, B, C (= D)
  cublasLtMatmulAlgo_t algo{};
  bool found = false;
};

// The thread's plans. They live until the process ends, as the handles do
// (gemm_lt.cuh).
std::map<PlanKey, Plan>& thread_plans() {
  static thread_local auto* plans = new std::map<PlanKey, Plan>;
  return *plans;
}

const Plan& plan_for(cublasLtHandle_t handle, int device, const GemmView& p, int64_t ws_bytes) {
  const uint32_t align_a = gpu::lt_alignment(p.b, p.batch, p.stride_b * 2);  // cuBLASLt's A is weft's B
  const uint32_t align_b = gpu::lt_alignment(p.a, p.batch, p.stride_a * 2);
  const uint32_t align_c = gpu::lt_alignment(p.c, p.batch, p.stride_c * p.c_bytes);
  const PlanKey key{device, int(p.trans_a), int(p.trans_b), p.m, p.n, p.k, p.lda, p.ldb, p.ldc,
                    p.batch, p.stride_a, p.stride_b, p.stride_c, int(p.c_type), align_a, align_b,
                    align_c, ws_bytes};
  auto& plans = thread_plans();
  if (auto it = plans.find(key); it != plans.end()) return it->second;

  Plan plan;
  const cublasOperation_t op_a = p.trans_b == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = p.trans_a == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  // Column-major: cuBLASLt's A is weft's B seen as (n, k) or (k, n), its B is
  // weft's A seen as (k, m) or (m, k), and C is weft's C seen as (n, m).
  plan.a = p.trans_b == Trans::no ? gpu::lt_layout(CUDA_R_16BF, p.n, p.k, p.ldb, p.batch, p.stride_b)
                                  : gpu::lt_layout(CUDA_R_16BF, p.k, p.n, p.ldb, p.batch, p.stride_b);
  plan.b = p.trans_a == Trans::no ? gpu::lt_layout(CUDA_R_16BF, p.k, p.m, p.lda, p.batch, p.stride_a)
                                  : gpu::lt_layout(CUDA_R_16BF, p.m, p.k, p.lda, p.batch, p.stride_a);
  plan.c = gpu::lt_layout(p.c_type, p.n, p.m, p.ldc, p.batch, p.stride_c);

  plan.found =
      gpu::lt_pick(handle, plan.op, plan.a, plan.b, plan.c, ws_bytes, align_a, align_b, align_c, &plan.algo);
  return plans.emplace(key, plan).first->second;
}

// C = beta * C for k = 0 (beta = 0 writes zeros, so NaN does not survive).
template <typename T>
__global__ void __launch_bounds__(gpu::kElementwiseThreads)
    scale_c_kernel(int64_t batch, int64_t m, int64_t n, int64_t ldc, int64_t stride_c, float beta,
                   T* c) {  // (batch, m, n) with ldc and stride_c
  const int64_t total = batch * m * n, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t j = idx % n, i = (idx / n) % m, b = idx / (m * n);
    T& e = c[b * stride_c + i * ldc + j];
    if constexpr (sizeof(T) == 2) {
      e = gpu::to_bf16(beta == 0.0f ? 0.0f : beta * gpu::to_float(e));
    } else {
      e = beta == 0.0f ? 0.0f : beta * e;
    }
  }
}

Status run_view(const GemmView& p, Workspace ws, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return Status::ok;
  if (p.k == 0) {
    const int64_t total = p.batch * p.m * p.n;
    const int64_t blocks = gpu::grid_blocks(total, gpu::kElementwiseThreads);
    if (p.c_type == CUDA_R_16BF)
      scale_c_kernel<<<blocks, gpu::kElementwiseThreads, 0, stream>>>(
          p.batch, p.m, p.n, p.ldc, p.stride_c, p.beta, static_cast<gpu::nv_bf16*>(p.c));
    else
      scale_c_kernel<<<blocks, gpu::kElementwiseThreads, 0, stream>>>(
          p.batch, p.m, p.n, p.ldc, p.stride_c, p.beta, static_cast<float*>(p.c));
    WEFT_LAUNCH_CHECK(stream, "scale_c_kernel");
    return Status::ok;
  }
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const cublasLtHandle_t handle = gpu::lt_handle(device);
  // The workspace rounded up to cuBLASLt's preferred 256-byte alignment.
  const gpu::LtScratch scratch = gpu::lt_scratch(ws);
  const Plan& plan = plan_for(handle, device, p, scratch.bytes);
  if (!plan.found) return Status::unsupported;
  CUBLAS_CHECK(cublasLtMatmul(handle, plan.op, &p.alpha, p.b, plan.a, p.a, plan.b, &p.beta, p.c,
                              plan.c, p.c, plan.c, &plan.algo, scratch.data, size_t(scratch.bytes),
                              stream));
  WEFT_LAUNCH_CHECK(stream, "cublasLtMatmul");
  return Status::ok;
}

int64_t scratch_view(const GemmView& p) {
  return p.m == 0 || p.n == 0 || p.k == 0 ? 0 : kLtWorkspace + kLtAlign;
}

// The shared rules (gemm_check.h); cuBLASLt takes 64-bit sizes and a 32-bit batch.
template <typename P>
Status lt_check(const P& p) {
  if (Status s = params_check(p); s != Status::ok) return s;
  return p.batch > INT_MAX ? Status::unsupported : Status::ok;
}
Status check(const GemmParams<bf16>& p) { return lt_check(p); }
Status check(const GemmAccParams<bf16>& p) { return lt_check(p); }
int64_t scratch(const GemmParams<bf16>& p) { return scratch_view(view(p)); }
int64_t scratch(const GemmAccParams<bf16>& p) { return scratch_view(view(p)); }
Status run(const GemmParams<bf16>& p, Workspace ws, cudaStream_t stream) {
  return run_view(view(p), ws, stream);
}
Status run(const GemmAccParams<bf16>& p, Workspace ws, cudaStream_t stream) {
  return run_view(view(p), ws, stream);
}

}  // namespace

cublasLtHandle_t gpu::lt_handle(int device) {
  static thread_local auto* handles = new std::unordered_map<int, cublasLtHandle_t>;
  auto it = handles->find(device);
  if (it == handles->end()) {
    cublasLtHandle_t h = nullptr;
    CUBLAS_CHECK(cublasLtCreate(&h));
    it = handles->emplace(device, h).first;
  }
  return it->second;
}

WEFT_CUDA_INSTANTIATE(GemmParams)
WEFT_CUDA_INSTANTIATE(GemmAccParams)

}  // namespace weft::kernels
