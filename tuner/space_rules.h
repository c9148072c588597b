// The rules of the space's search (space_search.cpp): which rule each
// layout of a subspace breaks, found from a handful of its layouts.
// Internal to the tuner.
#pragma once

#include <string>
#include <unordered_set>
#include <vector>

#include "tuner/space.h"

namespace weft::tuner {

// The rule texts of one thread's subspaces, each held once: a space of
// a hundred thousand shapes breaks a few hundred distinct rules, and a copy
// of each per shape and knob came to millions of allocations and a few
// hundred MB.
class RulePool {
 public:
  const std::string* intern(std::string text) {
    if (text.empty()) return &none_;  // (most of what is asked: no rule broken)
    return &*texts_.insert(std::move(text)).first;
  }

 private:
  std::unordered_set<std::string> texts_;  // (nodes: the pointers stay valid)
  const std::string none_;
};

// The first rule each layout of a subspace breaks, from a handful of layouts
// (texts in a RulePool; an empty text: none).
struct Rules {
  std::vector<const std::string*> shape;      // per attention kind: the shape's first broken rule
  std::vector<const std::string*> ckpt;       // per checkpointing choice, on a valid shape
  std::vector<const std::string*> zero;       // per ZeRO stage
  std::vector<const std::string*> grad;       // per gradient precision
  std::vector<const std::string*> attention;  // per attention kind: cudnn on a CPU
  std::vector<size_t> valid_attentions;

  // The first rule layout (c, a, z, g) of the subspace breaks; empty when none.
  const std::string& of(size_t c, size_t a, size_t z, size_t g) const {
    if (!shape[a]->empty()) return *shape[a];
    for (const std::string* r : {ckpt[c], zero[z], grad[g], attention[a]})
      if (!r->empty()) return *r;
    return *shape[a];
  }
};

// The first rule of each attention kind and knob choice of subspace s
// (core/layout's order: the shape's rules before the knobs').
Rules rules_of(const SpaceContext& ctx, const Subspace& s, RulePool& pool);
// An FP8 shape's rules from its bf16 twin's (the same shape with FP8 off).
Rules twin_rules(const SpaceContext& ctx, const Subspace& s, const Rules& bf16, RulePool& pool);

}  // namespace weft::tuner
