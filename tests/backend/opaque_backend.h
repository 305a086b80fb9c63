// A test Backend that forwards to a CPU backend but says its device memory is not
// host-accessible (as the CUDA backend's is not), so the runtime takes its device paths (no host
// access, a transport that moves device memory, compute ordered before RECVs) while the memory
// stays host memory a test can check. It counts event recordings, in all and on compute queues,
// so a test can tell how often a caller ordered work through it.
#ifndef PIPEOFFLOAD_TESTS_BACKEND_OPAQUE_BACKEND_H_
#define PIPEOFFLOAD_TESTS_BACKEND_OPAQUE_BACKEND_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "pipeoffload/backend.h"

namespace pipeoffload::testing {

class OpaqueBackend final : public Backend {
 public:
  explicit OpaqueBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::string Name() const override { return "opaque-cpu"; }
  bool DeviceMemoryIsHostAccessible() const override { return false; }
  absl::StatusOr<void*> AllocateDevice(std::int64_t b) override {
    return inner_->AllocateDevice(b);
  }
  void FreeDevice(void* p) override { inner_->FreeDevice(p); }
  absl::StatusOr<void*> AllocateHost(std::int64_t b) override { return inner_->AllocateHost(b); }
  void FreeHost(void* p) override { inner_->FreeHost(p); }
  absl::Status CopyAsync(Queue q, void* d, const void* s, std::int64_t b) override {
    return inner_->CopyAsync(Inner(q), d, s, b);
  }
  absl::Status FillAsync(Queue q, void* d, std::uint32_t p, std::int64_t b) override {
    return inner_->FillAsync(Inner(q), d, p, b);
  }
  absl::StatusOr<Event> CreateEvent() override {
    absl::StatusOr<Event> e = inner_->CreateEvent();
    if (!e.ok()) return e;
    return Event(this, e->id());
  }
  void DestroyEvent(Event e) override { inner_->DestroyEvent(Inner(e)); }
  absl::Status RecordEvent(Event e, Queue q) override {
    ++records_;
    if (q.kind() == QueueKind::kCompute) ++compute_records_;
    return inner_->RecordEvent(Inner(e), Inner(q));
  }
  absl::Status QueueWaitEvent(Queue q, Event e) override {
    return inner_->QueueWaitEvent(Inner(q), Inner(e));
  }
  absl::StatusOr<bool> QueryEvent(Event e) override { return inner_->QueryEvent(Inner(e)); }
  absl::Status WaitEvent(Event e, double t) override { return inner_->WaitEvent(Inner(e), t); }
  absl::StatusOr<double> EventTime(Event e) override { return inner_->EventTime(Inner(e)); }
  absl::Status Synchronize(double t) override { return inner_->Synchronize(t); }
  double NowSeconds() const override { return inner_->NowSeconds(); }
  BackendStats Stats() const override { return inner_->Stats(); }
  int records() const { return records_.load(); }
  int compute_records() const { return compute_records_.load(); }

 private:
  Queue Inner(Queue q) const { return inner_->queue(q.kind()); }
  Event Inner(Event e) const { return Event(inner_.get(), e.id()); }
  std::unique_ptr<Backend> inner_;
  std::atomic<int> records_{0};
  std::atomic<int> compute_records_{0};
};

}  // namespace pipeoffload::testing

#endif  // PIPEOFFLOAD_TESTS_BACKEND_OPAQUE_BACKEND_H_
