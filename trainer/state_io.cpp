#include "trainer/state_io.h"

#include <cstring>

namespace weft::trainer {

namespace {

using checkpoint::OptimState;
using checkpoint::optim_state_name;

void slice_into(const checkpoint::TensorRef& t, float* dst, const ParamSpec& p) {
  checkpoint::tensor_read_f32_block(t, p.row_begin, p.local_rows, p.col_begin, p.local_cols, dst);
}

}  // namespace

void state_save(const std::string& dir, LlamaStage<float>& stage, Optimizer<float>& opt,
                const SaveInfo& info) {
  std::vector<checkpoint::TensorRef> model, state;
  for (const auto& p : stage.params().specs) {
    // One rank holds every parameter whole (multi-rank runs gather first).
    WEFT_ASSERT(p.local_rows == p.rows && p.local_cols == p.cols);
    const auto shape = p.shape();
    model.push_back({p.name, checkpoint::DType::F32, shape, stage.weight(p)});
    state.push_back({optim_state_name(OptimState::exp_avg, p.name), checkpoint::DType::F32, shape,
                     opt.adam_m() + p.offset});
    state.push_back({optim_state_name(OptimState::exp_avg_sq, p.name), checkpoint::DType::F32, shape,
                     opt.adam_v() + p.offset});
  }
  checkpoint::Manifest man;
  man.step = info.step;
  man.data_position = info.data_position;
  man.rng_state = {info.seed};
  const auto& c = opt.config();
  man.optimizer = {"adamw", info.lr, c.beta1, c.beta2, c.eps, c.weight_decay, c.clip, opt.updates()};
  man.layout = stage.layout();
  man.model = stage.model();
  man.run = info.run;
  man.run["nonfinite_total"] = opt.nonfinite_total();
  checkpoint::save_checkpoint(dir, model, state, man);
}

void state_load(const checkpoint::Checkpoint& ck, LlamaStage<float>& stage, Optimizer<float>* optim) {
  checkpoint::check_compatible(ck.manifest, stage.model(), ck.dir);
  for (const auto& p : stage.params().specs) {
    slice_into(ck.model.at(p.name), stage.weight(p), p);
    if (!optim) continue;
    slice_into(ck.optimizer.at(optim_state_name(OptimState::exp_avg, p.name)), optim->adam_m() + p.offset, p);
    slice_into(ck.optimizer.at(optim_state_name(OptimState::exp_avg_sq, p.name)), optim->adam_v() + p.offset, p);
  }
  if (optim) optim->restore(ck.manifest.optimizer.step, ck.manifest.run.value("nonfinite_total", int64_t{0}));
}

}  // namespace weft::trainer
