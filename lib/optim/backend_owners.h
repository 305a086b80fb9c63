// Owners of Backend resources for lib/optim's users of a Backend (the engine,
// optimizer_offload.cc, and the update-rate calibration, update_calibration.cc): an array of
// host or device memory and an event, each given back to its backend with the object. The
// owner must make sure no queued work still uses the memory when it goes (drain first).
#ifndef PIPEOFFLOAD_LIB_OPTIM_BACKEND_OWNERS_H_
#define PIPEOFFLOAD_LIB_OPTIM_BACKEND_OWNERS_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/optim/offload_plan.h"
#include "pipeoffload/backend.h"

namespace pipeoffload::internal {

// `count` T of backend memory (host: AllocateHost, pinned on CUDA; else AllocateDevice), freed
// with the object; empty for count 0.
template <typename T>
class BackendArray {
 public:
  BackendArray() = default;
  BackendArray(const BackendArray&) = delete;
  BackendArray& operator=(const BackendArray&) = delete;
  ~BackendArray() {
    if (data_ == nullptr) return;
    host_ ? backend_->FreeHost(data_) : backend_->FreeDevice(data_);
  }

  // Errors: the backend's (ResourceExhausted when out of memory) behind "cannot allocate N
  // bytes (...) of host|device memory for `what`"; the caller adds who it is (Annotate).
  // REQUIRES: count * sizeof(T) fits in int64 (callers bound their counts first).
  [[nodiscard]] absl::Status Allocate(Backend& backend, bool host, std::int64_t count,
                                      const char* what) {
    if (count <= 0) return absl::OkStatus();
    const std::int64_t bytes = count * static_cast<std::int64_t>(sizeof(T));
    absl::StatusOr<void*> ptr = host ? backend.AllocateHost(bytes) : backend.AllocateDevice(bytes);
    if (!ptr.ok()) {
      return Annotate(ptr.status(), absl::StrCat("cannot allocate ", bytes, " bytes (",
                                                 FormatBytes(static_cast<double>(bytes)), ") of ",
                                                 host ? "host" : "device", " memory for ", what));
    }
    backend_ = &backend;
    host_ = host;
    data_ = static_cast<T*>(*ptr);
    count_ = count;
    return absl::OkStatus();
  }

  T* get() const { return data_; }
  std::int64_t count() const { return count_; }

 private:
  Backend* backend_ = nullptr;
  bool host_ = false;
  T* data_ = nullptr;
  std::int64_t count_ = 0;
};

// An event of the backend, destroyed with the object (the backend allows pending work).
class OwnedEvent {
 public:
  OwnedEvent() = default;
  OwnedEvent(const OwnedEvent&) = delete;
  OwnedEvent& operator=(const OwnedEvent&) = delete;
  ~OwnedEvent() {
    if (backend_ != nullptr) backend_->DestroyEvent(*event_);
  }
  [[nodiscard]] absl::Status Create(Backend& backend) {
    PO_ASSIGN_OR_RETURN(const Event event, backend.CreateEvent());
    backend_ = &backend;
    event_.emplace(event);
    return absl::OkStatus();
  }
  bool created() const { return backend_ != nullptr; }
  Event get() const { return *event_; }

 private:
  Backend* backend_ = nullptr;
  std::optional<Event> event_;
};

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_OPTIM_BACKEND_OWNERS_H_
