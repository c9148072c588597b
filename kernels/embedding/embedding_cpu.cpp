// embedding on the CPU.
//
// Forward: a parallel copy of one table row (or zeros) per token. Backward:
// tokens repeat, so a row-parallel scatter-add would race; instead each
// thread owns a block of columns and walks all tokens in order, which needs
// no atomics and sums every table entry in the same order on any thread count.
#include "kernels/embedding/embedding.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cpu_common.h"
#include "kernels/embedding/embedding_check.h"

namespace weft::kernels {
namespace {

// Data errors are the user's (a corrupt token file, a tokenizer for another
// vocabulary), so they name the first offending token.
void tokens_check(const int32_t* tokens, int64_t rows, int64_t V) {
  for (int64_t i = 0; i < rows; ++i)
    if (tokens[i] < 0 || tokens[i] >= V)
      throw InputError(fmt::format(
          "embedding: token id {} at position {} is outside [0, V) for the model's vocabulary "
          "size V = {}",
          tokens[i], i, V));
}

}  // namespace

template <typename Elem>
bool supports(const EmbeddingForwardParams<Elem>& p, Backend backend) {
  return backend == Backend::cpu && params_check(p) == Status::ok;
}
template <typename Elem>
int64_t workspace_bytes(const EmbeddingForwardParams<Elem>&, Backend) {
  return 0;
}
template <typename Elem>
Status launch(const EmbeddingForwardParams<Elem>& p, Workspace ws, Stream stream) {
  if (Status s = cpu::preflight(params_check(p), 0, ws, stream); s != Status::ok) return s;
  tokens_check(p.tokens, p.rows, p.V);
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(p.rows * p.C))
  for (int64_t i = 0; i < p.rows; ++i) {
    const int64_t local = int64_t{p.tokens[i]} - p.vocab_start;
    Elem* out = p.out + i * p.C;
    if (local >= 0 && local < p.V_local)
      std::copy(p.table + local * p.C, p.table + (local + 1) * p.C, out);
    else
      std::fill(out, out + p.C, Elem(0));
  }
  return Status::ok;
}

template <typename Elem, typename G>
bool supports(const EmbeddingBackwardParams<Elem, G>& p, Backend backend) {
  return backend == Backend::cpu && params_check(p) == Status::ok;
}
template <typename Elem, typename G>
int64_t workspace_bytes(const EmbeddingBackwardParams<Elem, G>&, Backend) {
  return 0;
}
template <typename Elem, typename G>
Status launch(const EmbeddingBackwardParams<Elem, G>& p, Workspace ws, Stream stream) {
  if (Status s = cpu::preflight(params_check(p), 0, ws, stream); s != Status::ok) return s;
  tokens_check(p.tokens, p.rows, p.V);
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(p.rows * p.C))
  for (int64_t c0 = 0; c0 < p.C; c0 += cpu::kColumnBlock) {
    const int64_t c1 = std::min(p.C, c0 + cpu::kColumnBlock);
    for (int64_t i = 0; i < p.rows; ++i) {
      const int64_t local = int64_t{p.tokens[i]} - p.vocab_start;
      if (local < 0 || local >= p.V_local) continue;
      G* dst = p.dtable + local * p.C;
      const Elem* src = p.dout + i * p.C;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
  return Status::ok;
}

WEFT_CPU_INSTANTIATE(EmbeddingForwardParams)
WEFT_CPU_INSTANTIATE(EmbeddingBackwardParams)

}  // namespace weft::kernels
