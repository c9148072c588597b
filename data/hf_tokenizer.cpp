#include "data/hf_tokenizer.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/added_tokens.h"
#include "data/bpe.h"
#include "data/hf_tokenizer_json.h"
#include "data/mapped_file.h"
#include "data/split_regex.h"
#include "data/utf8.h"

namespace weft::data {

namespace {

std::string names_with_ids(const std::vector<std::string>& names, const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
  return fmt::format("{} ({})", s, fmt::join(ids, ", "));
}

class HfTokenizer final : public Tokenizer {
 public:
  HfTokenizer(const HfTokenizerSpec& spec, const std::string& path, TokenizerFile file)
      : splits_(spec.splits),
        prefix_space_(spec.prefix_space),
        model_(spec),
        added_(spec.added),
        vocab_(spec.vocab_size),
        file_(std::move(file)) {
    for (const auto& rule : spec.splits)
      regexes_.push_back(
          std::make_unique<SplitRegex>(rule.pattern, "tokenizer '" + path + "'"));
    if (spec.byte_level_regex)
      byte_level_regex_ = std::make_unique<SplitRegex>(kGpt2Pattern, "ByteLevel");
    documents_.prefix = spec.prefix;
    documents_.suffix = spec.suffix;
    documents_.description = fmt::format(
        "{} before each document, {} after",
        spec.prefix.empty() ? "nothing" : names_with_ids(spec.prefix_names, spec.prefix),
        spec.suffix.empty() ? "nothing" : names_with_ids(spec.suffix_names, spec.suffix));
    if (spec.prefix.empty() && spec.suffix.empty())
      documents_.description =
          "no BOS or EOS: the tokenizer's post-processor adds none, so documents are not marked";
    tokens_.resize(static_cast<size_t>(vocab_));
    for (const auto& [bytes, id] : spec.vocab) tokens_[static_cast<size_t>(id)] = bytes;
    for (const auto& a : spec.added) tokens_[static_cast<size_t>(a.id)] = a.content;
  }

  std::string name() const override { return "hf-bpe"; }
  int64_t vocab() const override { return vocab_; }
  const DocumentTokens& document_tokens() const override { return documents_; }
  std::optional<TokenizerFile> file() const override { return file_; }
  std::unique_ptr<TokenEncoder> encoder() const override;

  std::string decode(const std::vector<int32_t>& tokens) const override {
    std::string text;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] < 0 || tokens[i] >= vocab_)
        throw InputError(fmt::format("token id {} at position {} is outside the vocab [0, {})",
                                     tokens[i], i, vocab_));
      text += tokens_[static_cast<size_t>(tokens[i])];
    }
    return text;
  }

 private:
  friend class HfEncoder;
  std::vector<HfSplitRule> splits_;
  bool prefix_space_;
  std::vector<std::unique_ptr<SplitRegex>> regexes_;
  std::unique_ptr<SplitRegex> byte_level_regex_;
  BpeModel model_;
  AddedTokenSplitter added_;
  int64_t vocab_;
  TokenizerFile file_;
  DocumentTokens documents_;
  std::vector<std::string> tokens_;  // the bytes of each id, for decode
};

class HfEncoder final : public TokenEncoder {
 public:
  explicit HfEncoder(const HfTokenizer& t) : t_(t), pieces_(t.regexes_.size() + 1) {
    for (const auto& r : t.regexes_) matchers_.push_back(std::make_unique<SplitRegex::Matcher>(*r));
    if (t.byte_level_regex_)
      byte_level_ = std::make_unique<SplitRegex::Matcher>(*t.byte_level_regex_);
  }

  void encode(std::string_view text, std::vector<int32_t>& out) override {
    const std::string_view valid = utf8_repair(text, repaired_);
    t_.added_.split(valid, runs_, runs_scratch_);
    for (const TextRun& r : runs_) {
      if (r.id >= 0)
        out.push_back(r.id);
      else
        pre_tokenize(0, valid.substr(r.offset, r.bytes), out);
    }
  }

 private:
  // Split rule `stage` on `text`, then the next rule on each of its pieces.
  void pre_tokenize(size_t stage, std::string_view text, std::vector<int32_t>& out) {
    if (stage == matchers_.size()) {
      byte_level(text, out);
      return;
    }
    std::vector<TextPiece>& pieces = pieces_[stage];
    pieces.clear();
    matchers_[stage]->split(text, t_.splits_[stage].remove_matches, pieces);
    for (const auto& [offset, bytes] : pieces)
      pre_tokenize(stage + 1, text.substr(offset, bytes), out);
  }

  void byte_level(std::string_view piece, std::vector<int32_t>& out) {
    if (t_.prefix_space_ && piece.front() != ' ') {
      prefixed_.assign(1, ' ');
      prefixed_.append(piece);
      piece = prefixed_;
    }
    if (!byte_level_) {
      t_.model_.encode_word(piece, out, bpe_);
      return;
    }
    std::vector<TextPiece>& words = pieces_.back();
    words.clear();
    byte_level_->split(piece, false, words);
    for (const auto& [offset, bytes] : words)
      t_.model_.encode_word(piece.substr(offset, bytes), out, bpe_);
  }

  const HfTokenizer& t_;
  std::vector<std::unique_ptr<SplitRegex::Matcher>> matchers_;
  std::unique_ptr<SplitRegex::Matcher> byte_level_;
  std::vector<std::vector<TextPiece>> pieces_;  // per stage, the last one for ByteLevel's regex
  std::vector<TextRun> runs_, runs_scratch_;
  std::string repaired_, prefixed_;
  BpeState bpe_;
};

std::unique_ptr<TokenEncoder> HfTokenizer::encoder() const {
  return std::make_unique<HfEncoder>(*this);
}

}  // namespace

std::unique_ptr<Tokenizer> hf_tokenizer_load(const std::string& path) {
  const MappedFile f(path, "tokenizer file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f.data(), f.data() + f.size());
  } catch (const nlohmann::json::exception& e) {
    throw FileFormatError(
        fmt::format("tokenizer '{}' is not a Hugging Face tokenizer.json: {}", path, e.what()));
  }
  const HfTokenizerSpec spec = hf_tokenizer_parse(j, path);
  return std::make_unique<HfTokenizer>(spec, path,
                                       tokenizer_file_describe(path, f.data(), f.size()));
}

}  // namespace weft::data
