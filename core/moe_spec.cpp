#include "core/moe_spec.h"

namespace weft {

const char* router_score_name(RouterScore s) { return s == RouterScore::softmax ? "softmax" : "sigmoid"; }

const char* router_weights_name(RouterWeights w) {
  return w == RouterWeights::scores ? "scores" : "renormalized";
}

const char* gate_on_name(GateOn g) { return g == GateOn::output ? "output" : "input"; }

const char* aux_loss_scope_name(AuxLossScope s) { return s == AuxLossScope::global ? "global" : "per_layer"; }

const char* qk_norm_name(QkNorm q) {
  switch (q) {
    case QkNorm::none: return "none";
    case QkNorm::rms: return "rms";
    case QkNorm::l2: return "l2";
  }
  return "?";
}

}  // namespace weft
