#include "trainer/eval.h"

#include "core/stop.h"

#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "core/json_io.h"
#include "data/corpus.h"
#include "data/loader.h"
#include "data/token_data.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/state_io.h"

namespace weft::trainer {

void npy_write(const std::string& path, const void* data, const char* descr,
               const std::vector<int64_t>& shape) {
  std::string dims;
  for (int64_t d : shape) dims += fmt::format("{}, ", d);
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr, dims);
  // Magic, version 1.0, header length; the header pads to a multiple of 64.
  const size_t pre = 10;
  header.append((64 - (pre + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += char(1);
  out += char(0);
  out += char(header.size() & 0xff);
  out += char(header.size() >> 8);
  out += header;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  out.append(static_cast<const char*>(data), size_t(n * 4));
  file_write_atomic(path, out);
}

double EvalLoss::perplexity() const { return std::exp(loss); }
double EvalResult::perplexity() const { return std::exp(loss); }

namespace {

// One dataset to evaluate, opened and checked before anything is computed,
// so that bad data is one error and no partial output.
struct EvalData {
  std::string path;
  double weight = 1;
  data::TokenData data;
  const data::TokenSource* source = nullptr;  // val split, else train
  data::ValidationSamples samples;            // --samples, capped at the source's windows
};

// The checkpoint --checkpoint names: the folder itself, or, for a folder of
// checkpoints (a run's checkpoints/, or the run folder holding one), the
// newest in it, named on `log`.
std::string checkpoint_to_evaluate(const std::string& dir, std::FILE* log) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (dir.empty() || fs::exists(fs::path(dir) / checkpoint::kManifestFile, ec) || !fs::is_directory(dir, ec))
    return dir;
  for (const fs::path& root : {fs::path(dir), fs::path(dir) / "checkpoints"})
    if (const auto latest = checkpoint::latest_checkpoint(root.string())) {
      fmt::print(log, "using {}, the newest checkpoint in {}\n", *latest, root.string());
      return *latest;
    }
  return dir;
}

}  // namespace

EvalResult evaluate(const EvalConfig& config, std::FILE* log) {
  EvalConfig c = config;
  c.checkpoint = checkpoint_to_evaluate(config.checkpoint, log);
  const auto ck = checkpoint::load_checkpoint(c.checkpoint);
  const ModelSpec m = ck.manifest.model;
  RunSpec run;
  const auto& recorded = ck.manifest.run;
  if (c.seq <= 0 && recorded.contains("seq") && !recorded["seq"].is_number_integer())
    throw FileFormatError(fmt::format("{}/{}: field 'run.seq' must be a whole number, got {}; pass --seq",
                                      c.checkpoint, checkpoint::kManifestFile, recorded["seq"].dump()));
  run.seq = c.seq > 0 ? c.seq : recorded.value("seq", int64_t{0});
  if (run.seq <= 0) throw InputError(fmt::format("checkpoint {} records no sequence length; pass --seq", c.checkpoint));
  run.global_batch = 1;
  run.precision = Precision::fp32;
  // A LoRA checkpoint: its adapters on the base model it records.
  run.lora = checkpoint::checkpoint_lora(ck.manifest);
  if (c.samples < 1) throw InputError(fmt::format("--samples {} must be at least 1", c.samples));

  const data::DataSpec spec = data::data_spec_or_corpus(c.data);
  std::vector<EvalData> sets;
  for (size_t i = 0; i < spec.paths.size(); ++i) {
    EvalData& e = sets.emplace_back();
    e.path = spec.paths[i];
    e.weight = spec.blend() ? spec.weights[i] : 1.0;
    e.data = data::token_data_open(e.path);
    data::token_data_validate(e.data, m.vocab, run.seq);
    e.source = e.data.val ? e.data.val.get() : e.data.train.get();
    e.samples = data::validation_samples(*e.source, run.seq, c.samples, "--samples");
  }

  memory::Arena arena;
  auto groups = parallel::single_process_groups();
  LlamaStage<float> stage(m, run, Layout::parse("mb1"), 0, device_preset("cpu"), arena, groups);
  state_load<float>(ck, stage, nullptr);
  std::vector<float> logits;
  std::vector<int32_t> tokens(size_t(run.seq)), targets(size_t(run.seq));
  EvalResult r;
  for (const EvalData& e : sets) {
    const data::Loader loader = data::validation_loader(*e.source, run.seq);
    const bool dump = r.parts.empty() && !c.dump_dir.empty();
    double loss = 0;
    for (int64_t i = 0; i < e.samples.samples; ++i) {
      stop_check();
      loader.batch(i, 1, tokens.data(), targets.data());
      stage.capture_logits(i == 0 && dump ? &logits : nullptr);
      stage.forward(0, tokens.data(), targets.data(), 0.0);
      loss += stage.take_loss();
      if (i == 0 && dump) {
        npy_write(c.dump_dir + "/tokens.npy", tokens.data(), "<i4", {run.seq});
        npy_write(c.dump_dir + "/logits.npy", logits.data(), "<f4", {run.seq, m.vocab});
      }
    }
    EvalLoss& part = r.parts.emplace_back();
    part.data = e.path;
    part.weight = e.weight;
    part.tokens = e.samples.samples * run.seq;
    part.loss = loss / double(part.tokens);
    r.tokens += part.tokens;
  }
  // The mean over every token, or for a blend the parts' losses weighted by
  // the blend (a dataset with fewer windows than --samples gives fewer
  // tokens, so the two differ then).
  double weights = 0;
  for (const EvalLoss& p : r.parts) {
    const double w = spec.blend() ? p.weight : double(p.tokens);
    r.loss += w * p.loss;
    weights += w;
  }
  r.loss /= weights;

  const auto samples_of = [&](const EvalData& e) {
    return fmt::format("{} {} samples of {} tokens{}", e.samples.samples, e.data.val ? "validation" : "training",
                       run.seq, e.samples.note.empty() ? "" : " (" + e.samples.note + ")");
  };
  if (sets.size() == 1) {
    fmt::print(log, "{} at step {}: {} loss {:.6f} nats/token, perplexity {:.4f}, over {}\n", c.checkpoint,
               ck.manifest.step, m.summary(), r.loss, r.perplexity(), samples_of(sets[0]));
    return r;
  }
  fmt::print(log, "{} at step {}: {}\n", c.checkpoint, ck.manifest.step, m.summary());
  for (size_t i = 0; i < sets.size(); ++i) {
    const EvalLoss& p = r.parts[i];
    fmt::print(log, "  {}{}: loss {:.6f} nats/token, perplexity {:.4f}, over {}\n",
               spec.blend() ? fmt::format("{} x ", p.weight) : "", p.data, p.loss, p.perplexity(),
               samples_of(sets[i]));
  }
  fmt::print(log, "  overall: loss {:.6f} nats/token, perplexity {:.4f}, {}\n", r.loss, r.perplexity(),
             spec.blend() ? "the parts' losses weighted by the blend" : "the mean over every token");
  return r;
}

}  // namespace weft::trainer
