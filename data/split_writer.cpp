#include "data/split_writer.h"

#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "data/megatron_file.h"
#include "data/token_file.h"

namespace weft::data {

namespace {

namespace fs = std::filesystem;

class WeftSplitWriter final : public SplitWriter {
 public:
  WeftSplitWriter(const std::string& dir, const std::string& name, int64_t vocab)
      : file_(name + ".tok"), writer_((fs::path(dir) / file_).string(), vocab) {}
  void document_append(std::span<const int32_t> tokens) override {
    writer_.append(tokens);
    ++documents_;
  }
  int64_t count() const override { return writer_.count(); }
  SplitFile finish() override {
    const TokenFileHeader h = writer_.finish();
    return {file_, h.count, documents_, h.dtype, h.checksum};
  }

 private:
  std::string file_;
  TokenFileWriter writer_;
  int64_t documents_ = 0;
};

// One sequence per document, as Megatron's preprocess_data writes without
// sentence splitting.
class MegatronSplitWriter final : public SplitWriter {
 public:
  MegatronSplitWriter(const std::string& dir, const std::string& name, int64_t vocab)
      : name_(name), writer_((fs::path(dir) / name).string(), vocab) {}
  void document_append(std::span<const int32_t> tokens) override {
    writer_.document_append(tokens);
  }
  int64_t count() const override { return writer_.count(); }
  SplitFile finish() override {
    const MegatronWritten w = writer_.finish();
    return {name_ + ".bin", w.info.tokens, w.info.documents, w.info.dtype, w.checksum};
  }

 private:
  std::string name_;
  MegatronWriter writer_;
};

}  // namespace

TokenFormat token_format_parse(const std::string& name) {
  if (name == "weft") return TokenFormat::weft;
  if (name == "megatron") return TokenFormat::megatron;
  throw InputError(fmt::format(
      "--format '{}' is not valid; use weft (.tok files) or megatron (.bin/.idx pairs)", name));
}

const char* token_format_name(TokenFormat format) {
  return format == TokenFormat::weft ? "weft" : "megatron";
}

std::unique_ptr<SplitWriter> split_writer_create(TokenFormat format, const std::string& dir,
                                                 const std::string& name, int64_t vocab) {
  if (format == TokenFormat::megatron)
    return std::make_unique<MegatronSplitWriter>(dir, name, vocab);
  return std::make_unique<WeftSplitWriter>(dir, name, vocab);
}

}  // namespace weft::data
