// The C ABI's error boundary: the thread-local last-error message, status names, the library's
// version, and po_free. Every exported function reports through Record (c_api_internal.h).
#include <cstdlib>
#include <string>

#include "lib/c_api/c_api_internal.h"

#ifndef PO_VERSION_STRING
#error "PO_VERSION_STRING must be defined by the build (the project's version)"
#endif

namespace pipeoffload::c_api {
namespace {

// po_status reuses absl's numbers (c_api.h), so Record needs no table.
static_assert(PO_ERROR_UNKNOWN == static_cast<int>(absl::StatusCode::kUnknown));
static_assert(PO_ERROR_INVALID_ARGUMENT == static_cast<int>(absl::StatusCode::kInvalidArgument));
static_assert(PO_ERROR_NOT_FOUND == static_cast<int>(absl::StatusCode::kNotFound));
static_assert(PO_ERROR_PERMISSION_DENIED ==
              static_cast<int>(absl::StatusCode::kPermissionDenied));
static_assert(PO_ERROR_RESOURCE_EXHAUSTED ==
              static_cast<int>(absl::StatusCode::kResourceExhausted));
static_assert(PO_ERROR_FAILED_PRECONDITION ==
              static_cast<int>(absl::StatusCode::kFailedPrecondition));
static_assert(PO_ERROR_OUT_OF_RANGE == static_cast<int>(absl::StatusCode::kOutOfRange));
static_assert(PO_ERROR_UNIMPLEMENTED == static_cast<int>(absl::StatusCode::kUnimplemented));
static_assert(PO_ERROR_INTERNAL == static_cast<int>(absl::StatusCode::kInternal));

// Thread-local rather than per handle (c_api.h): a failed create has no handle to hang a
// message on, and a per-thread slot keeps threads that share a handle from reading each
// other's errors.
thread_local std::string last_error;
// Points at a fixed text when storing the real message failed (out of memory), else null.
thread_local const char* last_error_fallback = nullptr;

}  // namespace

po_status Record(const absl::Status& status) noexcept {
  last_error_fallback = nullptr;
  try {
    last_error.assign(status.message().data(), status.message().size());
  } catch (...) {
    last_error_fallback = "out of memory while storing the error message";
  }
  // absl's codes are the canonical numbers, which po_status uses as they are.
  return static_cast<po_status>(status.code());
}

absl::Status NotNull(const void* pointer, std::string_view name) {
  if (pointer != nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(std::string(name), " is NULL"));
}

absl::Status CheckIndex(std::int64_t index, std::size_t count, std::string_view what) {
  if (index >= 0 && static_cast<std::uint64_t>(index) < count) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrCat(std::string(what), " ", index,
                                            " is out of range [0, ", count, ")"));
}

absl::Status CheckStructSize(std::uint32_t struct_size, std::size_t first_size,
                             std::size_t known_size, std::string_view name) {
  if (struct_size < first_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(name), ".struct_size is ", struct_size, ", below the ", first_size,
        " bytes of its first release; call ", std::string(name), "_init (or set it to sizeof)"));
  }
  if (struct_size > known_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(name), ".struct_size is ", struct_size, " but this library (",
        PO_VERSION_STRING, ") knows ", known_size,
        " bytes of it: the caller's header is newer than the library"));
  }
  return absl::OkStatus();
}

}  // namespace pipeoffload::c_api

extern "C" {

const char* po_status_name(po_status status) {
  switch (status) {
    case PO_OK: return "OK";
    case 1: return "CANCELLED";
    case PO_ERROR_UNKNOWN: return "UNKNOWN";
    case PO_ERROR_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case 4: return "DEADLINE_EXCEEDED";
    case PO_ERROR_NOT_FOUND: return "NOT_FOUND";
    case 6: return "ALREADY_EXISTS";
    case PO_ERROR_PERMISSION_DENIED: return "PERMISSION_DENIED";
    case PO_ERROR_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case PO_ERROR_FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case 10: return "ABORTED";
    case PO_ERROR_OUT_OF_RANGE: return "OUT_OF_RANGE";
    case PO_ERROR_UNIMPLEMENTED: return "UNIMPLEMENTED";
    case PO_ERROR_INTERNAL: return "INTERNAL";
    case 14: return "UNAVAILABLE";
    case 15: return "DATA_LOSS";
    case 16: return "UNAUTHENTICATED";
    default: return "UNKNOWN";
  }
}

const char* po_last_error_message(void) {
  using pipeoffload::c_api::last_error;
  using pipeoffload::c_api::last_error_fallback;
  return last_error_fallback != nullptr ? last_error_fallback : last_error.c_str();
}

const char* po_version(void) { return PO_VERSION_STRING; }

int32_t po_c_api_version(void) { return PO_C_API_VERSION; }

// Text handed out through char** comes from malloc in this library; po_free keeps callers from
// pairing it with another allocator (another libc, or Python, which cannot call free simply).
void po_free(void* text) { std::free(text); }

}  // extern "C"
