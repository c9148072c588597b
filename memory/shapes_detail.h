// Internal to memory/: what the files that build the tensor table
// (shapes.cpp, shapes_fp8.cpp, shapes_comm.cpp) share. Not for other layers:
// memory/shapes.h is the table's interface.
#pragma once

#include <cstdint>
#include <vector>

#include "memory/shapes.h"

namespace weft::memory::detail {

inline constexpr int64_t kFp32 = 4;
inline constexpr int64_t kInt32 = 4;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// T is this rank's tokens of a sequence: T / cp under context parallelism
// (Tfull the whole sequence), Tsp those of its norm regions (T / tp more
// under sequence parallelism).
struct Dims {
  int64_t B, T, Tsp, C, Hl, Kl, D, Fl, Vl, a;
  int64_t Tfull, cp;
};
// A layout's dimensions; refuses sizes a 64-bit count cannot hold.
Dims dims(const ModelSpec& m, const RunSpec& run, const Layout& l);

// Elements of the largest block's parameters of the stage on a tp rank (0
// without blocks).
int64_t block_param_elements(const ModelSpec& m, const Layout& l, const StagePlan& plan);

// The token rows an MoE block routes on a rank: its own (B x T / (cp tp)
// under sp), or under sp with an expert tp degree all the tp group's.
int64_t routed_token_rows(const Layout& l, const Dims& d);
// The rows an MoE block's routed experts compute on: those this rank's
// experts receive (MoeSpec::received_rows), and under an expert tp degree
// with sp every tp rank's (gathered).
int64_t moe_expert_input_rows(const ModelSpec& m, const Layout& l, const Dims& d);
// An MoE block's saved tensors past its norm, and the MoE backward's
// scratch (shapes_moe.cpp).
void moe_saved_shapes(const ModelSpec& m, const Layout& l, const Dims& d, std::vector<TensorShape>& out);
void moe_scratch_shapes(const ModelSpec& m, const Layout& l, const LoraSpec& lora, const Dims& d,
                        std::vector<TensorShape>& out);

// The stage's FP8 buffers (shapes_fp8.cpp): quantised weights, the operands
// of the GEMM running, scales and health counts.
void fp8_buffer_shapes(const ModelSpec& m, const RunSpec& run, const Layout& l, const DeviceSpec& device,
                       const StagePlan& plan, const Dims& d, std::vector<TensorShape>& out);

// The stage's communication buffers (shapes_comm.cpp): sequence-parallel
// gathers, pipeline transfers, tied-embedding and ZeRO buffers, and context
// parallelism's exchanges.
void comm_buffer_shapes(const ModelSpec& m, const Layout& l, const StagePlan& plan, const Dims& d,
                        std::vector<TensorShape>& out);

}  // namespace weft::memory::detail
