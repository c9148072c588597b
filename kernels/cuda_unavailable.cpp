// The bf16 protocol functions of every kernel family in a build without CUDA
// (kernels/CMakeLists.txt compiles this file instead of the .cu files): bf16
// runs only on the CUDA backend, so each one refuses. The symbols exist so
// that code written for both backends (the trainer's GPU path, the tuner's
// "would this run?") links and runs in a CPU-only build and gets a clear
// answer: supports() false, no workspace, launch() Status::unsupported.
//
// A family's <family>.cu defines the same specializations in CUDA builds;
// a new params struct with a bf16 CUDA launch gets a line here as well.
#include "kernels/adamw/adamw.h"
#include "kernels/attention/attention.h"
#include "kernels/cross_entropy/cross_entropy.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/elementwise/elementwise_fp32_cuda.h"
#include "kernels/embedding/embedding.h"
#include "kernels/fp8/fp8_ops.h"
#include "kernels/gemm/gemm.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/swiglu/swiglu.h"
#include "kernels/dropout/dropout.h"
#include "kernels/lazy_library.h"
#include "kernels/moe/moe.h"

namespace weft::kernels {

bool cublas_loaded() { return false; }

#define WEFT_CUDA_UNAVAILABLE(Params)                                                \
  template <>                                                                        \
  bool supports<bf16>(const Params<bf16>&, Backend) {                                \
    return false;                                                                    \
  }                                                                                  \
  template <>                                                                        \
  int64_t workspace_bytes<bf16>(const Params<bf16>&, Backend) {                      \
    return 0;                                                                        \
  }                                                                                  \
  template <>                                                                        \
  Status launch<bf16>(const Params<bf16>&, Workspace, Stream) {                      \
    return Status::unsupported;                                                      \
  }

WEFT_CUDA_UNAVAILABLE(GemmParams)
WEFT_CUDA_UNAVAILABLE(GemmAccParams)
WEFT_CUDA_UNAVAILABLE(GroupedGemmParams)
WEFT_CUDA_UNAVAILABLE(GroupedGemmAccParams)
WEFT_CUDA_UNAVAILABLE(AttentionForwardParams)
WEFT_CUDA_UNAVAILABLE(AttentionBackwardParams)
WEFT_CUDA_UNAVAILABLE(AttentionMergeParams)
WEFT_CUDA_UNAVAILABLE(RmsnormForwardParams)
WEFT_CUDA_UNAVAILABLE(RmsnormBackwardParams)
WEFT_CUDA_UNAVAILABLE(RmsnormUnfusedForwardParams)
WEFT_CUDA_UNAVAILABLE(RmsnormUnfusedBackwardParams)
WEFT_CUDA_UNAVAILABLE(RopeParams)
WEFT_CUDA_UNAVAILABLE(SwigluForwardParams)
WEFT_CUDA_UNAVAILABLE(SwigluBackwardParams)
WEFT_CUDA_UNAVAILABLE(DropoutParams)
WEFT_CUDA_UNAVAILABLE(EmbeddingForwardParams)
WEFT_CUDA_UNAVAILABLE(EmbeddingBackwardParams)
WEFT_CUDA_UNAVAILABLE(CrossEntropyMaxParams)
WEFT_CUDA_UNAVAILABLE(CrossEntropySumExpParams)
WEFT_CUDA_UNAVAILABLE(CrossEntropyLossGradParams)
WEFT_CUDA_UNAVAILABLE(AdamwParams)
WEFT_CUDA_UNAVAILABLE(AddParams)
WEFT_CUDA_UNAVAILABLE(ScaleParams)
WEFT_CUDA_UNAVAILABLE(AxpyParams)
WEFT_CUDA_UNAVAILABLE(FillParams)
WEFT_CUDA_UNAVAILABLE(SumSquaresParams)
WEFT_CUDA_UNAVAILABLE(WidenParams)
WEFT_CUDA_UNAVAILABLE(NarrowParams)
WEFT_CUDA_UNAVAILABLE(Fp8CastParams)
WEFT_CUDA_UNAVAILABLE(Fp8BlockCastParams)
WEFT_CUDA_UNAVAILABLE(Fp8AmaxParams)
WEFT_CUDA_UNAVAILABLE(MoeRouteParams)
WEFT_CUDA_UNAVAILABLE(MoeRouteBackwardParams)
WEFT_CUDA_UNAVAILABLE(MoePermuteParams)
WEFT_CUDA_UNAVAILABLE(MoePermuteBackwardParams)
WEFT_CUDA_UNAVAILABLE(MoeUnpermuteParams)
WEFT_CUDA_UNAVAILABLE(MoeUnpermuteBackwardParams)
WEFT_CUDA_UNAVAILABLE(Fp8ScaleUpdateParams)
WEFT_CUDA_UNAVAILABLE(Fp8GemmParams)
WEFT_CUDA_UNAVAILABLE(Fp8GemmAccParams)

// The bf16-gradient forms (grad:bf16) of the params with a gradient type.
#define WEFT_CUDA_UNAVAILABLE_BF16_GRAD(Params)                                      \
  template <>                                                                        \
  bool supports<bf16, bf16>(const Params<bf16, bf16>&, Backend) {                    \
    return false;                                                                    \
  }                                                                                  \
  template <>                                                                        \
  int64_t workspace_bytes<bf16, bf16>(const Params<bf16, bf16>&, Backend) {          \
    return 0;                                                                        \
  }                                                                                  \
  template <>                                                                        \
  Status launch<bf16, bf16>(const Params<bf16, bf16>&, Workspace, Stream) {          \
    return Status::unsupported;                                                      \
  }

WEFT_CUDA_UNAVAILABLE_BF16_GRAD(RmsnormBackwardParams)
WEFT_CUDA_UNAVAILABLE_BF16_GRAD(RmsnormUnfusedBackwardParams)
WEFT_CUDA_UNAVAILABLE_BF16_GRAD(EmbeddingBackwardParams)
WEFT_CUDA_UNAVAILABLE_BF16_GRAD(AdamwParams)

// No CUDA backend: the CPU's kinds only (attention_cpu.cpp has no cudnn).
bool attention_available(AttentionKind kind, Backend backend) {
  return backend == Backend::cpu && kind != AttentionKind::cudnn;
}
int64_t cudnn_graph_workspace(const AttentionForwardParams<bf16>&) { return -1; }
int64_t cudnn_graph_workspace(const AttentionBackwardParams<bf16>&) { return -1; }

// No CUDA backend: FP8 GEMMs on the CPU only.
bool fp8_gemm_available(Backend backend, std::string* device) {
  if (device) *device = backend == Backend::cpu ? "the CPU" : "a build without CUDA";
  return backend == Backend::cpu;
}

namespace fp32_cuda {
bool available() { return false; }
Status launch(const FillParams<float>&, Workspace, Stream) { return Status::unsupported; }
Status launch(const AxpyParams<float>&, Workspace, Stream) { return Status::unsupported; }
Status launch(const ScaleParams<float>&, Workspace, Stream) { return Status::unsupported; }
Status launch(const SumSquaresParams<float>&, Workspace, Stream) { return Status::unsupported; }
}  // namespace fp32_cuda

#undef WEFT_CUDA_UNAVAILABLE
#undef WEFT_CUDA_UNAVAILABLE_BF16_GRAD

}  // namespace weft::kernels
