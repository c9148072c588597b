// What `--data` names: one path, several paths, or a weighted blend.
//
//   --data PATH               one dataset (a folder, a token file of any format
//                             or a Megatron prefix)
//   --data A B C              several, read back to back by `weft train` (as a
//                             folder of shards is) and one by one by `weft eval`
//   --data 0.7 A 0.3 B        a blend: weights and paths alternate, and each
//                             part's share of the samples follows its weight
//                             (weights need not sum to 1; they are normalised)
//
// A list is a blend when its first item is a number.
#pragma once

#include <string>
#include <vector>

namespace weft::data {

struct DataSpec {
  std::vector<std::string> paths;  // empty: the caller's default (the default corpus)
  std::vector<double> weights;     // one per path for a blend; empty otherwise

  bool blend() const { return !weights.empty(); }
  // The items as the user would type them, for messages.
  std::string describe() const;
};

// Parses `--data`'s items. InputError, naming the item and what would be
// valid, for a blend whose weights do not parse, are negative or not finite,
// or sum to 0, for a weight without a path, and for a list of paths with a
// number among them that is no file (a blend must start with a weight).
DataSpec data_spec_parse(const std::vector<std::string>& items);

}  // namespace weft::data
