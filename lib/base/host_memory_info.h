// How much host memory this process may still take: the one reader of /proc/meminfo, for every
// check that refuses a plan before allocating it (the optimizer-offload engine's pinned state,
// layer sliding's host tiers, gpt_train's CPU model).
#ifndef PIPEOFFLOAD_LIB_BASE_HOST_MEMORY_INFO_H_
#define PIPEOFFLOAD_LIB_BASE_HOST_MEMORY_INFO_H_

#include <cstdint>

namespace pipeoffload::internal {

// MemAvailable of /proc/meminfo in bytes, or -1 when it cannot be read (then callers skip their
// check: the allocation itself will tell).
std::int64_t AvailableHostMemoryBytes();

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_BASE_HOST_MEMORY_INFO_H_
