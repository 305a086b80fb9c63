// The C ABI's private side: what the opaque handles hold, the one boundary every exported
// function goes through (absl::Status and C++ exceptions -> po_status + thread-local message),
// and the versioned-struct rules of c_api.h. Nothing here is exported from libpipeoffload_c.
#ifndef PIPEOFFLOAD_LIB_C_API_C_API_INTERNAL_H_
#define PIPEOFFLOAD_LIB_C_API_C_API_INTERNAL_H_

#include <cstddef>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "pipeoffload/c_api.h"
#include "pipeoffload/cost_model.h"
#include "pipeoffload/schedule.h"

// Immutable after creation (c_api.h: any number of threads may read one handle).
struct po_schedule {
  pipeoffload::Schedule schedule;  // passes Validate
  // The model the schedule was compiled or loaded with: what po_schedule_simulate(NULL) and the
  // trace format time it with.
  pipeoffload::CostModel cost;
  bool unit_costs = false;  // the trace's time scale: 1 unit = 1 ms, else seconds
};

struct po_predictions {
  pipeoffload::Predictions predictions;
};

namespace pipeoffload::c_api {

// Stores `status`'s message as this thread's last error ("" when OK) and returns its code.
// Never throws: when even the message cannot be stored, a fixed one stands in.
po_status Record(const absl::Status& status) noexcept;

// Runs `body` (returning absl::Status) and Records its result, prefixing errors with
// `function` so every message names the call that failed. Any C++ exception (bad_alloc from a
// huge spec, anything else from a bug) becomes a status here instead of crossing into C.
template <typename Body>
po_status Boundary(const char* function, Body&& body) noexcept {
  try {
    const absl::Status status = body();
    if (status.ok()) return Record(status);
    return Record(absl::Status(status.code(),
                               absl::StrCat(function, ": ", std::string(status.message()))));
  } catch (const std::bad_alloc&) {
    return Record(absl::ResourceExhaustedError(absl::StrCat(function, ": out of memory")));
  } catch (const std::exception& e) {
    return Record(absl::InternalError(
        absl::StrCat(function, ": unexpected C++ exception (a bug): ", e.what())));
  } catch (...) {
    return Record(
        absl::InternalError(absl::StrCat(function, ": unexpected C++ exception (a bug)")));
  }
}

// InvalidArgument "<name> is NULL" unless `pointer` is set.
[[nodiscard]] absl::Status NotNull(const void* pointer, std::string_view name);

// OutOfRange "<what> <index> is out of range [0, <count>)" unless index is in range.
[[nodiscard]] absl::Status CheckIndex(std::int64_t index, std::size_t count, std::string_view what);

// For functions that create a handle: checks `out` and sets *out to NULL first, so a failed
// call leaves NULL behind (c_api.h).
template <typename Handle>
[[nodiscard]] absl::Status ClearOut(Handle** out) {
  if (out == nullptr) return NotNull(out, "out");
  *out = nullptr;
  return absl::OkStatus();
}

// --- versioned structs (c_api.h, "ABI rules") --------------------------------------------------

// Checks a struct_size against [the first release's size, the size this library knows].
[[nodiscard]] absl::Status CheckStructSize(std::uint32_t struct_size, std::size_t first_size,
                                           std::size_t known_size, std::string_view name);

// Sizes of each struct in its first release: fields after these bytes came later and keep their
// defaults for older callers. (They stay fixed when fields are added: po_spec has grown.)
inline constexpr std::size_t kSpecSizeV1 = 64;
inline constexpr std::size_t kCostOptionsSizeV1 = 48;
inline constexpr std::size_t kLoadOptionsSizeV1 = 24;
inline constexpr std::size_t kSummarySizeV1 = 48;
inline constexpr std::size_t kStagePredictionSizeV1 = 72;
inline constexpr std::size_t kLinkTrafficSizeV1 = 32;

// `in`'s first struct_size bytes over `defaults` (NULL `in` = the defaults).
template <typename T>
[[nodiscard]] absl::StatusOr<T> ReadVersioned(const T* in, const T& defaults,
                                              std::size_t first_size, std::string_view name) {
  T out = defaults;
  if (in == nullptr) return out;
  const absl::Status size_ok = CheckStructSize(in->struct_size, first_size, sizeof(T), name);
  if (!size_ok.ok()) return size_ok;
  std::memcpy(&out, in, in->struct_size);
  return out;
}

// Writes `value`'s fields into the first out->struct_size bytes of `out`, keeping the caller's
// struct_size (a result struct: the caller says how much of it it knows).
template <typename T>
[[nodiscard]] absl::Status WriteVersioned(const T& value, T* out, std::size_t first_size,
                                          std::string_view name) {
  if (out == nullptr) return NotNull(out, "out");
  const std::uint32_t struct_size = out->struct_size;
  if (absl::Status ok = CheckStructSize(struct_size, first_size, sizeof(T), name); !ok.ok()) {
    return ok;
  }
  std::memcpy(out, &value, struct_size);
  out->struct_size = struct_size;
  return absl::OkStatus();
}

// --- conversions (options.cc) -----------------------------------------------------------------

// The PipelineSpec a po_spec names (NULL = po_spec_init's defaults). Checks the names and the
// struct; the ranges are the compiler's to check (ResolveSpec).
[[nodiscard]] absl::StatusOr<PipelineSpec> ToPipelineSpec(const po_spec* spec);
// The family / policy a C string names (NULL = "1f1b" / "none"); InvalidArgument naming
// `field` ("po_spec.family") and the accepted names otherwise.
[[nodiscard]] absl::StatusOr<Family> FamilyNamed(const char* name, std::string_view field);
[[nodiscard]] absl::StatusOr<OffloadPolicy> OffloadPolicyNamed(const char* name,
                                                               std::string_view field);
// The po_spec of a PipelineSpec; its strings are static.
po_spec FromPipelineSpec(const PipelineSpec& spec);

// The cost model po-schedule would build from the same choices (NULL = the defaults).
struct CostChoice {
  CostModel cost;
  bool unit_costs = false;
};
[[nodiscard]] absl::StatusOr<CostChoice> ToCostModel(const po_cost_options* options);

// --- files (file_io.cc) -----------------------------------------------------------------------

// The whole file at `path`. Errors: ErrnoStatus naming the path (NotFound, PermissionDenied...).
[[nodiscard]] absl::StatusOr<std::string> ReadWholeFile(const std::string& path);
// Creates or truncates `path` and writes `text`, reporting a failed write or close.
[[nodiscard]] absl::Status WriteWholeFile(const std::string& path, std::string_view text);

// --- formats (export.cc) ----------------------------------------------------------------------

// The schedule as po_schedule_format renders it.
[[nodiscard]] absl::StatusOr<std::string> Render(const po_schedule& schedule, std::int32_t format);

}  // namespace pipeoffload::c_api

#endif  // PIPEOFFLOAD_LIB_C_API_C_API_INTERNAL_H_
