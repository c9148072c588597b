// The search's rules (space_rules.h).
#include "tuner/space_rules.h"

#include "memory/shapes.h"

namespace weft::tuner {

namespace {

std::string first_violation(const SpaceContext& ctx, const Layout& l) {
  // evaluate_one's order: FP8 on a device without it before the layout's rules.
  if (auto f8 = fp8_on_device(l, ctx.cluster.device); !f8.empty()) return f8;
  auto v = l.violations(ctx.model, ctx.run, ctx.cluster.gpus);
  return v.empty() ? memory::fp8_runs_none(ctx.model, ctx.run, l) : std::move(v.front());
}

}  // namespace

// An FP8 shape's rules from its bf16 twin's (the same shape with FP8 off;
// search_one): at fp8@0 Layout::violations has no rule of FP8's own, so FP8
// adds two that hold for the whole shape, FP8 on the device (first) and no
// GEMM left in FP8 (last), and otherwise breaks what the twin breaks.
Rules twin_rules(const SpaceContext& ctx, const Subspace& s, const Rules& bf16, RulePool& pool) {
  Layout l = s.shape;
  l.attention = s.attentions.front();
  const std::string device = fp8_on_device(l, ctx.cluster.device);
  const std::string none = device.empty() ? memory::fp8_runs_none(ctx.model, ctx.run, l) : std::string();
  if (device.empty() && none.empty()) return bf16;
  Rules r;
  r.attention = bf16.attention;
  const std::string* whole = pool.intern(!device.empty() ? device : none);
  for (const std::string* rule : bf16.shape) r.shape.push_back(!device.empty() || rule->empty() ? whole : rule);
  return r;  // (no attention valid: the knobs' rules are not read)
}

Rules rules_of(const SpaceContext& ctx, const Subspace& s, RulePool& pool) {
  Rules r;
  // (Each list at its size up front: grown one choice at a time they took
  // three times the allocations, a few million in a large space.)
  r.shape.reserve(s.attentions.size());
  r.attention.reserve(s.attentions.size());
  r.valid_attentions.reserve(s.attentions.size());
  const std::string* none = pool.intern(std::string());
  Layout l = s.shape;  // one copy, its knobs set in turn (a Layout's split allocates)
  for (AttentionKind a : s.attentions) {
    l.attention = a;
    r.shape.push_back(pool.intern(first_violation(ctx, l)));
    if (r.shape.back()->empty()) r.valid_attentions.push_back(r.shape.size() - 1);
    r.attention.push_back(a == AttentionKind::cudnn && ctx.cluster.device.kind != DeviceKind::gpu
                              ? pool.intern(cudnn_on_cpu(ctx.cluster.device))
                              : none);
  }
  if (r.valid_attentions.empty()) return r;
  r.ckpt.reserve(s.ckpts.size());
  r.zero.reserve(s.zeros.size());
  r.grad.reserve(s.grads.size());
  l.attention = s.attentions[r.valid_attentions.front()];
  for (const auto& [mode, k] : s.ckpts) {
    l.ckpt = mode;
    l.ckpt_layers = k;
    r.ckpt.push_back(pool.intern(first_violation(ctx, l)));
  }
  l.ckpt = s.shape.ckpt;
  l.ckpt_layers = s.shape.ckpt_layers;
  for (const ZeroChoice& z : s.zeros) {
    z.apply(l);
    r.zero.push_back(pool.intern(first_violation(ctx, l)));
  }
  l.zero = s.shape.zero;
  l.zero_group = s.shape.zero_group;
  for (GradPrecision g : s.grads) {
    l.grad = g;
    r.grad.push_back(pool.intern(first_violation(ctx, l)));
  }
  return r;
}

}  // namespace weft::tuner
