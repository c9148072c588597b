// The MoE FFN's tensors of the shape table (memory/shapes.h): what an MoE
// block saves past its norm, and its backward's scratch.
#include <algorithm>

#include "memory/shapes.h"
#include "memory/shapes_detail.h"

namespace weft::memory::detail {

int64_t routed_token_rows(const Layout& /*l*/, const Dims& d) { return d.B * d.Tsp; }

int64_t moe_expert_input_rows(const ModelSpec& m, const Layout& l, const Dims& d) {
  const int64_t received = m.moe.received_rows(routed_token_rows(l, d), l.ep);
  return l.sp && l.etp > 1 ? l.tp * received : received;
}

}  // namespace weft::memory::detail

namespace weft::memory {

int64_t moe_routed_rows(const ModelSpec& m, const RunSpec& run, const Layout& l) {
  return detail::routed_token_rows(l, detail::dims(m, run, l));
}

}  // namespace weft::memory

namespace weft::memory::detail {

void moe_saved_shapes(const ModelSpec& m, const Layout& l, const Dims& d, std::vector<TensorShape>& out) {
  const MoeSpec& e = m.moe;
  // The routed experts run on the norm region's rows (this rank's own
  // under sp), the shared expert on all of them. The experts' rows: every
  // choice, rows x k (dropless), or at most E x capacity under a capacity.
  // Each rank computes its share of the experts' width under an expert tp
  // degree, and with sp on every tp rank's received rows.
  const int64_t rows = routed_token_rows(l, d), k = e.top_k, E = e.experts;
  const int64_t Fe = e.expert_intermediate / std::max<int64_t>(1, l.etp);
  // Under expert parallelism the experts' rows are those this rank's
  // experts receive (MoeSpec::received_rows), and the routing keeps the
  // counts each ep rank sent it per local expert (E of them in all), and
  // under etp with sp every tp rank's received counts (tp x E).
  const int64_t received = moe_expert_input_rows(m, l, d);
  out.push_back({"layer.moe.scores", Category::activations, rows * E, kFp32, 1});
  out.push_back({"layer.moe.experts", Category::activations, rows * k, kInt32, 1});
  out.push_back({"layer.moe.weights", Category::activations, rows * k, kFp32, 1});
  // (allgather: every ep rank's per-expert counts, ep x E).
  const int64_t counts = (l.ep <= 1 ? 0 : l.dispatch == MoeDispatch::allgather ? l.ep * E : E) +
                         (l.sp && l.etp > 1 ? l.tp * E : 0);
  out.push_back({"layer.moe.routing", Category::activations, rows * k + E + 1 + counts, 8, 1});
  out.push_back({"layer.moe.input", Category::activations, received * d.C, d.a, 1});
  out.push_back({"layer.moe.gate", Category::activations, received * Fe, d.a, 1});
  out.push_back({"layer.moe.up", Category::activations, received * Fe, d.a, 1});
  out.push_back({"layer.moe.act", Category::activations, received * Fe, d.a, 1});
  // The gate on the output multiplies each received row's SwiGLU output by
  // its weight (Megatron-Core's order), so the weights' gradient reads the
  // activation: the row's weight is kept, the experts' output is not.
  if (e.gate_on == GateOn::output)
    out.push_back({"layer.moe.row_weights", Category::activations, received, kFp32, 1});
  if (e.shared_intermediate > 0) {
    const int64_t Fs = e.shared_intermediate / l.tp, all = d.B * d.T;
    out.push_back({"layer.moe.shared_gate", Category::activations, all * Fs, d.a, 1});
    out.push_back({"layer.moe.shared_up", Category::activations, all * Fs, d.a, 1});
    out.push_back({"layer.moe.shared_act", Category::activations, all * Fs, d.a, 1});
  }
}

void moe_scratch_shapes(const ModelSpec& m, const Layout& l, const LoraSpec& lora, const Dims& d,
                        std::vector<TensorShape>& out) {
  // The router's logits (then their gradient), the gradient of the experts'
  // rows (their output's, then their input's), of their SwiGLU, of the
  // combine weights, and the router's statistics of a block rebuilding its
  // FFN (its saved ones stay as they were). Under expert parallelism the
  // rows in expert order leave from moe_send (the permuted input, then the
  // output gradient) and the experts compute on the rows received, whose
  // output, then input gradient, is moe_received. Under an expert tp degree
  // with sp the same two (the rows the tp ranks gathered), and with expert
  // parallelism the rows this rank received, or the sums it gets back, are
  // staged in moe_staged. With the gate on the output the rows' weights
  // travel as the rows do: from moe_row_weights (in this rank's expert
  // order, where their gradients come back) to the experts, whose
  // gradients moe_row_dweights holds.
  const int64_t rows = routed_token_rows(l, d), k = m.moe.top_k, E = m.moe.experts;
  const bool etp_sp = l.sp && l.etp > 1;
  const int64_t routed = m.moe.routed_rows(rows), received = moe_expert_input_rows(m, l, d);
  out.push_back({"scratch.moe_logits", Category::workspace, rows * E, d.a, 1});
  out.push_back({"scratch.moe_d_rows", Category::workspace, routed * d.C, d.a, 1});
  const int64_t Fe = m.moe.expert_intermediate / std::max<int64_t>(1, l.etp);
  out.push_back({"scratch.moe_d_mlp", Category::workspace, received * Fe, d.a, 3});
  if (l.ep > 1 || etp_sp) {
    out.push_back({"scratch.moe_send", Category::workspace, routed * d.C, d.a, 1});
    out.push_back({"scratch.moe_received", Category::workspace, received * d.C, d.a, 1});
  }
  if (l.ep > 1 && etp_sp)
    out.push_back({"scratch.moe_staged", Category::workspace, m.moe.received_rows(rows, l.ep) * d.C, d.a, 1});
  // The all-gather dispatcher's: every ep rank's routed rows.
  if (l.ep > 1 && l.dispatch == MoeDispatch::allgather)
    out.push_back({"scratch.moe_gathered", Category::workspace, l.ep * routed * d.C, d.a, 1});
  out.push_back({"scratch.moe_dweights", Category::workspace, rows * k, kFp32, 1});
  if (m.moe.gate_on == GateOn::output) {
    out.push_back({"scratch.moe_row_dweights", Category::workspace, received, kFp32, 1});
    if (l.ep > 1 || etp_sp) out.push_back({"scratch.moe_row_weights", Category::workspace, routed, kFp32, 1});
  }
  out.push_back({"scratch.moe_stats", Category::workspace, 2 * E, 8, 1});
  // LoRA on the routed experts: h = x A^T of the rows received, then the
  // adapters' gradient g = s dY B (llama_moe_lora.cpp), (rows, r) each (the
  // larger r where gate_up's is its own).
  if (lora.enabled() && (lora.targets_linear(Linear::gate) || lora.targets_linear(Linear::down))) {
    const int64_t r = std::max(lora.rank, lora.targets_linear(Linear::gate) ? lora.experts_gate_up_rank() : 0);
    out.push_back({"scratch.moe_lora", Category::workspace, received * r, d.a, 2});
  }
}

}  // namespace weft::memory::detail
