#include "core/layout.h"

#include <algorithm>
#include <map>
#include <charconv>
#include <cstdlib>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace weft {

const char* to_string(Checkpointing c) {
  switch (c) {
    case Checkpointing::none: return "none";
    case Checkpointing::selective: return "selective";
    case Checkpointing::ffn: return "ffn";
    case Checkpointing::full: return "full";
  }
  return "?";
}
const char* to_string(AttentionKind a) {
  switch (a) {
    case AttentionKind::flash: return "flash";
    case AttentionKind::materialized: return "materialized";
    case AttentionKind::cudnn: return "cudnn";
  }
  return "?";
}
const char* to_string(NormKind n) { return n == NormKind::fused ? "fused" : "unfused"; }
const char* to_string(GradPrecision g) { return g == GradPrecision::fp32 ? "fp32" : "bf16"; }
const char* to_string(MoeDispatch d) { return d == MoeDispatch::a2a ? "a2a" : "allgather"; }
const char* to_string(CpComm c) {
  switch (c) {
    case CpComm::ring: return "ring";
    case CpComm::allgather: return "allgather";
    case CpComm::a2a: return "a2a";
  }
  return "?";
}

const char* to_string(Fp8Recipe r) {
  switch (r) {
    case Fp8Recipe::off: return "off";
    case Fp8Recipe::tensorwise: return "tensorwise";
    case Fp8Recipe::delayed: return "delayed";
    case Fp8Recipe::blockwise: return "blockwise";
  }
  return "?";
}

Fp8Recipe fp8_recipe_parse(const std::string& s) {
  for (auto r : {Fp8Recipe::off, Fp8Recipe::tensorwise, Fp8Recipe::delayed, Fp8Recipe::blockwise})
    if (s == to_string(r)) return r;
  throw InputError(fmt::format("unknown FP8 scaling recipe '{}'; valid: tensorwise, delayed, off, blockwise "
                               "(delayed@N keeps the first and last N blocks in bf16)",
                               s));
}

std::string gemm_precision_text(const Layout& l) {
  if (l.fp8 == Fp8Recipe::off) return "bf16";
  return fmt::format("fp8:{}{}", to_string(l.fp8), l.fp8_bf16_layers > 0 ? fmt::format("@{}", l.fp8_bf16_layers) : "");
}

Checkpointing checkpointing_parse(const std::string& s) {
  for (auto c : {Checkpointing::none, Checkpointing::selective, Checkpointing::ffn,
                 Checkpointing::full})
    if (s == to_string(c)) return c;
  throw InputError(fmt::format("unknown checkpointing mode '{}'; valid: none, selective, ffn, full "
                               "(full@K for the first K layers of each stage)",
                               s));
}
AttentionKind attention_parse(const std::string& s) {
  for (auto a : {AttentionKind::flash, AttentionKind::materialized, AttentionKind::cudnn})
    if (s == to_string(a)) return a;
  throw InputError(fmt::format("unknown attention kind '{}'; valid: flash, materialized, cudnn (GPU only)", s));
}
NormKind norm_parse(const std::string& s) {
  if (s == "fused") return NormKind::fused;
  if (s == "unfused") return NormKind::unfused;
  throw InputError(fmt::format("unknown norm kind '{}'; valid: fused, unfused", s));
}
CpComm cp_comm_parse(const std::string& s) {
  for (auto c : {CpComm::ring, CpComm::allgather, CpComm::a2a})
    if (s == to_string(c)) return c;
  throw InputError(fmt::format("unknown context-parallel transport '{}'; valid: ring, allgather, a2a", s));
}
MoeDispatch moe_dispatch_parse(const std::string& s) {
  for (auto d : {MoeDispatch::a2a, MoeDispatch::allgather})
    if (s == to_string(d)) return d;
  throw InputError(fmt::format("unknown expert dispatcher '{}'; valid: a2a, allgather", s));
}
GradPrecision grad_precision_parse(const std::string& s) {
  if (s == "fp32") return GradPrecision::fp32;
  if (s == "bf16") return GradPrecision::bf16;
  throw InputError(fmt::format("unknown gradient precision '{}'; valid: fp32, bf16", s));
}

int64_t Layout::virtual_first_layer(const ModelSpec& m, int64_t v) const {
  if (split.empty()) return v * (m.layers / (pp * vpp));
  int64_t first = 0;
  for (int64_t i = 0; i < v && size_t(i) < split.size(); ++i) first += split[size_t(i)];
  return first;
}

int64_t Layout::stage_layers(const ModelSpec& m, int64_t stage) const {
  if (split.empty()) return m.layers / pp;
  int64_t n = 0;
  for (int64_t c = 0; c < vpp; ++c) n += chunk_layers(m, stage, c);
  return n;
}

int64_t Layout::max_stage_layers(const ModelSpec& m) const {
  if (split.empty()) return m.layers / pp;
  int64_t n = 0;
  for (int64_t s = 0; s < pp; ++s) n = std::max(n, stage_layers(m, s));
  return n;
}

int64_t Layout::max_chunk_layers(const ModelSpec& m, int64_t stage) const {
  if (split.empty()) return m.layers / (pp * vpp);
  int64_t n = 0;
  for (int64_t c = 0; c < vpp; ++c) n = std::max(n, chunk_layers(m, stage, c));
  return n;
}

int64_t Layout::chunk_checkpointed(const ModelSpec& m, int64_t stage) const {
  if (ckpt == Checkpointing::none) return 0;
  const int64_t n = max_chunk_layers(m, stage);
  return ckpt_layers > 0 ? std::min(n, ckpt_layers / vpp) : n;
}

int64_t Layout::checkpointed_layers(const ModelSpec& m, int64_t stage) const {
  if (ckpt == Checkpointing::none) return 0;
  if (split.empty()) {
    const int64_t n = stage_layers(m, stage);
    return ckpt_layers > 0 && ckpt_layers < n ? ckpt_layers : n;
  }
  const int64_t k = chunk_checkpointed(m, stage);
  int64_t n = 0;
  for (int64_t c = 0; c < vpp; ++c) n += std::min(k, chunk_layers(m, stage, c));
  return n;
}

bool Layout::edge_split() const {
  for (size_t v = 2; v + 1 < split.size(); ++v)
    if (split[v] != split[1]) return false;
  return true;
}

std::string split_text(const std::vector<int64_t>& split) {
  std::string out;
  for (size_t i = 0; i < split.size();) {
    size_t j = i;
    while (j < split.size() && split[j] == split[i]) ++j;
    if (!out.empty()) out += '.';
    out += j - i > 1 ? fmt::format("{}x{}", split[i], j - i) : fmt::format("{}", split[i]);
    i = j;
  }
  return out;
}

std::optional<std::vector<int64_t>> edge_split(int64_t layers, int64_t virtual_stages, int64_t first, int64_t last) {
  if (virtual_stages < 2 || first < 0 || last < 0) return std::nullopt;
  const int64_t rest = layers - first - last, between = virtual_stages - 2;
  if (between == 0 ? rest != 0 : rest < between || rest % between != 0) return std::nullopt;
  const int64_t each = between > 0 ? rest / between : first;
  if (first == each && last == each) return std::vector<int64_t>{};
  std::vector<int64_t> s(size_t(virtual_stages), each);
  s.front() = first;
  s.back() = last;
  return s;
}

namespace {

// A capacity factor as the layout text writes it: its shortest form that
// reads back the same, without an exponent (whose '-' would split the text).
std::string factor_text(double f) {
  std::string t = fmt::format("{}", f);
  if (t.find('e') == std::string::npos) return t;
  t = fmt::format("{:.17f}", f);
  while (t.back() == '0') t.pop_back();
  if (t.back() == '.') t.pop_back();
  return t;
}

}  // namespace

std::string Layout::to_string() const {
  std::string ck = weft::to_string(ckpt);
  if (ckpt != Checkpointing::none && ckpt_layers > 0) ck += fmt::format("@{}", ckpt_layers);
  std::string f8;
  if (fp8 != Fp8Recipe::off || fp8_bf16_layers > 0)
    f8 = fmt::format("-fp8:{}{}", weft::to_string(fp8), fp8_bf16_layers > 0 ? fmt::format("@{}", fp8_bf16_layers) : "");
  return fmt::format("tp{}{}-pp{}-dp{}{}{}-mb{}-vpp{}-{}-ckpt:{}-attn:{}-norm:{}-zero{}{}-grad:{}{}{}{}{}", tp,
                     cp != 1 ? fmt::format("-cp{}", cp) : "", pp, dp,
                     (ep != 1 ? fmt::format("-ep{}", ep) : "") + (ep_fold ? "-epfold" : ""),
                     etp != 1 ? fmt::format("-etp{}", etp) : "", mb,
                     vpp, sp ? "sp" : "nosp", ck,
                     weft::to_string(attention), weft::to_string(norm), zero,
                     zero_group > 0 ? fmt::format("@{}", zero_group) : "", weft::to_string(grad),
                     cp != 1 || cp_comm != CpComm::ring ? fmt::format("-cp:{}", weft::to_string(cp_comm)) : "",
                     ep != 1 || dispatch != MoeDispatch::a2a ? fmt::format("-dispatch:{}", weft::to_string(dispatch))
                                                             : "",
                     f8,
                     split.empty() ? "" : "-split:" + split_text(split)) +
         (capacity_factor > 0 ? "-cap:" + factor_text(capacity_factor) : "");
}

namespace {

int64_t parse_count(const std::string& field, const std::string& digits) {
  int64_t v = 0;
  const char* end = digits.data() + digits.size();
  auto [p, ec] = std::from_chars(digits.data(), end, v);
  if (digits.empty() || ec != std::errc() || p != end)
    throw InputError(fmt::format("layout field '{}': '{}' is not a whole number", field, digits));
  return v;
}

}  // namespace

std::vector<int64_t> split_parse(const std::string& text) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (true) {
    const size_t end = std::min(text.find('.', start), text.size());
    const std::string item = text.substr(start, end - start);
    const size_t x = item.find('x');
    const int64_t n = parse_count("split:" + text, item.substr(0, x));
    const int64_t k = x == std::string::npos ? 1 : parse_count("split:" + text, item.substr(x + 1));
    if (k < 1 || k > (int64_t{1} << 20))
      throw InputError(fmt::format("split:{}: '{}' repeats a count {} times; give 1 to 2^20", text, item, k));
    if (n > (int64_t{1} << 40))
      throw InputError(fmt::format("split:{}: {} layers in one virtual stage is past any model", text, n));
    if (out.size() + size_t(k) > (size_t{1} << 20))
      throw InputError(fmt::format("split:{} names more than 2^20 virtual stages", text));
    out.insert(out.end(), size_t(k), n);
    if (end == text.size()) break;
    start = end + 1;
  }
  // Equal counts are the even split, which the text leaves out.
  if (std::all_of(out.begin(), out.end(), [&](int64_t n) { return n == out.front(); })) out.clear();
  return out;
}

Layout Layout::parse(const std::string& text) {
  if (text.empty())
    throw InputError("empty layout; expected e.g. tp2-pp2-dp1-mb1-vpp1-sp-ckpt:none-attn:flash-"
                     "norm:fused-zero0");
  Layout l;
  // Each field once: "tp2-tp1" or "zero3-zero0" would otherwise take the
  // last and drop the first without a word.
  std::map<std::string, std::string> seen;
  const auto once = [&](const std::string& field, const std::string& tok) {
    const auto [it, fresh] = seen.emplace(field, tok);
    if (!fresh)
      throw InputError(fmt::format("layout '{}': {} is given twice ('{}' and '{}'); give each field once", text,
                                   field, it->second, tok));
  };
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('-', start);
    if (end == std::string::npos) end = text.size();
    const std::string tok = text.substr(start, end - start);
    start = end + 1;
    {
      // The field a token sets: its name before ':' or its digits.
      std::string field = tok.substr(0, tok.find(':'));
      if (tok.find(':') == std::string::npos) field = tok.substr(0, tok.find_first_of("0123456789"));
      if (tok.rfind("cp:", 0) == 0) field = "cp transport";
      if (field == "nosp") field = "sp";
      if (!field.empty()) once(field, tok);
    }
    auto after = [&](size_t n) { return tok.substr(n); };
    // A number cut off by its own '-' ("mb-1" reads as "mb" then "1"): the
    // value the user wrote is negative, and the message says so.
    auto count = [&](const std::string& digits, const char* name, const char* valid) {
      if (digits.empty() && end < text.size()) {
        const size_t next_end = std::min(text.find('-', start), text.size());
        const std::string next = text.substr(start, next_end - start);
        if (!next.empty() && next.find_first_not_of("0123456789") == std::string::npos)
          throw InputError(fmt::format("layout '{}': {} is -{}; it must be {}", text, name, next, valid));
      }
      return parse_count(tok, digits);
    };
    if (tok.rfind("ckpt:", 0) == 0) {
      std::string mode = after(5);
      const auto at = mode.find('@');
      if (at != std::string::npos) {
        l.ckpt_layers = count(mode.substr(at + 1), "ckpt@K", "a whole number of layers, 0 or more");
        mode = mode.substr(0, at);
      }
      l.ckpt = checkpointing_parse(mode);
    } else if (tok.rfind("attn:", 0) == 0) {
      l.attention = attention_parse(after(5));
    } else if (tok.rfind("norm:", 0) == 0) {
      l.norm = norm_parse(after(5));
    } else if (tok.rfind("fp8:", 0) == 0) {
      std::string recipe = after(4);
      const auto at = recipe.find('@');
      if (at != std::string::npos) {
        l.fp8_bf16_layers = count(recipe.substr(at + 1), "fp8@N", "a whole number of blocks, 0 or more");
        recipe = recipe.substr(0, at);
      }
      l.fp8 = fp8_recipe_parse(recipe);
    } else if (tok.rfind("cp:", 0) == 0) {
      l.cp_comm = cp_comm_parse(after(3));
    } else if (tok.rfind("dispatch:", 0) == 0) {
      l.dispatch = moe_dispatch_parse(after(9));
    } else if (tok.rfind("cap:", 0) == 0) {
      const std::string f = after(4);
      char* end = nullptr;
      const double v = std::strtod(f.c_str(), &end);
      if (f.empty() || end != f.c_str() + f.size() || !(v >= 0 && v <= kMaxCapacityFactor))
        throw InputError(fmt::format("layout '{}': cap:{} must be an MoE capacity factor from 0 (dropless) to {:g}",
                                     text, f, kMaxCapacityFactor));
      l.capacity_factor = v;
    } else if (tok.rfind("split:", 0) == 0) {
      l.split = split_parse(after(6));
    } else if (tok.rfind("grad:", 0) == 0) {
      l.grad = grad_precision_parse(after(5));
    } else if (tok == "sp") {
      l.sp = true;
    } else if (tok == "nosp") {
      l.sp = false;
    } else if (tok.rfind("zero", 0) == 0) {
      std::string stage = after(4);
      const auto at = stage.find('@');
      if (at != std::string::npos) {
        l.zero_group = count(stage.substr(at + 1), "zero@G", "a whole number of ranks that divides dp x cp");
        if (l.zero_group == 0)
          throw InputError(fmt::format("layout '{}': zero{} shards within groups of 0 ranks; give at least 2 "
                                       "(or leave out @G for one group of all dp x cp ranks)",
                                       text, stage.substr(0, at)));
        stage = stage.substr(0, at);
      }
      l.zero = count(stage, "zero", "0, 1, 2 or 3");
    } else if (tok.rfind("vpp", 0) == 0) {
      l.vpp = count(after(3), "vpp", "a whole number of at least 1");
    } else if (tok == "epfold") {
      l.ep_fold = true;
    } else if (tok.rfind("etp", 0) == 0) {
      l.etp = count(after(3), "etp", "1 or the tp degree");
    } else if (tok.rfind("ep", 0) == 0) {
      l.ep = count(after(2), "ep", "a whole number of at least 1");
    } else if (tok.rfind("cp", 0) == 0) {
      l.cp = count(after(2), "cp", "a whole number of at least 1");
    } else if (tok.rfind("tp", 0) == 0) {
      l.tp = count(after(2), "tp", "a whole number of at least 1");
    } else if (tok.rfind("pp", 0) == 0) {
      l.pp = count(after(2), "pp", "a whole number of at least 1");
    } else if (tok.rfind("dp", 0) == 0) {
      l.dp = count(after(2), "dp", "a whole number of at least 1");
    } else if (tok.rfind("mb", 0) == 0) {
      l.mb = count(after(2), "mb", "a whole number of at least 1");
    } else {
      throw InputError(fmt::format(
          "layout '{}': unknown field '{}'; fields are tpN, cpN, ppN, dpN, epN, epfold, etpN, mbN, vppN, sp|nosp, "
          "ckpt:none|selective|ffn|full[@K], attn:flash|materialized|cudnn, norm:fused|unfused, zeroN[@G], "
          "grad:fp32|bf16, cp:ring|allgather|a2a, dispatch:a2a|allgather, cap:F, fp8:tensorwise|delayed|blockwise[@N], "
          "split:N.N.N (layers per virtual stage; NxK for K stages of N)",
          text, tok));
    }
    if (end == text.size()) break;
  }
  // One shard group of every dp x cp rank is plain ZeRO.
  if (int64_t ways = 0; l.zero_group > 0 && !__builtin_mul_overflow(l.dp, l.cp, &ways) && l.zero_group == ways)
    l.zero_group = 0;
  return l;
}

std::vector<std::string> Layout::violations(const ModelSpec& m, const RunSpec& run,
                                            int64_t world) const {
  std::vector<std::string> v;
  // No degree past the most GPUs a cluster may have (2^20), so that the
  // products below stay far inside 64 bits.
  constexpr int64_t kMaxDegree = int64_t{1} << 20;
  for (auto [name, x] :
       {std::pair{"tp", tp}, {"cp", cp}, {"pp", pp}, {"dp", dp}, {"ep", ep}, {"etp", etp}, {"mb", mb}, {"vpp", vpp}}) {
    if (x < 1) v.push_back(fmt::format("{}={} must be at least 1", name, x));
    else if (x > kMaxDegree) v.push_back(fmt::format("{}={} must be at most {} (2^20)", name, x, kMaxDegree));
  }
  if (!v.empty()) return v;
  int64_t ranks = tp * cp;  // each factor at most 2^20: the product of two fits, of four may not
  const bool past = __builtin_mul_overflow(ranks, pp * dp, &ranks);
  if (past || ranks != world)
    v.push_back(cp == 1 ? fmt::format("tp*pp*dp = {}*{}*{} = {} must equal the world size {}", tp, pp, dp,
                                      past ? std::string("more than 2^63") : std::to_string(ranks), world)
                        : fmt::format("tp*cp*pp*dp = {}*{}*{}*{} = {} must equal the world size {}", tp, cp, pp,
                                      dp, past ? std::string("more than 2^63") : std::to_string(ranks), world));
  if (cp > 1 && run.seq % (2 * cp) != 0)
    v.push_back(fmt::format("context parallelism cuts seq T={} into 2*cp = {} equal chunks: T must be divisible",
                            run.seq, 2 * cp));
  if (cp == 1 && cp_comm != CpComm::ring)
    v.push_back(fmt::format("cp:{} names a context-parallel transport but cp=1", weft::to_string(cp_comm)));
  if (cp > 1 && cp_comm == CpComm::a2a && m.heads % tp == 0 && m.kv_heads % tp == 0 &&
      ((m.heads / tp) % cp != 0 || (m.kv_heads / tp) % cp != 0))
    v.push_back(fmt::format("cp:a2a splits each rank's heads over cp={}: heads H/tp={} and kv heads H_kv/tp={} "
                            "must be divisible by it (use cp:ring or cp:allgather)",
                            cp, m.heads / tp, m.kv_heads / tp));
  if (cp > 1 && cp_comm == CpComm::ring && attention == AttentionKind::materialized)
    v.push_back(fmt::format("cp:ring merges each query chunk over the key chunks it receives, which the materialized "
                            "kernel cannot (it keeps probabilities per call): use attn:flash, or cp:allgather or "
                            "cp:a2a"));
  if (m.heads % tp != 0)
    v.push_back(fmt::format("heads H={} must be divisible by tp={}", m.heads, tp));
  if (m.kv_heads % tp != 0)
    v.push_back(fmt::format("kv heads H_kv={} must be divisible by tp={}", m.kv_heads, tp));
  if (m.intermediate % tp != 0)
    v.push_back(fmt::format("intermediate F={} must be divisible by tp={}", m.intermediate, tp));
  const int64_t stages = pp * vpp;  // both at most 2^20
  if (split.empty() && m.layers % stages != 0) {
    // The split that counts the embedding and the loss as layers, where it divides.
    const auto counted = m.layers + 2 > stages ? weft::edge_split(m.layers, stages, (m.layers + 2) / stages - 1,
                                                           (m.layers + 2) / stages - 1)
                                               : std::nullopt;
    v.push_back(fmt::format("layers L={} must be divisible by pp*vpp = {}*{} = {}, or the layout must give each "
                            "virtual stage's layers (split:{}){}",
                            m.layers, pp, vpp, stages,
                            counted && !counted->empty() ? split_text(*counted) : "N.N...",
                            counted && !counted->empty() ? ", the embedding and the loss counted as layers" : ""));
  }
  if (!split.empty()) {
    int64_t sum = 0;
    for (int64_t n : split) sum += n;
    if (int64_t(split.size()) != stages)
      v.push_back(fmt::format("split:{} gives {} virtual stages; pp*vpp = {}*{} = {} need a count each",
                              split_text(split), split.size(), pp, vpp, stages));
    else if (sum != m.layers)
      v.push_back(fmt::format("split:{} holds {} layers; the model has L={}", split_text(split), sum, m.layers));
    for (size_t i = 1; i + 1 < split.size(); ++i)
      if (split[i] < 1) {
        v.push_back(fmt::format("split:{} leaves virtual stage {} without a layer; only the first (embedding) and "
                                "the last (head and loss) may hold none",
                                split_text(split), i));
        break;
      }
  }
  if (run.global_batch % (mb * dp) != 0)
    v.push_back(fmt::format("global batch {} must be divisible by mb*dp = {}*{} = {}",
                            run.global_batch, mb, dp, mb * dp));
  if (sp && tp == 1) v.push_back("sequence parallelism (sp) needs tp > 1, got tp=1");
  if (sp && cp == 1 && run.seq % tp != 0)
    v.push_back(fmt::format("sequence parallelism shards seq T={} by tp={}: T must be divisible",
                            run.seq, tp));
  if (sp && cp > 1 && run.seq % (2 * cp) == 0 && (run.seq / cp) % tp != 0)
    v.push_back(fmt::format("sequence parallelism shards the T/cp = {} tokens of each rank by tp={}: they must be "
                            "divisible",
                            run.seq / cp, tp));
  if (vpp > 1 && pp == 1) v.push_back(fmt::format("vpp={} needs pp > 1, got pp=1", vpp));
  if (vpp > 1 && run.global_batch % (mb * dp) == 0 && micro_batches(run) % pp != 0)
    v.push_back(fmt::format("interleaved 1F1B (vpp={}) needs the micro-batch count {} "
                            "(global batch {} / (mb {} * dp {})) divisible by pp={}",
                            vpp, micro_batches(run), run.global_batch, mb, dp, pp));
  if (ckpt_layers < 0) v.push_back(fmt::format("ckpt@{} must not be negative", ckpt_layers));
  if (ckpt == Checkpointing::none && ckpt_layers > 0)
    v.push_back(fmt::format("ckpt:none@{} names layers but no checkpointing mode", ckpt_layers));
  if (ckpt_layers > 0 && split.empty() && m.layers % pp == 0 && ckpt_layers > m.layers / pp)
    v.push_back(fmt::format("ckpt@{} exceeds the {} layers of a pipeline stage (L={} / pp={})",
                            ckpt_layers, m.layers / pp, m.layers, pp));
  if (ckpt_layers > 0 && !split.empty() && int64_t(split.size()) == stages && ckpt_layers > max_stage_layers(m))
    v.push_back(fmt::format("ckpt@{} exceeds the {} layers of the largest pipeline stage", ckpt_layers,
                            max_stage_layers(m)));
  if (vpp > 1 && ckpt_layers > 0 && ckpt_layers % vpp != 0)
    v.push_back(fmt::format("ckpt@{} with vpp={} must be divisible by vpp (K/vpp layers of each "
                            "chunk are checkpointed)",
                            ckpt_layers, vpp));
  if (fp8_bf16_layers < 0) v.push_back(fmt::format("fp8@{} must not be negative", fp8_bf16_layers));
  // Attention within chunks past the chunk: weft's CPU flash and
  // materialized kernels mask by chunk; cuDNN's graphs (attn:cudnn) have no
  // chunk mask in weft. The GPU's own kernels refuse it too, which the
  // trainer says for a GPU run (validate_config).
  if (m.attention.attention_chunk > 0 && run.seq > m.attention.attention_chunk && attention == AttentionKind::cudnn)
    v.push_back(fmt::format("seq {} is past {}'s attention chunk of {} positions, and attn:cudnn does not attend "
                            "within chunks; use attn:flash or attn:materialized (on the CPU), or --seq {} or less",
                            run.seq, m.name, m.attention.attention_chunk, m.attention.attention_chunk));
  if (capacity_factor != m.moe.capacity_factor) {
    if (!m.moe.enabled())
      v.push_back(fmt::format("cap:{:g} names an MoE capacity factor, but {} is dense", capacity_factor, m.name));
    else
      v.push_back(fmt::format("cap:{:g} but the run's {} drops at capacity factor {:g} (--moe-capacity-factor)",
                              capacity_factor, m.name, m.moe.capacity_factor));
  }
  if (fp8 == Fp8Recipe::off && fp8_bf16_layers > 0)
    v.push_back(fmt::format("fp8:off@{} names bf16 blocks but FP8 is off", fp8_bf16_layers));
  if (fp8 != Fp8Recipe::off && fp8_bf16_layers > 0 && fp8_bf16_layers >= m.layers - fp8_bf16_layers)
    v.push_back(fmt::format("fp8:{}@{} keeps the first and last {} blocks in bf16, which is all L={} of them",
                            weft::to_string(fp8), fp8_bf16_layers, fp8_bf16_layers, m.layers));
  if (zero < 0 || zero > 3) v.push_back(fmt::format("zero={} must be 0, 1, 2 or 3", zero));
  if (zero_group != 0) {
    const int64_t ways = dp * cp;  // each at most 2^20
    if (zero == 0)
      v.push_back(fmt::format("zero0@{} names a shard group but ZeRO-0 shards nothing (use zero1, zero2 or zero3 "
                              "with @{})",
                              zero_group, zero_group));
    else if (zero_group < 2 || zero_group > ways || ways % zero_group != 0)
      v.push_back(fmt::format("zero{}@{}: the shard group must divide dp x cp = {} x {} = {} and hold at least 2 "
                              "ranks",
                              zero, zero_group, dp, cp, ways));
  }
  if (etp != 1) {
    if (!m.moe.enabled())
      v.push_back(fmt::format("etp={} splits the routed experts over tp ranks, but {} is dense (use etp1)", etp, m.name));
    else if (etp != tp)
      v.push_back(fmt::format("etp={} must be 1 (experts whole on every tp rank) or tp={}", etp, tp));
    else if (m.moe.expert_intermediate % etp != 0)
      v.push_back(fmt::format("etp={} must divide the experts' width {}", etp, m.moe.expert_intermediate));
  }
  if (ep == 1 && dispatch != MoeDispatch::a2a)
    v.push_back(fmt::format("dispatch:{} names an expert dispatcher but ep=1", weft::to_string(dispatch)));
  if (ep_fold) {
    if (ep <= 1)
      v.push_back("epfold folds the ep group over the tp ranks, but ep=1 (give epN with N a multiple of tp)");
    else if (tp <= 1)
      v.push_back(fmt::format("epfold folds ep={} over the tp ranks, but tp=1 (leave out epfold: ep then spans dp x "
                              "cp)",
                              ep));
    else if (ep % tp != 0)
      v.push_back(fmt::format("epfold: ep={} counts the tp={} ranks first and must be a multiple of tp", ep, tp));
    if (etp != 1)
      v.push_back(fmt::format("epfold with etp={}: the ep group folds over the tp ranks only at an expert tp degree "
                              "of 1 (use etp1, or leave out epfold)",
                              etp));
    if (tp > 1 && !sp)
      v.push_back(fmt::format("epfold needs sp: each tp rank routes and dispatches its own rows (layout {})",
                              to_string()));
  }
  if (ep > 1) {
    const int64_t ways = dp * cp;
    if (!m.moe.enabled())
      v.push_back(fmt::format("ep={} splits the routed experts over ranks, but {} is dense (use ep1)", ep, m.name));
    else if (m.moe.experts % ep != 0)
      v.push_back(fmt::format("ep={} must divide the {} routed experts of {}", ep, m.moe.experts, m.name));
    if (!ep_fold && ways % ep != 0)
      v.push_back(fmt::format("ep={} folds over dp x cp = {} x {} = {} ranks and must divide it", ep, dp, cp, ways));
    if (ep_fold && tp > 1 && ep % tp == 0 && ways % (ep / tp) != 0)
      v.push_back(fmt::format("epfold: ep={} spans the tp={} ranks and ep / tp = {} of dp x cp = {} x {} = {}, which "
                              "it must divide",
                              ep, tp, ep / tp, dp, cp, ways));
    if (zero_group != 0)
      v.push_back(fmt::format("zero{}@{} with ep={}: hybrid sharding and expert parallelism together are not "
                              "supported (under ep, ZeRO shards over the expert data-parallel group already)",
                              zero, zero_group, ep));
  }
  if (grad == GradPrecision::bf16 && run.precision != Precision::bf16)
    v.push_back(fmt::format("grad:bf16 needs bf16 compute, got precision {} (gradients are never "
                            "kept narrower than the compute type; use grad:fp32)",
                            weft::to_string(run.precision)));
  return v;
}

void Layout::validate(const ModelSpec& m, const RunSpec& run, int64_t world) const {
  const auto v = violations(m, run, world);
  if (!v.empty())
    throw LayoutError(fmt::format("layout {} is invalid for {} on {} rank{}: {}", to_string(),
                                  m.name, world, world == 1 ? "" : "s", fmt::join(v, "; ")));
}

ModelSpec model_for(const ModelSpec& m, const Layout& l) {
  ModelSpec out = m;
  if (m.moe.enabled()) out.moe.capacity_factor = l.capacity_factor;
  return out;
}

void to_json(nlohmann::json& j, const Layout& l) { j = l.to_string(); }

void from_json(const nlohmann::json& j, Layout& l) {
  if (!j.is_string()) throw InputError("layout: expected its text form, e.g. \"tp2-pp1-dp4-mb1\"");
  l = Layout::parse(j.get<std::string>());
}

}  // namespace weft
