// gemm: row-major C = alpha * op(A) * op(B) + beta * C, optionally strided-
// batched. Training uses three forms per linear layer (forward, dgrad, wgrad);
// the linear_*_gemm helpers build them for Hugging Face weights (out, in).
//
// alpha and beta are Acc<Elem>: the element type for fp32 and fp64, fp32 for
// bf16, since the CUDA backend hands them to cuBLASLt as its fp32 scale type
// and a bf16 alpha would round values such as 1/3 before the product.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/kernel.h"

namespace weft::kernels {

enum class Trans { no, yes };

// m, n, k describe the product, not the dimension letters of the model:
// op(A) is (m, k), op(B) is (k, n), C is (m, n). Matrices are row-major with
// leading dimensions (elements between consecutive rows) lda, ldb, ldc. With
// beta = 0, C is not read (NaN in it does not propagate). batch > 1 repeats
// the product with the pointers advanced by the strides (elements); the C
// matrices of a batch must not overlap.
template <typename Elem>
struct GemmParams {
  Trans trans_a = Trans::no;
  Trans trans_b = Trans::no;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  Acc<Elem> alpha = 1;
  Acc<Elem> beta = 0;
  const Elem* a = nullptr;  // (m, k), or (k, m) when trans_a
  int64_t lda = 0;
  const Elem* b = nullptr;  // (k, n), or (n, k) when trans_b
  int64_t ldb = 0;
  Elem* c = nullptr;  // (m, n)
  int64_t ldc = 0;
  int64_t batch = 1;
  int64_t stride_a = 0;
  int64_t stride_b = 0;
  int64_t stride_c = 0;
};

// The same product with C in the accumulator type: A and B in Elem, C in
// Acc<Elem>. Weight gradients use it (linear_wgrad_gemm): on the GPU bf16
// activations and output gradients accumulate (beta = 1) straight into the
// fp32 main gradients, with no bf16 copy of dW rounded once per micro-batch. Every
// field means what it means in GemmParams. For fp32 and fp64 it is GemmParams.
template <typename Elem>
struct GemmAccParams {
  Trans trans_a = Trans::no;
  Trans trans_b = Trans::no;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  Acc<Elem> alpha = 1;
  Acc<Elem> beta = 0;
  const Elem* a = nullptr;  // (m, k), or (k, m) when trans_a
  int64_t lda = 0;
  const Elem* b = nullptr;  // (k, n), or (n, k) when trans_b
  int64_t ldb = 0;
  Acc<Elem>* c = nullptr;  // (m, n)
  int64_t ldc = 0;
  int64_t batch = 1;
  int64_t stride_a = 0;
  int64_t stride_b = 0;
  int64_t stride_c = 0;
};

// Workspace: none on the CPU; on CUDA, cuBLASLt's scratch (kernels/gemm/gemm.cu).
template <typename Elem>
bool supports(const GemmParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const GemmParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const GemmParams<Elem>& p, Workspace ws, Stream stream = {});

template <typename Elem>
bool supports(const GemmAccParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const GemmAccParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const GemmAccParams<Elem>& p, Workspace ws, Stream stream = {});

// A grouped GEMM: `count` independent products launched as one (an MoE
// layer's experts, each over its own rows, so each entry has its own m or k).
// Each entry is a GemmParams of its own, with batch 1: sizes, pointers,
// leading dimensions, alpha and beta. The list lives in host memory, the
// matrices where the backend's do; no two entries' C may overlap. On the
// CPU the entries run one after another. On CUDA they go to cuBLAS's grouped
// GEMM (cublasGemmGroupedBatchedEx) in one call, each entry a group of one,
// the device pointer arrays staged through the workspace; where cuBLAS has
// no grouped kernel for the types (it answers not supported), each entry
// goes to cuBLASLt as a GEMM of its own, as before.
template <typename Elem>
struct GroupedGemmParams {
  const GemmParams<Elem>* gemms = nullptr;  // (count), host memory
  int64_t count = 0;
};

// The same with C in the accumulator type (the experts' weight gradients
// into fp32 main gradients): entries as GemmAccParams.
template <typename Elem>
struct GroupedGemmAccParams {
  const GemmAccParams<Elem>* gemms = nullptr;  // (count), host memory
  int64_t count = 0;
};

// The grouped form of a GEMM's params: GroupedOf<GemmParams<E>> is
// GroupedGemmParams<E>, GroupedOf<GemmAccParams<E>> GroupedGemmAccParams<E>.
template <typename P>
struct GroupedOfT;
template <typename Elem>
struct GroupedOfT<GemmParams<Elem>> {
  using type = GroupedGemmParams<Elem>;
};
template <typename Elem>
struct GroupedOfT<GemmAccParams<Elem>> {
  using type = GroupedGemmAccParams<Elem>;
};
template <typename P>
using GroupedOf = typename GroupedOfT<P>::type;

template <typename Elem>
bool supports(const GroupedGemmParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const GroupedGemmParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const GroupedGemmParams<Elem>& p, Workspace ws, Stream stream = {});

template <typename Elem>
bool supports(const GroupedGemmAccParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const GroupedGemmAccParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const GroupedGemmAccParams<Elem>& p, Workspace ws, Stream stream = {});

// The CUDA grouped GEMM's workspace for `count` entries: cuBLASLt's scratch
// (for entries it runs alone) and the three device pointer arrays, each
// 256-byte aligned. The memory model sizes scratch.gemm with it.
inline constexpr int64_t kGroupedGemmPointerAlign = 256;
inline int64_t grouped_gemm_pointer_bytes(int64_t count) {
  const int64_t one = (count * 8 + kGroupedGemmPointerAlign - 1) / kGroupedGemmPointerAlign * kGroupedGemmPointerAlign;
  return 3 * one;
}

// A linear layer y = x W^T over `rows` tokens with weight W (out, in).

// Forward: y = x W^T.
template <typename Elem>
GemmParams<Elem> linear_forward_gemm(int64_t rows, int64_t in, int64_t out,
                                     const Elem* x,  // (rows, in)
                                     const Elem* w,  // (out, in)
                                     Elem* y,        // (rows, out)
                                     Write write = Write::overwrite) {
  return {.trans_a = Trans::no, .trans_b = Trans::yes, .m = rows, .n = out, .k = in,
          .alpha = Acc<Elem>(1), .beta = write == Write::accumulate ? Acc<Elem>(1) : Acc<Elem>(0),
          .a = x, .lda = in, .b = w, .ldb = in, .c = y, .ldc = out};
}

// Data gradient: dx = dy W; accumulate when several linears read the same x
// (q, k, v projections; gate and up).
template <typename Elem>
GemmParams<Elem> linear_dgrad_gemm(int64_t rows, int64_t in, int64_t out,
                                   const Elem* dy,  // (rows, out)
                                   const Elem* w,   // (out, in)
                                   Elem* dx,        // (rows, in)
                                   Write write = Write::overwrite) {
  return {.trans_a = Trans::no, .trans_b = Trans::no, .m = rows, .n = in, .k = out,
          .alpha = Acc<Elem>(1), .beta = write == Write::accumulate ? Acc<Elem>(1) : Acc<Elem>(0),
          .a = dy, .lda = out, .b = w, .ldb = in, .c = dx, .ldc = in};
}

// The GEMM of a weight gradient in G: GemmAccParams when G is Acc<Elem> (the
// fp32 main gradients of bf16 compute; the element type itself in fp32 and
// fp64), GemmParams when the gradients are in the element type, bf16
// (grad:bf16): cuBLASLt then reads dW in bf16, adds the fp32 product and
// rounds once per call.
template <typename Elem, typename G>
using WgradGemmParams =
    std::conditional_t<std::is_same_v<G, Acc<Elem>>, GemmAccParams<Elem>, GemmParams<Elem>>;

// Weight gradient: dW += dy^T x, accumulating over micro-batches by default,
// into the gradients, which are in Acc (fp32 under bf16 compute) or, with
// bf16 gradients, in Elem.
template <typename Elem, typename G = Acc<Elem>>
WgradGemmParams<Elem, G> linear_wgrad_gemm(int64_t rows, int64_t in, int64_t out,
                                           const Elem* dy,  // (rows, out)
                                           const Elem* x,   // (rows, in)
                                           G* dw,           // (out, in)
                                           Write write = Write::accumulate) {
  static_assert(std::is_same_v<G, Acc<Elem>> || std::is_same_v<G, Elem>);
  return {.trans_a = Trans::yes, .trans_b = Trans::no, .m = out, .n = in, .k = rows,
          .alpha = Acc<Elem>(1), .beta = write == Write::accumulate ? Acc<Elem>(1) : Acc<Elem>(0),
          .a = dy, .lda = out, .b = x, .ldb = in, .c = dw, .ldc = in};
}

}  // namespace weft::kernels
