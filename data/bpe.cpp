#include "data/bpe.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <queue>

#include <fmt/format.h>

#include "core/error.h"

namespace weft::data {

namespace {

// Words of up to this many bytes (nearly every word of prose) merge by
// scanning a small array on the stack; longer ones use the heap, whose
// allocations cost more than a scan of a few dozen ranks saves.
constexpr size_t kScanMaxSymbols = 48;

uint64_t mix(uint64_t key) { return key * 0x9E3779B97F4A7C15ull; }

}  // namespace

// ---- cache ------------------------------------------------------------------

const int32_t* BpeState::find(std::string_view word, size_t& count) const {
  const uint64_t* v = index_.find(word);
  if (!v) return nullptr;
  count = static_cast<size_t>(*v & 0xFFFF);
  return ids_.data() + (*v >> 16);
}

void BpeState::insert(std::string_view word, const int32_t* ids, size_t count) {
  if (word.size() > kMaxWordBytes) return;
  if (index_.size() >= kMaxWords) {
    index_.clear();
    ids_.clear();
  }
  // A word of at most 64 bytes merges into at most 64 ids: the count fits 16 bits.
  index_.insert(word, (uint64_t{ids_.size()} << 16) | count);
  ids_.insert(ids_.end(), ids, ids + count);
}

// ---- model ------------------------------------------------------------------

BpeModel::BpeModel(const HfTokenizerSpec& spec)
    : ignore_merges_(spec.ignore_merges), unk_(spec.unk), fuse_unk_(spec.fuse_unk) {
  for (const auto& [bytes, id] : spec.vocab) vocab_.insert(bytes, static_cast<uint64_t>(id));
  byte_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    if (const uint64_t* id = vocab_.find(std::string_view(&c, 1)))
      byte_ids_[b] = static_cast<int32_t>(*id);
  }
  const auto id_of = [&](const std::string& bytes) {
    return static_cast<int32_t>(*vocab_.find(bytes));
  };
  std::vector<std::pair<int32_t, int32_t>> pairs;
  std::vector<int32_t> results;
  pairs.reserve(spec.merges.size());
  results.reserve(spec.merges.size());
  for (const auto& [a, b] : spec.merges) {
    if (a.empty()) {  // a merge no byte string can reach (see hf_tokenizer_json.cpp)
      pairs.emplace_back(-1, -1);
      results.push_back(-1);
      continue;
    }
    // hf_tokenizer_parse checked that both sides and the result are in the vocab.
    pairs.emplace_back(id_of(a), id_of(b));
    results.push_back(id_of(a + b));
  }
  merges_build(pairs, results);
}

void BpeModel::merges_build(const std::vector<std::pair<int32_t, int32_t>>& pairs,
                            const std::vector<int32_t>& results) {
  const size_t capacity = std::bit_ceil(std::max<size_t>(16, pairs.size() * 2));
  slots_.assign(capacity, Slot{});
  slot_mask_ = capacity - 1;
  for (size_t rank = 0; rank < pairs.size(); ++rank) {
    if (results[rank] < 0) continue;
    const uint64_t key = pair_key(pairs[rank].first, pairs[rank].second);
    for (uint64_t i = mix(key) >> 32 & slot_mask_;; i = (i + 1) & slot_mask_) {
      // A pair listed twice keeps its last rank, as the reference's hash map does.
      if (slots_[i].key == key || slots_[i].key == ~uint64_t{0}) {
        slots_[i] = {key, {static_cast<int32_t>(rank), results[rank]}};
        break;
      }
    }
  }
}

BpeModel::Merge BpeModel::merge_of(int32_t a, int32_t b) const {
  const uint64_t key = pair_key(a, b);
  for (uint64_t i = mix(key) >> 32 & slot_mask_;; i = (i + 1) & slot_mask_) {
    if (slots_[i].key == key) return slots_[i].merge;
    if (slots_[i].key == ~uint64_t{0}) return {};
  }
}

void BpeModel::symbols_init(std::string_view word, std::vector<int32_t>& symbols) const {
  symbols.clear();
  bool pending_unk = false;
  for (const char c : word) {
    const int32_t id = byte_ids_[static_cast<unsigned char>(c)];
    if (id >= 0) {
      if (pending_unk) symbols.push_back(unk_);
      pending_unk = false;
      symbols.push_back(id);
    } else if (unk_ >= 0) {
      if (pending_unk && !fuse_unk_) symbols.push_back(unk_);
      pending_unk = true;
    }
  }
  if (pending_unk) symbols.push_back(unk_);
}

void BpeModel::merge_scan(std::vector<int32_t>& symbols) const {
  if (symbols.size() < 2) return;
  // ranks[i]: the merge of symbols i and i+1; rank INT_MAX when none.
  Merge ranks[kScanMaxSymbols];
  size_t n = symbols.size();
  for (size_t i = 0; i + 1 < n; ++i) {
    ranks[i] = merge_of(symbols[i], symbols[i + 1]);
    if (ranks[i].rank < 0) ranks[i].rank = INT_MAX;
  }
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (ranks[i].rank < ranks[best].rank) best = i;
    if (ranks[best].rank == INT_MAX) break;
    symbols[best] = ranks[best].id;
    for (size_t i = best + 1; i + 1 < n; ++i) symbols[i] = symbols[i + 1];
    for (size_t i = best; i + 2 < n; ++i) ranks[i] = ranks[i + 1];
    --n;
    for (size_t i : {best - 1, best}) {
      if (i >= n - 1) continue;  // best - 1 wraps around when best is 0
      ranks[i] = merge_of(symbols[i], symbols[i + 1]);
      if (ranks[i].rank < 0) ranks[i].rank = INT_MAX;
    }
  }
  symbols.resize(n);
}

void BpeModel::merge_heap(std::vector<int32_t>& symbols) const {
  const int32_t n = static_cast<int32_t>(symbols.size());
  if (n < 2) return;
  std::vector<int32_t> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
  std::vector<char> alive(static_cast<size_t>(n), 1);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  // (rank, left position, result): the lowest rank first, then the leftmost.
  struct Entry {
    int32_t rank, pos, id;
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
  auto push = [&](int32_t left) {
    if (left < 0 || next[left] < 0) return;
    const Merge m = merge_of(symbols[left], symbols[next[left]]);
    if (m.rank >= 0) heap.push({m.rank, left, m.id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Entry e = heap.top();
    heap.pop();
    if (!alive[e.pos] || next[e.pos] < 0) continue;
    const int32_t right = next[e.pos];
    // Stale when either symbol changed since the entry was pushed.
    if (merge_of(symbols[e.pos], symbols[right]).id != e.id) continue;
    symbols[e.pos] = e.id;
    alive[right] = 0;
    next[e.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = e.pos;
    push(prev[e.pos]);
    push(e.pos);
  }
  int32_t w = 0;
  for (int32_t i = 0; i < n; ++i)
    if (alive[i]) symbols[w++] = symbols[i];
  symbols.resize(static_cast<size_t>(w));
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out, BpeState& state,
                           MergeStrategy strategy) const {
  if (ignore_merges_) {
    if (const uint64_t* id = vocab_.find(word)) {
      out.push_back(static_cast<int32_t>(*id));
      return;
    }
  }
  const bool cached = strategy == MergeStrategy::automatic;
  if (cached) {
    size_t count = 0;
    if (const int32_t* ids = state.find(word, count)) {
      out.insert(out.end(), ids, ids + count);
      return;
    }
  }
  std::vector<int32_t>& symbols = state.symbols_;
  symbols_init(word, symbols);
  if (strategy == MergeStrategy::automatic)
    strategy = symbols.size() <= kScanMaxSymbols ? MergeStrategy::scan : MergeStrategy::heap;
  if (strategy == MergeStrategy::scan && symbols.size() > kScanMaxSymbols)
    throw InternalError(fmt::format("merge_scan takes at most {} symbols, not {}", kScanMaxSymbols,
                                    symbols.size()));
  if (strategy == MergeStrategy::scan)
    merge_scan(symbols);
  else
    merge_heap(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
  if (cached) state.insert(word, symbols.data(), symbols.size());
}

}  // namespace weft::data
