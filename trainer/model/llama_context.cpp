// RoPE and attention of a block over the whole sequence when context
// parallelism (cp > 1) splits it over the cp group.
//
// The sequence is cut into 2 cp equal chunks of c = T / (2 cp) tokens, and
// cp rank r holds chunks r and 2 cp - 1 - r of every sequence, in that order
// (its T / cp rows): under the causal mask an early chunk sees few keys and a
// late one many, so every rank gets the same work. RoPE rotates each chunk by
// its own positions. Attention needs every key at or before a query, which
// the layout's transport brings (core/layout.h, CpComm):
//
// ring: the ranks pass their K/V block (both chunks) around the ring, each
//   computing on the block it holds while the next one arrives (two
//   buffers). Every pair of a local query chunk and a key chunk at or before
//   it is one attention call over a block of the sequence; its partial output
//   and lse merge into the running result (attention_merge), which is exact.
//   The backward sends K and V around once more the same way, and each
//   block's dK and dV follow one step behind, every rank adding its queries'
//   share; after cp passes a block is home with its whole gradient. Flash
//   only (the layout refuses materialized: its probabilities would be per
//   block).
// allgather: K and V of the whole sequence are all-gathered (then put in
//   sequence order), each local query chunk attends to the keys up to its end
//   in one call, and the backward gathers them again (they are not kept),
//   accumulates dK and dV over the whole sequence and reduce-scatters them to
//   the chunks' owners.
// a2a (Ulysses): all-to-all exchanges turn the sequence-split q, k and v
//   into head-split ones (H/cp of this rank's heads over the whole sequence),
//   attention runs as without cp, and its output goes back the same way; the
//   backward redoes the exchanges from the kept sequence-split tensors. The
//   lse (and materialized probabilities) are kept head-split.
//
// Exchanges go over the cp group (groups_.cp): MPI on the host memory of a
// CPU run, NCCL on a device, where the ring's sends and receives run on
// streams of their own beside the attention (parallel/comm_nccl.cpp). The
// exchange buffers come from the shape table (memory/shapes.cpp,
// "comm.cp_*"). On a device the ring and the all-gather need the flash or
// the cudnn kernels (check_trainable): the materialized one takes no blocks
// of the sequence; a2a's whole-sequence calls take every kind.
//
// Llama 4's chunked attention (its RoPE layers: attention_chunk) needs no
// transport of its own: every call gives the kernels the absolute positions
// of its queries and keys (offsets; the whole sequence under a2a) and the
// chunk, and they mask the keys before each query's chunk, so a ring step
// whose keys all precede its queries' chunks yields nothing and merges as
// such.
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "kernels/attention/attention.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/rope/rope.h"
#include "trainer/model/llama_run.h"

namespace weft::trainer {

namespace {
constexpr int64_t kTagRing = 1 << 21;  // cp messages: distinct from the pipeline's and tied embeddings'
constexpr int64_t kTagA2a = kTagRing + 16;
}  // namespace

template <typename Elem, typename G>
int64_t LlamaStage<Elem, G>::chunk_offset(int64_t rank, int64_t k) const {
  const int64_t cp = l_.cp, c = run_.seq / (2 * cp);
  return (k == 0 ? rank : 2 * cp - 1 - rank) * c;
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::rope(Elem* q, Elem* k, kernels::RopeDirection direction) {
  const int64_t T = M_ / l_.mb, D = m_.head_dim;
  const int64_t Hl = m_.heads / l_.tp, Kl = m_.kv_heads / l_.tp;
  const char* op = direction == kernels::RopeDirection::forward ? "rope_forward" : "rope_backward";
  if (l_.cp == 1) {
    run(kernels::RopeParams<Elem>{.direction = direction, .B = l_.mb, .T = T, .H = Hl, .H_kv = Kl, .D = D,
                                  .position_offset = 0, .theta = m_.rope_theta, .scaling = m_.rope_scaling,
                                  .q = q, .k = k},
        op, "scratch.rope_table");
    return;
  }
  // Each chunk of each sequence at its own positions.
  const int64_t c = T / 2, r = groups_.cp_rank();
  for (int64_t b = 0; b < l_.mb; ++b)
    for (int64_t chunk = 0; chunk < 2; ++chunk) {
      const int64_t row = b * T + chunk * c;
      run(kernels::RopeParams<Elem>{.direction = direction, .B = 1, .T = c, .H = Hl, .H_kv = Kl, .D = D,
                                    .position_offset = chunk_offset(r, chunk), .theta = m_.rope_theta,
                                    .scaling = m_.rope_scaling, .q = q + row * Hl * D, .k = k + row * Kl * D},
          op, "scratch.rope_table");
    }
}

template <typename Elem, typename G>
template <typename T>
void LlamaStage<Elem, G>::fill(T* x, int64_t n, double value) {
  run(kernels::FillParams<T>{.n = n, .value = value, .x = x}, "fill");
}

template <typename Elem, typename G>
int64_t LlamaStage<Elem, G>::attention_chunk(const Block& b) const {
  return rope_layer(b) ? m_.attention.attention_chunk : 0;
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::attention_forward(const Block& b) {
  const int64_t T = M_ / l_.mb, D = m_.head_dim;
  const int64_t Hl = m_.heads / l_.tp, Kl = m_.kv_heads / l_.tp;
  if (l_.cp == 1) {
    run(kernels::AttentionForwardParams<Elem>{.kind = l_.attention, .B = l_.mb, .T = T, .H = Hl, .H_kv = Kl, .D = D,
                                              .q = b.q, .k = b.k, .v = b.v, .out = b.out, .lse = b.lse,
                                              .probs = b.probs, .chunk = attention_chunk(b)},
        "attention_forward", "scratch.attn_tiles");
    return;
  }
  switch (l_.cp_comm) {
    case CpComm::ring: return ring_forward(b);
    case CpComm::allgather: return allgather_forward(b);
    case CpComm::a2a: return a2a_forward(b);
  }
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::attention_backward(const Block& b, const Elem* dout, Elem* dq, Elem* dk, Elem* dv) {
  const int64_t T = M_ / l_.mb, D = m_.head_dim;
  const int64_t Hl = m_.heads / l_.tp, Kl = m_.kv_heads / l_.tp;
  if (l_.cp == 1) {
    run(kernels::AttentionBackwardParams<Elem>{.kind = l_.attention, .B = l_.mb, .T = T, .H = Hl, .H_kv = Kl,
                                               .D = D, .q = b.q, .k = b.k, .v = b.v, .out = b.out, .lse = b.lse,
                                               .probs = b.probs, .dout = dout, .dq = dq, .dk = dk, .dv = dv,
                                               .chunk = attention_chunk(b)},
        "attention_backward", "scratch.attn_tiles");
    return;
  }
  switch (l_.cp_comm) {
    case CpComm::ring: return ring_backward(b, dout, dq, dk, dv);
    case CpComm::allgather: return allgather_backward(b, dout, dq, dk, dv);
    case CpComm::a2a: return a2a_backward(b, dout, dq, dk, dv);
  }
}

// --- ring ---

// Step s of the ring computes on the K/V block of cp rank r - s (this rank's
// own at s = 0) while the next one arrives from r - 1 into the other buffer
// (into): the block in hand goes on to r + 1 meanwhile. Returns the pending
// transfers, which the caller waits for once the step's attention is queued.
template <typename Elem, typename G>
std::vector<std::unique_ptr<parallel::CommRequest>> LlamaStage<Elem, G>::ring_pass_kv(int64_t s, const Elem* k,
                                                                                     const Elem* v, Elem* into) {
  const int64_t cp = l_.cp, r = groups_.cp_rank(), n_kv = M_ * (m_.kv_heads / l_.tp) * m_.head_dim;
  std::vector<std::unique_ptr<parallel::CommRequest>> pending;
  if (s + 1 == cp) return pending;  // the last block: nothing left to pass
  auto& ring = *groups_.cp;
  pending.push_back(ring.isend(k, n_kv, (r + 1) % cp, kTagRing));
  pending.push_back(ring.isend(v, n_kv, (r + 1) % cp, kTagRing + 1));
  pending.push_back(ring.irecv(into, n_kv, (r + cp - 1) % cp, kTagRing));
  pending.push_back(ring.irecv(into + n_kv, n_kv, (r + cp - 1) % cp, kTagRing + 1));
  return pending;
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::ring_forward(const Block& b) {
  const int64_t B = l_.mb, T = M_ / l_.mb, c = T / 2, D = m_.head_dim;
  const int64_t Hl = m_.heads / l_.tp, Kl = m_.kv_heads / l_.tp;
  const int64_t cp = l_.cp, r = groups_.cp_rank(), n_kv = B * T * Kl * D;
  Elem* part_out = table_->get<Elem>("scratch.cp_part_out");
  A* part_lse = table_->get<A>("scratch.cp_part_lse");
  fill(b.out, M_ * Hl * D, 0.0);
  fill(b.lse, B * Hl * T, -std::numeric_limits<double>::infinity());
  const Elem* k = b.k;  // the block computed on: this rank's own first
  const Elem* v = b.v;
  for (int64_t s = 0; s < cp; ++s) {
    const int64_t src = (r - s + cp) % cp;  // whose block it is
    Elem* into = table_->get<Elem>("comm.cp_ring", s % 2);
    auto pending = ring_pass_kv(s, k, v, into);
    for (int64_t qc = 0; qc < 2; ++qc)
      for (int64_t kc = 0; kc < 2; ++kc) {
        const int64_t qo = chunk_offset(r, qc), ko = chunk_offset(src, kc);
        if (ko > qo) continue;  // every key after every query
        run(kernels::AttentionForwardParams<Elem>{
                .kind = l_.attention, .B = B, .T = c, .H = Hl, .H_kv = Kl, .D = D, .q = b.q + qc * c * Hl * D,
                .k = k + kc * c * Kl * D, .v = v + kc * c * Kl * D, .out = part_out + qc * c * Hl * D,
                .lse = part_lse + qc * c, .Tk = c, .q_offset = qo, .k_offset = ko, .q_batch_rows = T,
                .kv_batch_rows = T, .lse_batch_rows = T, .chunk = attention_chunk(b)},
            "attention_forward", "scratch.attn_tiles");
        run(kernels::AttentionMergeParams<Elem>{.B = B, .T = c, .H = Hl, .D = D, .out = b.out + qc * c * Hl * D,
                                                .lse = b.lse + qc * c, .part_out = part_out + qc * c * Hl * D,
                                                .part_lse = part_lse + qc * c, .q_batch_rows = T,
                                                .lse_batch_rows = T},
            "attention_merge");
      }
    for (auto& p : pending) p->wait();
    k = into;
    v = into + n_kv;
  }
}

// K and V go round as in the forward, ahead of the compute. A block's dK and
// dV (its accumulator: both, 2 n_kv) follow one step behind: at step s this
// rank computes its queries' share of block r - s into a buffer of its own
// while the accumulator of that block, holding the shares of ranks r - s ..
// r - 1, arrives from r - 1; the share is added to it once both are there and
// it goes on to r + 1, travelling while r + 1 computes its next step. After
// the last step each accumulator has one hop left, home to its block's owner:
// the only transfer no attention hides. On a device every transfer runs on a
// stream of its own (parallel/comm_nccl.cpp) beside the attention kernels.
template <typename Elem, typename G>
void LlamaStage<Elem, G>::ring_backward(const Block& b, const Elem* dout, Elem* dq, Elem* dk, Elem* dv) {
  const int64_t B = l_.mb, T = M_ / l_.mb, c = T / 2, D = m_.head_dim;
  const int64_t Hl = m_.heads / l_.tp, Kl = m_.kv_heads / l_.tp;
  const int64_t cp = l_.cp, r = groups_.cp_rank(), n_kv = B * T * Kl * D;
  const int64_t next = (r + 1) % cp, prev = (r + cp - 1) % cp;
  auto& ring = *groups_.cp;
  // Two accumulators in turn (one arriving or added to, the other still
  // going out), and the share this rank computes.
  Elem* acc[2] = {table_->get<Elem>("comm.cp_ring_grad", 0), table_->get<Elem>("comm.cp_ring_grad", 1)};
  Elem* share = table_->get<Elem>("comm.cp_ring_grad", 2);
  std::unique_ptr<parallel::CommRequest> acc_out[2];
  const auto settle = [&](int slot) {
    if (acc_out[slot]) acc_out[slot]->wait();
    acc_out[slot].reset();
  };
  fill(dq, M_ * Hl * D, 0.0);
  const Elem* k = b.k;
  const Elem* v = b.v;
  for (int64_t s = 0; s < cp; ++s) {
    const int64_t src = (r - s + cp) % cp;
    const int slot = int(s % 2);
    // The accumulator of block src so far (none yet for this rank's own),
    // posted before this step's K/V so both ends keep one order per
    // direction (which NCCL matches by).
    std::unique_ptr<parallel::CommRequest> arriving;
    if (s > 0) {
      settle(slot);
      arriving = ring.irecv(acc[slot], 2 * n_kv, prev, kTagRing + 2);
    }
    Elem* into = table_->get<Elem>("comm.cp_ring", s % 2);
    auto pending = ring_pass_kv(s, k, v, into);
    Elem* mine = s == 0 ? acc[slot] : share;
    fill(mine, 2 * n_kv, 0.0);
    for (int64_t qc = 0; qc < 2; ++qc)
      for (int64_t kc = 0; kc < 2; ++kc) {
        const int64_t qo = chunk_offset(r, qc), ko = chunk_offset(src, kc);
        if (ko > qo) continue;
        run(kernels::AttentionBackwardParams<Elem>{
                .kind = l_.attention, .B = B, .T = c, .H = Hl, .H_kv = Kl, .D = D, .q = b.q + qc * c * Hl * D,
                .k = k + kc * c * Kl * D, .v = v + kc * c * Kl * D, .out = b.out + qc * c * Hl * D,
                .lse = b.lse + qc * c, .dout = dout + qc * c * Hl * D, .dq = dq + qc * c * Hl * D,
                .dk = mine + kc * c * Kl * D, .dv = mine + n_kv + kc * c * Kl * D, .Tk = c, .q_offset = qo,
                .k_offset = ko, .q_batch_rows = T, .kv_batch_rows = T, .lse_batch_rows = T,
                .chunk = attention_chunk(b), .dq_write = kernels::Write::accumulate, .dkv_write = kernels::Write::accumulate},
            "attention_backward", "scratch.attn_tiles");
      }
    if (arriving) {
      arriving->wait();
      run(kernels::AddParams<Elem>{.n = 2 * n_kv, .a = acc[slot], .b = share, .out = acc[slot]}, "add");
    }
    acc_out[slot] = ring.isend(acc[slot], 2 * n_kv, next, kTagRing + 2);
    for (auto& p : pending) p->wait();
    k = into;
    v = into + n_kv;
  }
  // Home: this rank's own block, with every rank's share in it.
  const int home = int(cp % 2);
  settle(home);
  ring.irecv(acc[home], 2 * n_kv, prev, kTagRing + 2)->wait();
  copy(dk, acc[home], n_kv * int64_t(sizeof(Elem)));
  copy(dv, acc[home] + n_kv, n_kv * int64_t(sizeof(Elem)));
  settle(1 - home);
}

// --- all-gather ---

template <typename Elem, typename G>
void LlamaStage<Elem, G>::allgather_kv(const Elem* k, const Elem* v, Elem* full) {
  const int64_t B = l_.mb, T = M_ / l_.mb, c = T / 2, Tf = run_.seq, D = m_.head_dim;
  const int64_t Kl = m_.kv_heads / l_.tp, cp = l_.cp, n_kv = B * T * Kl * D, row = Kl * D;
  Elem* gathered = table_->get<Elem>("comm.cp_kv_gather");
  groups_.cp->all_gather(k, gathered, n_kv);
  groups_.cp->all_gather(v, gathered + cp * n_kv, n_kv);
  // Rank j's rows of sequence b, chunk by chunk, to their positions.
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t j = 0; j < cp; ++j)
      for (int64_t s = 0; s < B; ++s)
        for (int64_t chunk = 0; chunk < 2; ++chunk)
          copy(full + t * B * Tf * row + (s * Tf + chunk_offset(j, chunk)) * row,
               gathered + t * cp * n_kv + j * n_kv + (s * T + chunk * c) * row, c * row * int64_t(sizeof(Elem)));
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::allgather_forward(const Block& b) {
  const int64_t B = l_.mb, T = M_ / l_.mb, c = T / 2, Tf = run_.seq, D = m_.head_dim;
  const int64_t Hl = m_.heads / l_.tp, Kl = m_.kv_heads / l_.tp, r = groups_.cp_rank();
  Elem* full = table_->get<Elem>("comm.cp_kv_full");  // K, then V: (B, Tf, Kl, D) each
  allgather_kv(b.k, b.v, full);
  Elem* probs = b.probs;  // materialized: each chunk's (B, Hl, c, its keys), one after the other
  for (int64_t qc = 0; qc < 2; ++qc) {
    const int64_t qo = chunk_offset(r, qc), keys = qo + c;
    run(kernels::AttentionForwardParams<Elem>{
            .kind = l_.attention, .B = B, .T = c, .H = Hl, .H_kv = Kl, .D = D, .q = b.q + qc * c * Hl * D,
            .k = full, .v = full + B * Tf * Kl * D, .out = b.out + qc * c * Hl * D,
            .lse = b.lse ? b.lse + qc * c : nullptr, .probs = probs, .Tk = keys, .q_offset = qo, .k_offset = 0, .q_batch_rows = T, .kv_batch_rows = Tf,
            .lse_batch_rows = T, .chunk = attention_chunk(b)},
        "attention_forward", "scratch.attn_tiles");
    if (probs) probs += B * Hl * c * keys;
  }
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::allgather_backward(const Block& b, const Elem* dout, Elem* dq, Elem* dk, Elem* dv) {
  const int64_t B = l_.mb, T = M_ / l_.mb, c = T / 2, Tf = run_.seq, D = m_.head_dim;
  const int64_t Hl = m_.heads / l_.tp, Kl = m_.kv_heads / l_.tp, r = groups_.cp_rank(), cp = l_.cp;
  const int64_t n_kv = B * T * Kl * D, n_full = B * Tf * Kl * D, row = Kl * D;
  Elem* full = table_->get<Elem>("comm.cp_kv_full");
  Elem* dfull = table_->get<Elem>("comm.cp_dkv_full");  // dK, then dV, over the whole sequence
  allgather_kv(b.k, b.v, full);  // gathered again: the forward's are not kept
  fill(dfull, 2 * n_full, 0.0);
  const Elem* probs = b.probs;
  for (int64_t qc = 0; qc < 2; ++qc) {
    const int64_t qo = chunk_offset(r, qc), keys = qo + c;
    run(kernels::AttentionBackwardParams<Elem>{
            .kind = l_.attention, .B = B, .T = c, .H = Hl, .H_kv = Kl, .D = D, .q = b.q + qc * c * Hl * D,
            .k = full, .v = full + n_full, .out = b.out + qc * c * Hl * D,
            .lse = b.lse ? b.lse + qc * c : nullptr, .probs = probs,
            .dout = dout + qc * c * Hl * D, .dq = dq + qc * c * Hl * D, .dk = dfull, .dv = dfull + n_full,
            .Tk = keys, .q_offset = qo, .k_offset = 0, .q_batch_rows = T, .kv_batch_rows = Tf,
            .lse_batch_rows = T, .chunk = attention_chunk(b), .dkv_write = kernels::Write::accumulate},
        "attention_backward", "scratch.attn_tiles");
    if (probs) probs += B * Hl * c * keys;
  }
  // Rank by rank (its chunks' rows), then summed onto their owners.
  Elem* packed = table_->get<Elem>("comm.cp_kv_gather");
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t j = 0; j < cp; ++j)
      for (int64_t s = 0; s < B; ++s)
        for (int64_t chunk = 0; chunk < 2; ++chunk)
          copy(packed + t * cp * n_kv + j * n_kv + (s * T + chunk * c) * row,
               dfull + t * n_full + (s * Tf + chunk_offset(j, chunk)) * row, c * row * int64_t(sizeof(Elem)));
  groups_.cp->reduce_scatter(packed, dk, n_kv);
  groups_.cp->reduce_scatter(packed + cp * n_kv, dv, n_kv);
}

// --- all-to-all (Ulysses) ---

template <typename Elem, typename G>
void LlamaStage<Elem, G>::a2a_exchange(Elem* blocks_out, Elem* blocks_in, int64_t block) {
  // Through the group's all-to-all, which on NCCL reaches every rank (its
  // point-to-point channels reach ring neighbours only).
  const int64_t r = groups_.cp_rank();
  copy(blocks_in + r * block, blocks_out + r * block, block * int64_t(sizeof(Elem)));
  groups_.cp->all_to_all(blocks_out, blocks_in, block, kTagA2a);
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::a2a_to_heads(const Elem* x, int64_t heads, Elem* y) {
  // x (B, T, heads, D) of this rank's chunks -> y (B, Tf, heads / cp, D):
  // rank j gets heads [j h, (j + 1) h) of every rank's rows.
  const int64_t B = l_.mb, T = M_ / l_.mb, c = T / 2, Tf = run_.seq, D = m_.head_dim, cp = l_.cp;
  const int64_t h = heads / cp, block = B * T * h * D, e = int64_t(sizeof(Elem));
  Elem* out = table_->get<Elem>("comm.cp_a2a", 0);
  Elem* in = table_->get<Elem>("comm.cp_a2a", 1);
  for (int64_t j = 0; j < cp; ++j)
    for (int64_t row = 0; row < B * T; ++row)
      copy(out + j * block + row * h * D, x + (row * heads + j * h) * D, h * D * e);
  a2a_exchange(out, in, block);
  for (int64_t i = 0; i < cp; ++i)
    for (int64_t s = 0; s < B; ++s)
      for (int64_t chunk = 0; chunk < 2; ++chunk)
        copy(y + (s * Tf + chunk_offset(i, chunk)) * h * D, in + i * block + (s * T + chunk * c) * h * D,
             c * h * D * e);
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::a2a_to_sequence(const Elem* y, int64_t heads, Elem* x) {
  // The inverse: y (B, Tf, heads / cp, D) -> x (B, T, heads, D).
  const int64_t B = l_.mb, T = M_ / l_.mb, c = T / 2, Tf = run_.seq, D = m_.head_dim, cp = l_.cp;
  const int64_t h = heads / cp, block = B * T * h * D, e = int64_t(sizeof(Elem));
  Elem* out = table_->get<Elem>("comm.cp_a2a", 0);
  Elem* in = table_->get<Elem>("comm.cp_a2a", 1);
  for (int64_t i = 0; i < cp; ++i)
    for (int64_t s = 0; s < B; ++s)
      for (int64_t chunk = 0; chunk < 2; ++chunk)
        copy(out + i * block + (s * T + chunk * c) * h * D, y + (s * Tf + chunk_offset(i, chunk)) * h * D,
             c * h * D * e);
  a2a_exchange(out, in, block);
  for (int64_t j = 0; j < cp; ++j)
    for (int64_t row = 0; row < B * T; ++row)
      copy(x + (row * heads + j * h) * D, in + j * block + row * h * D, h * D * e);
}

// The head-split tensors in comm.cp_heads: q, out, dout and dq with H/tp/cp
// heads, k, v, dk and dv with H_kv/tp/cp, each over the whole sequence.
template <typename Elem, typename G>
Elem* LlamaStage<Elem, G>::a2a_head_tensor(int which) {
  const int64_t nq = M_ * (m_.heads / l_.tp) * m_.head_dim, nk = M_ * (m_.kv_heads / l_.tp) * m_.head_dim;
  Elem* base = table_->get<Elem>("comm.cp_heads");
  // 0 q, 1 out, 2 dout, 3 dq, 4 k, 5 v, 6 dk, 7 dv
  return which < 4 ? base + which * nq : base + 4 * nq + (which - 4) * nk;
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::a2a_forward(const Block& b) {
  const int64_t Tf = run_.seq, D = m_.head_dim, cp = l_.cp;
  const int64_t Hl = m_.heads / l_.tp, Kl = m_.kv_heads / l_.tp;
  Elem *q = a2a_head_tensor(0), *out = a2a_head_tensor(1), *k = a2a_head_tensor(4), *v = a2a_head_tensor(5);
  a2a_to_heads(b.q, Hl, q);
  a2a_to_heads(b.k, Kl, k);
  a2a_to_heads(b.v, Kl, v);
  run(kernels::AttentionForwardParams<Elem>{.kind = l_.attention, .B = l_.mb, .T = Tf, .H = Hl / cp,
                                            .H_kv = Kl / cp, .D = D, .q = q, .k = k, .v = v, .out = out,
                                            .lse = b.lse, .probs = b.probs, .chunk = attention_chunk(b)},
      "attention_forward", "scratch.attn_tiles");
  a2a_to_sequence(out, Hl, b.out);
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::a2a_backward(const Block& b, const Elem* dout, Elem* dq, Elem* dk, Elem* dv) {
  const int64_t Tf = run_.seq, D = m_.head_dim, cp = l_.cp;
  const int64_t Hl = m_.heads / l_.tp, Kl = m_.kv_heads / l_.tp;
  Elem *q = a2a_head_tensor(0), *out = a2a_head_tensor(1), *d_out = a2a_head_tensor(2), *d_q = a2a_head_tensor(3);
  Elem *k = a2a_head_tensor(4), *v = a2a_head_tensor(5), *d_k = a2a_head_tensor(6), *d_v = a2a_head_tensor(7);
  a2a_to_heads(b.q, Hl, q);
  a2a_to_heads(b.k, Kl, k);
  a2a_to_heads(b.v, Kl, v);
  a2a_to_heads(b.out, Hl, out);
  a2a_to_heads(dout, Hl, d_out);
  run(kernels::AttentionBackwardParams<Elem>{.kind = l_.attention, .B = l_.mb, .T = Tf, .H = Hl / cp,
                                             .H_kv = Kl / cp, .D = D, .q = q, .k = k, .v = v, .out = out,
                                             .lse = b.lse, .probs = b.probs, .dout = d_out, .dq = d_q, .dk = d_k,
                                             .dv = d_v, .chunk = attention_chunk(b)},
      "attention_backward", "scratch.attn_tiles");
  a2a_to_sequence(d_q, Hl, dq);
  a2a_to_sequence(d_k, Kl, dk);
  a2a_to_sequence(d_v, Kl, dv);
}

#define WEFT_LLAMA_CONTEXT(E, G)                                                                \
  template int64_t LlamaStage<E, G>::chunk_offset(int64_t, int64_t) const;                      \
  template void LlamaStage<E, G>::rope(E*, E*, kernels::RopeDirection);                         \
  template int64_t LlamaStage<E, G>::attention_chunk(const Block&) const;                       \
  template void LlamaStage<E, G>::attention_forward(const Block&);                              \
  template void LlamaStage<E, G>::attention_backward(const Block&, const E*, E*, E*, E*);              \
  template std::vector<std::unique_ptr<parallel::CommRequest>> LlamaStage<E, G>::ring_pass_kv(         \
      int64_t, const E*, const E*, E*);                                                            \
  template void LlamaStage<E, G>::ring_forward(const Block&);                                   \
  template void LlamaStage<E, G>::ring_backward(const Block&, const E*, E*, E*, E*);             \
  template void LlamaStage<E, G>::allgather_kv(const E*, const E*, E*);                         \
  template void LlamaStage<E, G>::allgather_forward(const Block&);                              \
  template void LlamaStage<E, G>::allgather_backward(const Block&, const E*, E*, E*, E*);        \
  template void LlamaStage<E, G>::a2a_exchange(E*, E*, int64_t);                                \
  template void LlamaStage<E, G>::a2a_to_heads(const E*, int64_t, E*);                          \
  template void LlamaStage<E, G>::a2a_to_sequence(const E*, int64_t, E*);                       \
  template E* LlamaStage<E, G>::a2a_head_tensor(int);                                           \
  template void LlamaStage<E, G>::a2a_forward(const Block&);                                    \
  template void LlamaStage<E, G>::a2a_backward(const Block&, const E*, E*, E*, E*);
WEFT_LLAMA_CONTEXT(float, float)
WEFT_LLAMA_CONTEXT(double, double)
WEFT_LLAMA_CONTEXT(kernels::bf16, float)
WEFT_LLAMA_CONTEXT(kernels::bf16, kernels::bf16)
#undef WEFT_LLAMA_CONTEXT

}  // namespace weft::trainer
