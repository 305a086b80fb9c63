// AvailableHostMemoryBytes (host_memory_info.h).
#include "lib/base/host_memory_info.h"

#include <fstream>
#include <string>

namespace pipeoffload::internal {

std::int64_t AvailableHostMemoryBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  std::int64_t kib = 0;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib < 0 ? -1 : kib * 1024;
  }
  return -1;
}

}  // namespace pipeoffload::internal
