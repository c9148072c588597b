// `weft data`: prepare text into token files, inspect token data, and locate
// (preparing on first use) the built-in default corpus.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/progress.h"
#include "core/error.h"
#include "core/stop.h"
#include "data/corpus.h"
#include "data/loader.h"
#include "data/prepare.h"
#include "data/split_writer.h"
#include "data/token_data.h"

namespace weft::cli {

namespace {

struct InfoArgs {
  std::vector<std::string> paths, data;  // the positional items, or --data's
  int64_t vocab = 0;  // 0: the vocab the data declares
  int64_t seq = 0;    // 0: no window count
};

// Inputs this large get a progress display (a second or more to tokenize).
constexpr int64_t kProgressMinBytes = 32 << 20;

int run_prepare(data::PrepareOptions o, const std::string& format) {
  StopScope stoppable;
  o.format = data::token_format_parse(format);
  std::optional<Progress> progress;
  o.progress = [&](const data::PrepareProgress& p) {
    if (!progress)
      progress.emplace(stdout, Progress::style_for(stdout, p.bytes_total, kProgressMinBytes),
                       "tokenizing");
    progress->update(p.bytes_done, p.bytes_total, p.seconds);
  };
  const auto r = data::data_prepare(o);
  if (progress) progress->finish();
  const char* ext = o.format == data::TokenFormat::megatron ? ".bin/.idx" : ".tok";
  const std::string tokenizer = r.tokenizer == "byte"
                                    ? "byte tokenizer"
                                    : fmt::format("{} tokenizer {}", r.tokenizer, o.tokenizer);
  fmt::print("weft: prepared {} from {} file(s), {} documents, {} (vocab {})\n", r.dir,
             o.inputs.size(), r.documents, tokenizer, r.vocab);
  fmt::print("  documents: {}\n", r.document_tokens);
  fmt::print("  {:.1f} MB of text in {:.2f} s ({:.1f} MB/s on {} thread{})\n",
             double(r.text_bytes) / 1e6, r.seconds,
             r.seconds > 0 ? double(r.text_bytes) / 1e6 / r.seconds : 0.0, r.threads,
             r.threads == 1 ? "" : "s");
  if (r.invalid_utf8 > 0)
    fmt::print(stderr,
               "weft: warning: {} invalid UTF-8 sequence{} replaced by U+FFFD, the first in '{}' "
               "at byte {}\n",
               r.invalid_utf8, r.invalid_utf8 == 1 ? "" : "s", r.invalid_utf8_file,
               r.invalid_utf8_offset);
  fmt::print("  {:14} {} tokens, {} documents\n", fmt::format("train{}", ext), r.train_tokens,
             r.documents_train);
  if (o.val_fraction > 0)
    fmt::print("  {:14} {} tokens, {} documents\n", fmt::format("val{}", ext), r.val_tokens,
               r.documents_val);
  else
    fmt::print("  no validation split (--val-fraction 0)\n");
  fmt::print("  unigram entropy of train: {:.4f} nats/token (the loss baseline)\n",
             r.unigram_entropy);
  return 0;
}

int run_info(const InfoArgs& a) {
  if (a.vocab < 0) throw InputError(fmt::format("--vocab {} must be positive", a.vocab));
  if (a.seq < 0) throw InputError(fmt::format("--seq {} must be positive", a.seq));
  if (!a.paths.empty() && !a.data.empty())
    throw InputError("name the data either as arguments or with --data, not both");
  const auto spec = data::data_spec_parse(a.paths.empty() ? a.data : a.paths);
  if (spec.paths.empty()) throw InputError("no data given: pass a path, or --data");
  const auto d = data::token_data_open(spec);
  // The vocab to check against: --vocab, else what the files declare, else
  // meta.json's (Megatron files do not record one).
  int64_t vocab = a.vocab > 0 ? a.vocab : d.train->vocab();
  if (vocab == 0) vocab = data::token_data_meta_vocab(d);
  // Every check before any output, so a failure is one line.
  const std::pair<const char*, const data::TokenSource*> splits[] = {{"train", d.train.get()},
                                                                     {"val", d.val.get()}};
  std::vector<int64_t> windows;
  for (const auto& [name, src] : splits) {
    if (!src) continue;
    if (vocab > 0) data::validate_vocab(*src, vocab);
    if (a.seq > 0) windows.push_back(data::Loader(*src, a.seq, 0).windows());
  }
  const double baseline = data::token_data_baseline(d);

  const auto meta_lines = data::token_data_meta_lines(d);
  if (meta_lines.empty()) fmt::print("{}\n", d.path);
  for (const auto& line : meta_lines) fmt::print("{}\n", line);
  size_t w = 0;
  for (const auto& [name, src] : splits) {
    if (!src) {
      fmt::print("  {:5}  none\n", name);
      continue;
    }
    fmt::print("  {:5}  {}\n", name, src->describe());
    if (a.seq > 0) fmt::print("         {} windows of {} + 1 tokens\n", windows[w++], a.seq);
  }
  fmt::print("  unigram entropy of train: {:.4f} nats/token\n", baseline);
  if (vocab > 0)
    fmt::print("  every token id is below {}\n", vocab);
  else
    fmt::print("  vocab unknown: pass --vocab V to check token ids\n");
  return 0;
}

}  // namespace

Command add_data_command(CLI::App& app) {
  auto* sub = app.add_subcommand("data", "Prepare and inspect training data");
  sub->require_subcommand(1);

  auto prep = std::make_shared<data::PrepareOptions>();
  auto format = std::make_shared<std::string>("weft");
  auto* p = sub->add_subcommand(
      "prepare", "Tokenize text files into DIR/train.tok, DIR/val.tok (or, with --format megatron, "
                 "DIR/train.bin/.idx, DIR/val.bin/.idx) and DIR/meta.json");
  p->add_option("--input", prep->inputs,
                "Text files (one document each; fortune files split at '%' lines) and JSONL "
                "files (*.jsonl: one document a line)");
  p->add_option("--out", prep->out, "Folder to create (must not exist or be empty)");
  p->add_option("--tokenizer", prep->tokenizer,
                "byte (vocab 256), a Hugging Face tokenizer.json (byte-level BPE: Llama 3, "
                "GPT-2) or a SentencePiece tokenizer.model (Llama 2)")
      ->capture_default_str();
  p->add_option("--text-field", prep->text_field, "The field of JSONL objects that holds the text")
      ->capture_default_str();
  p->add_option("--threads", prep->threads, "Threads that tokenize (0: every core)")
      ->capture_default_str();
  p->add_option("--val-fraction", prep->val_fraction,
                "Share of the text, in whole documents, held out for validation (0 to 0.5)")
      ->capture_default_str();
  p->add_option("--seed", prep->seed, "Seed of the train/validation split")->capture_default_str();
  p->add_flag("--force", prep->force, "Replace DIR when it already holds a prepared dataset");
  p->add_option("--format", *format,
                "Token files: weft (train.tok, val.tok) or megatron (train.bin/.idx, val.bin/.idx, one "
                "sequence per document)")
      ->capture_default_str();

  auto info = std::make_shared<InfoArgs>();
  auto* i = sub->add_subcommand("info", "Describe a token file or data folder and check it");
  i->add_option("path", info->paths,
                "Data folder, token file (.tok, llm.c .bin, .npy) or Megatron prefix; several are read back "
                "to back; a blend alternates weights and paths: 0.7 A 0.3 B");
  i->add_option("--data", info->data, "The same as the arguments, as train and eval take it");
  i->add_option("--vocab", info->vocab, "Check that every token id is below this vocab");
  i->add_option("--seq", info->seq,
                "Report how many training windows of this length the data holds");

  auto* c = sub->add_subcommand(
      "corpus", "Print the built-in default corpus folder, preparing it on first use");

  return {sub, [=] {
            if (p->parsed()) return run_prepare(*prep, *format);
            if (i->parsed()) return run_info(*info);
            if (c->parsed()) {
              fmt::print("{}\n", data::default_corpus_dir());
              return 0;
            }
            return 2;
          }};
}

}  // namespace weft::cli
