// The embedding params' rules (Status::invalid_argument), defined once for
// both backends: embedding_cpu.cpp and embedding.cu apply them beside any
// limit of their own. Free of CUDA and fmt, so nvcc compiles it too.
#pragma once

#include <cstdint>

#include "kernels/cpu_common.h"
#include "kernels/embedding/embedding.h"

namespace weft::kernels {

inline bool embedding_shard_valid(int64_t rows, int64_t C, int64_t V, int64_t vocab_start,
                                  int64_t V_local) {
  // A shard may reach past V, or lie past it: a padded vocabulary's rows,
  // which no valid id looks up.
  return rows >= 0 && C >= 1 && V >= 1 && V <= (int64_t{1} << 31) && vocab_start >= 0 &&
         V_local >= 1 && vocab_start <= (int64_t{1} << 31);
}

template <typename Elem>
Status params_check(const EmbeddingForwardParams<Elem>& p) {
  return cpu::status_of(embedding_shard_valid(p.rows, p.C, p.V, p.vocab_start, p.V_local) &&
                        cpu::present(p.tokens, p.rows) && cpu::present(p.table, p.V_local * p.C) &&
                        cpu::present(p.out, p.rows * p.C));
}

template <typename Elem, typename G>
Status params_check(const EmbeddingBackwardParams<Elem, G>& p) {
  return cpu::status_of(embedding_shard_valid(p.rows, p.C, p.V, p.vocab_start, p.V_local) &&
                        cpu::present(p.tokens, p.rows) && cpu::present(p.dout, p.rows * p.C) &&
                        cpu::present(p.dtable, p.V_local * p.C));
}

}  // namespace weft::kernels
