// The communication buffers of the tensor table (memory/shapes.h), as the
// trainer's collectives and transfers use them.
#include <algorithm>

#include "memory/shapes.h"
#include "memory/shapes_detail.h"

namespace weft::memory::detail {

void comm_buffer_shapes(const ModelSpec& m, const Layout& l, const StagePlan& plan, const Dims& d,
                        std::vector<TensorShape>& out) {
  const int64_t ways = l.zero_shards();  // dp x cp, or the hybrid shard group
  const bool lora = plan.lora.enabled();
  const int64_t psi = stage_param_elements(m, l, plan);
  const int64_t g = l.grad_bytes();
  // Communication buffers.
  if (l.sp) out.push_back({"comm.sp_gather", Category::comm, d.B * d.T * d.C, d.a, 1});
  if (l.pp > 1) out.push_back({"comm.pp_p2p", Category::comm, d.B * d.Tsp * d.C, d.a, 2});
  // Tied embeddings over several stages: the first stage receives the last
  // stage's head gradient here to add it to the embedding's. Under ZeRO-1
  // and -2 both stages gather their copy's reduced gradient over dp here.
  if (!lora && m.tied_embeddings && l.pp > 1 && (plan.has_embedding || (plan.has_head && ways > 1 && l.zero >= 1)))
    out.push_back({"comm.tied_embedding_grad", Category::comm, d.Vl * d.C, g, 1});
  // (ZeRO-1 reduce-scatters the gradients in place: its shard is its range
  // of grads.flat.)
  if (ways > 1 && l.zero >= 2) {
    // Gradients are reduce-scattered a group at a time, every micro-batch,
    // each beside the backward of the next group, so two buckets: one holds
    // the largest group (a block, the vocab table, or the final norm with the
    // LM head), the other a block.
    // Under LoRA a group is a block's adapters.
    const int64_t block = lora ? lora_largest_block_elements(m, l, plan) : block_param_elements(m, l, plan);
    const int64_t group = lora ? block : std::max(block, (m.padded_vocab(l.tp) / l.tp) * m.hidden + m.hidden);
    out.push_back({"comm.dp_grad_bucket", Category::comm, std::min(group, psi), g, 1});
    out.push_back({"comm.dp_grad_bucket_next", Category::comm, std::min(block, psi), g, 1});
  }
  if (ways > 1 && l.zero >= 3) {
    // ZeRO-3 gathers each parameter group's weights over dp before it
    // computes (every micro-batch, forward and backward): two buffers, the
    // group in use and the next one prefetched, each as large as the largest
    // group of the stage (a block, the embedding table, or the final norm
    // with the LM head or the tied table).
    // (Under LoRA only the adapters are sharded: a block's adapters.)
    int64_t largest = plan.layers > 0 ? (lora ? lora_largest_block_elements(m, l, plan) : block_param_elements(m, l, plan)) : 0;
    const int64_t table = (m.padded_vocab(l.tp) / l.tp) * m.hidden;
    if (plan.has_embedding && !lora) largest = std::max(largest, table);
    if (plan.has_head && !lora) largest = std::max(largest, m.hidden + table);
    out.push_back({"comm.dp_param_gather", Category::comm, largest, d.a, 2});
  }

  // Context parallelism's exchange of keys and values, per transport (the
  // trainer's llama_context.cpp), with one block's tensors at a time:
  // ring: two buffers (one computed on, one arriving) of a block's K and V;
  // in the backward, two of a block's travelling dK and dV (one arriving and
  // added to, one going out) and this rank's share of them; the partial
  // output and lse of one block of keys before it is merged.
  // allgather: the gathered K and V as they arrive (rank by rank), in
  // sequence order, and dK and dV over the whole sequence (reduce-scattered
  // from the first buffer, repacked rank by rank).
  // a2a: q, k, v, out and their gradients with the heads split and the
  // whole sequence, and the packed blocks of one exchange going out and in.
  if (d.cp > 1) {
    const int64_t kv = d.B * d.T * d.Kl * d.D, q = d.B * d.T * d.Hl * d.D;
    const int64_t kv_full = d.B * d.Tfull * d.Kl * d.D;
    switch (l.cp_comm) {
      case CpComm::ring:
        out.push_back({"comm.cp_ring", Category::comm, 2 * kv, d.a, 2});
        out.push_back({"comm.cp_ring_grad", Category::comm, 2 * kv, d.a, 3});
        out.push_back({"scratch.cp_part_out", Category::workspace, q, d.a, 1});
        out.push_back({"scratch.cp_part_lse", Category::workspace, d.B * d.Hl * d.T, kFp32, 1});
        break;
      case CpComm::allgather:
        out.push_back({"comm.cp_kv_gather", Category::comm, 2 * kv_full, d.a, 1});
        out.push_back({"comm.cp_kv_full", Category::comm, 2 * kv_full, d.a, 1});
        out.push_back({"comm.cp_dkv_full", Category::comm, 2 * kv_full, d.a, 1});
        break;
      case CpComm::a2a:
        out.push_back({"comm.cp_heads", Category::comm, 4 * q + 4 * kv, d.a, 1});
        out.push_back({"comm.cp_a2a", Category::comm, q, d.a, 2});
        break;
    }
  }
}

}  // namespace weft::memory::detail
