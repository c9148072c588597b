#include "data/sp_tokenizer.h"

#include <algorithm>

#include <fmt/format.h>
#include <sentencepiece_processor.h>

#include "core/error.h"
#include "data/mapped_file.h"
#include "data/utf8.h"

namespace weft::data {

namespace {

// libsentencepiece's messages can span lines; weft's errors are one line.
std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

class SpTokenizer final : public Tokenizer {
 public:
  SpTokenizer(std::unique_ptr<sentencepiece::SentencePieceProcessor> sp, TokenizerFile file)
      : sp_(std::move(sp)), file_(std::move(file)) {
    const int bos = sp_->bos_id(), eos = sp_->eos_id();
    if (bos >= 0) documents_.prefix.push_back(bos);
    if (eos >= 0) documents_.suffix.push_back(eos);
    const auto describe = [&](int id, const char* what) {
      return id >= 0 ? fmt::format("{} {} ({})", what, sp_->IdToPiece(id), id)
                     : fmt::format("no {} (the model defines none)", what);
    };
    documents_.description = fmt::format("{} before each document, {} after", describe(bos, "BOS"),
                                         describe(eos, "EOS"));
  }

  std::string name() const override { return "sentencepiece"; }
  int64_t vocab() const override { return sp_->GetPieceSize(); }
  const DocumentTokens& document_tokens() const override { return documents_; }
  std::optional<TokenizerFile> file() const override { return file_; }

  std::unique_ptr<TokenEncoder> encoder() const override { return std::make_unique<Encoder>(*sp_); }

  std::string decode(const std::vector<int32_t>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] < 0 || tokens[i] >= vocab())
        throw InputError(fmt::format("token id {} at position {} is outside the vocab [0, {})",
                                     tokens[i], i, vocab()));
    std::string text;
    const std::vector<int> ids(tokens.begin(), tokens.end());
    const auto status = sp_->Decode(ids, &text);
    if (!status.ok()) throw InputError("sentencepiece decode: " + one_line(status.ToString()));
    return text;
  }

 private:
  // SentencePieceProcessor::Encode is const and thread-safe, so encoders
  // share the processor and keep only their buffers.
  class Encoder final : public TokenEncoder {
   public:
    explicit Encoder(const sentencepiece::SentencePieceProcessor& sp) : sp_(sp) {}
    void encode(std::string_view text, std::vector<int32_t>& out) override {
      const std::string_view valid = utf8_repair(text, repaired_);
      const auto status = sp_.Encode(valid, &ids_);
      if (!status.ok()) throw InputError("sentencepiece encode: " + one_line(status.ToString()));
      out.insert(out.end(), ids_.begin(), ids_.end());
    }

   private:
    const sentencepiece::SentencePieceProcessor& sp_;
    std::string repaired_;
    std::vector<int> ids_;
  };

  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  TokenizerFile file_;
  DocumentTokens documents_;
};

}  // namespace

std::unique_ptr<Tokenizer> sp_tokenizer_load(const std::string& path) {
  const MappedFile f(path, "tokenizer file");
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  sentencepiece::util::Status status;
  try {
    status = sp->LoadFromSerializedProto(
        std::string_view(reinterpret_cast<const char*>(f.data()), static_cast<size_t>(f.size())));
  } catch (const std::exception& e) {
    // The library's own parts throw on some malformed models (its trie
    // builder on an empty piece) instead of returning a status.
    throw FileFormatError(fmt::format("tokenizer '{}' is not a valid SentencePiece model: {}", path, e.what()));
  }
  if (!status.ok())
    throw FileFormatError(fmt::format("tokenizer '{}' is not a SentencePiece model: {}", path,
                                      one_line(status.ToString())));
  return std::make_unique<SpTokenizer>(std::move(sp),
                                       tokenizer_file_describe(path, f.data(), f.size()));
}

}  // namespace weft::data
