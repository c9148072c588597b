// The words of a command line as users give them to weft recipe sbatch
// (--train, split as a shell splits them and parsed with weft train's own
// option table: --change, --memory-limit, --lora-* and the rest) and the
// values of --memory-limit and --time.
#include <algorithm>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/sbatch.h"
#include "core/units.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weft;
  const std::string text(fuzz::fuzz_bytes(data, size));
  fuzz::fuzz_parse([&] { (void)parse_bytes(text); });
  (void)cli::slurm_time_valid(text);
  fuzz::fuzz_parse([&] {
    std::vector<std::string> words = cli::shell_words(text, "--train");
    // Quoted again and split again, the words come back as they were.
    std::string quoted;
    for (const auto& w : words) quoted += (quoted.empty() ? "" : " ") + cli::shell_quote(w);
    if (cli::shell_words(quoted, "--train") != words) {
      std::fprintf(stderr, "fuzz: finding: words do not survive quoting\n");
      std::abort();
    }
    CLI::App app{"weft"};
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    const cli::Command train = cli::add_train_command(app);
    if (std::any_of(words.begin(), words.end(), [](const std::string& w) { return w.empty(); })) return;
    words.insert(words.begin(), "train");
    std::reverse(words.begin(), words.end());
    try {
      app.parse(words);
    } catch (const CLI::Error&) {
      // A refusal by the option table: what weft train would print.
    }
  });
  return 0;
}
