// A tuning journal, read when `weft tune` resumes, and the trial results it
// holds as the search reads them back.
#include "tests/fuzz/fuzz_common.h"
#include "tuner/journal.h"
#include "tuner/tune_search.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weft;
  const std::string path = fuzz::fuzz_file("journal.jsonl", fuzz::fuzz_bytes(data, size));
  // The seeds carry this header, so the fuzzer starts past the header check.
  static const nlohmann::json header = {{"model", "0123456789abcdef"}, {"world", 1}};
  fuzz::fuzz_parse([&] {
    const tuner::Journal j = tuner::Journal::open(path, header);
    (void)j.unfinished();
    for (const auto& result : j.results()) (void)tuner::record_from_json(result, path);
  });
  return 0;
}
