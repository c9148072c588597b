#include "data/added_tokens.h"

#include <algorithm>
#include <cstdint>

namespace weft::data {

void AddedTokenSplitter::Trie::insert(std::string_view token, int32_t id) {
  int32_t node = 0;
  for (const char ch : token) {
    const auto c = static_cast<uint8_t>(ch);
    auto& edges = nodes[node].edges;
    const auto it = std::lower_bound(edges.begin(), edges.end(), std::make_pair(c, INT32_MIN));
    if (it != edges.end() && it->first == c) {
      node = it->second;
      continue;
    }
    const auto child = static_cast<int32_t>(nodes.size());
    edges.insert(it, {c, child});
    nodes.emplace_back();  // may move `edges`; it is not used again
    node = child;
  }
  first[static_cast<uint8_t>(token[0])] = true;
  // The same content twice: the later entry wins, as in the reference's map.
  nodes[node].id = id;
}

size_t AddedTokenSplitter::Trie::longest(std::string_view text, size_t pos, int32_t& id) const {
  size_t best = 0;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto c = static_cast<uint8_t>(text[i]);
    const auto& edges = nodes[node].edges;
    const auto it = std::lower_bound(edges.begin(), edges.end(), std::make_pair(c, INT32_MIN));
    if (it == edges.end() || it->first != c) break;
    node = it->second;
    if (nodes[node].id >= 0) {
      best = i + 1 - pos;
      id = nodes[node].id;
    }
  }
  return best;
}

AddedTokenSplitter::AddedTokenSplitter(const std::vector<HfAddedToken>& tokens) {
  for (const auto& t : tokens) (t.normalized ? normalized_ : raw_).insert(t.content, t.id);
}

void AddedTokenSplitter::split_pass(const Trie& trie, std::string_view text, size_t base,
                                    std::vector<TextRun>& out) {
  size_t start = 0;  // of the pending text run
  for (size_t pos = 0; pos < text.size();) {
    if (!trie.first[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    int32_t id = -1;
    const size_t len = trie.longest(text, pos, id);
    if (len == 0) {
      ++pos;
      continue;
    }
    if (pos > start) out.push_back({base + start, pos - start, -1});
    out.push_back({base + pos, len, id});
    pos += len;
    start = pos;
  }
  if (text.size() > start) out.push_back({base + start, text.size() - start, -1});
}

void AddedTokenSplitter::split(std::string_view text, std::vector<TextRun>& runs,
                               std::vector<TextRun>& scratch) const {
  runs.clear();
  if (normalized_.empty()) {
    split_pass(raw_, text, 0, runs);
    return;
  }
  scratch.clear();
  split_pass(raw_, text, 0, scratch);
  for (const TextRun& r : scratch) {
    if (r.id >= 0)
      runs.push_back(r);
    else
      split_pass(normalized_, text.substr(r.offset, r.bytes), r.offset, runs);
  }
}

}  // namespace weft::data
