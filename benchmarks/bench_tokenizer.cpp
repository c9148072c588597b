// Tokenization throughput of one tokenizer on one thread: the weft side of
// tokenizer_vs_hf.py, and usable alone.
//
//   bench_tokenizer TOKENIZER FILE... [--repeats N]
//
// Each file's documents (data::text_documents: fortune files split at '%'
// lines, other files whole) are encoded with one encoder, the way `weft data
// prepare` encodes them on one of its threads, without the document tokens
// and without writing anything. Prints the best of N timed passes in MB/s
// of text, after one untimed pass that warms the page cache and the word
// cache, and a checksum of the ids so runs can be compared. Time is the
// process's CPU time, so that other work on a shared machine slows the
// measurement less than wall-clock time would (wall time beside it).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "data/documents.h"
#include "data/tokenizer.h"

namespace {

double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw weft::InputError(fmt::format("cannot read '{}'", path));
  return {std::istreambuf_iterator<char>(in), {}};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    int repeats = 3;
    for (size_t i = 0; i + 1 < args.size(); ++i)
      if (args[i] == "--repeats") {
        repeats = std::max(1, std::stoi(args[i + 1]));
        args.erase(args.begin() + static_cast<long>(i), args.begin() + static_cast<long>(i) + 2);
        break;
      }
    if (args.size() < 2) {
      std::fprintf(stderr, "usage: bench_tokenizer TOKENIZER FILE... [--repeats N]\n");
      return 2;
    }
    const auto tokenizer = weft::data::tokenizer_create(args[0]);
    std::vector<std::string> texts;
    for (size_t i = 1; i < args.size(); ++i) texts.push_back(read_file(args[i]));
    std::vector<std::string_view> docs;
    int64_t bytes = 0;
    for (const auto& t : texts)
      for (const auto d : weft::data::text_documents(t)) {
        docs.push_back(d);
        bytes += static_cast<int64_t>(d.size());
      }

    auto encoder = tokenizer->encoder();
    std::vector<int32_t> ids;
    double best = 1e30, best_wall = 1e30;
    uint64_t checksum = 0;
    int64_t tokens = 0;
    for (int pass = 0; pass <= repeats; ++pass) {
      const auto start = std::chrono::steady_clock::now();
      const double cpu_start = cpu_seconds();
      tokens = 0;
      checksum = 0;
      for (const auto d : docs) {
        ids.clear();
        encoder->encode(d, ids);
        tokens += static_cast<int64_t>(ids.size());
        for (const int32_t id : ids) checksum = checksum * 1000003 + static_cast<uint32_t>(id);
      }
      const double wall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (pass > 0) {
        best = std::min(best, cpu_seconds() - cpu_start);
        best_wall = std::min(best_wall, wall);
      }
    }
    fmt::print(
        "weft {}: {:.1f} MB/s ({} documents, {:.2f} MB, {} tokens, {:.3f} s CPU and {:.3f} s "
        "wall, best of {}, 1 thread) checksum {:016x}\n",
        tokenizer->name(), double(bytes) / 1e6 / best, docs.size(), double(bytes) / 1e6, tokens,
        best, best_wall, repeats, checksum);
    return 0;
  } catch (const weft::InputError& e) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", e.what());
    return 2;
  }
}
