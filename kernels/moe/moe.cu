// moe on CUDA: bf16 tokens and logits, fp32 scores and weights, int64
// counts and positions, all in device memory (offsets and the dropped count
// too: a caller that sizes its expert GEMMs on the host copies offsets back).
//
// route: one warp per token. Each lane holds the scores of experts lane,
// lane + 32, ... (E <= 256 here: 8 per lane; larger E is unsupported), the
// softmax's max and sum are warp butterflies, and the k choices are k warp
// arg-maxes over the logits (ties: the lower index, as on the CPU). Token
// counts are integer atomics (exact in any order); each expert's score sum is
// one block's fixed-order reduction over the tokens, in double.
//
// permute numbers each expert's choices in token order without a sort:
// 1. count: every chunk of kChunk choices counts its choices per expert;
// 2. scan: per expert, the chunks' exclusive prefix (each chunk's first rank
//    in that expert), the experts' totals, the kept counts under the capacity
//    and the offsets;
// 3. rank: each chunk walks its choices in 32-wide steps; lanes choosing the
//    same expert find each other with __match_any_sync, rank among
//    themselves by lane, and the lowest of them advances the expert's count.
//    A choice's rank within its expert is its position there; past the
//    capacity it is dropped (-1);
// 4. copy: each kept choice's token row into its place, scaled by its weight
//    where the gate applies to the input.
// An expert id outside [0, E) (route never writes one) is dropped without a
// word: checking would need a synchronisation per layer.
// The unpermutes and the backwards are one block per token row, the weights'
// gradients block reductions over C in a fixed order.
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda_common.cuh"
#include "kernels/moe/moe.h"
#include "kernels/moe/moe_check.h"

namespace weft::kernels {
namespace {

using gpu::nv_bf16;
using gpu::to_bf16;
using gpu::to_float;

constexpr int kWarp = 32;
constexpr int kMaxPerLane = 8;  // experts a lane scores: E <= 256
constexpr int64_t kMaxRouteExperts = int64_t{kWarp} * kMaxPerLane;
constexpr int kRouteWarps = 8;  // tokens per block of route
constexpr int64_t kChunk = 1024;  // choices a permute block numbers
constexpr int kSumThreads = 256;
constexpr int kRowThreads = 256;

// The larger of two (value, index) pairs: the higher value, the lower index
// on a tie. An index of -1 loses to everything.
__device__ __forceinline__ void arg_max(float& v, int& i, float ov, int oi) {
  if (oi < 0) return;
  if (i < 0 || ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

__global__ void __launch_bounds__(kRouteWarps* kWarp)
    route_kernel(int64_t rows, int E, int k, bool softmax, bool renormalize, float scale,
                 const nv_bf16* logits,  // (rows, E)
                 float* scores,          // (rows, E)
                 int32_t* experts,       // (rows, k)
                 float* weights,         // (rows, k)
                 unsigned long long* counts) {  // (E)
  const int lane = threadIdx.x % kWarp;
  const int64_t t = int64_t(blockIdx.x) * kRouteWarps + threadIdx.x / kWarp;
  if (t >= rows) return;  // whole warps leave together
  const int per_lane = (E + kWarp - 1) / kWarp;
  float z[kMaxPerLane], s[kMaxPerLane];
  float top = -INFINITY;
#pragma unroll
  for (int m = 0; m < kMaxPerLane; ++m) {
    const int e = lane + m * kWarp;
    z[m] = m < per_lane && e < E ? to_float(logits[t * E + e]) : -INFINITY;
    top = fmaxf(top, z[m]);
  }
  if (softmax) {
    top = gpu::warp_reduce(top, gpu::MaxOp{});
    float sum = 0;
#pragma unroll
    for (int m = 0; m < kMaxPerLane; ++m) {
      const int e = lane + m * kWarp;
      s[m] = m < per_lane && e < E ? expf(z[m] - top) : 0.0f;
      sum += s[m];
    }
    sum = gpu::warp_reduce(sum, gpu::SumOp{});
#pragma unroll
    for (int m = 0; m < kMaxPerLane; ++m) s[m] /= sum;
  } else {
#pragma unroll
    for (int m = 0; m < kMaxPerLane; ++m) s[m] = 1.0f / (1.0f + expf(-z[m]));
  }
#pragma unroll
  for (int m = 0; m < kMaxPerLane; ++m) {
    const int e = lane + m * kWarp;
    if (m < per_lane && e < E) scores[t * E + e] = s[m];
  }
  unsigned taken = 0;  // bit m: expert lane + 32 m chosen
  float chosen_sum = 0, chosen_score[kMaxPerLane];
  for (int j = 0; j < k; ++j) {
    float v = 0;
    int best = -1;
#pragma unroll
    for (int m = 0; m < kMaxPerLane; ++m) {
      const int e = lane + m * kWarp;
      if (m < per_lane && e < E && !(taken >> m & 1u)) arg_max(v, best, z[m], e);
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, offset);
      const int oi = __shfl_xor_sync(0xffffffffu, best, offset);
      arg_max(v, best, ov, oi);
    }
    // The owner of the winner marks it and hands out its score.
    float score = 0;
#pragma unroll
    for (int m = 0; m < kMaxPerLane; ++m)
      if (best == lane + m * kWarp) {
        taken |= 1u << m;
        score = s[m];
      }
    score = __shfl_sync(0xffffffffu, score, best % kWarp);
    if (j < kMaxPerLane) chosen_score[j] = score;
    chosen_sum += score;
    if (lane == 0) {
      experts[t * k + j] = best;
      weights[t * k + j] = score;
      atomicAdd(counts + best, 1ull);
    }
  }
  // The weights: lane 0 rescales what it wrote (k > 8 reads them back).
  if (lane == 0)
    for (int j = 0; j < k; ++j) {
      const float w = j < kMaxPerLane ? chosen_score[j] : weights[t * k + j];
      weights[t * k + j] = scale * (renormalize ? w / chosen_sum : w);
    }
}

// score_sums[e] += sum over the rows of scores[t, e]: one block per expert.
__global__ void __launch_bounds__(kSumThreads)
    score_sum_kernel(int64_t rows, int E, const float* scores, double* score_sums) {
  const int e = blockIdx.x;
  double sum = 0;
  for (int64_t t = threadIdx.x; t < rows; t += blockDim.x) sum += double(scores[t * E + e]);
  sum = gpu::block_reduce(sum, gpu::SumOp{}, 0.0);
  if (threadIdx.x == 0) score_sums[e] += sum;
}

__global__ void __launch_bounds__(kRouteWarps* kWarp)
    route_backward_kernel(int64_t rows, int E, int k, bool softmax, bool renormalize, float scale,
                          const float* scores,           // (rows, E)
                          const int32_t* experts,        // (rows, k)
                          const float* dweights,         // (rows, k)
                          const double* dscore_per_expert,  // (E) or null
                          nv_bf16* dlogits) {            // (rows, E)
  const int lane = threadIdx.x % kWarp;
  const int64_t t = int64_t(blockIdx.x) * kRouteWarps + threadIdx.x / kWarp;
  if (t >= rows) return;
  const int per_lane = (E + kWarp - 1) / kWarp;
  float s[kMaxPerLane], ds[kMaxPerLane];
#pragma unroll
  for (int m = 0; m < kMaxPerLane; ++m) {
    const int e = lane + m * kWarp;
    const bool mine = m < per_lane && e < E;
    s[m] = mine ? scores[t * E + e] : 0.0f;
    ds[m] = mine && dscore_per_expert ? float(dscore_per_expert[e]) : 0.0f;
  }
  // Every lane walks the k choices (k is small) and adds to the ones it owns.
  float sum = 0, weighted = 0;
  if (renormalize) {
    for (int j = 0; j < k; ++j) {
      const float sj = scores[t * E + experts[t * k + j]];
      sum += sj;
      weighted += dweights[t * k + j] * sj;
    }
    weighted /= sum;
  }
  for (int j = 0; j < k; ++j) {
    const int e = experts[t * k + j];
    if (e % kWarp != lane) continue;
    const float dw = dweights[t * k + j];
    const float add = renormalize ? scale / sum * (dw - weighted) : scale * dw;
#pragma unroll
    for (int m = 0; m < kMaxPerLane; ++m) ds[m] += m == e / kWarp ? add : 0.0f;
  }
  float dot = 0;
  if (softmax) {
#pragma unroll
    for (int m = 0; m < kMaxPerLane; ++m) dot += ds[m] * s[m];
    dot = gpu::warp_reduce(dot, gpu::SumOp{});
  }
#pragma unroll
  for (int m = 0; m < kMaxPerLane; ++m) {
    const int e = lane + m * kWarp;
    if (m < per_lane && e < E)
      dlogits[t * E + e] = to_bf16(softmax ? s[m] * (ds[m] - dot) : ds[m] * s[m] * (1.0f - s[m]));
  }
}

// The expert of choice i, or -1 when out of range (dropped).
__device__ __forceinline__ int expert_at(const int32_t* expert_of, int64_t i, int64_t E) {
  const int32_t e = expert_of[i];
  return e >= 0 && e < E ? e : -1;
}

// 1. block b counts its chunk's choices per expert: chunk_counts[e * chunks + b].
__global__ void __launch_bounds__(kWarp)
    permute_count_kernel(int64_t n, int64_t E, int64_t chunks, const int32_t* expert_of, int32_t* chunk_counts) {
  extern __shared__ int32_t shared_counts[];  // (E)
  const int64_t b = blockIdx.x;
  for (int64_t e = threadIdx.x; e < E; e += kWarp) shared_counts[e] = 0;
  __syncwarp();
  const int64_t lo = b * kChunk, hi = lo + kChunk < n ? lo + kChunk : n;
  for (int64_t i = lo + threadIdx.x; i < hi; i += kWarp) {
    const int e = expert_at(expert_of, i, E);
    if (e >= 0) atomicAdd(shared_counts + e, 1);
  }
  __syncwarp();
  for (int64_t e = threadIdx.x; e < E; e += kWarp) chunk_counts[e * chunks + b] = shared_counts[e];
}

// 2. per expert: the chunks' counts become exclusive prefixes (in place),
// the total goes to totals[e]; then one thread lays out the kept rows.
__global__ void __launch_bounds__(kRowThreads)
    permute_scan_kernel(int64_t E, int64_t chunks, int64_t capacity, int32_t* chunk_counts, int64_t* totals,
                        int64_t* offsets, int64_t* dropped) {
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int64_t running = 0;
    for (int64_t b = 0; b < chunks; ++b) {
      const int32_t c = chunk_counts[e * chunks + b];
      chunk_counts[e * chunks + b] = int32_t(running);
      running += c;
    }
    totals[e] = running;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t lost = 0;
    offsets[0] = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t kept = capacity > 0 && totals[e] > capacity ? capacity : totals[e];
      offsets[e + 1] = offsets[e] + kept;
      lost += totals[e] - kept;
    }
    if (dropped) *dropped += lost;
  }
}

// 3. block b ranks its chunk's choices within their experts, in order.
__global__ void __launch_bounds__(kWarp)
    permute_rank_kernel(int64_t n, int64_t E, int64_t chunks, int64_t capacity, const int32_t* expert_of,
                        const int32_t* chunk_counts, const int64_t* offsets, int64_t* position) {
  extern __shared__ int32_t running[];  // (E): ranks given so far in each expert
  const int64_t b = blockIdx.x;
  const int lane = threadIdx.x;
  for (int64_t e = lane; e < E; e += kWarp) running[e] = chunk_counts[e * chunks + b];
  __syncwarp();
  const int64_t lo = b * kChunk, hi = lo + kChunk < n ? lo + kChunk : n;
  for (int64_t base = lo; base < hi; base += kWarp) {
    const int64_t i = base + lane;
    // Lanes past the end take a value no expert has, and write nothing.
    const int e = i < hi ? expert_at(expert_of, i, E) : -2;
    const unsigned same = __match_any_sync(0xffffffffu, e);
    const int below = __popc(same & ((1u << lane) - 1u));
    const int rank = e >= 0 ? running[e] + below : 0;
    __syncwarp();
    if (e >= 0 && below == 0) running[e] += __popc(same);
    __syncwarp();
    if (i < hi) position[i] = e >= 0 && (capacity == 0 || rank < capacity) ? offsets[e] + rank : -1;
  }
}

// 4. out[position[i]] = x[i / k] (times weights[i] with the gate on the
// input), and row_weights[position[i]] = weights[i] where asked.
__global__ void __launch_bounds__(kRowThreads)
    permute_copy_kernel(int64_t n, int64_t C, int64_t k, bool gated, const int64_t* position,
                        const float* weights, const nv_bf16* x, nv_bf16* out, float* row_weights) {
  const int64_t i = blockIdx.x;
  const int64_t pos = position[i];
  if (pos < 0) return;
  if (row_weights && threadIdx.x == 0) row_weights[pos] = weights[i];
  const nv_bf16* src = x + (i / k) * C;
  nv_bf16* dst = out + pos * C;
  const float w = gated ? weights[i] : 1.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dst[c] = gated ? to_bf16(w * to_float(src[c])) : src[c];
}

// Row t of out = (out[t] +) the sum over its kept choices of src[pos[j]],
// each times weights[t, j] unless weights is null (the block's threads
// across C): the unpermute, and the permute's backward for dx.
__device__ void combine_row(int64_t t, int64_t C, int64_t k, const int64_t* pos, const float* weights,
                            const nv_bf16* src, nv_bf16* out, bool add) {
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float sum = add ? to_float(out[t * C + c]) : 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      if (pos[j] < 0) continue;
      const float v = to_float(src[pos[j] * C + c]);
      sum += weights ? weights[t * k + j] * v : v;
    }
    out[t * C + c] = to_bf16(sum);
  }
}

__global__ void __launch_bounds__(kRowThreads)
    permute_backward_kernel(int64_t C, int64_t k, bool gated, bool add, const int64_t* position,
                            const float* weights, const nv_bf16* x, const nv_bf16* dout, nv_bf16* dx,
                            float* dweights, const float* row_dweights) {
  const int64_t t = blockIdx.x;
  const int64_t* pos = position + t * k;
  if (row_dweights && threadIdx.x == 0)
    for (int64_t j = 0; j < k; ++j) dweights[t * k + j] = pos[j] >= 0 ? row_dweights[pos[j]] : 0.0f;
  if (gated)
    for (int64_t j = 0; j < k; ++j) {
      float dot = 0;
      if (pos[j] >= 0)
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
          dot += to_float(x[t * C + c]) * to_float(dout[pos[j] * C + c]);
      dot = gpu::block_reduce(dot, gpu::SumOp{}, 0.0f);
      if (threadIdx.x == 0) dweights[t * k + j] = dot;
    }
  combine_row(t, C, k, pos, gated ? weights : nullptr, dout, dx, add);
}

__global__ void __launch_bounds__(kRowThreads)
    unpermute_kernel(int64_t C, int64_t k, bool weighted, bool add, const int64_t* position, const float* weights,
                     const nv_bf16* y, nv_bf16* out) {
  const int64_t t = blockIdx.x;
  combine_row(t, C, k, position + t * k, weighted ? weights : nullptr, y, out, add);
}

__global__ void __launch_bounds__(kRowThreads)
    unpermute_backward_kernel(int64_t C, int64_t k, bool weighted, const int64_t* position, const float* weights,
                              const nv_bf16* y, const nv_bf16* dout, nv_bf16* dy, float* dweights) {
  const int64_t t = blockIdx.x;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t pos = position[t * k + j];
    if (pos < 0) {
      if (weighted && threadIdx.x == 0) dweights[t * k + j] = 0;
      continue;
    }
    const float w = weighted ? weights[t * k + j] : 1.0f;
    float dot = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float g = to_float(dout[t * C + c]);
      if (weighted) dot += to_float(y[pos * C + c]) * g;
      dy[pos * C + c] = to_bf16(w * g);
    }
    if (weighted) {
      dot = gpu::block_reduce(dot, gpu::SumOp{}, 0.0f);
      if (threadIdx.x == 0) dweights[t * k + j] = dot;
    }
  }
}

int64_t chunks_of(int64_t n) { return (n + kChunk - 1) / kChunk; }

// Route and its backward: at most 256 experts (a lane's 8), token rows
// within one grid.
Status check(const MoeRouteParams<bf16>& p) {
  if (Status s = params_check(p); s != Status::ok) return s;
  return p.router.experts <= kMaxRouteExperts && p.rows / kRouteWarps < gpu::kMaxGridX ? Status::ok
                                                                                      : Status::unsupported;
}
Status check(const MoeRouteBackwardParams<bf16>& p) {
  if (Status s = params_check(p); s != Status::ok) return s;
  return p.router.experts <= kMaxRouteExperts && p.rows / kRouteWarps < gpu::kMaxGridX ? Status::ok
                                                                                      : Status::unsupported;
}
// Permute: int32 ranks within an expert, the experts' counters in one
// block's shared memory (48 KiB: 12,288 experts), a block per choice.
Status check(const MoePermuteParams<bf16>& p) {
  if (Status s = params_check(p); s != Status::ok) return s;
  const int64_t n = p.rows * p.top_k;
  return n < (int64_t{1} << 31) && p.experts <= 12288 ? Status::ok : Status::unsupported;
}
Status check(const MoePermuteBackwardParams<bf16>& p) {
  if (Status s = params_check(p); s != Status::ok) return s;
  return p.rows <= gpu::kMaxGridX ? Status::ok : Status::unsupported;
}
Status check(const MoeUnpermuteParams<bf16>& p) {
  if (Status s = params_check(p); s != Status::ok) return s;
  return p.rows <= gpu::kMaxGridX ? Status::ok : Status::unsupported;
}
Status check(const MoeUnpermuteBackwardParams<bf16>& p) {
  if (Status s = params_check(p); s != Status::ok) return s;
  return p.rows <= gpu::kMaxGridX ? Status::ok : Status::unsupported;
}

int64_t scratch(const MoeRouteParams<bf16>&) { return 0; }
int64_t scratch(const MoeRouteBackwardParams<bf16>&) { return 0; }
// The chunks' counts (E x chunks) and the experts' totals.
int64_t scratch(const MoePermuteParams<bf16>& p) {
  return cpu::piece_bytes<int32_t>(p.experts * chunks_of(p.rows * p.top_k)) + cpu::piece_bytes<int64_t>(p.experts);
}
int64_t scratch(const MoePermuteBackwardParams<bf16>&) { return 0; }
int64_t scratch(const MoeUnpermuteParams<bf16>&) { return 0; }
int64_t scratch(const MoeUnpermuteBackwardParams<bf16>&) { return 0; }

int route_blocks(int64_t rows) { return int((rows + kRouteWarps - 1) / kRouteWarps); }

Status run(const MoeRouteParams<bf16>& p, Workspace, cudaStream_t stream) {
  if (p.rows == 0) return Status::ok;
  const RouterConfig& r = p.router;
  route_kernel<<<route_blocks(p.rows), kRouteWarps * kWarp, 0, stream>>>(
      p.rows, int(r.experts), int(r.top_k), r.score == RouterScore::softmax, r.weights == RouterWeights::renormalized,
      float(r.scale), gpu::dev(p.logits), p.scores, p.experts, p.weights,
      reinterpret_cast<unsigned long long*>(p.counts));
  gpu::launch_check(stream, "moe_route", __FILE__, __LINE__);
  if (p.score_sums) {
    score_sum_kernel<<<int(r.experts), kSumThreads, 0, stream>>>(p.rows, int(r.experts), p.scores, p.score_sums);
    gpu::launch_check(stream, "moe_route score sums", __FILE__, __LINE__);
  }
  return Status::ok;
}

Status run(const MoeRouteBackwardParams<bf16>& p, Workspace, cudaStream_t stream) {
  if (p.rows == 0) return Status::ok;
  const RouterConfig& r = p.router;
  route_backward_kernel<<<route_blocks(p.rows), kRouteWarps * kWarp, 0, stream>>>(
      p.rows, int(r.experts), int(r.top_k), r.score == RouterScore::softmax, r.weights == RouterWeights::renormalized,
      float(r.scale), p.scores, p.experts, p.dweights, p.dscore_per_expert, gpu::dev(p.dlogits));
  gpu::launch_check(stream, "moe_route_backward", __FILE__, __LINE__);
  return Status::ok;
}

Status run(const MoePermuteParams<bf16>& p, Workspace ws, cudaStream_t stream) {
  const int64_t n = p.rows * p.top_k, E = p.experts, chunks = chunks_of(n);
  cpu::WorkspaceCarver carve(ws);
  int32_t* chunk_counts = carve.take<int32_t>(E * chunks);
  int64_t* totals = carve.take<int64_t>(E);
  const size_t shared = size_t(E) * sizeof(int32_t);
  if (chunks > 0) {
    permute_count_kernel<<<int(chunks), kWarp, shared, stream>>>(n, E, chunks, p.expert_of, chunk_counts);
    gpu::launch_check(stream, "moe_permute count", __FILE__, __LINE__);
  }
  permute_scan_kernel<<<1, kRowThreads, 0, stream>>>(E, chunks, p.capacity, chunk_counts, totals, p.offsets,
                                                     p.dropped);
  gpu::launch_check(stream, "moe_permute scan", __FILE__, __LINE__);
  if (chunks == 0) return Status::ok;
  permute_rank_kernel<<<int(chunks), kWarp, shared, stream>>>(n, E, chunks, p.capacity, p.expert_of, chunk_counts,
                                                              p.offsets, p.position);
  gpu::launch_check(stream, "moe_permute rank", __FILE__, __LINE__);
  permute_copy_kernel<<<unsigned(n), gpu::row_threads(p.C, kRowThreads), 0, stream>>>(
      n, p.C, p.top_k, p.gate == GateOn::input, p.position, p.weights, gpu::dev(p.x), gpu::dev(p.out),
      p.row_weights);
  gpu::launch_check(stream, "moe_permute copy", __FILE__, __LINE__);
  return Status::ok;
}

Status run(const MoePermuteBackwardParams<bf16>& p, Workspace, cudaStream_t stream) {
  if (p.rows == 0) return Status::ok;
  permute_backward_kernel<<<unsigned(p.rows), gpu::row_threads(p.C, kRowThreads), 0, stream>>>(
      p.C, p.top_k, p.gate == GateOn::input, p.write == Write::accumulate, p.position, p.weights, gpu::dev(p.x),
      gpu::dev(p.dout), gpu::dev(p.dx), p.dweights, p.row_dweights);
  gpu::launch_check(stream, "moe_permute_backward", __FILE__, __LINE__);
  return Status::ok;
}

Status run(const MoeUnpermuteParams<bf16>& p, Workspace, cudaStream_t stream) {
  if (p.rows == 0) return Status::ok;
  unpermute_kernel<<<unsigned(p.rows), gpu::row_threads(p.C, kRowThreads), 0, stream>>>(
      p.C, p.top_k, p.gate == GateOn::output, p.write == Write::accumulate, p.position, p.weights, gpu::dev(p.y),
      gpu::dev(p.out));
  gpu::launch_check(stream, "moe_unpermute", __FILE__, __LINE__);
  return Status::ok;
}

Status run(const MoeUnpermuteBackwardParams<bf16>& p, Workspace, cudaStream_t stream) {
  if (p.rows == 0) return Status::ok;
  unpermute_backward_kernel<<<unsigned(p.rows), gpu::row_threads(p.C, kRowThreads), 0, stream>>>(
      p.C, p.top_k, p.gate == GateOn::output, p.position, p.weights, gpu::dev(p.y), gpu::dev(p.dout),
      gpu::dev(p.dy), p.dweights);
  gpu::launch_check(stream, "moe_unpermute_backward", __FILE__, __LINE__);
  return Status::ok;
}

}  // namespace

WEFT_CUDA_INSTANTIATE(MoeRouteParams)
WEFT_CUDA_INSTANTIATE(MoeRouteBackwardParams)
WEFT_CUDA_INSTANTIATE(MoePermuteParams)
WEFT_CUDA_INSTANTIATE(MoePermuteBackwardParams)
WEFT_CUDA_INSTANTIATE(MoeUnpermuteParams)
WEFT_CUDA_INSTANTIATE(MoeUnpermuteBackwardParams)

}  // namespace weft::kernels
