// embedding on CUDA, bf16 table and rows, fp32 or bf16 table gradient,
// vocab-parallel.
//
// Forward: one block per token row copies the table row (or writes zeros for
// a token of another shard) in 16-byte pieces; C = 4096 is 512 pieces, one
// per thread. Bytes moved are the minimum, a row read and a row written.
//
// Backward: tokens repeat, so a scatter-add per row would race. Atomic adds
// would resolve the race but sum in an arbitrary order. Instead the rows are
// grouped by token with a stable radix sort of (token, row) pairs (CUB;
// out-of-shard tokens get the key V_local and sort last), and one block per
// run of equal tokens and per 1024-column slice adds its rows' gradients in
// row order to the table gradient, read once and written once. Starting
// from the table entry makes the adds the CPU's own, in its order, so an
// fp32 result is bit-identical to the CPU float backend on the same bf16
// inputs, and a bf16 one (grad:bf16: the sum is kept in fp32 and rounded
// once, at the store) is that result's rounding; deterministic on every run,
// and the dout traffic is the minimum (each row read once). A
// frequent token makes one long run, summed by one block per column slice;
// at a few percent of the rows that costs little next to the GEMMs.
//
// Token ids are checked on the device before anything is written
// (gpu::first_invalid_id, which synchronises the stream), unless the caller
// checked them (ids_checked).
#include <cub/device/device_radix_sort.cuh>
#include <string>

#include "core/error.h"
#include "kernels/cuda_common.cuh"
#include "kernels/embedding/embedding.h"
#include "kernels/embedding/embedding_check.h"

namespace weft::kernels {
namespace {

using gpu::kVec;
using gpu::nv_bf16;

constexpr int kForwardMaxThreads = 512;
constexpr int kSumThreads = 128;
constexpr int kKeyThreads = 256;

// CUB's radix sort scratch for `rows` pairs with double buffers it may
// overwrite, bounded from above: its onesweep path needs digit histograms
// (passes x 256 x 4 bytes), a look-back slot per tile and digit (tiles of at
// least 256 items: at most 4 bytes per item) and counters, each piece
// rounded to 256 bytes. The launch asks CUB for the exact figure and refuses
// to run past this bound, so a CUB whose needs grew fails loudly.
int64_t sort_scratch_bound(int64_t rows) { return (int64_t{64} << 10) + 8 * rows; }

void tokens_check(const gpu::InvalidId& bad, int64_t V) {
  if (bad.position >= 0)
    throw InputError("embedding: token id " + std::to_string(bad.id) + " at position " +
                     std::to_string(bad.position) +
                     " is outside [0, V) for the model's vocabulary size V = " + std::to_string(V));
}

template <bool kVectorized>
__global__ void __launch_bounds__(kForwardMaxThreads)
    embedding_forward_kernel(int64_t C, int64_t vocab_start, int64_t V_local,
                             const int32_t* tokens,  // (rows)
                             const nv_bf16* table,   // (V_local, C)
                             nv_bf16* out) {         // (rows, C)
  const int64_t row = blockIdx.x;
  const int64_t local = int64_t(tokens[row]) - vocab_start;
  // A token of another shard, or an invalid one under graph capture: zeros.
  const bool mine = local >= 0 && local < V_local;
  const nv_bf16* src = table + (mine ? local : 0) * C;
  nv_bf16* dst = out + row * C;
  if constexpr (kVectorized) {
    for (int64_t c = int64_t(threadIdx.x) * kVec; c < C; c += int64_t(blockDim.x) * kVec)
      *reinterpret_cast<uint4*>(dst + c) =
          mine ? *reinterpret_cast<const uint4*>(src + c) : make_uint4(0, 0, 0, 0);
  } else {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dst[c] = mine ? src[c] : gpu::to_bf16(0.0f);
  }
}

// keys[i] = the row's token within the shard, V_local for other shards;
// rows[i] = i.
__global__ void __launch_bounds__(kKeyThreads)
    embedding_keys_kernel(int64_t n, int64_t vocab_start, int64_t V_local,
                          const int32_t* tokens,  // (rows)
                          uint32_t* keys,         // (rows)
                          int32_t* rows) {        // (rows)
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t local = int64_t(tokens[i]) - vocab_start;
    keys[i] = uint32_t(local >= 0 && local < V_local ? local : V_local);
    rows[i] = int32_t(i);
  }
}

// Block (position, column slice): when `position` starts a run of equal keys
// in the sorted order, sum that run's dout rows over the slice (in row order,
// the sort being stable) to the table gradient's row, starting from its value.
// G: float, or nv_bf16 (the fp32 sum rounded once).
template <bool kVectorized, typename G>
__global__ void __launch_bounds__(kSumThreads)
    embedding_sum_runs_kernel(int64_t n, int64_t C, int64_t V_local,
                              const uint32_t* keys,   // (rows) sorted
                              const int32_t* rows,    // (rows) the row of each sorted key
                              const nv_bf16* dout,    // (rows, C)
                              G* dtable) {            // (V_local, C)
  const int64_t position = blockIdx.x;
  const uint32_t key = keys[position];
  if (key >= V_local || (position > 0 && keys[position - 1] == key)) return;
  const int64_t width = kVectorized ? kVec : 1;
  const int64_t c = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * width;
  if (c >= C) return;
  G* dst = dtable + int64_t(key) * C + c;
  if constexpr (kVectorized) {
    gpu::Float8 acc = gpu::load8(dst);
    for (int64_t j = position; j < n && keys[j] == key; ++j) {
      const gpu::Float8 g = gpu::load8(dout + int64_t(rows[j]) * C + c);
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc.v[e] += g.v[e];
    }
    gpu::store8(dst, acc);
  } else {
    float acc = gpu::to_float(*dst);
    for (int64_t j = position; j < n && keys[j] == key; ++j)
      acc += gpu::to_float(dout[int64_t(rows[j]) * C + c]);
    gpu::put(*dst, acc);
  }
}

// The grid limit, then the shared rules (embedding_check.h).
Status check(const EmbeddingForwardParams<bf16>& p) {
  if (p.rows > gpu::kMaxGridX) return Status::unsupported;
  return params_check(p);
}

template <typename G>
Status check(const EmbeddingBackwardParams<bf16, G>& p) {
  if (p.rows > gpu::kMaxGridX) return Status::unsupported;
  return params_check(p);
}

int64_t scratch(const EmbeddingForwardParams<bf16>&) { return gpu::kIdCheckBytes; }

template <typename G>
int64_t scratch(const EmbeddingBackwardParams<bf16, G>& p) {
  return gpu::kIdCheckBytes + 2 * cpu::piece_bytes<uint32_t>(p.rows) +
         2 * cpu::piece_bytes<int32_t>(p.rows) + cpu::align_up(sort_scratch_bound(p.rows));
}

Status run(const EmbeddingForwardParams<bf16>& p, Workspace ws, cudaStream_t stream) {
  if (p.rows == 0) return Status::ok;
  if (!p.ids_checked)
    tokens_check(gpu::first_invalid_id(p.tokens, p.rows, p.V, int64_t{1} << 40, ws.data, stream), p.V);
  const bool vec = p.C % kVec == 0 && gpu::aligned16(p.table) && gpu::aligned16(p.out);
  const int threads = gpu::row_threads(vec ? p.C / kVec : p.C, kForwardMaxThreads);
  if (vec)
    embedding_forward_kernel<true><<<p.rows, threads, 0, stream>>>(
        p.C, p.vocab_start, p.V_local, p.tokens, gpu::dev(p.table), gpu::dev(p.out));
  else
    embedding_forward_kernel<false><<<p.rows, threads, 0, stream>>>(
        p.C, p.vocab_start, p.V_local, p.tokens, gpu::dev(p.table), gpu::dev(p.out));
  WEFT_LAUNCH_CHECK(stream, "embedding_forward_kernel");
  return Status::ok;
}

template <typename G>
Status run(const EmbeddingBackwardParams<bf16, G>& p, Workspace ws, cudaStream_t stream) {
  if (p.rows == 0) return Status::ok;
  // The sum's grid has a block per row and up to 65535 blocks of columns (C up to 8M).
  if (p.C > int64_t{65535} * kSumThreads) return Status::unsupported;
  cpu::WorkspaceCarver carve(ws);
  void* id_scratch = carve.take<std::byte>(gpu::kIdCheckBytes);
  uint32_t* keys_a = carve.take<uint32_t>(p.rows);
  uint32_t* keys_b = carve.take<uint32_t>(p.rows);
  int32_t* rows_a = carve.take<int32_t>(p.rows);
  int32_t* rows_b = carve.take<int32_t>(p.rows);
  void* sort_scratch = carve.take<std::byte>(sort_scratch_bound(p.rows));

  if (!p.ids_checked)
    tokens_check(gpu::first_invalid_id(p.tokens, p.rows, p.V, int64_t{1} << 40, id_scratch, stream), p.V);

  embedding_keys_kernel<<<gpu::grid_blocks(p.rows, kKeyThreads), kKeyThreads, 0, stream>>>(
      p.rows, p.vocab_start, p.V_local, p.tokens, keys_a, rows_a);
  WEFT_LAUNCH_CHECK(stream, "embedding_keys_kernel");

  // Keys run up to V_local (the other-shard key), so that many bits sort them.
  int end_bit = 1;
  while ((int64_t{1} << end_bit) <= p.V_local) ++end_bit;
  cub::DoubleBuffer<uint32_t> keys(keys_a, keys_b);
  cub::DoubleBuffer<int32_t> rows(rows_a, rows_b);
  size_t needed = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, needed, keys, rows, p.rows, 0, end_bit, stream));
  if (int64_t(needed) > sort_scratch_bound(p.rows))
    throw InternalError("embedding backward: CUB's radix sort asks for " + std::to_string(needed) +
                        " bytes of scratch for " + std::to_string(p.rows) + " rows, more than the " +
                        std::to_string(sort_scratch_bound(p.rows)) +
                        " bytes workspace_bytes() counted");
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_scratch, needed, keys, rows, p.rows, 0, end_bit,
                                             stream));
  WEFT_LAUNCH_CHECK(stream, "cub::DeviceRadixSort::SortPairs");

  const bool vec = p.C % kVec == 0 && gpu::aligned16(p.dout) && gpu::aligned16(p.dtable);
  const int64_t columns_per_block = int64_t(kSumThreads) * (vec ? kVec : 1);
  const int64_t column_blocks = (p.C + columns_per_block - 1) / columns_per_block;
  const dim3 grid(unsigned(p.rows), unsigned(column_blocks));
  if (vec)
    embedding_sum_runs_kernel<true><<<grid, kSumThreads, 0, stream>>>(
        p.rows, p.C, p.V_local, keys.Current(), rows.Current(), gpu::dev(p.dout), gpu::dev(p.dtable));
  else
    embedding_sum_runs_kernel<false><<<grid, kSumThreads, 0, stream>>>(
        p.rows, p.C, p.V_local, keys.Current(), rows.Current(), gpu::dev(p.dout), gpu::dev(p.dtable));
  WEFT_LAUNCH_CHECK(stream, "embedding_sum_runs_kernel");
  return Status::ok;
}

}  // namespace

WEFT_CUDA_INSTANTIATE(EmbeddingForwardParams)
WEFT_CUDA_INSTANTIATE(EmbeddingBackwardParams)
WEFT_CUDA_INSTANTIATE_BF16_GRAD(EmbeddingBackwardParams)

}  // namespace weft::kernels
