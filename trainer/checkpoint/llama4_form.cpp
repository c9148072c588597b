#include "trainer/checkpoint/llama4_form.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/error.h"
#include "trainer/checkpoint/dtype.h"

namespace weft::checkpoint {

namespace {

std::string experts_tensor(int64_t layer, const char* which) {
  return fmt::format("model.layers.{}.feed_forward.experts.{}", layer, which);
}

// Row r of a (H * D)-row q or k projection in weft's order is this row in
// Meta's: within each head, weft's i < D/2 is Meta's 2i and weft's
// D/2 + i is Meta's 2i + 1.
int64_t meta_row(int64_t r, int64_t D) {
  const int64_t head = r / D, i = r % D, half = D / 2;
  return head * D + (i < half ? 2 * i : 2 * (i - half) + 1);
}

// t's rows permuted: row r goes to row to(r) when `to_meta`, else row to(r)
// comes to row r.
std::vector<std::byte> permute_rows(const TensorRef& t, int64_t D, bool to_meta) {
  const int64_t es = dtype_size(t.dtype), rows = t.shape.at(0), cols = t.elements() / std::max<int64_t>(rows, 1);
  std::vector<std::byte> out(size_t(rows * cols * es));
  const auto* src = static_cast<const std::byte*>(t.data);
  const int64_t row = cols * es;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t m = meta_row(r, D);
    std::memcpy(out.data() + (to_meta ? m : r) * row, src + (to_meta ? r : m) * row, size_t(row));
  }
  return out;
}

bool is_expert(ParamKind k) {
  return k == ParamKind::expert_gate || k == ParamKind::expert_up || k == ParamKind::expert_down;
}

}  // namespace

std::vector<std::byte> llama4_rows_to_meta(const TensorRef& t, int64_t head_dim) {
  return permute_rows(t, head_dim, true);
}

std::vector<std::byte> llama4_rows_from_meta(const TensorRef& t, int64_t head_dim) {
  return permute_rows(t, head_dim, false);
}

std::optional<Llama4Source> llama4_source(const ModelSpec& m, const ParamInfo& p) {
  if (ffn_naming(m) != FfnNaming::llama4) return std::nullopt;
  const int64_t E = m.moe.experts, C = m.hidden, F = m.moe.expert_intermediate;
  switch (p.kind) {
    case ParamKind::expert_gate:
    case ParamKind::expert_up: return Llama4Source{experts_tensor(p.layer, "gate_up_proj"), {E, C, 2 * F}};
    case ParamKind::expert_down: return Llama4Source{experts_tensor(p.layer, "down_proj"), {E, F, C}};
    case ParamKind::q_proj:
    case ParamKind::k_proj: return Llama4Source{p.name, p.shape};
    default: return std::nullopt;
  }
}

std::vector<std::byte> llama4_from_stored(const ModelSpec& m, const ParamInfo& p, const TensorRef& t) {
  if (p.kind == ParamKind::q_proj || p.kind == ParamKind::k_proj) return llama4_rows_from_meta(t, m.head_dim);
  const int64_t es = dtype_size(t.dtype), rows = p.shape[0], cols = p.shape[1];
  std::vector<std::byte> out(size_t(rows * cols * es));
  const auto* src = static_cast<const std::byte*>(t.data);
  const auto put = [&](int64_t r, int64_t c, int64_t from) {
    std::memcpy(out.data() + (r * cols + c) * es, src + from * es, size_t(es));
  };
  const int64_t e = p.expert;
  if (p.kind == ParamKind::expert_down) {  // (C, F) from down_proj[e] (F, C)
    const int64_t F = cols, C = rows;
    for (int64_t r = 0; r < C; ++r)
      for (int64_t c = 0; c < F; ++c) put(r, c, (e * F + c) * C + r);
    return out;
  }
  // (F, C) from gate_up_proj[e] (C, 2F), columns [0, F) or [F, 2F).
  const int64_t F = rows, C = cols, first = p.kind == ParamKind::expert_up ? F : 0;
  for (int64_t r = 0; r < F; ++r)
    for (int64_t c = 0; c < C; ++c) put(r, c, (e * C + c) * 2 * F + first + r);
  return out;
}

std::vector<TensorRef> llama4_to_stored(const ModelSpec& m, const std::vector<TensorRef>& tensors,
                                        std::vector<std::vector<std::byte>>& buffers) {
  std::map<std::string, ParamInfo, std::less<>> info;
  for (auto& p : hf_param_table(m)) info.emplace(p.name, std::move(p));
  std::map<std::string, const TensorRef*, std::less<>> by_name;
  for (const auto& t : tensors) by_name.emplace(t.name, &t);
  const int64_t E = m.moe.experts, C = m.hidden, F = m.moe.expert_intermediate, D = m.head_dim;

  std::vector<TensorRef> out;
  std::set<int64_t> fused;  // the layers whose experts are written
  for (const TensorRef& t : tensors) {
    const auto it = info.find(t.name);
    if (it == info.end() || !llama4_source(m, it->second)) {
      out.push_back(t);
      continue;
    }
    const ParamInfo& p = it->second;
    const int64_t es = dtype_size(t.dtype);
    if (!is_expert(p.kind)) {  // q or k: rows back into Meta's pairs
      out.push_back(TensorRef{t.name, t.dtype, t.shape, buffers.emplace_back(llama4_rows_to_meta(t, D)).data()});
      continue;
    }
    if (!fused.insert(p.layer).second) continue;
    // Expert e's weight of `kind` in this layer, in t's dtype.
    const auto part = [&](ParamKind kind, int64_t e) -> const std::byte* {
      const std::string name = hf_param_name(m, kind, p.layer, e);
      const auto found = by_name.find(name);
      if (found == by_name.end())
        throw InternalError(fmt::format("Llama 4 export: tensor '{}' is missing beside '{}'", name, t.name));
      if (found->second->dtype != t.dtype)
        throw InternalError(fmt::format("Llama 4 export: tensor '{}' is {} and '{}' is {}", name,
                                        to_string(found->second->dtype), t.name, to_string(t.dtype)));
      return static_cast<const std::byte*>(found->second->data);
    };
    auto& gate_up = buffers.emplace_back(size_t(E * C * 2 * F * es));
    for (int64_t e = 0; e < E; ++e) {
      const std::byte* gate = part(ParamKind::expert_gate, e);
      const std::byte* up = part(ParamKind::expert_up, e);
      // gate_up[e, c, f] = gate_e[f, c], gate_up[e, c, F + f] = up_e[f, c].
      for (int64_t c = 0; c < C; ++c)
        for (int64_t f = 0; f < F; ++f) {
          std::byte* row = gate_up.data() + ((e * C + c) * 2 * F) * es;
          std::memcpy(row + f * es, gate + (f * C + c) * es, size_t(es));
          std::memcpy(row + (F + f) * es, up + (f * C + c) * es, size_t(es));
        }
    }
    out.push_back(TensorRef{experts_tensor(p.layer, "gate_up_proj"), t.dtype, {E, C, 2 * F}, gate_up.data()});
    auto& down = buffers.emplace_back(size_t(E * F * C * es));
    for (int64_t e = 0; e < E; ++e) {
      const std::byte* d = part(ParamKind::expert_down, e);
      // down[e, f, c] = down_e[c, f].
      for (int64_t f = 0; f < F; ++f)
        for (int64_t c = 0; c < C; ++c)
          std::memcpy(down.data() + ((e * F + f) * C + c) * es, d + (c * F + f) * es, size_t(es));
    }
    out.push_back(TensorRef{experts_tensor(p.layer, "down_proj"), t.dtype, {E, F, C}, down.data()});
  }
  return out;
}

}  // namespace weft::checkpoint
