#include "trainer/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/adamw/adamw.h"
#include "kernels/elementwise/elementwise.h"
#include "memory/device.h"
#include "trainer/optim/dense_split_comm.h"

namespace weft::trainer {

void OptimConfig::validate() const {
  auto bad = [](const char* flag, double v, const char* valid) {
    throw InputError(fmt::format("{} {} is not valid; {}", flag, v, valid));
  };
  if (!std::isfinite(lr) || lr <= 0) bad("--lr", lr, "use a finite positive learning rate");
  if (!(min_lr_ratio >= 0 && min_lr_ratio <= 1)) bad("--min-lr-ratio", min_lr_ratio, "use 0..1");
  if (warmup_steps < 0) bad("--warmup", double(warmup_steps), "use 0 or more steps");
  if (!(beta1 >= 0 && beta1 < 1)) bad("--beta1", beta1, "use [0, 1)");
  if (!(beta2 >= 0 && beta2 < 1)) bad("--beta2", beta2, "use [0, 1)");
  if (!(eps > 0)) bad("--adam-eps", eps, "use a positive epsilon");
  if (!(weight_decay >= 0) || !std::isfinite(weight_decay))
    bad("--weight-decay", weight_decay, "use 0 or more");
  if (!(clip >= 0) || !std::isfinite(clip)) bad("--clip", clip, "use 0 (off) or a positive norm");
  if (max_nonfinite < 1) bad("--max-nonfinite", double(max_nonfinite), "use 1 or more");
}

double lr_at(const OptimConfig& c, int64_t step) {
  if (c.warmup_steps > 0 && step <= c.warmup_steps)
    return c.lr * double(step) / double(c.warmup_steps);
  if (c.schedule == Schedule::constant) return c.lr;
  const double span = double(std::max<int64_t>(1, c.total_steps - c.warmup_steps));
  const double progress = std::min(1.0, double(step - c.warmup_steps) / span);
  const double floor = c.lr * c.min_lr_ratio;
  return floor + 0.5 * (c.lr - floor) * (1.0 + std::cos(M_PI * progress));
}

template <typename Elem, typename G>
Optimizer<Elem, G>::Optimizer(LlamaStage<Elem, G>& stage, const OptimConfig& config)
    : stage_(stage), c_(config) {
  c_.validate();
  m_ = stage.tensors().template get<A>("optimizer.adam_m");
  v_ = stage.tensors().template get<A>("optimizer.adam_v");
  if (stage.tensors().has("optimizer.master")) master_ = stage.tensors().template get<A>("optimizer.master");
  WEFT_ASSERT((master_ != nullptr) == (sizeof(Elem) < sizeof(A)));
  const Layout& l = stage.layout();
  const int64_t ways = l.zero_shards(), psi = stage.param_elements();
  sharded_ = ways > 1 && l.zero >= 1;
  lo_ = 0;
  hi_ = psi;
  if (sharded_) {
    // This rank updates the stage's shard of the flat parameters.
    counts_ = stage.dp_shard_counts();
    WEFT_ASSERT(int64_t(counts_.size()) == ways);
    lo_ = stage.dp_shard_begin();
    hi_ = lo_ + counts_[size_t(stage.groups().zero_shard().rank())];
    // ZeRO-1 reduce-scatters the full gradients in place, into this rank's
    // range of them (the stage during its backward, or reduce_grads() after
    // it); under ZeRO-2 the stage already accumulated its shard group by
    // group in a buffer of the shard's size.
    grad_shard_ = stage.grads_sharded() ? stage.grads() : stage.grads() + lo_;
  }
  split_ = stage.dense_split();
  if (split_) {
    WEFT_ASSERT(split_->lo() == lo_ && split_->hi() == hi_);
    for (const auto& r : split_->owned()) {
      owned_.push_back({r.begin, r.end, state_elements_});
      state_elements_ += r.end - r.begin;
    }
  } else {
    owned_.push_back({lo_, hi_, 0});
    state_elements_ = hi_ - lo_;
  }
  WEFT_ASSERT(state_elements_ <= stage.tensors().elements("optimizer.adam_m"));
}

template <typename Elem, typename G>
void Optimizer<Elem, G>::reset_master() {
  if (!master_) return;
  // Under ZeRO-3 the stage holds only its shard: the range starts its weights.
  const int64_t weights_from = stage_.weights_sharded() ? lo_ : 0;
  for (const Owned& r : owned_)
    kernels::status_check(
        kernels::launch(kernels::WidenParams<Elem>{.n = r.end - r.begin, .x = stage_.weights() + (r.begin - weights_from),
                                                   .out = master_ + r.at},
                        {}, stage_.stream()),
        "widen");
}

template <typename Elem, typename G>
void Optimizer<Elem, G>::reduce_grads() {
  const parallel::ProcessGroups& g = stage_.groups();
  if (!stage_.grads_sharded() && !stage_.grads_reduced()) {  // else done during the backward
    // Over the replicas and the context-parallel ranks (or, under hybrid
    // sharding, the shard group's).
    if (sharded_) {
      g.zero_shard().reduce_scatter_v(stage_.grads(), grad_shard_, std::span<const int64_t>(counts_));
    } else if (g.ep) {
      // Expert parallelism without shards: over the ranks holding the same
      // experts, then the rest over ep (under the dense split each replica
      // its part).
      if (g.edp->size() > 1) g.edp->all_reduce(stage_.grads(), stage_.param_elements());
      stage_.reduce_replicas(stage_.grads(), 0, stage_.param_elements());
    } else {
      g.dpcp->all_reduce(stage_.grads(), stage_.param_elements());
    }
  }
  // Hybrid sharding (and expert parallelism): each shard group summed its
  // own part of the batch; the groups holding the same shard add theirs
  // (the second level), unless the backward did, group by group.
  if (sharded_ && g.replica && !stage_.replicas_reduced()) stage_.reduce_replicas(grad_shard_, lo_, hi_ - lo_);
}

template <typename Elem, typename G>
template <typename F>
void Optimizer<Elem, G>::for_each_piece(F f) {
  // The part of each parameter in this rank's ranges of the flat buffer
  // (both ascending).
  const auto& specs = stage_.params().specs;
  size_t i = 0;
  for (const Owned& r : owned_) {
    while (i < specs.size() && specs[i].offset + specs[i].local_elements() <= r.begin) ++i;
    for (size_t j = i; j < specs.size() && specs[j].offset < r.end; ++j) {
      const auto& p = specs[j];
      const int64_t begin = std::max(r.begin, p.offset), end = std::min(r.end, p.offset + p.local_elements());
      if (begin < end) f(p, begin, end, r.at + (begin - r.begin));
    }
  }
}

template <typename Elem, typename G>
G* Optimizer<Elem, G>::grad_at(int64_t flat) {
  return sharded_ ? grad_shard_ + (flat - lo_) : stage_.grads() + flat;
}

template <typename Elem, typename G>
double Optimizer<Elem, G>::grad_norm() {
  // Parameters replicated over tp (the norms) count once; sharded ones sum
  // over tp; stages sum over pp; ZeRO shards sum over their shard group (without
  // ZeRO the dp replicas hold equal gradients, and under hybrid sharding each
  // shard group the same shards).
  // sums[0]: tp-sharded parameters, sums[1]: tp-replicated ones, sums[2]:
  // under expert parallelism the routed experts', which the ep ranks hold
  // different parts of (summed over ep as well); in device memory on a GPU,
  // read back once.
  double host_sums[3] = {0, 0, 0};
  auto& table = stage_.tensors();
  const kernels::Stream stream = stage_.stream();
  double* sums = stage_.on_device() ? table.template get<double>("scratch.grad_norm_sum") : host_sums;
  if (stage_.on_device()) memory::copy(sums, host_sums, sizeof host_sums, stream);
  const bool ep = stage_.groups().ep != nullptr;
  // Under an expert tp degree the experts' adapters are whole on every tp
  // rank, their gradients summed over tp (LlamaStage::reduce_replicated_grads):
  // counted by tp rank 0, where the experts' own parts count on every one.
  const bool etp_whole_once = stage_.layout().etp > 1 && stage_.groups().tp_rank() != 0;
  for_each_piece([&](const ParamSpec& p, int64_t begin, int64_t end, int64_t) {
    if (p.tied_copy) return;  // the first stage counts the tied embedding
    if (etp_whole_once && p.expert >= 0 && p.shard == ShardDim::none) return;
    const kernels::SumSquaresParams<G> sq{
        .n = end - begin,
        .x = grad_at(begin),
        .sum = ep && p.expert >= 0 ? &sums[2] : p.shard == ShardDim::none ? &sums[1] : &sums[0]};
    const int64_t need = kernels::workspace_bytes(sq, stream.backend);
    WEFT_ASSERT(need <= table.bytes("scratch.grad_norm"));
    kernels::status_check(
        kernels::launch(sq, {table.template get<std::byte>("scratch.grad_norm"), need}, stream), "sum_squares");
  });
  if (stage_.on_device()) {
    memory::copy(host_sums, sums, sizeof host_sums, stream);
    memory::synchronize(stream);
  }
  // Replicated parameters are equal on every tp rank: counted by tp rank 0 only.
  const bool first = stage_.groups().tp_rank() == 0;
  // (The experts are whole on every tp rank, or split over them under an
  // expert tp degree, or each tp rank's others under epfold.)
  const bool experts_split = stage_.layout().etp > 1 || stage_.layout().ep_fold;
  double sum[2] = {host_sums[0] + (first ? host_sums[1] : 0.0), first || experts_split ? host_sums[2] : 0.0};
  const parallel::ProcessGroups& host = stage_.groups().host_groups();
  host.tp->all_reduce(sum, 2);
  host.pp->all_reduce(sum, 2);
  if (sharded_) host.zero_shard().all_reduce(sum, 2);
  // (Folded, the tp ranks of the ep group are summed already: the rest of
  // it is the replicas over dp x cp, none at ep = tp.)
  if (ep && !stage_.layout().ep_fold) host.ep->all_reduce(&sum[1], 1);
  if (ep && stage_.layout().ep_fold && host.replica) host.replica->all_reduce(&sum[1], 1);
  // Under the dense split each replica holds its part of the dense elements.
  if (split_) host.replica->all_reduce(&sum[0], 1);
  return std::sqrt(sum[0] + sum[1]);
}

template <typename Elem, typename G>
StepStats Optimizer<Elem, G>::step(int64_t step, double loss) {
  StepStats s;
  s.lr = lr_at(c_, step);
  s.grad_norm = grad_norm();
  if (!std::isfinite(loss) || !std::isfinite(s.grad_norm)) {
    s.skipped = true;
    ++bad_total_;
    if (++bad_in_a_row_ >= c_.max_nonfinite)
      throw NonFiniteError(fmt::format(
          "stopping: {} steps in a row had a non-finite loss or gradient norm (last: loss {}, "
          "grad norm {}) at step {}; lower --lr or check the data",
          bad_in_a_row_, loss, s.grad_norm, step));
    return s;
  }
  bad_in_a_row_ = 0;
  ++updates_;
  // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when below 1.
  const double scale = c_.clip > 0 ? std::min(1.0, c_.clip / (s.grad_norm + 1e-6)) : 1.0;
  std::vector<kernels::AdamwTensor<Elem, G>> tensors;
  const int64_t weights_from = stage_.weights_sharded() ? lo_ : 0;  // the flat index of weights()[0]
  for_each_piece([&](const ParamSpec& p, int64_t begin, int64_t end, int64_t at) {
    tensors.push_back({.param = stage_.weights() + (begin - weights_from),
                       .master = master_ ? master_ + at : nullptr,
                       .grad = grad_at(begin),
                       .m = m_ + at, .v = v_ + at, .n = end - begin,
                       .decay = p.decay ? kernels::WeightDecay::apply : kernels::WeightDecay::skip});
  });
  const kernels::AdamwParams<Elem, G> params{.tensors = tensors, .step = updates_, .lr = s.lr,
                                             .beta1 = c_.beta1, .beta2 = c_.beta2, .eps = c_.eps,
                                             .weight_decay = c_.weight_decay, .grad_scale = scale};
  // The gathered copies of the weights are stale from here on (and a gather
  // still reading the shard must finish before the update writes it).
  stage_.weights_updated();
  kernels::status_check(kernels::launch(params, {}, stage_.stream()), "adamw");
  // The dense split: the replicas complete their range's dense weights.
  if (split_)
    all_gather_dense(*stage_.groups().replica, *split_, stage_.weights() + (lo_ - weights_from), lo_, hi_ - lo_);
  // ZeRO-1 and -2: every replica gathers the updated parameters from their
  // owners; under ZeRO-3 they stay sharded, gathered group by group as the
  // next forward needs them.
  if (sharded_ && !stage_.weights_sharded())
    stage_.groups().zero_shard().all_gather_v(stage_.weights() + lo_, stage_.weights(),
                                     std::span<const int64_t>(counts_));
  return s;
}

template <typename Elem, typename G>
void Optimizer<Elem, G>::host_full(const A* mine, bool state, std::vector<A>& full) {
  // This rank's range to the host (under the dense split the replicas'
  // parts of its dense elements gathered over the host replica group), then
  // (ZeRO-1) every shard over the host dp group.
  const int64_t psi = stage_.param_elements();
  full.resize(size_t(psi));
  if (!sharded_ && !(split_ && state)) {
    memory::copy(full.data(), mine, psi * int64_t(sizeof(A)), stage_.stream());
    memory::synchronize(stage_.stream());
    return;
  }
  std::vector<A> range(size_t(hi_ - lo_));
  if (split_ && state) {
    std::vector<A> packed(static_cast<size_t>(state_elements_));
    memory::copy(packed.data(), mine, state_elements_ * int64_t(sizeof(A)), stage_.stream());
    memory::synchronize(stage_.stream());
    for (const Owned& r : owned_)
      std::copy_n(packed.begin() + r.at, r.end - r.begin, range.begin() + (r.begin - lo_));
    all_gather_dense(*stage_.groups().host_groups().replica, *split_, range.data(), lo_, hi_ - lo_);
  } else {
    memory::copy(range.data(), mine, (hi_ - lo_) * int64_t(sizeof(A)), stage_.stream());
    memory::synchronize(stage_.stream());
  }
  if (!sharded_) {
    full = std::move(range);
    return;
  }
  stage_.groups().host_groups().zero_shard().all_gather_v(range.data(), full.data(),
                                                          std::span<const int64_t>(counts_));
}

template <typename Elem, typename G>
void Optimizer<Elem, G>::state_from(const std::vector<A>& full, A* state) {
  for (const Owned& r : owned_)
    memory::copy(state + r.at, full.data() + r.begin, (r.end - r.begin) * int64_t(sizeof(A)), stage_.stream());
  memory::synchronize(stage_.stream());
}

template <typename Elem, typename G>
void Optimizer<Elem, G>::weights_full(std::vector<A>& w) {
  if (master_) {
    host_full(master_, true, w);
    return;
  }
  // The weights are the master: sharded under ZeRO-3, else every replica
  // holds all of them.
  if constexpr (std::is_same_v<Elem, A>)
    if (stage_.weights_sharded()) {
      host_full(stage_.weights(), false, w);
      return;
    }
  const int64_t psi = stage_.param_elements();
  w.resize(size_t(psi));
  memory::copy(w.data(), stage_.weights(), psi * int64_t(sizeof(A)), stage_.stream());
  memory::synchronize(stage_.stream());
}

template <typename Elem, typename G>
void Optimizer<Elem, G>::weights_set(const std::vector<A>& w) {
  stage_.set_weights(w);
  if (master_) state_from(w, master_);
}

template <typename Elem, typename G>
void Optimizer<Elem, G>::state_full(std::vector<A>& m, std::vector<A>& v) {
  host_full(m_, true, m);
  host_full(v_, true, v);
}

template <typename Elem, typename G>
void Optimizer<Elem, G>::host_views(const A*& w, const A*& m, const A*& v) const {
  w = m = v = nullptr;
  if constexpr (std::is_same_v<Elem, A>) {
    if (sharded_ || split_ || master_ || stage_.weights_sharded() || stage_.on_device()) return;
    w = stage_.weights();
    m = m_;
    v = v_;
  }
}

template <typename Elem, typename G>
void Optimizer<Elem, G>::state_set(const std::vector<A>& m, const std::vector<A>& v) {
  state_from(m, m_);
  state_from(v, v_);
}

template class Optimizer<float>;
template class Optimizer<double>;
template class Optimizer<kernels::bf16>;
template class Optimizer<kernels::bf16, kernels::bf16>;

void to_json(nlohmann::json& j, const OptimConfig& c) {
  j = nlohmann::json{{"lr", c.lr},
                     {"min_lr_ratio", c.min_lr_ratio},
                     {"warmup_steps", c.warmup_steps},
                     {"total_steps", c.total_steps},
                     {"schedule", c.schedule == Schedule::cosine ? "cosine" : "constant"},
                     {"beta1", c.beta1},
                     {"beta2", c.beta2},
                     {"eps", c.eps},
                     {"weight_decay", c.weight_decay},
                     {"clip", c.clip}};
}

}  // namespace weft::trainer
