// CheckpointTier: activation checkpoints in one NvmeStore file, through a ring of pinned
// staging buffers and one thread that moves them between copy events and drive requests
// (invariants in checkpoint_tier.h).
#include "lib/slide/checkpoint_tier.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/slide/nvme_store.h"

namespace pipeoffload::internal {
namespace {

constexpr std::int64_t kAlign = NvmeStore::kAlignment;

enum class BufferState : std::uint8_t { kFree, kSaving, kWriting, kReading, kLoaded, kLoading };

}  // namespace

struct CheckpointTier::Impl {
  struct Buffer {
    std::byte* data = nullptr;
    Event event{nullptr, -1};
    BufferState state = BufferState::kFree;
    int record = -1;          // index into load_order of what it holds or moves
    std::int64_t ticket = 0;  // the drive request in flight (kWriting, kReading)
    double started = 0.0;     // when that request was submitted (trace)
  };
  // What the tier thread waits for next: buffer `buffer`'s copy event (kSaving, kLoading) or
  // drive request (kWriting, kReading).
  struct Job {
    int buffer = -1;
  };

  Backend* backend = nullptr;
  SlideRecorder* recorder = nullptr;
  CheckpointTierOptions options;
  std::int64_t record_bytes = 0;  // a checkpoint rounded up to kAlign: one file record
  std::unique_ptr<NvmeStore> store;
  void* staging = nullptr;
  std::int64_t staging_bytes = 0;
  std::map<std::pair<int, int>, int> record_of;  // (unit, mb) -> record

  std::mutex mu;
  std::condition_variable cv;
  std::vector<Buffer> buffers;
  std::vector<bool> written;  // per record: its last write of the round finished
  std::deque<Job> jobs;
  int saves = 0;      // saves handed over this round
  int next_read = 0;  // records read (or reading) this round, in load order
  int loads = 0;      // records lent for their H2D this round
  std::int64_t bytes = 0;
  absl::Status error;
  bool stop = false;
  std::thread thread;

  int total() const { return static_cast<int>(options.load_order.size()); }

  std::string RecordName(int record) const {
    const auto [unit, mb] = options.load_order[static_cast<std::size_t>(record)];
    const std::string name = unit >= 0 && unit < static_cast<int>(options.unit_names.size())
                                 ? options.unit_names[static_cast<std::size_t>(unit)]
                                 : absl::StrCat("unit ", unit);
    return absl::StrCat(name, " mb", mb);
  }

  // Until `ready` (under `lock`), the sticky error, or the deadline.
  absl::Status WaitFor(std::unique_lock<std::mutex>& lock, const std::function<bool()>& ready,
                       const std::string& what) {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration<double>(options.timeout_seconds);
    while (error.ok() && !ready()) {
      if (cv.wait_until(lock, deadline) == std::cv_status::timeout && error.ok() && !ready()) {
        return absl::DeadlineExceededError(absl::StrCat(
            "layer sliding: waited ", options.timeout_seconds, " s for ", what,
            " (NVMe checkpoint tier: ", jobs.size(), " copies or drive requests pending)"));
      }
    }
    return error;
  }

  // Reads the next records in load order into free buffers, while the round's saves are all
  // handed over and the next record's write has finished. Under mu.
  absl::Status StartReads() {
    while (saves == total() && next_read < total() && written[static_cast<std::size_t>(next_read)]) {
      Buffer* free = nullptr;
      for (Buffer& b : buffers) {
        if (b.state == BufferState::kFree) {
          free = &b;
          break;
        }
      }
      if (free == nullptr) return absl::OkStatus();
      PO_ASSIGN_OR_RETURN(free->ticket,
                          store->SubmitRead(next_read * record_bytes, free->data, record_bytes));
      free->state = BufferState::kReading;
      free->record = next_read;
      free->started = backend->NowSeconds();
      jobs.push_back({static_cast<int>(free - buffers.data())});
      ++next_read;
    }
    return absl::OkStatus();
  }

  void Trace(const Buffer& b, bool write) {
    SlideRecord record;
    record.engine = SlideEngineKind::kNvme;
    record.name = absl::StrCat(write ? "write checkpoint " : "read checkpoint ", RecordName(b.record));
    record.unit = options.load_order[static_cast<std::size_t>(b.record)].first;
    record.mb = options.load_order[static_cast<std::size_t>(b.record)].second;
    record.start = b.started;
    record.end = backend->NowSeconds();
    record.bytes = record_bytes;
    recorder->AddHost(std::move(record));
  }

  // Waits for job's event or request (without mu), then moves its buffer on (with mu).
  absl::Status Process(std::unique_lock<std::mutex>& lock, const Job& job) {
    Buffer& b = buffers[static_cast<std::size_t>(job.buffer)];
    const BufferState state = b.state;
    lock.unlock();
    absl::Status waited = state == BufferState::kSaving || state == BufferState::kLoading
                              ? backend->WaitEvent(b.event, options.timeout_seconds)
                              : store->Wait(b.ticket);
    lock.lock();
    if (!waited.ok()) {
      return Annotate(waited, absl::StrCat(state == BufferState::kSaving   ? "the D2H of checkpoint "
                                           : state == BufferState::kLoading ? "the H2D of checkpoint "
                                           : state == BufferState::kWriting ? "the drive write of checkpoint "
                                                                            : "the drive read of checkpoint ",
                                           RecordName(b.record)));
    }
    switch (state) {
      case BufferState::kSaving: {
        PO_ASSIGN_OR_RETURN(b.ticket, store->SubmitWrite(b.record * record_bytes, b.data, record_bytes));
        b.state = BufferState::kWriting;
        b.started = backend->NowSeconds();
        jobs.push_back(job);
        break;
      }
      case BufferState::kWriting:
        Trace(b, /*write=*/true);
        bytes += record_bytes;
        written[static_cast<std::size_t>(b.record)] = true;
        b.state = BufferState::kFree;
        break;
      case BufferState::kReading:
        Trace(b, /*write=*/false);
        bytes += record_bytes;
        b.state = BufferState::kLoaded;
        break;
      case BufferState::kLoading:
        b.state = BufferState::kFree;
        break;
      case BufferState::kFree:
      case BufferState::kLoaded:
        return absl::InternalError("NVMe checkpoint tier: a job for an idle buffer");
    }
    return StartReads();
  }

  void Run() {
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      cv.wait(lock, [&] { return stop || !jobs.empty(); });
      if (stop) return;
      const Job job = jobs.front();
      jobs.pop_front();
      const absl::Status status = Process(lock, job);
      if (!status.ok()) {
        error = Annotate(status, "layer sliding: the NVMe checkpoint tier");
        cv.notify_all();
        return;
      }
      cv.notify_all();
    }
  }
};

absl::StatusOr<std::unique_ptr<CheckpointTier>> CheckpointTier::Create(
    Backend& backend, const CheckpointTierOptions& options, SlideRecorder& recorder,
    const IoBackendStarter* start) {
  if (options.checkpoint_bytes <= 0 || options.load_order.empty() || options.staging_buffers < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NVMe checkpoint tier: needs checkpoint_bytes > 0 (is ", options.checkpoint_bytes,
        "), checkpoints (", options.load_order.size(), ") and staging buffers >= 1 (",
        options.staging_buffers, ")"));
  }
  std::unique_ptr<CheckpointTier> tier(new CheckpointTier());
  tier->impl_ = std::make_unique<Impl>();
  Impl& impl = *tier->impl_;
  impl.backend = &backend;
  impl.recorder = &recorder;
  impl.options = options;
  impl.record_bytes = (options.checkpoint_bytes + kAlign - 1) / kAlign * kAlign;
  for (int r = 0; r < impl.total(); ++r) {
    if (!impl.record_of.emplace(options.load_order[static_cast<std::size_t>(r)], r).second) {
      return absl::InvalidArgumentError(absl::StrCat("NVMe checkpoint tier: ", impl.RecordName(r),
                                                     " is loaded twice"));
    }
  }
  impl.written.assign(static_cast<std::size_t>(impl.total()), false);

  NvmeStoreOptions store_options;
  store_options.dir = options.dir;
  store_options.capacity_bytes = impl.total() * impl.record_bytes;
  store_options.timeout_seconds = options.timeout_seconds;
  absl::StatusOr<std::unique_ptr<NvmeStore>> store =
      start != nullptr ? CreateNvmeStoreWithBackend(store_options, *start)
                       : NvmeStore::Create(store_options);
  if (!store.ok()) {
    return Annotate(store.status(), "layer sliding: the NVMe checkpoint tier (--nvme-dir)");
  }
  impl.store = std::move(*store);
  // One allocation, one spare page to align every buffer for O_DIRECT.
  impl.staging_bytes = options.staging_buffers * impl.record_bytes + kAlign;
  absl::StatusOr<void*> staging = backend.AllocateHost(impl.staging_bytes);
  if (!staging.ok()) {
    return Annotate(staging.status(), absl::StrCat("layer sliding: ", impl.staging_bytes,
                                                   " bytes of pinned checkpoint staging"));
  }
  impl.staging = *staging;
  auto* base = reinterpret_cast<std::byte*>(
      (reinterpret_cast<std::uintptr_t>(impl.staging) + kAlign - 1) / kAlign * kAlign);
  impl.buffers.resize(static_cast<std::size_t>(options.staging_buffers));
  for (std::size_t b = 0; b < impl.buffers.size(); ++b) {
    impl.buffers[b].data = base + static_cast<std::int64_t>(b) * impl.record_bytes;
    PO_ASSIGN_OR_RETURN(impl.buffers[b].event, backend.CreateEvent());
  }
  PO_RETURN_IF_ERROR(impl.store->RegisterBuffers({std::span<std::byte>(
      base, static_cast<std::size_t>(options.staging_buffers * impl.record_bytes))}));
  impl.thread = std::thread([&impl] { impl.Run(); });
  return tier;
}

CheckpointTier::~CheckpointTier() {
  if (impl_ == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->store.reset();  // waits for the pieces in flight into the ring
  for (const Impl::Buffer& b : impl_->buffers) {
    if (b.event.id() >= 0) impl_->backend->DestroyEvent(b.event);
  }
  if (impl_->staging != nullptr) impl_->backend->FreeHost(impl_->staging);
}

absl::StatusOr<CheckpointTier::Lent> CheckpointTier::AcquireForSave(int unit, int mb) {
  Impl& impl = *impl_;
  std::unique_lock<std::mutex> lock(impl.mu);
  PO_RETURN_IF_ERROR(impl.error);
  const auto it = impl.record_of.find({unit, mb});
  if (it == impl.record_of.end() || impl.saves == impl.total() || impl.loads > 0) {
    return absl::InternalError(absl::StrCat(
        "NVMe checkpoint tier: a save of unit ", unit, " mb ", mb, " out of protocol (",
        it == impl.record_of.end() ? "not on the drive" : "the round's saves are done",
        ")"));
  }
  int free = -1;
  PO_RETURN_IF_ERROR(impl.WaitFor(
      lock,
      [&] {
        for (std::size_t b = 0; b < impl.buffers.size(); ++b) {
          if (impl.buffers[b].state == BufferState::kFree) {
            free = static_cast<int>(b);
            return true;
          }
        }
        return false;
      },
      absl::StrCat("a free checkpoint staging buffer (to save ", impl.RecordName(it->second), ")")));
  Impl::Buffer& b = impl.buffers[static_cast<std::size_t>(free)];
  b.state = BufferState::kSaving;
  b.record = it->second;
  impl.written[static_cast<std::size_t>(it->second)] = false;
  return Lent{free, b.data, b.event};
}

absl::Status CheckpointTier::SaveEnqueued(int buffer) {
  Impl& impl = *impl_;
  {
    std::lock_guard<std::mutex> lock(impl.mu);
    PO_RETURN_IF_ERROR(impl.error);
    ++impl.saves;
    impl.jobs.push_back({buffer});
  }
  impl.cv.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<CheckpointTier::Lent> CheckpointTier::AcquireLoaded(int unit, int mb) {
  Impl& impl = *impl_;
  std::unique_lock<std::mutex> lock(impl.mu);
  PO_RETURN_IF_ERROR(impl.error);
  const auto it = impl.record_of.find({unit, mb});
  if (it == impl.record_of.end() || it->second != impl.loads || impl.saves != impl.total()) {
    return absl::InternalError(absl::StrCat(
        "NVMe checkpoint tier: a load of unit ", unit, " mb ", mb, " out of protocol (",
        impl.saves != impl.total() ? "saves of the round missing" : "not the next in load order",
        ")"));
  }
  const int record = it->second;
  int loaded = -1;
  PO_RETURN_IF_ERROR(impl.WaitFor(
      lock,
      [&] {
        for (std::size_t b = 0; b < impl.buffers.size(); ++b) {
          if (impl.buffers[b].state == BufferState::kLoaded && impl.buffers[b].record == record) {
            loaded = static_cast<int>(b);
            return true;
          }
        }
        return false;
      },
      absl::StrCat("the drive read of checkpoint ", impl.RecordName(record))));
  Impl::Buffer& b = impl.buffers[static_cast<std::size_t>(loaded)];
  b.state = BufferState::kLoading;
  if (++impl.loads == impl.total()) {  // the round is over: the next step saves again
    impl.saves = impl.next_read = impl.loads = 0;
  }
  return Lent{loaded, b.data, b.event};
}

absl::Status CheckpointTier::LoadEnqueued(int buffer) {
  Impl& impl = *impl_;
  {
    std::lock_guard<std::mutex> lock(impl.mu);
    PO_RETURN_IF_ERROR(impl.error);
    impl.jobs.push_back({buffer});
  }
  impl.cv.notify_all();
  return absl::OkStatus();
}

std::int64_t CheckpointTier::TakeBytes() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const std::int64_t bytes = impl_->bytes;
  impl_->bytes = 0;
  return bytes;
}

std::int64_t CheckpointTier::staging_bytes() const { return impl_->staging_bytes; }
std::string CheckpointTier::Describe() const { return impl_->store->Describe(); }

}  // namespace pipeoffload::internal
