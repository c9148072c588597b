// The documents of `weft data prepare`'s input files.
//
//   text   a file whose lines holding only "%" (the fortune format) each end
//          a document; any other text file is one document. A document keeps
//          its bytes, separator line included, so the documents of a file
//          concatenate back to the file.
//   JSONL  a file named *.jsonl: one JSON object per line, the document the
//          string in its text field ("text" unless told otherwise). Blank
//          lines and empty texts are skipped. The text is the decoded JSON
//          string, so it is valid UTF-8 (JSON requires it; the parser checks).
//
// A piece is a document, or a part of one that the split cut (see
// prepare.h), located by the document's raw span in its file and a byte
// range of the document's text.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/mapped_file.h"

namespace weft::data {

enum class InputFormat { text, jsonl };

struct InputFile {
  std::shared_ptr<MappedFile> file;
  InputFormat format = InputFormat::text;
  int64_t documents = 0;
  int64_t text_bytes = 0;  // of its documents' text
};

enum class Split { train, val };

struct Piece {
  size_t file = 0;         // index into the input files
  int64_t offset = 0;      // the document's raw span in the file
  int64_t bytes = 0;       //   (a JSONL document: its line, newline excluded)
  int64_t line = 0;        // JSONL: the line's 1-based number, for messages
  int64_t text_begin = 0;  // the piece's range of the document's text
  int64_t text_bytes = 0;
  Split split = Split::train;
};

// The documents of one text file's contents (see above), each a view into
// `text`.
std::vector<std::string_view> text_documents(std::string_view text);

// Maps `paths` and lists their documents as pieces, in file order, filling
// in each file's counts. InputError naming the file (and line) for a folder,
// a missing or empty file, or a JSONL line that is not an object with a
// string `text_field`.
std::vector<Piece> documents_scan(const std::vector<std::string>& paths,
                                  const std::string& text_field, std::vector<InputFile>& files);

// The text of a piece: a view into the mapped file, or for JSONL into
// `scratch`, which it overwrites.
std::string_view piece_text(const std::vector<InputFile>& files, const std::string& text_field,
                            const Piece& piece, std::string& scratch);

}  // namespace weft::data
