// Reading a whole input file with the checks every reader of user files needs: it must be a
// regular file (not /dev/zero, a FIFO or a directory, whose reads never end or block), it must
// fit a size limit named after what it holds, and a text file must hold no NUL byte (nlohmann's
// JSON parser stops at one and would ignore the rest). Every reader of a schedule, CSV, cost
// model or data file goes through ReadBoundedFile, so the checks cannot drift apart.
#ifndef PIPEOFFLOAD_LIB_BASE_BOUNDED_FILE_H_
#define PIPEOFFLOAD_LIB_BASE_BOUNDED_FILE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace pipeoffload {

// The size limits of the project's input files (docs/hardening.md lists them with the reasons).
// A schedule file at the limit already parses into a JSON tree of several GiB, so a larger one
// would run the host out of memory before it could be refused.
inline constexpr std::int64_t kMaxScheduleFileBytes = std::int64_t{256} << 20;  // JSON or CSV
// A cost model holds at most p * v = 4M per-virtual-stage entries of ~20 bytes each.
inline constexpr std::int64_t kMaxCostModelFileBytes = std::int64_t{128} << 20;
// Training text for the GPT example, held in memory whole.
inline constexpr std::int64_t kMaxDataFileBytes = std::int64_t{1} << 30;

struct FileLimits {
  std::string_view what;  // "schedule file", "cost model", ...: how errors name the file
  std::int64_t max_bytes = 0;
  bool text = true;  // refuse NUL bytes
};

// The whole of the regular file at `path`. Never blocks on a FIFO and never reads more than
// limits.max_bytes + 1 bytes, also from a file that grows while it is read.
// Errors: ErrnoStatus ("cannot open '<path>': No such file or directory": NotFound,
// PermissionDenied, ...) for open, stat and read failures; InvalidArgument "'<path>' is not a
// regular file (a FIFO); a <what> must be one", "'<path>' has more than <max> bytes, the limit
// for a <what>" and "'<path>' holds a NUL byte at offset <k>; a <what> is text".
[[nodiscard]] absl::StatusOr<std::string> ReadBoundedFile(const std::string& path,
                                                          const FileLimits& limits);

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_LIB_BASE_BOUNDED_FILE_H_
