// Expert parallelism's exchange of an MoE block's rows between the ep
// ranks (LlamaStage::moe_exchange; llama_moe.cpp says the block): by
// all-to-all with the per-expert counts the block exchanged first, or by
// the all-gather dispatcher, every rank's rows gathered and the outputs
// reduce-scattered back.
#include <numeric>
#include <utility>
#include <vector>

#include "kernels/elementwise/elementwise.h"
#include "trainer/model/llama_run.h"

namespace weft::trainer {

namespace {

// The tag of the ep group's exchange of rows (the counts': 4000).
constexpr int64_t kMoeRowsTag = 4001;

}  // namespace

template <typename Elem, typename G>
template <typename T>
int64_t LlamaStage<Elem, G>::moe_exchange(const int64_t* sent, const int64_t* counts, const T* in, T* out,
                                          int64_t width, bool back) {
  parallel::Comm& g = *groups_.ep;
  const int64_t P = g.size(), E = m_.moe.experts, El = E / P, me = g.rank();
  if (l_.dispatch == MoeDispatch::allgather) {
    // Every rank's rows in expert order, rank after rank (`counts`: each
    // rank's per expert), in scratch; this rank's experts' runs of them are
    // the received order (source by source, expert by expert).
    // (T: the rows' Elem, or the combine weights' A, one a row.)
    T* all = reinterpret_cast<T*>(table_->get<char>("scratch.moe_gathered"));
    std::vector<int64_t> block(size_t(P), 0);  // elements of each rank's rows
    for (int64_t r = 0; r < P; ++r)
      for (int64_t j = 0; j < E; ++j) block[size_t(r)] += counts[r * E + j] * width;
    // Each of this rank's runs: where it sits among all rows, and its size.
    std::vector<std::pair<int64_t, int64_t>> runs;
    int64_t base = 0, landed = 0;
    for (int64_t s = 0; s < P; ++s) {
      int64_t at = base + std::accumulate(counts + s * E, counts + s * E + me * El, int64_t{0}) * width;
      for (int64_t j = 0; j < El; ++j) {
        const int64_t n = counts[s * E + me * El + j] * width;
        runs.emplace_back(at, n);
        at += n;
      }
      base += block[size_t(s)];
    }
    if (!back) {
      g.all_gather_v(in, all, block);
      for (const auto& [at, n] : runs) {
        copy(out + landed, all + at, n * int64_t(sizeof(T)));
        landed += n;
      }
      return landed / width;
    }
    // Back: this rank's experts' outputs in their places among zeros, summed
    // over the ranks into each one's own rows (only the expert's rank wrote
    // any, so the sums are exact).
    run(kernels::FillParams<T>{.n = base, .value = 0.0, .x = all}, "fill");
    for (const auto& [at, n] : runs) {
      copy(all + at, in + landed, n * int64_t(sizeof(T)));
      landed += n;
    }
    g.reduce_scatter_v(all, out, block);
    return block[size_t(me)] / width;
  }
  // All-to-all: elements to and from each ep rank. In expert order, rank
  // r's block is the rows for its experts; in received order, rank s's the
  // rows it sent.
  const int64_t* received = counts;
  std::vector<int64_t> to(size_t(P), 0), from(size_t(P), 0);
  for (int64_t r = 0; r < P; ++r)
    for (int64_t j = 0; j < El; ++j) {
      to[size_t(r)] += sent[r * El + j] * width;
      from[size_t(r)] += received[r * El + j] * width;
    }
  if (back) std::swap(to, from);
  const int64_t in_at = std::accumulate(to.begin(), to.begin() + me, int64_t{0});
  const int64_t out_at = std::accumulate(from.begin(), from.begin() + me, int64_t{0});
  g.all_to_all_v(in, to, out, from, parallel::dtype_of<T>(), kMoeRowsTag);
  copy(out + out_at, in + in_at, to[size_t(me)] * int64_t(sizeof(T)));  // this rank's own rows
  return std::accumulate(from.begin(), from.end(), int64_t{0}) / width;
}

#define WEFT_LLAMA_MOE_DISPATCH(E, G, T) \
  template int64_t LlamaStage<E, G>::moe_exchange(const int64_t*, const int64_t*, const T*, T*, int64_t, bool);
// The rows (Elem) and the combine weights (Acc<Elem>, the same type but in bf16).
WEFT_LLAMA_MOE_DISPATCH(float, float, float)
WEFT_LLAMA_MOE_DISPATCH(double, double, double)
WEFT_LLAMA_MOE_DISPATCH(kernels::bf16, float, kernels::bf16)
WEFT_LLAMA_MOE_DISPATCH(kernels::bf16, kernels::bf16, kernels::bf16)
WEFT_LLAMA_MOE_DISPATCH(kernels::bf16, float, float)
WEFT_LLAMA_MOE_DISPATCH(kernels::bf16, kernels::bf16, float)
#undef WEFT_LLAMA_MOE_DISPATCH

}  // namespace weft::trainer
