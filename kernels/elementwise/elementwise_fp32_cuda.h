// The elementwise ops that also run on CUDA in fp32: bf16 training keeps its
// main gradients (and the gradient norm's input) in fp32, and zeroes, adds
// into, scales and sums them on the device. elementwise_cpu.cpp forwards the
// float instantiations of these params here when the stream is a CUDA one;
// elementwise.cu defines them, and kernels/cuda_unavailable.cpp refuses them
// in a build without CUDA. Internal to kernels/.
#pragma once

#include <cstdint>

#include "kernels/elementwise/elementwise.h"

namespace weft::kernels::fp32_cuda {

template <typename P>
inline constexpr bool runs = false;
template <>
inline constexpr bool runs<FillParams<float>> = true;
template <>
inline constexpr bool runs<AxpyParams<float>> = true;
template <>
inline constexpr bool runs<ScaleParams<float>> = true;
template <>
inline constexpr bool runs<SumSquaresParams<float>> = true;

// False in a build without CUDA.
bool available();

// The CPU's params rules apply (elementwise_check.h); SumSquares needs the
// same workspace as on the CPU (one double per kSumChunk elements) and adds
// into *sum in device memory.
Status launch(const FillParams<float>& p, Workspace ws, Stream stream);
Status launch(const AxpyParams<float>& p, Workspace ws, Stream stream);
Status launch(const ScaleParams<float>& p, Workspace ws, Stream stream);
Status launch(const SumSquaresParams<float>& p, Workspace ws, Stream stream);

}  // namespace weft::kernels::fp32_cuda
