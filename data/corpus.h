// The built-in default corpus: the English text of Debian's `fortunes`
// package (about 2.8 MB, some 15,000 short documents), tokenized with the
// byte tokenizer. Small enough to prepare in a second and to train a tiny
// model on in minutes on a CPU, varied enough that the model visibly learns.
#pragma once

#include <string>
#include <vector>

#include "data/data_spec.h"

namespace weft::data {

inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

// The fortune text files in `dir`, sorted: regular files only, skipping the
// strfile indexes (.dat), the .u8 variants, symlinks, hidden files and the
// offensive "off/" subfolder (it is never descended into). InputError naming
// `dir` and `apt-get install fortunes` when there are none.
std::vector<std::string> fortune_files(const std::string& dir = kFortunesDir);

// $XDG_CACHE_HOME/weft/data, else ~/.cache/weft/data. InputError when
// neither XDG_CACHE_HOME nor HOME is set.
std::string data_cache_dir();

// The prepared default corpus folder (train.tok, val.tok, meta.json), at
// `<cache_dir>/fortunes`. Prepared on first use from `source_dir`; later calls
// return it at once. It is prepared into a temporary sibling and renamed into
// place, so a concurrent or interrupted run never leaves a half-written
// corpus, and when two runs race the first rename wins and both use it.
std::string default_corpus_dir(const std::string& source_dir = kFortunesDir,
                               const std::string& cache_dir = data_cache_dir());

// `--data`'s items parsed (data_spec.h), or the default corpus when there are none.
DataSpec data_spec_or_corpus(const std::vector<std::string>& items);

}  // namespace weft::data
