// The attention params' rules (Status::invalid_argument), defined once for
// both backends (flash and cudnn keep the same tensors): attention_cpu.cpp and attention.cu apply them, then what each
// implements (Status::unsupported). Free of CUDA and fmt, so nvcc compiles it
// too.
#pragma once

#include <cstdint>

#include "kernels/attention/attention.h"
#include "kernels/cpu_common.h"

namespace weft::kernels {

inline bool attention_dims_valid(int64_t B, int64_t T, int64_t H, int64_t H_kv, int64_t D) {
  return B >= 0 && T >= 0 && H >= 1 && H_kv >= 1 && D >= 1 && H % H_kv == 0;
}

template <typename Elem>
Status params_check(const AttentionForwardParams<Elem>& p) {
  if (!attention_dims_valid(p.B, p.T, p.H, p.H_kv, p.D)) return Status::invalid_argument;
  const int64_t nq = p.B * p.T * p.H * p.D, nkv = p.B * p.T * p.H_kv * p.D;
  bool ok = cpu::present(p.q, nq) && cpu::present(p.k, nkv) && cpu::present(p.v, nkv) &&
            cpu::present(p.out, nq);
  if (p.kind != AttentionKind::materialized) ok = ok && cpu::present(p.lse, p.B * p.H * p.T);
  if (p.kind == AttentionKind::materialized) ok = ok && cpu::present(p.probs, p.B * p.H * p.T * p.T);
  return cpu::status_of(ok);
}

template <typename Elem>
Status params_check(const AttentionBackwardParams<Elem>& p) {
  if (!attention_dims_valid(p.B, p.T, p.H, p.H_kv, p.D)) return Status::invalid_argument;
  const int64_t nq = p.B * p.T * p.H * p.D, nkv = p.B * p.T * p.H_kv * p.D;
  bool ok = cpu::present(p.q, nq) && cpu::present(p.k, nkv) && cpu::present(p.v, nkv) &&
            cpu::present(p.dout, nq) && cpu::present(p.dq, nq) && cpu::present(p.dk, nkv) &&
            cpu::present(p.dv, nkv);
  if (p.kind != AttentionKind::materialized)
    ok = ok && cpu::present(p.out, nq) && cpu::present(p.lse, p.B * p.H * p.T);
  if (p.kind == AttentionKind::materialized) ok = ok && cpu::present(p.probs, p.B * p.H * p.T * p.T);
  return cpu::status_of(ok);
}

}  // namespace weft::kernels
