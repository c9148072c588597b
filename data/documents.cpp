#include "data/documents.h"

#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace weft::data {

namespace fs = std::filesystem;

namespace {

bool is_separator_line(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line == "%";
}

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r\n") == std::string_view::npos;
}

std::string_view file_text(const MappedFile& f) {
  return {reinterpret_cast<const char*>(f.data()), static_cast<size_t>(f.size())};
}

// The text field of one JSONL line, decoded into `scratch`.
std::string_view jsonl_text(const MappedFile& f, std::string_view line, int64_t line_no,
                            const std::string& field, std::string& scratch) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("'{}' line {} is not JSON: {}", f.path(), line_no, e.what()));
  }
  if (!j.is_object())
    throw InputError(
        fmt::format("'{}' line {} is a JSON {}, not an object", f.path(), line_no, j.type_name()));
  const auto it = j.find(field);
  if (it == j.end() || !it->is_string()) {
    std::string keys;
    for (const auto& [k, v] : j.items()) keys += (keys.empty() ? "" : ", ") + k;
    throw InputError(fmt::format(
        "'{}' line {} has no string field '{}' (its fields: {}); pass --text-field NAME", f.path(),
        line_no, field, keys.empty() ? "none" : keys));
  }
  scratch = it->get_ref<const std::string&>();
  return scratch;
}

void scan_text(size_t index, InputFile& in, std::vector<Piece>& pieces) {
  const std::string_view text = file_text(*in.file);
  for (const auto d : text_documents(text)) {
    const auto bytes = static_cast<int64_t>(d.size());
    pieces.push_back({index, static_cast<int64_t>(d.data() - text.data()), bytes, 0, 0, bytes});
    ++in.documents;
    in.text_bytes += bytes;
  }
}

void scan_jsonl(size_t index, InputFile& in, const std::string& field, std::vector<Piece>& pieces) {
  const std::string_view text = file_text(*in.file);
  std::string scratch;
  int64_t line_no = 0;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(start, end - start);
    ++line_no;
    if (!is_blank(line)) {
      const auto doc = jsonl_text(*in.file, line, line_no, field, scratch);
      if (!doc.empty()) {
        const auto bytes = static_cast<int64_t>(doc.size());
        pieces.push_back({index, static_cast<int64_t>(start), static_cast<int64_t>(line.size()),
                          line_no, 0, bytes});
        ++in.documents;
        in.text_bytes += bytes;
      }
    }
    start = end + 1;
  }
}

}  // namespace

std::vector<std::string_view> text_documents(std::string_view text) {
  std::vector<std::string_view> docs;
  size_t doc_start = 0, line_start = 0;
  while (line_start < text.size()) {
    const size_t nl = text.find('\n', line_start);
    const size_t line_end = nl == std::string_view::npos ? text.size() : nl;
    const size_t next = nl == std::string_view::npos ? text.size() : nl + 1;
    if (is_separator_line(text.substr(line_start, line_end - line_start))) {
      docs.push_back(text.substr(doc_start, next - doc_start));
      doc_start = next;
    }
    line_start = next;
  }
  if (doc_start < text.size()) docs.push_back(text.substr(doc_start));
  return docs;
}

std::vector<Piece> documents_scan(const std::vector<std::string>& paths,
                                  const std::string& text_field, std::vector<InputFile>& files) {
  files.clear();
  for (const auto& path : paths) {
    if (fs::is_directory(path))
      throw InputError(fmt::format("input '{}' is a folder; pass its text files", path));
    InputFile in;
    in.file = std::make_shared<MappedFile>(path, "input file");
    in.format = fs::path(path).extension() == ".jsonl" ? InputFormat::jsonl : InputFormat::text;
    files.push_back(std::move(in));
  }
  std::vector<Piece> pieces;
  for (size_t f = 0; f < files.size(); ++f) {
    if (files[f].format == InputFormat::jsonl)
      scan_jsonl(f, files[f], text_field, pieces);
    else
      scan_text(f, files[f], pieces);
  }
  return pieces;
}

std::string_view piece_text(const std::vector<InputFile>& files, const std::string& text_field,
                            const Piece& p, std::string& scratch) {
  const InputFile& in = files[p.file];
  const std::string_view raw =
      file_text(*in.file).substr(static_cast<size_t>(p.offset), static_cast<size_t>(p.bytes));
  const std::string_view doc = in.format == InputFormat::jsonl
                                   ? jsonl_text(*in.file, raw, p.line, text_field, scratch)
                                   : raw;
  return doc.substr(static_cast<size_t>(p.text_begin), static_cast<size_t>(p.text_bytes));
}

}  // namespace weft::data
