#include "trainer/optim/optimizer.h"

#include <cmath>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/adamw/adamw.h"
#include "kernels/elementwise/elementwise.h"

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

template <typename Elem>
Optimizer<Elem>::Optimizer(LlamaStage<Elem>& stage, const OptimConfig& config)
    : stage_(stage), c_(config) {
  c_.validate();
  m_ = stage.tensors().template get<Elem>("optimizer.adam_m");
  v_ = stage.tensors().template get<Elem>("optimizer.adam_v");
}

template <typename Elem>
double Optimizer<Elem>::grad_norm() {
  // Parameters replicated over tp (the norms) count once; sharded ones sum
  // over tp; stages sum over pp. Data-parallel replicas hold equal gradients.
  double sharded = 0, replicated = 0;
  auto& table = stage_.tensors();
  for (const auto& p : stage_.params().specs) {
    const kernels::SumSquaresParams<Elem> sq{.n = p.local_elements(), .x = stage_.grad(p),
                                             .sum = p.shard == ShardDim::none ? &replicated : &sharded};
    const int64_t need = kernels::workspace_bytes(sq);
    WEFT_ASSERT(need <= table.elements("scratch.grad_norm") * 8);
    kernels::status_check(
        kernels::launch(sq, {table.template get<std::byte>("scratch.grad_norm"), need}, {}), "sum_squares");
  }
  // Replicated parameters are equal on every tp rank: counted by tp rank 0 only.
  double sum = sharded + (stage_.groups().tp_rank() == 0 ? replicated : 0.0);
  stage_.groups().tp->all_reduce(&sum, 1);
  stage_.groups().pp->all_reduce(&sum, 1);
  return std::sqrt(sum);
}

template <typename Elem>
StepStats Optimizer<Elem>::step(int64_t step, double loss) {
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
  std::vector<kernels::AdamwTensor<Elem>> tensors;
  for (const auto& p : stage_.params().specs)
    tensors.push_back({.param = stage_.weight(p), .grad = stage_.grad(p), .m = m_ + p.offset,
                       .v = v_ + p.offset, .n = p.local_elements(),
                       .decay = p.decay ? kernels::WeightDecay::apply : kernels::WeightDecay::skip});
  const kernels::AdamwParams<Elem> params{.tensors = tensors, .step = updates_, .lr = s.lr,
                                          .beta1 = c_.beta1, .beta2 = c_.beta2, .eps = c_.eps,
                                          .weight_decay = c_.weight_decay, .grad_scale = scale};
  kernels::status_check(kernels::launch(params, {}, {}), "adamw");
  return s;
}

template class Optimizer<float>;
template class Optimizer<double>;

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
