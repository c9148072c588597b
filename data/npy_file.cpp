// numpy .npy token arrays. The header is a Python dict literal, e.g.
//   {'descr': '<u2', 'fortran_order': False, 'shape': (1000,), }
// which numpy writes in a fixed style; this parser accepts that style and
// reasonable hand-written variants (either quote kind, spacing), not
// arbitrary Python.
#include <cctype>
#include <cstring>
#include <optional>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "data/formats.h"

namespace weft::data {

namespace {

constexpr char kMagic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw FileFormatError(fmt::format("numpy file '{}' {}", path, what));
}

// The text right after `'key':` in the header dict, or nullopt.
std::optional<std::string_view> value_after(std::string_view dict, std::string_view key) {
  for (const char q : {'\'', '"'}) {
    std::string quoted(1, q);
    quoted.append(key);
    quoted.push_back(q);
    const auto at = dict.find(quoted);
    if (at == std::string_view::npos) continue;
    auto rest = dict.substr(at + quoted.size());
    const auto colon = rest.find_first_not_of(" \t");
    if (colon == std::string_view::npos || rest[colon] != ':') return std::nullopt;
    rest = rest.substr(colon + 1);
    const auto start = rest.find_first_not_of(" \t");
    if (start == std::string_view::npos) return std::nullopt;
    return rest.substr(start);
  }
  return std::nullopt;
}

std::optional<std::string> quoted_string(std::string_view v) {
  if (v.empty() || (v[0] != '\'' && v[0] != '"')) return std::nullopt;
  const auto end = v.find(v[0], 1);
  if (end == std::string_view::npos) return std::nullopt;
  return std::string(v.substr(1, end - 1));
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// "(1000,)" -> {1000}; "()" -> {}; "(3, 4)" -> {3, 4}.
std::optional<std::vector<int64_t>> shape_tuple(std::string_view v) {
  if (v.empty() || v[0] != '(') return std::nullopt;
  const auto close = v.find(')');
  if (close == std::string_view::npos) return std::nullopt;
  const std::string_view inner = v.substr(1, close - 1);
  std::vector<int64_t> dims;
  size_t pos = 0;
  while (true) {
    const auto comma = inner.find(',', pos);
    std::string_view item =
        trim(inner.substr(pos, comma == std::string_view::npos ? comma : comma - pos));
    if (!item.empty() && item.back() == 'L') item.remove_suffix(1);  // Python 2 longs
    if (item.empty()) {
      // Only the text after a trailing comma may be empty: "(3,)", "()".
      if (comma != std::string_view::npos) return std::nullopt;
      break;
    }
    int64_t d = 0;
    for (const char c : item) {
      if (!std::isdigit(static_cast<unsigned char>(c)) || d > (INT64_MAX - 9) / 10)
        return std::nullopt;
      d = d * 10 + (c - '0');
    }
    dims.push_back(d);
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return dims;
}

std::optional<TokenDtype> dtype_from_descr(const std::string& d) {
  if (d == "|u1" || d == "<u1" || d == "u1") return TokenDtype::u8;
  if (d == "<u2") return TokenDtype::u16;
  if (d == "<u4") return TokenDtype::u32;
  if (d == "<i4") return TokenDtype::i32;
  if (d == "<i8") return TokenDtype::i64;
  return std::nullopt;
}

}  // namespace

bool npy_detect(const MappedFile& file) {
  return file.size() >= 6 && std::memcmp(file.data(), kMagic, 6) == 0;
}

std::unique_ptr<MappedTokenSource> npy_source(MappedFilePtr file) {
  const std::string& path = file->path();
  const uint8_t* b = file->data();
  const int64_t size = file->size();
  if (size < 10) fail(path, fmt::format("is truncated: {} bytes, shorter than its preamble", size));
  const int major = b[6];
  int64_t header_len = 0, preamble = 0;
  if (major == 1) {
    header_len = b[8] | (int64_t{b[9]} << 8);
    preamble = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12)
      fail(path, fmt::format("is truncated: {} bytes, shorter than its preamble", size));
    header_len = b[8] | (int64_t{b[9]} << 8) | (int64_t{b[10]} << 16) | (int64_t{b[11]} << 24);
    preamble = 12;
  } else {
    fail(path, fmt::format("has format version {}.{}; weft reads versions 1.0, 2.0 and 3.0", major,
                           b[7]));
  }
  if (preamble + header_len > size)
    fail(path,
         fmt::format("is truncated: its {}-byte header dict runs past the end of the {}-byte file",
                     header_len, size));
  const std::string_view dict(reinterpret_cast<const char*>(b + preamble),
                              static_cast<size_t>(header_len));

  const auto descr_v = value_after(dict, "descr");
  const auto descr = descr_v ? quoted_string(*descr_v) : std::nullopt;
  if (!descr) fail(path, "has no readable 'descr' in its header");
  const auto dtype = dtype_from_descr(*descr);
  if (!dtype)
    fail(path, fmt::format(
                   "has dtype '{}'; token arrays must be little-endian integers: "
                   "'<u2' (uint16), '<i4' (int32), '<u4' (uint32), '<i8' (int64) or '|u1' (uint8)",
                   *descr));
  const auto fortran_v = value_after(dict, "fortran_order");
  if (!fortran_v || !(fortran_v->starts_with("False") || fortran_v->starts_with("True")))
    fail(path, "has no readable 'fortran_order' in its header");
  const auto shape_v = value_after(dict, "shape");
  const auto shape = shape_v ? shape_tuple(*shape_v) : std::nullopt;
  if (!shape) fail(path, "has no readable 'shape' in its header");
  if (shape->size() != 1)
    fail(path, fmt::format("holds a {}-D array of shape ({}); token arrays must be 1-D",
                           shape->size(), fmt::join(*shape, ", ")));
  // Fortran order is the same layout as C order for a 1-D array.
  const int64_t count = (*shape)[0];
  if (count == 0) throw InputError(fmt::format("data file '{}' holds no tokens", path));
  const int64_t width = dtype_bytes(*dtype);
  const int64_t offset = preamble + header_len;
  const int64_t payload = size - offset;
  if (count > payload / width || payload != count * width)
    fail(path,
         fmt::format("is {}: its header says {} {} values but the file holds {} payload bytes",
                     payload / width < count ? "truncated" : "longer than its header says", count,
                     dtype_name(*dtype), payload));
  return std::make_unique<MappedTokenSource>(std::move(file), "numpy .npy", offset, *dtype, count,
                                             0);
}

}  // namespace weft::data
