// An MoE block's records of a micro-batch (llama_moe.cpp is its forward and
// backward): the load-balancing loss from the routers' saved statistics,
// per layer or pooled over every MoE layer (whose statistics travel with the
// micro-batch under pp), the experts' loads, the choices a capacity
// dropped and the receive buffers' peaks and overflows, taken by the run's
// records.
#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "kernels/moe/moe.h"
#include "trainer/model/llama_run.h"

namespace weft::trainer {

template <typename Elem, typename G>
double LlamaStage<Elem, G>::moe_balance(int64_t slot, int64_t chunk, std::vector<double>* dscore) {
  const MoeSpec& e = m_.moe;
  const int64_t E = e.experts;
  std::vector<int64_t> counts;
  std::vector<double> sums;
  for (int64_t i = 0; i < chunk_layers(chunk); ++i) {
    if (!params_.block_moe[size_t(chunk_begin_[size_t(chunk)] + i)]) continue;
    const std::vector<int64_t> host =
        moe_host(table_->get<int64_t>("layer.moe.stats", instance("layer.moe.stats", slot, i)), 2 * E);
    const int64_t* stats = host.data();
    counts.insert(counts.end(), stats, stats + E);
    const double* s = reinterpret_cast<const double*>(stats + E);
    sums.insert(sums.end(), s, s + E);
  }
  const int64_t layers = int64_t(counts.size()) / E;
  std::vector<double> unused;
  std::vector<double>& d = dscore ? *dscore : unused;
  d.assign(counts.size(), 0.0);
  if (layers == 0) return 0;
  // Over the micro-batch's tokens: its statistics were summed over the
  // ranks that split them.
  return kernels::moe_balance_loss(e.aux_scope, e.aux_loss_coef, layers, E, e.top_k, l_.mb * run_.seq, counts.data(),
                                   sums.data(), d.data());
}

template <typename Elem, typename G>
bool LlamaStage<Elem, G>::moe_stats_travel() const {
  return m_.moe.enabled() && m_.moe.aux_loss_coef > 0 && m_.moe.aux_scope == AuxLossScope::global &&
         (l_.pp > 1 || l_.vpp > 1);
}

template <typename Elem, typename G>
double LlamaStage<Elem, G>::global_balance(const double* totals, double* dscore) const {
  // The pooled loss is one layer of tokens x (MoE layers) rows.
  const MoeSpec& e = m_.moe;
  const int64_t E = e.experts;
  std::vector<int64_t> counts(static_cast<size_t>(E));
  for (int64_t j = 0; j < E; ++j) counts[size_t(j)] = int64_t(std::llround(totals[j]));
  std::vector<double> unused(static_cast<size_t>(E));
  return kernels::moe_balance_loss(AuxLossScope::global, e.aux_loss_coef, 1, E, e.top_k,
                                   l_.mb * run_.seq * m_.moe_layers(), counts.data(), totals + E,
                                   dscore ? dscore : unused.data());
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::moe_forward_end(int64_t slot, int64_t chunk, double grad_scale) {
  if (grad_scale > 0 && !dropped_pending_.empty()) {
    dropped_.resize(dropped_pending_.size());
    for (size_t i = 0; i < dropped_.size(); ++i) dropped_[i] += dropped_pending_[i];
  }
  std::fill(dropped_pending_.begin(), dropped_pending_.end(), int64_t{0});
  if (grad_scale <= 0) return;  // validation and evaluation: no loss to balance
  const MoeSpec& e = m_.moe;
  const int64_t E = e.experts, tokens = l_.mb * run_.seq;
  // This rank reports for the ranks that split the micro-batch (their
  // statistics are summed already).
  const bool report = groups_.tp_rank() == 0 && groups_.cp_rank() == 0;
  std::vector<double> sums(size_t(2 * E), 0.0);  // the chunk's, over its MoE layers
  for (int64_t i = 0; i < chunk_layers(chunk); ++i) {
    if (!params_.block_moe[size_t(chunk_begin_[size_t(chunk)] + i)]) continue;
    const std::vector<int64_t> host =
        moe_host(table_->get<int64_t>("layer.moe.stats", instance("layer.moe.stats", slot, i)), 2 * E);
    const int64_t* stats = host.data();
    const double* scores = reinterpret_cast<const double*>(stats + E);
    if (report) {
      load_.resize(size_t(m_.layers * E));
      int64_t* row = load_.data() + memory::global_layer(m_, l_, plan_.stage, chunk, i) * E;
      for (int64_t j = 0; j < E; ++j) row[j] += stats[j];
    }
    for (int64_t j = 0; j < E; ++j) {
      sums[size_t(j)] += double(stats[j]);
      sums[size_t(E + j)] += scores[j];
    }
  }
  if (e.aux_loss_coef <= 0) return;
  if (e.aux_scope == AuxLossScope::per_layer) {
    if (report) aux_host_ += moe_balance(slot, chunk, nullptr) * double(tokens);
    return;
  }
  // The global loss: the micro-batch's statistics over the virtual stages so
  // far; where it ends (the head's chunk), its totals.
  const bool travel = moe_stats_travel();
  const bool first = plan_.has_embedding && chunk == 0, last = plan_.has_head && chunk == l_.vpp - 1;
  if (travel && !first)
    for (int64_t j = 0; j < 2 * E; ++j) sums[size_t(j)] += moe_stats_in(slot)[j];
  if (!travel || last) {
    std::copy(sums.begin(), sums.end(), moe_totals(slot));
    if (report) aux_host_ += global_balance(moe_totals(slot), nullptr) * double(tokens);
  } else {
    std::copy(sums.begin(), sums.end(), moe_stats_out());
  }
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::take_expert_load(std::vector<int64_t>& into) {
  if (load_.empty()) return;
  into.resize(load_.size());
  for (size_t i = 0; i < load_.size(); ++i) into[i] += load_[i];
  std::fill(load_.begin(), load_.end(), int64_t{0});
}

template <typename Elem, typename G>
std::vector<double> LlamaStage<Elem, G>::take_dispatch_peaks() {
  std::vector<double> peaks(dispatch_peaks_.size(), 0.0);
  std::swap(peaks, dispatch_peaks_);
  return peaks;
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::take_dropped(std::vector<int64_t>& into) {
  if (dropped_.empty()) return;
  into.resize(dropped_.size());
  for (size_t i = 0; i < dropped_.size(); ++i) into[i] += dropped_[i];
  std::fill(dropped_.begin(), dropped_.end(), int64_t{0});
}

template <typename Elem, typename G>
std::optional<typename LlamaStage<Elem, G>::MoeOverflow> LlamaStage<Elem, G>::take_moe_overflow() {
  std::optional<MoeOverflow> o;
  std::swap(o, moe_overflow_);
  return o;
}

template <typename Elem, typename G>
std::string LlamaStage<Elem, G>::moe_overflow_text(const MoeOverflow& o) const {
  const MoeSpec& e = m_.moe;
  const int64_t rows = Msp_, balanced = rows * e.top_k;
  const double f = e.imbalance_for(rows, l_.ep);
  // The factor on a grid of hundredths that holds what arrived.
  const double needed = std::ceil(100.0 * double(o.rows) / double(balanced)) / 100.0;
  return fmt::format(
      "MoE layer {}: an ep rank's experts received {} rows of a micro-batch, past the {} its buffers hold "
      "(--moe-imbalance {:g}{}: {:g} x the balanced {}); raise --moe-imbalance (to at least {:g} for this "
      "micro-batch; 0 holds the worst case, {} rows) or cap the experts with --moe-capacity-factor",
      o.layer, o.rows, e.received_rows(rows, l_.ep), f, e.imbalance > 0 ? "" : ", sized by the tuning", f, balanced,
      needed, e.received_rows_worst(rows, l_.ep));
}

template <typename Elem, typename G>
double LlamaStage<Elem, G>::take_received_peak() {
  const double v = received_peak_;
  received_peak_ = 0;
  return v;
}

template <typename Elem, typename G>
double LlamaStage<Elem, G>::take_aux_loss() {
  const double v = aux_host_;
  aux_host_ = 0;
  return v;
}

#define WEFT_LLAMA_MOE_RECORDS(E, G)                                                          \
  template double LlamaStage<E, G>::moe_balance(int64_t, int64_t, std::vector<double>*);      \
  template double LlamaStage<E, G>::take_aux_loss();                                          \
  template void LlamaStage<E, G>::take_expert_load(std::vector<int64_t>&);                     \
  template std::vector<double> LlamaStage<E, G>::take_dispatch_peaks();                       \
  template bool LlamaStage<E, G>::moe_stats_travel() const;                                   \
  template double LlamaStage<E, G>::global_balance(const double*, double*) const;             \
  template void LlamaStage<E, G>::moe_forward_end(int64_t, int64_t, double);                   \
  template void LlamaStage<E, G>::take_dropped(std::vector<int64_t>&);                        \
  template std::optional<typename LlamaStage<E, G>::MoeOverflow> LlamaStage<E, G>::take_moe_overflow(); \
  template std::string LlamaStage<E, G>::moe_overflow_text(const MoeOverflow&) const;         \
  template double LlamaStage<E, G>::take_received_peak();
WEFT_LLAMA_MOE_RECORDS(float, float)
WEFT_LLAMA_MOE_RECORDS(double, double)
WEFT_LLAMA_MOE_RECORDS(kernels::bf16, float)
WEFT_LLAMA_MOE_RECORDS(kernels::bf16, kernels::bf16)

}  // namespace weft::trainer
