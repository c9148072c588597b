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

// The extents of a call's tensors, in elements, with the block's strides.
struct AttentionExtents {
  int64_t Tk = 0;               // keys
  int64_t q = 0, kv = 0, lse = 0, probs = 0;
  bool valid = false;
};

template <typename P>
AttentionExtents attention_extents(const P& p) {
  AttentionExtents e;
  e.Tk = p.Tk ? p.Tk : p.T;
  const int64_t qr = p.q_batch_rows ? p.q_batch_rows : p.T;
  const int64_t kr = p.kv_batch_rows ? p.kv_batch_rows : e.Tk;
  const int64_t lr = p.lse_batch_rows ? p.lse_batch_rows : p.T;
  e.valid = attention_dims_valid(p.B, p.T, p.H, p.H_kv, p.D) && p.Tk >= 0 && p.q_offset >= 0 && p.k_offset >= 0 &&
            p.chunk >= 0 &&
            qr >= p.T && kr >= e.Tk && lr >= p.T;
  if (!e.valid || p.B == 0) return e;
  e.q = ((p.B - 1) * qr + p.T) * p.H * p.D;
  e.kv = ((p.B - 1) * kr + e.Tk) * p.H_kv * p.D;
  e.lse = ((p.B - 1) * p.H + p.H - 1) * lr + p.T;
  e.probs = p.B * p.H * p.T * e.Tk;
  return e;
}

template <typename Elem>
Status params_check(const AttentionForwardParams<Elem>& p) {
  const AttentionExtents e = attention_extents(p);
  if (!e.valid) return Status::invalid_argument;
  bool ok = cpu::present(p.q, e.q) && cpu::present(p.k, e.kv) && cpu::present(p.v, e.kv) &&
            cpu::present(p.out, e.q);
  if (p.kind != AttentionKind::materialized) ok = ok && cpu::present(p.lse, e.lse);
  if (p.kind == AttentionKind::materialized) ok = ok && cpu::present(p.probs, e.probs);
  return cpu::status_of(ok);
}

template <typename Elem>
Status params_check(const AttentionBackwardParams<Elem>& p) {
  const AttentionExtents e = attention_extents(p);
  if (!e.valid) return Status::invalid_argument;
  bool ok = cpu::present(p.q, e.q) && cpu::present(p.k, e.kv) && cpu::present(p.v, e.kv) &&
            cpu::present(p.dout, e.q) && cpu::present(p.dq, e.q) && cpu::present(p.dk, e.kv) &&
            cpu::present(p.dv, e.kv);
  if (p.kind != AttentionKind::materialized) ok = ok && cpu::present(p.out, e.q) && cpu::present(p.lse, e.lse);
  if (p.kind == AttentionKind::materialized) ok = ok && cpu::present(p.probs, e.probs);
  return cpu::status_of(ok);
}

template <typename Elem>
Status params_check(const AttentionMergeParams<Elem>& p) {
  const int64_t qr = p.q_batch_rows ? p.q_batch_rows : p.T, lr = p.lse_batch_rows ? p.lse_batch_rows : p.T;
  if (p.B < 0 || p.T < 0 || p.H < 1 || p.D < 1 || qr < p.T || lr < p.T) return Status::invalid_argument;
  if (p.B == 0 || p.T == 0) return Status::ok;
  const int64_t n_out = ((p.B - 1) * qr + p.T) * p.H * p.D, n_lse = ((p.B - 1) * p.H + p.H - 1) * lr + p.T;
  return cpu::status_of(cpu::present(p.out, n_out) && cpu::present(p.part_out, n_out) && cpu::present(p.lse, n_lse) &&
                        cpu::present(p.part_lse, n_lse));
}

}  // namespace weft::kernels
