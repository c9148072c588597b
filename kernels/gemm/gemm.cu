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
// A grouped GEMM (an MoE layer's experts) is one cublasGemmGroupedBatchedEx
// call, each entry a group of one in the same column-major view, with the
// device pointer arrays written by a small kernel from its arguments (no
// host copy, so the host never waits). cuBLAS documents its grouped kernels
// for bf16 in and out; where it answers "not supported" (bf16 in, fp32 out:
// the weight gradients into fp32 main gradients) the entries go to
// cuBLASLt one by one.
//
// With beta = 0, C is not read (cuBLAS's documented contract, so NaN there
// does not propagate); k = 0 is done here as C = beta * C, which cuBLASLt
// does not accept.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <string>
#include <cstddef>
#include <map>
#include <tuple>
#include <unordered_map>
#include <vector>

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

// WEFT_GEMM_TUNE=1: a new plan times cuBLASLt's candidate algorithms for
// its shape (up to kTuneCandidates the heuristic offers) on the call's own
// operands and keeps the fastest, where the heuristic's first is otherwise
// taken. Off by default until a GPU run has measured it (benchmarks/
// bench_gpu_kernels' pct_of_cublas_best, its target 95%). The choice is the
// process's: a resumed run may choose again, and two algorithms may round
// differently.
constexpr int kTuneCandidates = 8;
constexpr int kTuneRuns = 3;
// Device memory left free beside the copy of C the timing keeps.
constexpr int64_t kTuneHeadroom = int64_t{256} << 20;

bool gemm_tune() {
  static const bool on = [] {
    const char* v = std::getenv("WEFT_GEMM_TUNE");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
}

// The fastest of `algos` for the call (the median of kTuneRuns launches
// after one warm-up each), on its own operands and stream; the candidates
// write C, so C's extent is copied aside first and back after. -1 where it
// cannot time them: too little free memory for the copy, or no candidate
// that runs.
int fastest(cublasLtHandle_t handle, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
            cublasLtMatrixLayout_t lc, const cublasLtMatmulAlgo_t* algos, int count, const GemmView& p,
            gpu::LtScratch scratch, cudaStream_t stream) {
  const int64_t extent = ((p.batch - 1) * p.stride_c + (p.m - 1) * p.ldc + p.n) * p.c_bytes;
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (int64_t(free_bytes) < extent + kTuneHeadroom) return -1;
  void* saved = nullptr;
  CUDA_CHECK(cudaMallocAsync(&saved, size_t(extent), stream));
  CUDA_CHECK(cudaMemcpyAsync(saved, p.c, size_t(extent), cudaMemcpyDeviceToDevice, stream));
  cudaEvent_t start = nullptr, stop = nullptr;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  int best = -1;
  float best_ms = 0;
  for (int i = 0; i < count; ++i) {
    const auto launch_one = [&] {
      return cublasLtMatmul(handle, op, &p.alpha, p.b, la, p.a, lb, &p.beta, p.c, lc, p.c, lc, &algos[i],
                            scratch.data, size_t(scratch.bytes), stream);
    };
    if (launch_one() != CUBLAS_STATUS_SUCCESS) continue;  // the warm-up; a candidate that fails is passed over
    std::vector<float> ms;
    for (int r = 0; r < kTuneRuns; ++r) {
      CUDA_CHECK(cudaEventRecord(start, stream));
      CUBLAS_CHECK(launch_one());
      CUDA_CHECK(cudaEventRecord(stop, stream));
      CUDA_CHECK(cudaEventSynchronize(stop));
      float t = 0;
      CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    if (best < 0 || ms[ms.size() / 2] < best_ms) best = i, best_ms = ms[ms.size() / 2];
  }
  CUDA_CHECK(cudaMemcpyAsync(p.c, saved, size_t(extent), cudaMemcpyDeviceToDevice, stream));
  CUDA_CHECK(cudaFreeAsync(saved, stream));
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  return best;
}

// The thread's plans. They live until the process ends, as the handles do
// (gemm_lt.cuh).
std::map<PlanKey, Plan>& thread_plans() {
  static thread_local auto* plans = new std::map<PlanKey, Plan>;
  return *plans;
}

const Plan& plan_for(cublasLtHandle_t handle, int device, const GemmView& p, gpu::LtScratch scratch,
                     cudaStream_t stream) {
  const int64_t ws_bytes = scratch.bytes;
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
  if (plan.found && gemm_tune()) {
    cublasLtMatmulAlgo_t algos[kTuneCandidates];
    const int count = gpu::lt_candidates(handle, plan.op, plan.a, plan.b, plan.c, ws_bytes, align_a, align_b,
                                         align_c, kTuneCandidates, algos);
    if (count > 1)
      if (const int best = fastest(handle, plan.op, plan.a, plan.b, plan.c, algos, count, p, scratch, stream);
          best >= 0)
        plan.algo = algos[best];
  }
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
  const Plan& plan = plan_for(handle, device, p, scratch, stream);
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

// ------------------------------------------------------------ grouped

// The pointer arrays go to the device by kernel argument, a chunk of
// kPointerChunk entries per launch (3 KiB of arguments, within the 4 KiB
// every device takes): stream-ordered, so the host never waits for the
// stream, and the workspace may be reused by the next call.
constexpr int kPointerChunk = 128;
struct PointerChunk {
  const void* a[kPointerChunk];  // cuBLAS's A (weft's B)
  const void* b[kPointerChunk];  // cuBLAS's B (weft's A)
  void* c[kPointerChunk];
  int64_t count;
};

__global__ void pointer_chunk_kernel(PointerChunk chunk, const void** a, const void** b, void** c) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= chunk.count) return;
  a[i] = chunk.a[i];
  b[i] = chunk.b[i];
  c[i] = chunk.c[i];
}

// Types cuBLAS answered "not supported" for in a grouped call (bf16 in,
// C's type): those entries run one by one through cuBLASLt from then on.
std::atomic<bool>& grouped_unsupported(cudaDataType_t c_type) {
  static std::atomic<bool> bf16_c{false}, fp32_c{false};
  return c_type == CUDA_R_16BF ? bf16_c : fp32_c;
}

// The entries that reach cuBLAS in one call: those with a non-empty C and
// k > 0 (k = 0 is C = beta * C, which run_view does alone).
template <typename Entry>
Status run_grouped(const Entry* gemms, int64_t count, Workspace ws, cudaStream_t stream) {
  if (count == 0) return Status::ok;
  const cudaDataType_t c_type = view(gemms[0]).c_type;
  const int64_t pointer_bytes = grouped_gemm_pointer_bytes(count);
  const Workspace lt{static_cast<std::byte*>(ws.data) + pointer_bytes, ws.bytes - pointer_bytes};
  std::vector<GemmView> grouped;
  for (int64_t i = 0; i < count; ++i) {
    const GemmView v = view(gemms[i]);
    if (v.m == 0 || v.n == 0) continue;
    if (v.k == 0 || grouped_unsupported(c_type)) {
      if (Status s = run_view(v, lt, stream); s != Status::ok) return s;
      continue;
    }
    grouped.push_back(v);
  }
  if (grouped.empty()) return Status::ok;
  const int64_t n = int64_t(grouped.size());
  // cuBLAS is column-major: each entry as run_view hands it to cuBLASLt,
  // weft's B as cuBLAS's A, (n, m) for C.
  const auto count_n = static_cast<size_t>(n);
  std::vector<cublasOperation_t> ta(count_n), tb(count_n);
  std::vector<int64_t> m(count_n), nn(count_n), k(count_n), lda(count_n), ldb(count_n), ldc(count_n),
      size(count_n, 1);
  std::vector<float> alpha(count_n), beta(count_n);
  for (int64_t i = 0; i < n; ++i) {
    const GemmView& v = grouped[size_t(i)];
    ta[size_t(i)] = v.trans_b == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
    tb[size_t(i)] = v.trans_a == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
    m[size_t(i)] = v.n;
    nn[size_t(i)] = v.m;
    k[size_t(i)] = v.k;
    lda[size_t(i)] = v.ldb;
    ldb[size_t(i)] = v.lda;
    ldc[size_t(i)] = v.ldc;
    alpha[size_t(i)] = v.alpha;
    beta[size_t(i)] = v.beta;
  }
  const int64_t one = pointer_bytes / 3;
  auto* dev_a = reinterpret_cast<const void**>(ws.data);
  auto* dev_b = reinterpret_cast<const void**>(static_cast<std::byte*>(ws.data) + one);
  auto* dev_c = reinterpret_cast<void**>(static_cast<std::byte*>(ws.data) + 2 * one);
  for (int64_t at = 0; at < n; at += kPointerChunk) {
    PointerChunk chunk{};
    chunk.count = std::min<int64_t>(kPointerChunk, n - at);
    for (int64_t j = 0; j < chunk.count; ++j) {
      const GemmView& v = grouped[size_t(at + j)];
      chunk.a[j] = v.b;
      chunk.b[j] = v.a;
      chunk.c[j] = v.c;
    }
    pointer_chunk_kernel<<<1, kPointerChunk, 0, stream>>>(chunk, dev_a + at, dev_b + at, dev_c + at);
    WEFT_LAUNCH_CHECK(stream, "pointer_chunk_kernel");
  }
  const cublasStatus_t status = cublasGemmGroupedBatchedEx_64(
      gpu::cublas_handle(stream), ta.data(), tb.data(), m.data(), nn.data(), k.data(), alpha.data(), dev_a,
      CUDA_R_16BF, lda.data(), dev_b, CUDA_R_16BF, ldb.data(), beta.data(), dev_c, c_type, ldc.data(), n,
      size.data(), CUBLAS_COMPUTE_32F);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) {
    grouped_unsupported(c_type) = true;
    for (const GemmView& v : grouped)
      if (Status s = run_view(v, lt, stream); s != Status::ok) return s;
    return Status::ok;
  }
  CUBLAS_CHECK(status);
  WEFT_LAUNCH_CHECK(stream, "cublasGemmGroupedBatchedEx");
  return Status::ok;
}

template <typename P>
Status grouped_lt_check(const P& p) {
  Status s = grouped_check(p);
  for (int64_t i = 0; s == Status::ok && i < p.count; ++i) s = lt_check(p.gemms[i]);
  return s;
}
Status check(const GroupedGemmParams<bf16>& p) { return grouped_lt_check(p); }
Status check(const GroupedGemmAccParams<bf16>& p) { return grouped_lt_check(p); }
int64_t scratch(const GroupedGemmParams<bf16>& p) {
  return grouped_gemm_pointer_bytes(p.count) + kLtWorkspace + kLtAlign;
}
int64_t scratch(const GroupedGemmAccParams<bf16>& p) {
  return grouped_gemm_pointer_bytes(p.count) + kLtWorkspace + kLtAlign;
}
Status run(const GroupedGemmParams<bf16>& p, Workspace ws, cudaStream_t stream) {
  return run_grouped(p.gemms, p.count, ws, stream);
}
Status run(const GroupedGemmAccParams<bf16>& p, Workspace ws, cudaStream_t stream) {
  return run_grouped(p.gemms, p.count, ws, stream);
}

}  // namespace

cublasHandle_t gpu::cublas_handle(cudaStream_t stream) {
  static thread_local auto* handles = new std::unordered_map<int, cublasHandle_t>;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  auto it = handles->find(device);
  if (it == handles->end()) {
    cublasHandle_t h = nullptr;
    CUBLAS_CHECK(cublasCreate(&h));
    it = handles->emplace(device, h).first;
  }
  CUBLAS_CHECK(cublasSetStream(it->second, stream));
  return it->second;
}

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
WEFT_CUDA_INSTANTIATE(GroupedGemmParams)
WEFT_CUDA_INSTANTIATE(GroupedGemmAccParams)

}  // namespace weft::kernels
