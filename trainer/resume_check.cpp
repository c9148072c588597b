#include "trainer/resume_check.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string_view>
#include <tuple>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_io.h"
#include "core/moe_spec.h"

namespace weft::trainer {

namespace fs = std::filesystem;

namespace {

struct Setting {
  const char* field;  // as --change names it (the flag without dashes)
  const char* key;    // in the manifest's run.optim
};

// The optimizer settings a resume keeps unless --change names them.
constexpr Setting kOptimSettings[] = {
    {"lr", "lr"},         {"min-lr-ratio", "min_lr_ratio"}, {"warmup", "warmup_steps"},
    {"schedule", "schedule"}, {"beta1", "beta1"},           {"beta2", "beta2"},
    {"adam-eps", "eps"}, {"weight-decay", "weight_decay"}, {"clip", "clip"},
};

// The experts' training settings: the balancing loss and the capacity. The
// manifest keeps them in its model (the model's hash leaves them out); a
// resume keeps them as it keeps the optimizer's.
constexpr const char* kMoeSettings[] = {"moe-aux-coef", "moe-aux-scope", "moe-capacity-factor", "moe-imbalance"};

nlohmann::json moe_setting(const MoeSpec& e, std::string_view field) {
  if (field == "moe-aux-coef") return e.aux_loss_coef;
  if (field == "moe-aux-scope") return aux_loss_scope_name(e.aux_scope);
  if (field == "moe-imbalance") return e.imbalance;
  return e.capacity_factor;
}

void moe_setting_take(MoeSpec& e, const MoeSpec& from, std::string_view field) {
  if (field == "moe-aux-coef")
    e.aux_loss_coef = from.aux_loss_coef;
  else if (field == "moe-aux-scope")
    e.aux_scope = from.aux_scope;
  else if (field == "moe-imbalance")
    e.imbalance = from.imbalance;
  else
    e.capacity_factor = from.capacity_factor;
}

[[noreturn]] void bad_field(const std::string& dir, const std::string& field, const std::string& why) {
  throw FileFormatError(fmt::format("checkpoint {}: manifest field {} {}", dir, field, why));
}

// run.optim of the manifest, its types and ranges checked: what the run was
// trained with. nullopt for checkpoints written before it was recorded.
std::optional<nlohmann::json> saved_optim(const checkpoint::Manifest& m, const std::string& dir) {
  const auto it = m.run.find("optim");
  if (it == m.run.end()) return std::nullopt;
  const nlohmann::json& o = *it;
  if (!o.is_object()) bad_field(dir, "run.optim", "must be an object");
  auto number = [&](const char* key, double lo, double hi, bool hi_open) {
    const std::string field = std::string("run.optim.") + key;
    if (!o.contains(key)) bad_field(dir, field, "is missing");
    const auto& v = o[key];
    if (!v.is_number()) bad_field(dir, field, fmt::format("must be a number, got {}", v.dump()));
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < lo || x > hi || (hi_open && x == hi))
      bad_field(dir, field, fmt::format("is {}, out of its range [{}, {}{}", v.dump(), lo, hi, hi_open ? ")" : "]"));
  };
  auto count = [&](const char* key) {
    const std::string field = std::string("run.optim.") + key;
    if (!o.contains(key)) bad_field(dir, field, "is missing");
    if (!o[key].is_number_integer() || o[key].get<int64_t>() < 0)
      bad_field(dir, field, fmt::format("must be a whole number of steps, got {}", o[key].dump()));
  };
  constexpr double kHuge = 1e30;
  number("lr", 0, kHuge, false);
  number("min_lr_ratio", 0, 1, false);
  count("warmup_steps");
  count("total_steps");
  if (!o.contains("schedule") || !o["schedule"].is_string() ||
      (o["schedule"] != "cosine" && o["schedule"] != "constant"))
    bad_field(dir, "run.optim.schedule",
              fmt::format("must be \"cosine\" or \"constant\", got {}", o.value("schedule", nlohmann::json()).dump()));
  number("beta1", 0, 1, true);
  number("beta2", 0, 1, true);
  number("eps", 0, kHuge, false);
  if (!(o["eps"].get<double>() > 0)) bad_field(dir, "run.optim.eps", "must be positive");
  number("weight_decay", 0, kHuge, false);
  number("clip", 0, kHuge, false);
  return o;
}

}  // namespace

const std::vector<std::string>& changeable_settings() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& s : kOptimSettings) v.push_back(s.field);
    v.push_back("seed");
    v.push_back("data");
    for (const char* f : kMoeSettings) v.push_back(f);
    return v;
  }();
  return names;
}

const std::vector<std::string>& resumable_settings() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v = changeable_settings();
    v.push_back("steps");
    return v;
  }();
  return names;
}

std::vector<RunChange> resume_adopt(TrainConfig& c, const std::string& dir, const std::vector<std::string>& stated) {
  const auto m =
      checkpoint::manifest_from_json(json_read_file((fs::path(dir) / "manifest.json").string(), "checkpoint manifest"),
                                     dir);
  auto unstated = [&](const char* field) { return std::find(stated.begin(), stated.end(), field) == stated.end(); };
  std::vector<RunChange> out;
  const nlohmann::json before = c.optim;
  if (const auto saved = saved_optim(m, dir)) {
    nlohmann::json merged = before;
    for (const auto& s : kOptimSettings)
      if (unstated(s.field)) merged[s.key] = (*saved)[s.key];
    if (unstated("steps")) merged["total_steps"] = (*saved)["total_steps"];
    c.optim.lr = merged["lr"].get<double>();
    c.optim.min_lr_ratio = merged["min_lr_ratio"].get<double>();
    c.optim.warmup_steps = merged["warmup_steps"].get<int64_t>();
    c.optim.schedule = merged["schedule"] == "cosine" ? Schedule::cosine : Schedule::constant;
    c.optim.beta1 = merged["beta1"].get<double>();
    c.optim.beta2 = merged["beta2"].get<double>();
    c.optim.eps = merged["eps"].get<double>();
    c.optim.weight_decay = merged["weight_decay"].get<double>();
    c.optim.clip = merged["clip"].get<double>();
    if (unstated("steps")) c.steps = merged["total_steps"].get<int64_t>();
    for (const auto& s : kOptimSettings)
      if (before[s.key] != merged[s.key]) out.push_back({s.field, before[s.key], merged[s.key], false});
    if (before["total_steps"] != merged["total_steps"])
      out.push_back({"steps", before["total_steps"], merged["total_steps"], false});
  } else {
    const auto& o = m.optimizer;
    const std::tuple<const char*, double*, double> olds[] = {{"beta1", &c.optim.beta1, o.beta1},
                                                            {"beta2", &c.optim.beta2, o.beta2},
                                                            {"adam-eps", &c.optim.eps, o.eps},
                                                            {"weight-decay", &c.optim.weight_decay, o.weight_decay},
                                                            {"clip", &c.optim.clip, o.grad_clip}};
    for (const auto& [field, value, saved] : olds)
      if (unstated(field) && *value != saved) {
        out.push_back({field, *value, saved, false});
        *value = saved;
      }
  }
  if (const auto it = m.run.find("seed"); unstated("seed") && it != m.run.end() && it->is_number_unsigned() &&
                                          it->get<uint64_t>() != c.seed) {
    out.push_back({"seed", c.seed, *it, false});
    c.seed = it->get<uint64_t>();
  }
  // A checkpoint of another model is refused when it loads; adopt only
  // between MoE models.
  if (m.model.moe.enabled() && c.model.moe.enabled())
    for (const char* field : kMoeSettings)
      if (unstated(field) && moe_setting(c.model.moe, field) != moe_setting(m.model.moe, field)) {
        out.push_back({field, moe_setting(c.model.moe, field), moe_setting(m.model.moe, field), false});
        moe_setting_take(c.model.moe, m.model.moe, field);
      }
  return out;
}

std::vector<RunChange> resume_changes(const checkpoint::Manifest& m, const TrainConfig& c, const std::string& dir,
                                      const std::string& data) {
  const auto& run = m.run;
  if (run.value("seq", c.run.seq) != c.run.seq || run.value("global_batch", c.run.global_batch) != c.run.global_batch)
    throw InputError(fmt::format(
        "checkpoint {} was trained with seq {} and global batch {}, this run asks for seq {} "
        "and global batch {}; resume with the same values",
        dir, run.value("seq", int64_t{0}), run.value("global_batch", int64_t{0}), c.run.seq, c.run.global_batch));

  std::vector<RunChange> out;
  const nlohmann::json now = c.optim;
  if (const auto saved = saved_optim(m, dir)) {
    for (const auto& s : kOptimSettings)
      if ((*saved)[s.key] != now[s.key]) out.push_back({s.field, (*saved)[s.key], now[s.key], true});
  } else {
    // Older checkpoints record the optimizer's constants only.
    const auto& o = m.optimizer;
    const std::pair<const char*, double> kept[] = {{"beta1", o.beta1}, {"beta2", o.beta2}, {"adam-eps", o.eps},
                                                   {"weight-decay", o.weight_decay}, {"clip", o.grad_clip}};
    const std::pair<const char*, double> asked[] = {{"beta1", c.optim.beta1}, {"beta2", c.optim.beta2},
                                                    {"adam-eps", c.optim.eps}, {"weight-decay", c.optim.weight_decay},
                                                    {"clip", c.optim.clip}};
    for (size_t i = 0; i < std::size(kept); ++i)
      if (kept[i].second != asked[i].second) out.push_back({kept[i].first, kept[i].second, asked[i].second, true});
  }
  if (const auto it = run.find("seed"); it != run.end() && it->is_number_unsigned() && it->get<uint64_t>() != c.seed)
    out.push_back({"seed", *it, c.seed, true});
  // The data is a setting like the others: another corpus (or blend) is a
  // different run unless the user says so.
  if (const auto it = run.find("data"); !data.empty() && it != run.end() && it->is_string() && it->get<std::string>() != data)
    out.push_back({"data", *it, data, true});
  if (m.model.moe.enabled() && c.model.moe.enabled())
    for (const char* field : kMoeSettings)
      if (moe_setting(m.model.moe, field) != moe_setting(c.model.moe, field))
        out.push_back({field, moe_setting(m.model.moe, field), moe_setting(c.model.moe, field), true});

  // Free to change, but said: where the schedule ends, how the ranks split
  // the work, and the compute precision.
  if (const auto saved = saved_optim(m, dir); saved && (*saved)["total_steps"] != now["total_steps"])
    out.push_back({"steps", (*saved)["total_steps"], now["total_steps"], false});
  if (m.layout != c.layout) out.push_back({"layout", m.layout.to_string(), c.layout.to_string(), false});
  if (const auto it = run.find("precision");
      it != run.end() && it->is_string() && it->get<std::string>() != to_string(c.run.precision))
    out.push_back({"precision", *it, to_string(c.run.precision), false});
  return out;
}

void resume_changes_check(const std::vector<RunChange>& changes, const std::vector<std::string>& allowed,
                          const std::string& dir) {
  std::vector<std::string> refused, names;
  for (const auto& ch : changes) {
    if (!ch.needs_consent || std::find(allowed.begin(), allowed.end(), ch.field) != allowed.end()) continue;
    refused.push_back(fmt::format("--{} {} (the run was trained with {})", ch.field, ch.to.dump(), ch.from.dump()));
    names.push_back(ch.field);
  }
  if (refused.empty()) return;
  throw InputError(fmt::format(
      "this command changes the settings of the run it resumes from {}: {}; resume with the run's values, or add "
      "--change {} to train on with the new ones (recorded in metrics.jsonl)",
      dir, fmt::join(refused, ", "), fmt::join(names, ",")));
}

std::string resume_changes_text(const std::vector<RunChange>& changes) {
  std::vector<std::string> parts;
  for (const auto& ch : changes) {
    std::string s = fmt::format("--{} {} -> {}", ch.field, ch.from.dump(), ch.to.dump());
    if (ch.field == "steps") s += fmt::format(" (the schedule now ends at step {})", ch.to.dump());
    parts.push_back(s);
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

nlohmann::json resume_changes_json(const std::vector<RunChange>& changes) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& ch : changes) j.push_back({{"field", ch.field}, {"from", ch.from}, {"to", ch.to}});
  return j;
}

}  // namespace weft::trainer
