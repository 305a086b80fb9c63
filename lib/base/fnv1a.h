// FNV-1a 64 (Fowler, Noll, Vo), offset basis and prime from the published parameters: the hash
// of parameter checksums and schedule fingerprints. Header-only.
#ifndef PIPEOFFLOAD_LIB_BASE_FNV1A_H_
#define PIPEOFFLOAD_LIB_BASE_FNV1A_H_

#include <cstdint>

namespace pipeoffload::internal {

inline constexpr std::uint64_t kFnvOffsetBasis = 0xCBF29CE484222325ull;
inline constexpr std::uint64_t kFnvPrime = 0x100000001B3ull;

// Hashes `bytes` bytes at `data` onto `hash` (chain calls to hash pieces in order).
inline std::uint64_t Fnv1a64(const void* data, std::int64_t bytes,
                             std::uint64_t hash = kFnvOffsetBasis) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::int64_t i = 0; i < bytes; ++i) {
    hash ^= p[i];
    hash *= kFnvPrime;
  }
  return hash;
}

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_BASE_FNV1A_H_
