#include "data/hf_tokenizer_json.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_io.h"
#include "data/byte_level.h"

namespace weft::data {

namespace {

using nlohmann::json;

constexpr const char* kSupported =
    "weft reads byte-level BPE tokenizers (Llama 3, GPT-2): pre_tokenizer Split(Regex) and "
    "ByteLevel, model BPE, decoder ByteLevel";

class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void unsupported(const std::string& what) const {
    throw FileFormatError(
        fmt::format("tokenizer '{}': {} is not supported; {}", path_, what, kSupported));
  }
  [[noreturn]] void malformed(const std::string& what) const {
    throw FileFormatError(
        fmt::format("tokenizer '{}' is not a valid Hugging Face tokenizer.json: {}", path_, what));
  }

  std::string type_of(const json& component, const std::string& where) const {
    if (!component.is_object() || !component.contains("type") || !component["type"].is_string())
      malformed(fmt::format("{} has no \"type\"", where));
    return component["type"].get<std::string>();
  }

  // A boolean field that must hold `expected` (absent counts as `expected`).
  void require_flag(const json& obj, const char* key, bool expected,
                    const std::string& where) const {
    if (!obj.contains(key) || obj[key].is_null()) return;
    if (!obj[key].is_boolean()) malformed(fmt::format("{}.{} is not a boolean", where, key));
    if (obj[key].get<bool>() != expected)
      unsupported(fmt::format("{} with {} {}", where, key, !expected));
  }
  bool flag(const json& obj, const char* key, bool fallback) const {
    if (!obj.contains(key) || obj[key].is_null()) return fallback;
    if (!obj[key].is_boolean()) malformed(fmt::format("\"{}\" is not a boolean", key));
    return obj[key].get<bool>();
  }

  void normalizer(const json& n) const {
    if (n.is_null()) return;
    const std::string type = type_of(n, "normalizer");
    if (type == "Sequence" && n.value("normalizers", json::array()).empty()) return;
    unsupported(fmt::format("normalizer {}", type));
  }

  void split(const json& s, HfTokenizerSpec& spec) const {
    const json& pattern = s.value("pattern", json());
    if (!pattern.is_object() || !pattern.contains("Regex") || !pattern["Regex"].is_string()) {
      if (pattern.is_object() && pattern.contains("String"))
        unsupported("pre_tokenizer Split with a String pattern");
      malformed("pre_tokenizer Split has no pattern");
    }
    const std::string behavior = s.value("behavior", "");
    if (behavior != "Isolated" && behavior != "Removed")
      unsupported(fmt::format("pre_tokenizer Split with behavior {}", behavior));
    require_flag(s, "invert", false, "pre_tokenizer Split");
    spec.splits.push_back({pattern["Regex"].get<std::string>(), behavior == "Removed"});
  }

  void pre_tokenizer(const json& p, HfTokenizerSpec& spec) const {
    if (p.is_null()) unsupported("a tokenizer without a pre_tokenizer (not byte-level)");
    std::vector<json> stages;
    if (type_of(p, "pre_tokenizer") == "Sequence")
      for (const auto& s : p.value("pretokenizers", json::array())) stages.push_back(s);
    else
      stages.push_back(p);
    bool byte_level = false;
    for (const auto& s : stages) {
      const std::string type = type_of(s, "pre_tokenizer");
      if (byte_level) unsupported(fmt::format("pre_tokenizer {} after ByteLevel", type));
      if (type == "Split") {
        split(s, spec);
      } else if (type == "ByteLevel") {
        byte_level = true;
        spec.prefix_space = flag(s, "add_prefix_space", true);
        spec.byte_level_regex = flag(s, "use_regex", true);
      } else {
        unsupported(fmt::format("pre_tokenizer {}", type));
      }
    }
    if (!byte_level) unsupported("a pre_tokenizer without ByteLevel (not byte-level)");
  }

  void model(const json& m, HfTokenizerSpec& spec) const {
    const std::string type = type_of(m, "model");
    if (type != "BPE") unsupported(fmt::format("model {}", type));
    if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"] != 0)
      unsupported("model BPE with dropout");
    if (flag(m, "byte_fallback", false))
      unsupported(
          "model BPE with byte_fallback (SentencePiece-style, as Llama 2's tokenizer.json; pass "
          "its tokenizer.model instead)");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (m.contains(key) && !m[key].is_null() && m[key] != "")
        unsupported(fmt::format("model BPE with {}", key));
    spec.ignore_merges = flag(m, "ignore_merges", false);
    spec.fuse_unk = flag(m, "fuse_unk", false);

    if (!m.contains("vocab") || !m["vocab"].is_object()) malformed("model.vocab is not an object");
    std::unordered_map<std::string, int32_t> by_text;  // byte-level text -> id
    for (const auto& [text, id] : m["vocab"].items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1ll << 31))
        malformed(fmt::format("model.vocab[\"{}\"] is not an id in [0, 2^31)", text));
      by_text.emplace(text, id.get<int32_t>());
      if (auto raw = byte_level_decode(text))
        spec.vocab.emplace_back(std::move(*raw), id.get<int32_t>());
      spec.vocab_size = std::max<int64_t>(spec.vocab_size, id.get<int64_t>() + 1);
    }
    if (m.contains("unk_token") && !m["unk_token"].is_null()) {
      const auto unk = m["unk_token"].get<std::string>();
      const auto it = by_text.find(unk);
      if (it == by_text.end())
        malformed(fmt::format("model.unk_token '{}' is not in the vocab", unk));
      spec.unk = it->second;
    }

    if (!m.contains("merges") || !m["merges"].is_array()) malformed("model.merges is not a list");
    const json& merges = m["merges"];
    spec.merges.reserve(merges.size());
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      const json& e = merges[rank];
      std::string a, b;
      if (e.is_string()) {
        // The older form, "a b": exactly one space.
        const std::string s = e.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          malformed(fmt::format("merge {} \"{}\" is not two tokens separated by a space", rank, s));
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        a = e[0].get<std::string>();
        b = e[1].get<std::string>();
      } else {
        malformed(fmt::format("merge {} is neither \"a b\" nor [\"a\", \"b\"]", rank));
      }
      for (const std::string& s : {a, b, a + b}) {
        if (!by_text.count(s))
          malformed(fmt::format("merge {} (\"{}\" \"{}\") needs \"{}\", which is not in the vocab",
                                rank, a, b, s));
      }
      auto ra = byte_level_decode(a), rb = byte_level_decode(b);
      // A merge of tokens no byte string spells can never apply; keeping its
      // rank slot keeps the ranks of the rest as the file numbers them.
      if (ra && rb)
        spec.merges.emplace_back(std::move(*ra), std::move(*rb));
      else
        spec.merges.emplace_back();
    }
  }

  void added_tokens(const json& list, HfTokenizerSpec& spec) const {
    if (list.is_null()) return;
    if (!list.is_array()) malformed("added_tokens is not a list");
    for (const auto& t : list) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
          !t.contains("content") || !t["content"].is_string())
        malformed("an entry of added_tokens has no id or content");
      HfAddedToken a;
      a.id = t["id"].get<int32_t>();
      a.content = t["content"].get<std::string>();
      if (a.id < 0) malformed(fmt::format("added token '{}' has id {}", a.content, a.id));
      if (a.content.empty()) malformed(fmt::format("added token {} is empty", a.id));
      for (const char* key : {"lstrip", "rstrip", "single_word"})
        require_flag(t, key, false, fmt::format("added token '{}'", a.content));
      a.special = flag(t, "special", false);
      a.normalized = flag(t, "normalized", !a.special);
      spec.vocab_size = std::max<int64_t>(spec.vocab_size, int64_t{a.id} + 1);
      spec.added.push_back(std::move(a));
    }
  }

  // TemplateProcessing's "single": special tokens around the one sequence $A.
  void template_processing(const json& t, HfTokenizerSpec& spec) const {
    const json& single = t.value("single", json());
    const json& specials = t.value("special_tokens", json::object());
    if (!single.is_array()) malformed("post_processor TemplateProcessing has no single template");
    bool seen_sequence = false;
    for (const auto& piece : single) {
      if (piece.contains("Sequence")) {
        if (seen_sequence)
          malformed("post_processor TemplateProcessing's single template has two sequences");
        seen_sequence = true;
        continue;
      }
      if (!piece.contains("SpecialToken"))
        malformed(
            "a piece of TemplateProcessing's single template is neither Sequence nor "
            "SpecialToken");
      const std::string name = piece["SpecialToken"].value("id", "");
      if (!specials.contains(name) || !specials[name].contains("ids"))
        malformed(fmt::format("TemplateProcessing names special token '{}' but does not define it",
                              name));
      for (const auto& id : specials[name]["ids"]) {
        (seen_sequence ? spec.suffix : spec.prefix).push_back(id.get<int32_t>());
        spec.vocab_size = std::max<int64_t>(spec.vocab_size, id.get<int64_t>() + 1);
      }
      (seen_sequence ? spec.suffix_names : spec.prefix_names).push_back(name);
    }
    if (!seen_sequence) malformed("TemplateProcessing's single template has no $A");
  }

  void post_processor(const json& p, HfTokenizerSpec& spec) const {
    if (p.is_null()) return;
    const std::string type = type_of(p, "post_processor");
    if (type == "Sequence") {
      for (const auto& s : p.value("processors", json::array())) post_processor(s, spec);
    } else if (type == "TemplateProcessing") {
      if (!spec.prefix_names.empty() || !spec.suffix_names.empty())
        unsupported("two TemplateProcessing post-processors");
      template_processing(p, spec);
    } else if (type != "ByteLevel") {  // ByteLevel only moves offsets
      unsupported(fmt::format("post_processor {}", type));
    }
  }

  void decoder(const json& d) const {
    if (d.is_null()) return;
    const std::string type = type_of(d, "decoder");
    if (type != "ByteLevel") unsupported(fmt::format("decoder {}", type));
  }

 private:
  std::string path_;
};

}  // namespace

HfTokenizerSpec hf_tokenizer_parse(const nlohmann::json& file, const std::string& path) {
  const Reader r(path);
  if (!file.is_object() || !file.contains("model") || !file["model"].is_object())
    r.malformed("it is not a JSON object with a \"model\" object");
  HfTokenizerSpec spec;
  // The parts by reference, so that a value of the wrong type deep inside
  // one is named by its whole path ("post_processor.processors[1].type").
  static const json absent;
  const auto part = [&](const char* key) -> const json& { return file.contains(key) ? file[key] : absent; };
  try {
    for (const char* key : {"truncation", "padding"})
      if (file.contains(key) && !file[key].is_null())
        r.unsupported(fmt::format("{} (it would cut or pad documents)", key));
    r.normalizer(part("normalizer"));
    r.pre_tokenizer(part("pre_tokenizer"), spec);
    r.model(file["model"], spec);
    r.added_tokens(part("added_tokens"), spec);
    r.post_processor(part("post_processor"), spec);
    r.decoder(part("decoder"));
  } catch (const nlohmann::json::exception& e) {
    r.malformed(json_error_text(e));
  }
  // Real vocabularies number their tokens from 0 with few gaps; a table
  // indexed by id (decoding) is sized by the largest id, so one stray huge id
  // would ask for gigabytes. Gaps up to 2^20 ids (32 MiB of table) pass.
  const int64_t entries = int64_t(spec.vocab.size() + spec.added.size());
  if (spec.vocab_size > 2 * entries + (int64_t{1} << 20))
    r.malformed(fmt::format("its ids go up to {} but it has only {} tokens; a vocabulary numbers its tokens "
                            "from 0 with few gaps",
                            spec.vocab_size - 1, entries));
  return spec;
}

}  // namespace weft::data
