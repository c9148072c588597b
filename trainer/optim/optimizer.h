// AdamW with decoupled weight decay and bias correction over a stage's flat
// parameters, gradient clipping by the global norm, a warm-up + cosine (or
// constant) learning-rate schedule, and the non-finite guard: a step whose
// loss or gradient norm is not finite is skipped and counted, and too many in
// a row stop the run with a clear error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "trainer/model/llama.h"

namespace weft::trainer {

enum class Schedule { cosine, constant };

struct OptimConfig {
  double lr = 3e-3;
  double min_lr_ratio = 0.1;  // cosine floor as a fraction of lr
  int64_t warmup_steps = 20;
  int64_t total_steps = 1000;  // where the cosine reaches its floor
  Schedule schedule = Schedule::cosine;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  // 2-D weights only; norms never decay
  double clip = 1.0;          // max global gradient norm; 0 disables clipping
  int64_t max_nonfinite = 5;  // consecutive skipped steps before stopping

  // InputError naming any value out of its range (non-finite lr included).
  void validate() const;
};

// Learning rate of 1-based step `step`: linear warm-up from lr/warmup to lr
// over warmup_steps, then cosine decay to lr * min_lr_ratio at total_steps
// (or constant).
double lr_at(const OptimConfig& c, int64_t step);

// The step could not be taken: too many non-finite steps in a row.
class NonFiniteError : public Error {
 public:
  using Error::Error;
};

struct StepStats {
  double lr = 0;
  double grad_norm = 0;  // before clipping
  bool skipped = false;  // non-finite loss or gradient norm
};

// Adam moments and (for bf16 weights) the master weights are in Acc<Elem>,
// fp32 under bf16 compute; gradients are in the stage's G: Acc<Elem> too, or
// bf16 (grad:bf16), which the gradient norm and the update widen to fp32 as
// they read them. The update runs on the stage's stream.
template <typename Elem, typename G = kernels::Acc<Elem>>
class Optimizer {
 public:
  using A = kernels::Acc<Elem>;
  Optimizer(LlamaStage<Elem, G>& stage, const OptimConfig& config);

  // Where the stage keeps its weights in a narrower type than Acc (bf16), the
  // optimizer updates an fp32 master copy of this rank's range and writes
  // back their rounding. Call after the stage's weights were initialised or
  // loaded: the master takes their values. Nothing to do for fp32 and fp64.
  void reset_master();

  // Sums the step's gradients over the data-parallel replicas: an all-reduce,
  // or under ZeRO-1 a reduce-scatter into this rank's shard. Nothing to do
  // where the stage reduced them during the backward (ZeRO-0, ZeRO-1, ZeRO-2).
  void reduce_grads();
  // Clips and applies the update for 1-based step `step` (the schedule's and
  // the bias correction's count), given the step's mean loss. Under ZeRO-1
  // each rank updates its shard and the replicas all-gather the parameters.
  StepStats step(int64_t step, double loss);
  // The stage's weights in Acc on the host: the master weights (gathered over
  // dp under ZeRO-1), where the weights are their own master a copy of them.
  void weights_full(std::vector<A>& w);
  // The stage's weights (rounded to Elem) and this rank's master from full
  // Acc values on the host.
  void weights_set(const std::vector<A>& w);
  // Adam m and v of the whole stage (gathered over dp under ZeRO-1), and back.
  void state_full(std::vector<A>& m, std::vector<A>& v);
  // Where this rank holds the whole stage's weights (their own master), m
  // and v in host memory (the CPU trainer without ZeRO sharding): pointers
  // to them, read in place by a checkpoint save. Leaves them null otherwise.
  void host_views(const A*& w, const A*& m, const A*& v) const;
  void state_set(const std::vector<A>& m, const std::vector<A>& v);

  int64_t updates() const { return updates_; }  // applied (non-skipped) updates
  int64_t nonfinite_in_a_row() const { return bad_in_a_row_; }
  int64_t nonfinite_total() const { return bad_total_; }
  void restore(int64_t updates, int64_t bad_total) {
    updates_ = updates;
    bad_total_ = bad_total;
  }
  const OptimConfig& config() const { return c_; }

 private:
  double grad_norm();
  // f(spec, begin, end, at) for the part [begin, end) of each parameter in
  // this rank's ranges, `at` its place in the optimizer state.
  template <typename F>
  void for_each_piece(F f);
  G* grad_at(int64_t flat);
  // The stage's whole flat values from this rank's: `mine` holds its range
  // [lo_, hi_), or where `state` its ranges_ packed (the optimizer state).
  void host_full(const A* mine, bool state, std::vector<A>& full);
  // Flat values to this rank's packed state.
  void state_from(const std::vector<A>& full, A* state);
  LlamaStage<Elem, G>& stage_;
  bool sharded_ = false;      // ZeRO-1 over dp
  int64_t lo_ = 0, hi_ = 0;   // this rank's range of the flat parameters
  // The flat ranges whose state this rank keeps, ascending, and where each
  // starts in the state: [lo_, hi_), or under expert parallelism's dense
  // split (memory/dense_split.h) the range's experts and this replica's
  // part of its dense elements.
  struct Owned {
    int64_t begin = 0, end = 0, at = 0;
  };
  std::vector<Owned> owned_;
  int64_t state_elements_ = 0;
  const memory::DenseSplit* split_ = nullptr;
  std::vector<int64_t> counts_;  // every dp rank's shard size
  G* grad_shard_ = nullptr;
  OptimConfig c_;
  A* m_;
  A* v_;
  A* master_ = nullptr;  // bf16 weights only: this rank's state ranges in fp32
  int64_t updates_ = 0;
  int64_t bad_in_a_row_ = 0;
  int64_t bad_total_ = 0;
};

extern template class Optimizer<float>;
extern template class Optimizer<double>;
extern template class Optimizer<kernels::bf16>;
extern template class Optimizer<kernels::bf16, kernels::bf16>;

void to_json(nlohmann::json& j, const OptimConfig& c);

}  // namespace weft::trainer
