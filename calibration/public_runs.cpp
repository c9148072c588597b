#include "calibration/public_runs.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "core/error.h"
#include "core/flops.h"
#include "core/hash.h"

#ifndef WEFT_CALIBRATION_DIR
#define WEFT_CALIBRATION_DIR "calibration"
#endif

namespace weft::calibration {

std::string calibration_dir() {
  if (const char* d = std::getenv("WEFT_CALIBRATION_DIR"); d && *d) return d;
  return WEFT_CALIBRATION_DIR;
}

namespace {

// One CSV record (RFC 4180: quoted fields may hold commas, doubled quotes and
// newlines). False at the end of the input.
bool csv_record(std::istream& in, std::vector<std::string>& fields, int64_t& line, const std::string& path) {
  const int64_t first = line;
  fields.clear();
  std::string field;
  bool quoted = false, any = false;
  char ch;
  while (in.get(ch)) {
    any = true;
    if (quoted) {
      if (ch == '"') {
        if (in.peek() == '"') {
          field += '"';
          in.get();
        } else {
          quoted = false;
        }
      } else {
        if (ch == '\n') ++line;
        field += ch;
      }
    } else if (ch == '"') {
      quoted = true;
    } else if (ch == ',') {
      fields.push_back(std::move(field));
      field.clear();
    } else if (ch == '\n') {
      ++line;
      break;
    } else if (ch != '\r') {
      field += ch;
    }
  }
  if (!any) return false;
  if (quoted) throw InputError(fmt::format("{}:{}: unterminated quote", path, first));
  fields.push_back(std::move(field));
  return true;
}

// A row that weft cannot express; the reason is counted.
struct Skip {
  std::string reason;
};

struct Row {
  const std::vector<std::string>& header;
  const std::vector<std::string>& fields;
  const std::string& path;
  int64_t line;

  const std::string& get(const char* name) const {
    for (size_t i = 0; i < header.size(); ++i)
      if (header[i] == name) {
        if (i >= fields.size())
          throw InputError(fmt::format("{}:{}: row has {} fields, the header {}", path, line, fields.size(),
                                       header.size()));
        return fields[i];
      }
    throw InputError(fmt::format("{}: no column '{}' in the header", path, name));
  }
  bool has(const char* name) const { return !get(name).empty(); }
  // A count: the cell's leading digits ("3 (FSDP2)" is 3); a Skip when empty.
  int64_t count(const char* name) const {
    const std::string& v = get(name);
    char* end = nullptr;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || end == v.c_str()) throw Skip{fmt::format("{} not stated", name)};
    if (x <= 0) throw InputError(fmt::format("{}:{}: {} '{}' must be positive", path, line, name, v));
    return x;
  }
  int64_t count_or(const char* name, int64_t fallback) const { return has(name) ? count(name) : fallback; }
  double number(const char* name) const {
    const std::string& v = get(name);
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || end == v.c_str() || !std::isfinite(x) || x <= 0)
      throw InputError(fmt::format("{}:{}: {} '{}' is not a positive number", path, line, name, v));
    return x;
  }
};

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

std::string device_of(const std::string& gpu) {
  if (contains(gpu, "A100")) return contains(gpu, "40GB") ? "a100-40gb" : "a100-80gb";
  if (contains(gpu, "H100")) {
    // The 95/96 GB HBM2e parts at 500 W (core/device_spec.cpp).
    if (contains(gpu, "95GB") || contains(gpu, "96GB")) return "h100-96gb";
    return "h100";
  }
  throw Skip{fmt::format("device '{}' has no preset", gpu.empty() ? "(none)" : gpu)};
}

PublicRun row_to_run(const Row& r) {
  PublicRun p;
  p.source = r.get("source");
  p.line = r.line;
  const std::string& notes = r.get("notes");
  const bool hagemann = p.source.rfind("hagemann2023", 0) == 0;
  const bool foundry = p.source.rfind("llmfoundry", 0) == 0;
  const bool titan = p.source.rfind("torchtitan", 0) == 0;
  // S6's notes quote the source's "8B 1D w/o Float8" on its bf16 rows too.
  std::string precision_notes = notes;
  for (size_t at; (at = precision_notes.find("w/o Float8")) != std::string::npos;) precision_notes.erase(at, 10);
  // FP8 rows train the blocks' linear layers in FP8 with the framework's
  // recipe (SOURCES.md, "FP8 rows"); none keeps blocks in bf16 by default.
  const bool fp8 =
      contains(precision_notes, "fp8") || contains(precision_notes, "FP8") || contains(precision_notes, "Float8");

  // The model. A Mixture of Experts is its weft preset (the `preset`
  // column), whose shape the row's columns must state alike. GPT-style
  // models (4h GELU MLP: two h x 4h matrices) become a Llama with the same
  // matmul FLOPs per token: three h x F matrices, F = 8h/3.
  ModelSpec& m = p.model;
  if (r.has("preset")) {
    m = model_preset(r.get("preset"));
    if (!m.moe.enabled())
      throw InputError(fmt::format("{}:{}: preset '{}' is not a Mixture of Experts (the column names MoE models)",
                                   r.path, r.line, r.get("preset")));
    const std::pair<const char*, int64_t> shape[] = {
        {"layers", m.layers}, {"hidden", m.hidden}, {"heads", m.heads}, {"kv_heads", m.kv_heads}};
    for (const auto& [column, value] : shape)
      if (r.count(column) != value)
        throw InputError(fmt::format("{}:{}: {} {} differs from preset {}'s {}", r.path, r.line, column,
                                     r.get(column), m.name, value));
    // Public MoE benchmarks force balanced routing (SOURCES.md, "MoE rows"):
    // the receive buffers hold the balanced rows.
    m.moe.imbalance = 1.0;
  }
  m.name = r.get("model");
  // Another Mixture of Experts (no weft preset) from the columns: every
  // layer routed over `experts`, top_k of them, each `moe_ffn` wide, plus a
  // shared expert where `shared_ffn` is stated; its experts' activation (a
  // GELU's, say) priced as SwiGLU's, the same matmuls.
  const bool routed = !r.has("preset") && r.has("experts");
  if (!m.moe.enabled()) {
    m.layers = r.count("layers");
    m.hidden = r.count("hidden");
    m.heads = r.count("heads");
    m.kv_heads = r.count_or("kv_heads", m.heads);
    m.head_dim = m.hidden / m.heads;
    const int64_t ffn = r.count("ffn");
    const bool gpt = ffn == 4 * m.hidden && !hagemann && !titan;
    m.intermediate = gpt ? round_up(8 * m.hidden / 3, 128) : ffn;
    m.tied_embeddings = gpt;
    m.vocab = r.count("vocab");
  }
  if (routed) {
    m.moe.experts = r.count("experts");
    m.moe.top_k = r.count("top_k");
    m.moe.expert_intermediate = r.count("moe_ffn");
    m.moe.shared_intermediate = r.count_or("shared_ffn", 0);
    m.moe.imbalance = 1.0;  // balanced, as the MoE presets' rows above
    m.tied_embeddings = false;
    try {
      m.validate();
    } catch (const InputError& e) {
      throw InputError(fmt::format("{}:{}: the MoE columns describe no valid model: {}", r.path, r.line, e.what()));
    }
  }

  // The layout.
  Layout& l = p.layout;
  l.tp = r.count_or("tp", 1);
  l.pp = r.count_or("pp", 1);
  l.dp = r.count("dp");
  l.mb = r.count("micro_batch");
  l.vpp = r.has("vpp") && std::isdigit(static_cast<unsigned char>(r.get("vpp")[0])) ? r.count("vpp") : 1;
  // Context parallelism: the degree as stated; the transport is the
  // framework's default, which no row states (SOURCES.md): torchtitan's
  // context_parallel_rotate_method "allgather", Megatron-Core's (NeMo's)
  // cp_comm_type "p2p", a ring.
  l.cp = r.count_or("cp", 1);
  // Expert parallelism and the expert tp degree (Megatron's folding, as
  // weft's): all-to-all dispatch, Megatron-Core's default "alltoall".
  l.ep = r.count_or("ep", 1);
  l.etp = r.count_or("etp", 1);
  if (l.cp > 1) l.cp_comm = titan ? CpComm::allgather : CpComm::ring;
  // Sequence parallelism over one tp rank is no parallelism (S9 swept it at tp1 too).
  l.sp = r.get("sp").rfind("yes", 0) == 0 && l.tp > 1;
  // An MoE row whose layers do not divide over pp x vpp: Megatron's
  // account_for_embedding_in_pipeline_split and _loss_ (the embedding and
  // the loss counted as a layer each, so L + 2 divides), as weft's split
  // text writes it: one layer fewer on the first and the last virtual stage.
  if (m.moe.enabled() && l.pp * l.vpp > 1 && m.layers % (l.pp * l.vpp) != 0 &&
      (m.layers + 2) % (l.pp * l.vpp) == 0) {
    const int64_t each = (m.layers + 2) / (l.pp * l.vpp);
    l.split.assign(size_t(l.pp * l.vpp), each);
    --l.split.front();
    --l.split.back();
  }
  // Megatron pads the vocabulary to a multiple of 128 x tp.
  if (m.vocab % (128 * l.tp) != 0 && !hagemann) m.vocab = round_up(m.vocab, 128 * l.tp);

  const std::string& rc = r.get("recompute");
  if (rc.rfind("full@", 0) == 0) {  // full recomputation of the first K blocks of each stage
    l.ckpt = Checkpointing::full;
    l.ckpt_layers = std::strtoll(rc.c_str() + 5, nullptr, 10);
    if (l.ckpt_layers <= 0) throw InputError(fmt::format("{}:{}: recompute '{}': K in full@K must be positive", r.path, r.line, rc));
  } else if (rc.rfind("full", 0) == 0) l.ckpt = Checkpointing::full;
  else if (rc == "selective" || rc == "selective op") l.ckpt = Checkpointing::selective;
  else if (rc == "selective layer") {  // every other block recomputed in full
    l.ckpt = Checkpointing::full;
    l.ckpt_layers = m.layers / l.pp / 2;
  } else if (rc == "none") l.ckpt = Checkpointing::none;
  else throw Skip{"recomputation not stated"};

  // Attention and norm kernels: the CSV's columns (S9), else the source's.
  const std::string& attn = r.get("attention");
  const bool te_hopper =
      (p.source.rfind("nemo", 0) == 0 || p.source.rfind("megatron", 0) == 0) && contains(r.get("gpu"), "H100");
  if (attn == "flash2") l.attention = AttentionKind::flash;
  else if (attn == "cudnn") l.attention = AttentionKind::cudnn;
  else if (attn == "fused_softmax") l.attention = AttentionKind::materialized;
  else if (!attn.empty()) throw Skip{fmt::format("attention '{}' (no weft kernel of its kind)", attn)};
  else if (p.source.rfind("narayanan", 0) == 0 || p.source.rfind("bloom", 0) == 0)
    l.attention = AttentionKind::materialized;  // Megatron's fused softmax; no flash attention yet
  else if (te_hopper)
    // Megatron-Core through Transformer Engine, which on Hopper prefers its
    // cuDNN fused attention to FlashAttention (SOURCES.md, "Attention and
    // tensor-parallel overlap").
    l.attention = AttentionKind::cudnn;
  else l.attention = AttentionKind::flash;
  // NeMo's and Megatron-Bridge's Hopper recipes overlap the tensor-parallel
  // collectives with the GEMMs (userbuffers), as torchtitan's rows that
  // state AsyncTP do: weft prices that through tp_overlap.
  p.tp_comm_overlapped =
      (te_hopper && (p.source.rfind("nemo", 0) == 0 || p.source.rfind("megatronbridge", 0) == 0)) ||
      contains(notes, "AsyncTP") || contains(notes, "Async TP");
  const std::string& norm = r.get("norm");
  // torchtitan's eager RMSNorm is separate kernels; torch.compile fuses it
  // (SOURCES.md, "Attention and tensor-parallel overlap").
  const bool eager_titan = titan && !contains(notes, "compile");
  l.norm = norm == "unfused" || (norm.empty() && eager_titan) ? NormKind::unfused : NormKind::fused;

  // ZeRO and gradient precision. S9 states neither: its 13B tp1-pp1-dp64
  // run trained on 80 GB, which only 16-bit gradients with a sharded
  // optimizer allow. FSDP (S4, S5) is ZeRO-3; llm-foundry's PURE mode
  // reduces in bf16, its DEFAULT mode and torchtitan's FSDP2 in fp32.
  const std::string& zero = r.get("zero");
  if (hagemann) {
    l.zero = 1;
    l.grad = GradPrecision::bf16;
  } else {
    l.zero = zero.empty() || zero == "none" ? 0 : int64_t(zero[0] - '0');
    l.grad = (foundry && contains(notes, "mixed_precision=PURE")) || r.get("grad_dtype").rfind("bf16", 0) == 0
                 ? GradPrecision::bf16
                 : GradPrecision::fp32;
  }
  if (l.dp * l.cp == 1) l.zero = 0;  // ZeRO shards over dp x cp
  // Current scaling (torchtitan's Float8, Megatron-Bridge's FP8-CS) is
  // tensorwise; Transformer Engine's default (llm-foundry, NeMo 24.07) delayed.
  if (fp8) l.fp8 = titan || contains(notes, "FP8-CS") ? Fp8Recipe::tensorwise : Fp8Recipe::delayed;

  const std::string device = device_of(r.get("gpu"));
  p.cluster = cluster_resolve(device, r.count("gpus"), r.count_or("gpus_per_node", 8));
  p.run = RunSpec{r.count("seq"), r.count("global_batch"), Precision::bf16};
  p.sweep = fmt::format("{} {} seq{} {}x{}{}", p.source, m.name, p.run.seq, p.cluster.gpus, device, fp8 ? " fp8" : "");
  if (fp8 && !p.cluster.device.has_fp8()) throw Skip{"fp8 on a device without FP8 tensor cores"};
  // Megatron's expert grid at an expert tp degree of 1 below tp takes the
  // tp ranks into the ep group first (weft's epfold); an ep below tp would
  // fold over part of them, which weft does not.
  if (m.moe.enabled() && l.ep > 1 && l.etp == 1 && l.tp > 1) {
    if (l.ep % l.tp != 0) throw Skip{"moe: ep below tp, folded over part of the tp ranks"};
    l.ep_fold = true;
  }
  const auto broken = l.violations(m, p.run, p.cluster.gpus);
  if (!broken.empty()) throw Skip{"layout weft cannot run: " + broken.front().substr(0, 40)};

  const std::string& status = r.get("status");
  if (status == "OOM") {
    p.oom = true;
  } else if (status == "measured") {
    const double peak = p.cluster.device.peak_flops("bf16");
    const double flops = model_flops_per_step(m, p.run);
    if (r.has("tokens_per_s_per_gpu")) {
      p.measured_step_s = double(p.run.tokens_per_step()) / (r.number("tokens_per_s_per_gpu") * double(p.cluster.gpus));
    } else if (r.has("mfu_weft_def")) {
      p.measured_step_s = flops / (r.number("mfu_weft_def") * peak * double(p.cluster.gpus));
    } else {
      throw Skip{"no throughput stated"};
    }
    p.measured_mfu = mfu(flops / p.measured_step_s, p.cluster.gpus, peak);
  } else {
    throw InputError(fmt::format("{}:{}: status '{}' is not measured or OOM", r.path, r.line, status));
  }
  return p;
}

// Holds out whole sweeps: the held-out rows ask what the tuner meets, a
// model and cluster it was not fitted to. Of each study's sweeps (its tables
// together: the source tag up to the first '_'), ordered by a hash of their
// name, the first 30% (rounded up; none of a study with one sweep) are held
// out. A study's FP8 sweeps and its MoE sweeps are split apart from its
// others, so that they hold out their own 30% (and the others' split stays
// as it was).
// Rows on the power-limited h100-96gb are all held out (below).
void hold_out(std::vector<PublicRun>& runs) {
  std::map<std::string, std::vector<std::pair<uint64_t, std::string>>> sweeps;
  const auto judged_only = [](const PublicRun& r) { return r.cluster.device.name == "h100-96gb"; };
  for (const auto& r : runs) {
    if (judged_only(r)) continue;  // out of the draw, so the others' split stays as it was
    auto& v = sweeps[r.source.substr(0, r.source.find('_')) + (r.layout.fp8 != Fp8Recipe::off ? " fp8" : "") +
                     (r.model.moe.enabled() ? " moe" : "")];  // a study's tables together
    const std::pair<uint64_t, std::string> key{splitmix64(fnv1a64(r.sweep)), r.sweep};
    if (std::find(v.begin(), v.end(), key) == v.end()) v.push_back(key);
  }
  std::set<std::string> held;
  for (auto& [source, v] : sweeps) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size() < 2 ? 0 : (3 * v.size() + 9) / 10;
    for (size_t i = 0; i < n; ++i) held.insert(v[i].second);
  }
  // Rows on a part whose peak under its power limit is unknown are judged
  // and never fitted: fitted, they would pull the family's constants
  // towards clocks its other parts do not run at.
  for (auto& r : runs) r.held_out = held.count(r.sweep) > 0 || judged_only(r);
}

}  // namespace

PublicRunSet public_runs_load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("cannot read the public runs '{}'", path));
  PublicRunSet set;
  std::vector<std::string> header, fields;
  int64_t line = 1;
  if (!csv_record(in, header, line, path) || header.empty() || header[0] != "source")
    throw InputError(fmt::format("{}: expected a CSV header starting with 'source'", path));
  while (true) {
    const int64_t at = line;
    if (!csv_record(in, fields, line, path)) break;
    if (fields.size() == 1 && fields[0].empty()) continue;
    if (fields.size() != header.size())
      throw InputError(fmt::format("{}:{}: {} fields, the header has {}", path, at, fields.size(), header.size()));
    const Row row{header, fields, path, at};
    try {
      set.runs.push_back(row_to_run(row));
    } catch (const Skip& s) {
      ++set.skipped[s.reason];
      if (std::strtoll(row.get("cp").c_str(), nullptr, 10) > 1) ++set.skipped_cp[s.reason];
    }
  }
  hold_out(set.runs);
  return set;
}

}  // namespace weft::calibration
