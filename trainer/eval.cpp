#include "trainer/eval.h"

#include <fmt/format.h>

#include "core/json_io.h"
#include "trainer/data/corpus.h"
#include "trainer/data/loader.h"
#include "trainer/data/token_data.h"
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

EvalResult evaluate(const EvalConfig& c, std::FILE* log) {
  const auto ck = checkpoint::load_checkpoint(c.checkpoint);
  const ModelSpec m = ck.manifest.model;
  RunSpec run;
  run.seq = c.seq > 0 ? c.seq : ck.manifest.run.value("seq", int64_t{0});
  if (run.seq <= 0) throw InputError(fmt::format("checkpoint {} records no sequence length; pass --seq", c.checkpoint));
  run.global_batch = 1;
  run.precision = Precision::fp32;
  if (c.samples < 1) throw InputError(fmt::format("--samples {} must be at least 1", c.samples));

  const std::string path = c.data.empty() ? data::default_corpus_dir() : c.data;
  data::TokenData td = data::token_data_open(path);
  data::token_data_validate(td, m.vocab, run.seq);
  const data::TokenSource& src = td.val ? *td.val : *td.train;
  const data::Loader loader = data::validation_loader(src, run.seq);

  memory::Arena arena;
  auto groups = parallel::single_process_groups();
  LlamaStage<float> stage(m, run, Layout::parse("mb1"), 0, device_preset("cpu"), arena, groups);
  state_load<float>(ck, stage, nullptr);
  std::vector<float> logits;
  std::vector<int32_t> tokens(size_t(run.seq)), targets(size_t(run.seq));
  EvalResult r;
  double loss = 0;
  for (int64_t i = 0; i < c.samples; ++i) {
    loader.batch(i, 1, tokens.data(), targets.data());
    stage.capture_logits(i == 0 && !c.dump_dir.empty() ? &logits : nullptr);
    stage.forward(0, tokens.data(), targets.data(), 0.0);
    loss += stage.take_loss();
    if (i == 0 && !c.dump_dir.empty()) {
      npy_write(c.dump_dir + "/tokens.npy", tokens.data(), "<i4", {run.seq});
      npy_write(c.dump_dir + "/logits.npy", logits.data(), "<f4", {run.seq, m.vocab});
    }
  }
  r.tokens = c.samples * run.seq;
  r.loss = loss / double(r.tokens);
  fmt::print(log, "{} at step {}: {} loss {:.6f} nats/token over {} {} samples of {} tokens\n",
             c.checkpoint, ck.manifest.step, m.summary(), r.loss, c.samples,
             td.val ? "validation" : "training", run.seq);
  return r;
}

}  // namespace weft::trainer
