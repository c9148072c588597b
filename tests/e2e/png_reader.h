// A tiny PNG reader for the browser test's screenshots: 8-bit RGB or RGBA,
// not interlaced (what headless Chromium writes), inflated with zlib.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace weft::test {

struct Image {
  int64_t width = 0, height = 0, channels = 0;
  std::vector<uint8_t> pixels;  // (height, width, channels)
};

inline Image png_read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> f((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (f.size() < 8 || f[1] != 'P' || f[2] != 'N' || f[3] != 'G') throw std::runtime_error(path + ": not a PNG");
  auto be32 = [&](size_t at) {
    return (uint32_t(f[at]) << 24) | (uint32_t(f[at + 1]) << 16) | (uint32_t(f[at + 2]) << 8) | uint32_t(f[at + 3]);
  };
  Image img;
  std::vector<uint8_t> idat;
  for (size_t at = 8; at + 8 <= f.size();) {
    const uint32_t len = be32(at);
    const std::string type(f.begin() + long(at) + 4, f.begin() + long(at) + 8);
    if (at + 12 + len > f.size()) throw std::runtime_error(path + ": truncated chunk " + type);
    const uint8_t* d = f.data() + at + 8;
    if (type == "IHDR") {
      img.width = be32(at + 8);
      img.height = be32(at + 12);
      if (d[8] != 8 || (d[9] != 2 && d[9] != 6) || d[12] != 0)
        throw std::runtime_error(path + ": only 8-bit RGB/RGBA, not interlaced");
      img.channels = d[9] == 6 ? 4 : 3;
    } else if (type == "IDAT") {
      idat.insert(idat.end(), d, d + len);
    }
    at += 12 + len;
  }
  const size_t stride = size_t(img.width * img.channels);
  std::vector<uint8_t> raw(size_t(img.height) * (stride + 1));
  uLongf n = raw.size();
  if (uncompress(raw.data(), &n, idat.data(), uLong(idat.size())) != Z_OK || n != raw.size())
    throw std::runtime_error(path + ": bad image data");
  // Undo the per-row filters (PNG spec, section 9).
  img.pixels.resize(size_t(img.height) * stride);
  const size_t bpp = size_t(img.channels);
  for (int64_t y = 0; y < img.height; ++y) {
    const uint8_t filter = raw[size_t(y) * (stride + 1)];
    const uint8_t* src = &raw[size_t(y) * (stride + 1) + 1];
    uint8_t* row = &img.pixels[size_t(y) * stride];
    const uint8_t* up = y > 0 ? row - stride : nullptr;
    for (size_t x = 0; x < stride; ++x) {
      const int a = x >= bpp ? row[x - bpp] : 0, b = up ? up[x] : 0, c = up && x >= bpp ? up[x - bpp] : 0;
      int v = src[x];
      switch (filter) {
        case 0: break;
        case 1: v += a; break;
        case 2: v += b; break;
        case 3: v += (a + b) / 2; break;
        case 4: {
          const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
          v += pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
          break;
        }
        default: throw std::runtime_error(path + ": bad row filter");
      }
      row[x] = uint8_t(v);
    }
  }
  return img;
}

// Pixels that are not (nearly) white.
inline int64_t png_ink(const Image& img) {
  int64_t n = 0;
  for (size_t i = 0; i < img.pixels.size(); i += size_t(img.channels))
    if (img.pixels[i] < 240 || img.pixels[i + 1] < 240 || img.pixels[i + 2] < 240) ++n;
  return n;
}

}  // namespace weft::test
