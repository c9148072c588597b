// CRC32C (Castagnoli polynomial 0x1EDC6F41, reflected), the checksum of every
// checkpoint file. Chosen over FNV-1a-64 because it detects every burst error
// up to 32 bits and every error of up to 5 bits in files of this size, is the
// checksum storage stacks already use (ext4, iSCSI, LevelDB, gRPC), and runs
// at several GB/s with the SSE4.2 crc32 instruction (a byte-serial FNV-1a is
// bound by one multiply latency per byte). Without SSE4.2 a slicing-by-8
// table version gives the same values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace weft::checkpoint {

// Extends a finished CRC32C value `crc` (0 for the empty input) by n bytes:
// crc32c_update(crc32c_update(0, a), b) == CRC32C of a followed by b.
uint32_t crc32c_update(uint32_t crc, const void* data, size_t n);

// The table version alone, whatever the CPU; tests check that it agrees with
// the SSE4.2 path.
uint32_t crc32c_update_portable(uint32_t crc, const void* data, size_t n);

inline uint32_t crc32c(const void* data, size_t n) { return crc32c_update(0, data, n); }

// "crc32c:" followed by 8 lower-case hex digits, the form the manifest stores.
std::string crc32c_text(uint32_t crc);

}  // namespace weft::checkpoint
