// The optimizer-offload engine (include/pipeoffload/optimizer_offload.h), on a Backend: memory,
// queues, events and copies are the backend's; its arithmetic is OffloadDeviceOps'
// (offload_device_ops.h); no CUDA call is made here.
//
// Invariants:
//  - Everything is allocated in Create (plan first: offload_plan.h); Step, AddGradients and
//    SetGpuShare allocate nothing from the backend (allocations() counts what Create took).
//  - Queues: compute_ (sum of squares, upcasts, Adam), d2h_ (fp32 gradients of host subgroups,
//    write-back of staged state), h2d_state_ (prefetch of staged state) and upload_ (bf16 of
//    host subgroups), all made by Backend::CreateQueue. The caller's queue (the backend's
//    built-in compute queue) orders against them by events only.
//  - Gradient path: upcast chunk k in {0, 1} is reused only after chunk_free_[k] (its D2H) has
//    completed: compute_ waits for it before the next upcast into it.
//  - The norm accumulator (the last double of partials_) is read by a D2H copy on d2h_ after
//    compute_'s last sum (norm_ready_), and zeroed on compute_ only after that copy
//    (norm_copied_), which also follows every gradient D2H (d2h_ is in order).
//  - Staged subgroup j uses staging set s = j % 2: its prefetch waits written_[s] (the
//    write-back of subgroup j - 2), its kernel waits loaded_[s], its write-back waits
//    updated_[s]. So GPU optimizer state never exceeds two subgroups' worth, and EVERY staged
//    subgroup, the last one included, is written back before Step returns.
//  - Upload slot k is refilled by the CPU only after upload_done_[k] has completed (host wait).
//  - Step returns only after every lane has finished, so between steps no engine work is in
//    flight except gradient-path work from AddGradients; the destructor waits for that too
//    before the memory goes back to the backend.
#include "pipeoffload/optimizer_offload.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/optim/backend_owners.h"
#include "lib/optim/offload_device_ops.h"
#include "lib/optim/offload_plan.h"
#include "lib/optim/update_model.h"
#include "pipeoffload/adam.h"

namespace pipeoffload {
namespace {

using internal::BackendArray;
using internal::OffloadDeviceOps;
using internal::OffloadPlan;
using internal::OwnedEvent;

static_assert(internal::kPlanSumBlock == 8192, "plan and OffloadDeviceOps::PartialsFor disagree");

// Runs fn(begin, end) over [0, count) on all hardware threads (Create only: it spawns them).
template <typename Fn>
void ParallelFor(std::int64_t count, Fn fn) {
  const std::int64_t threads = std::clamp<std::int64_t>(
      std::thread::hardware_concurrency(), 1, std::max<std::int64_t>(1, count / (1 << 20)));
  std::vector<std::thread> workers;
  const std::int64_t per = (count + threads - 1) / threads;
  for (std::int64_t t = 1; t < threads; ++t) {
    const std::int64_t begin = std::min(count, t * per), end = std::min(count, begin + per);
    workers.emplace_back([=] { fn(begin, end); });
  }
  fn(0, std::min(count, per));
  for (std::thread& worker : workers) worker.join();
}

class OptimizerOffloadImpl final : public OptimizerOffload {
 public:
  OptimizerOffloadImpl(Backend& backend, const OptimizerOffloadOptions& options, OffloadPlan plan,
                       std::uint16_t* device_bf16)
      : backend_(backend),
        caller_(backend.queue(QueueKind::kCompute)),
        options_(options),
        plan_(std::move(plan)),
        places_(plan_.places),
        device_bf16_(device_bf16),
        received_(static_cast<std::size_t>(plan_.layout.num_subgroups()), 0) {}
  ~OptimizerOffloadImpl() override;

  absl::Status Init(std::span<const float> initial);

  absl::Status AddGradients(const std::uint16_t* grads, std::int64_t offset,
                            std::int64_t count) override;
  absl::Status WaitForGradients() override;
  absl::StatusOr<OptimizerStepResult> Step(float loss_scale) override;
  absl::Status SetGpuShare(double share) override;
  absl::Status SetLearningRate(float learning_rate) override;
  absl::Status ReadState(std::int64_t offset, std::int64_t count, float* param, float* exp_avg,
                         float* exp_avg_sq) override;

  const OptimizerOffloadOptions& options() const override { return options_; }
  std::int64_t num_subgroups() const override { return plan_.layout.num_subgroups(); }
  std::vector<SubgroupPlace> placement() const override { return places_; }
  OptimizerMemory memory() const override {
    return OptimizerMemory{plan_.pinned_bytes(), plan_.device_state_bytes, plan_.device_grad_bytes,
                           plan_.device_scratch_bytes};
  }
  OptimizerStepStats last_step_stats() const override { return stats_; }
  std::int64_t allocations() const override { return allocations_; }

 private:
  template <typename T>
  absl::Status Alloc(BackendArray<T>& array, bool host, std::int64_t count, const char* what) {
    PO_RETURN_IF_ERROR(
        Annotate(array.Allocate(backend_, host, count, what), "optimizer offload"));
    if (count > 0) ++allocations_;
    return absl::OkStatus();
  }
  // Device fp32 gradients of subgroup x (GPU-updated this step).
  float* DeviceGrad(std::int64_t x) const {
    const std::int64_t resident = plan_.resident_offset[static_cast<std::size_t>(x)];
    if (resident >= 0) return device_grad_.get() + resident;
    return device_grad_.get() + staged_slot_[static_cast<std::size_t>(x)] * options_.subgroup_size;
  }
  double* accumulator() const { return partials_.get() + partials_.count() - 1; }
  void AssignStagedSlots();
  absl::Status Wait(const OwnedEvent& event, const char* what) {
    return Annotate(backend_.WaitEvent(event.get(), options_.timeout_seconds),
                    absl::StrCat("optimizer offload: ", what));
  }
  // Records `event` on `queue` and makes `waiter` wait for it.
  absl::Status Order(const OwnedEvent& event, Queue queue, Queue waiter) {
    PO_RETURN_IF_ERROR(backend_.RecordEvent(event.get(), queue));
    return backend_.QueueWaitEvent(waiter, event.get());
  }
  absl::Status Copy(Queue queue, void* dst, const void* src, std::int64_t bytes) {
    return backend_.CopyAsync(queue, dst, src, bytes);
  }
  absl::Status EnqueueGpuLanes(const AdamStepScalars& scalars);
  absl::Status RunCpuLane(const AdamStepScalars& scalars);
  void ResetGradients();
  // Waits for every lane (teardown and failed Create).
  absl::Status Drain();

  Backend& backend_;
  const Queue caller_;  // the backend's built-in compute queue
  OptimizerOffloadOptions options_;  // adam.learning_rate changes with SetLearningRate
  const OffloadPlan plan_;
  std::vector<SubgroupPlace> places_;
  std::vector<std::int64_t> staged_slot_;  // per subgroup: device grad slot, or -1
  std::uint16_t* const device_bf16_;       // (num_params) bf16, the caller's
  std::unique_ptr<CpuAdam> cpu_adam_;
  std::unique_ptr<OffloadDeviceOps> ops_;
  std::int64_t allocations_ = 0;
  std::int64_t step_ = 0;
  OptimizerStepStats stats_;

  // Gradient bookkeeping of the current step: elements received per subgroup and the ranges.
  std::vector<std::int64_t> received_;
  std::map<std::int64_t, std::int64_t> ranges_;  // begin -> end, disjoint
  std::int64_t upcast_round_ = 0;                // which upcast chunk is next

  // Host memory (AllocateHost: pinned on CUDA).
  BackendArray<float> host_param_, host_m_, host_v_, host_grad_;  // (host_params)
  BackendArray<std::uint16_t> upload_slots_;                      // (kUploadSlots, subgroup) bf16
  BackendArray<double> norm_host_;                                // (1)
  // Device memory.
  BackendArray<float> resident_param_, resident_m_, resident_v_;  // (resident_params)
  BackendArray<float> stage_;        // (staging_sets, 3, subgroup): p, m, v
  BackendArray<float> device_grad_;  // resident grads, or (staged_slots, subgroup)
  BackendArray<float> upcast_;       // (2, upcast_chunk)
  BackendArray<double> partials_;    // (sum-of-squares partials + 1 accumulator)

  // The engine's lanes; valid once Init has made them (queues_made_).
  Queue compute_{nullptr, QueueKind::kCompute}, d2h_{nullptr, QueueKind::kD2H};
  Queue h2d_state_{nullptr, QueueKind::kH2D}, upload_{nullptr, QueueKind::kH2D};
  bool queues_made_ = false;
  OwnedEvent grads_ready_, grads_read_, caller_ready_, norm_ready_, norm_copied_;
  OwnedEvent upcast_done_[2], chunk_free_[2];
  OwnedEvent loaded_[2], updated_[2], written_[2];
  OwnedEvent upload_done_[internal::kUploadSlots];
  OwnedEvent compute_done_, d2h_done_, h2d_done_, uploads_done_;
};

OptimizerOffloadImpl::~OptimizerOffloadImpl() {
  if (absl::Status drained = Drain(); !drained.ok()) {
    std::fprintf(stderr, "pipeoffload: optimizer offload teardown frees memory that queued work "
                 "may use: %s\n", std::string(drained.message()).c_str());
  }
}

absl::Status OptimizerOffloadImpl::Drain() {
  if (!queues_made_) return absl::OkStatus();
  const std::pair<const OwnedEvent*, Queue> lanes[] = {
      {&compute_done_, compute_}, {&d2h_done_, d2h_}, {&h2d_done_, h2d_state_},
      {&uploads_done_, upload_}};
  for (const auto& [event, queue] : lanes) {
    PO_RETURN_IF_ERROR(backend_.RecordEvent(event->get(), queue));
  }
  for (const auto& [event, queue] : lanes) PO_RETURN_IF_ERROR(Wait(*event, "teardown"));
  return absl::OkStatus();
}

void OptimizerOffloadImpl::AssignStagedSlots() {
  staged_slot_.assign(places_.size(), -1);
  std::int64_t next = 0;
  for (std::size_t x = 0; x < places_.size(); ++x) {
    if (places_[x] == SubgroupPlace::kGpuStaged) staged_slot_[x] = next++;
  }
}

absl::Status OptimizerOffloadImpl::Init(std::span<const float> initial) {
  PO_ASSIGN_OR_RETURN(cpu_adam_, CpuAdam::Create(options_.cpu));
  PO_ASSIGN_OR_RETURN(ops_, internal::CreateOffloadDeviceOps(backend_, options_.cpu));
  const std::int64_t s = std::min(options_.subgroup_size, options_.num_params);
  constexpr bool kHost = true, kDevice = false;
  PO_RETURN_IF_ERROR(Alloc(host_param_, kHost, plan_.host_params, "fp32 master parameters"));
  PO_RETURN_IF_ERROR(Alloc(host_m_, kHost, plan_.host_params, "Adam m"));
  PO_RETURN_IF_ERROR(Alloc(host_v_, kHost, plan_.host_params, "Adam v"));
  PO_RETURN_IF_ERROR(Alloc(host_grad_, kHost, plan_.host_params, "fp32 gradients"));
  PO_RETURN_IF_ERROR(
      Alloc(upload_slots_, kHost, plan_.pinned_upload_bytes / 2, "bf16 upload slots"));
  PO_RETURN_IF_ERROR(Alloc(norm_host_, kHost, 1, "the gradient norm"));
  PO_RETURN_IF_ERROR(
      Alloc(resident_param_, kDevice, plan_.resident_params, "resident parameters"));
  PO_RETURN_IF_ERROR(Alloc(resident_m_, kDevice, plan_.resident_params, "resident Adam m"));
  PO_RETURN_IF_ERROR(Alloc(resident_v_, kDevice, plan_.resident_params, "resident Adam v"));
  PO_RETURN_IF_ERROR(Alloc(stage_, kDevice, plan_.staging_sets * 3 * s, "staging sets"));
  PO_RETURN_IF_ERROR(
      Alloc(device_grad_, kDevice, plan_.device_grad_bytes / 4, "device fp32 gradients"));
  PO_RETURN_IF_ERROR(Alloc(upcast_, kDevice, 2 * plan_.upcast_chunk, "gradient upcast staging"));
  // The partials of one AddGradients range (at most num_params) and the accumulator last.
  PO_RETURN_IF_ERROR(Alloc(partials_, kDevice,
                           OffloadDeviceOps::PartialsFor(options_.num_params) + 1,
                           "sum-of-squares scratch"));
  for (OwnedEvent* event :
       {&grads_ready_, &grads_read_, &caller_ready_, &norm_ready_, &norm_copied_, &upcast_done_[0],
        &upcast_done_[1], &chunk_free_[0], &chunk_free_[1], &loaded_[0], &loaded_[1],
        &updated_[0], &updated_[1], &written_[0], &written_[1], &compute_done_, &d2h_done_,
        &h2d_done_, &uploads_done_}) {
    PO_RETURN_IF_ERROR(event->Create(backend_));
  }
  for (OwnedEvent& event : upload_done_) PO_RETURN_IF_ERROR(event.Create(backend_));
  PO_ASSIGN_OR_RETURN(compute_, backend_.CreateQueue(QueueKind::kCompute));
  PO_ASSIGN_OR_RETURN(d2h_, backend_.CreateQueue(QueueKind::kD2H));
  PO_ASSIGN_OR_RETURN(h2d_state_, backend_.CreateQueue(QueueKind::kH2D));
  PO_ASSIGN_OR_RETURN(upload_, backend_.CreateQueue(QueueKind::kH2D));
  queues_made_ = true;
  AssignStagedSlots();

  // State: host masters from `initial`, m = v = 0; resident state copied up.
  if (plan_.host_params > 0) {
    // Host subgroups are one contiguous run of parameters (offload_plan.cc): all of them, or
    // the first ones in kStatic.
    const float* src = initial.data();
    ParallelFor(plan_.host_params, [&](std::int64_t begin, std::int64_t end) {
      const auto bytes = static_cast<std::size_t>(end - begin) * sizeof(float);
      std::memcpy(host_param_.get() + begin, src + begin, bytes);
      std::memset(host_m_.get() + begin, 0, bytes);
      std::memset(host_v_.get() + begin, 0, bytes);
      std::memset(host_grad_.get() + begin, 0, bytes);
    });
  }
  if (plan_.resident_params > 0) {
    const std::int64_t first = plan_.layout.num_params - plan_.resident_params;
    const std::int64_t bytes = plan_.resident_params * 4;
    // From the caller's (pageable) array, waited for below before Create returns.
    PO_RETURN_IF_ERROR(Copy(h2d_state_, resident_param_.get(), initial.data() + first, bytes));
    PO_RETURN_IF_ERROR(backend_.FillAsync(compute_, resident_m_.get(), 0u, bytes));
    PO_RETURN_IF_ERROR(backend_.FillAsync(compute_, resident_v_.get(), 0u, bytes));
  }
  PO_RETURN_IF_ERROR(backend_.FillAsync(compute_, partials_.get(), 0u, partials_.count() * 8));
  PO_RETURN_IF_ERROR(backend_.RecordEvent(h2d_done_.get(), h2d_state_));
  PO_RETURN_IF_ERROR(backend_.RecordEvent(compute_done_.get(), compute_));
  PO_RETURN_IF_ERROR(Wait(h2d_done_, "initial state upload"));
  PO_RETURN_IF_ERROR(Wait(compute_done_, "initial state zeroing"));

  // The bf16 parameters: FloatToBf16Bits of the masters, converted on the host into the first
  // upload slot (kGpu has no host slots: a pageable buffer, each copy waited for before the
  // buffer is refilled) and copied up one subgroup at a time.
  std::vector<std::uint16_t> pageable;
  std::uint16_t* staging = upload_slots_.get();
  if (staging == nullptr) {
    pageable.resize(static_cast<std::size_t>(s));
    staging = pageable.data();
  }
  for (std::int64_t x = 0; x < plan_.layout.num_subgroups(); ++x) {
    const std::int64_t begin = plan_.layout.offset(x), size = plan_.layout.size(x);
    PO_RETURN_IF_ERROR(Wait(uploads_done_, "initial bf16 upload"));
    ParallelFor(size, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) staging[i] = FloatToBf16Bits(initial[begin + i]);
    });
    PO_RETURN_IF_ERROR(Copy(upload_, device_bf16_ + begin, staging, size * 2));
    PO_RETURN_IF_ERROR(backend_.RecordEvent(uploads_done_.get(), upload_));
  }
  return Wait(uploads_done_, "initial bf16 upload");
}

absl::Status OptimizerOffloadImpl::AddGradients(const std::uint16_t* grads, std::int64_t offset,
                                                std::int64_t count) {
  const std::int64_t n = options_.num_params;
  if (grads == nullptr) {
    return absl::InvalidArgumentError("optimizer offload: AddGradients with null gradients");
  }
  if (count <= 0 || offset < 0 || offset > n - count) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer offload: AddGradients range [",
                                                   offset, ", ", offset + count,
                                                   ") is empty or outside the ", n, " parameters"));
  }
  // Overlap with a range already given this step: the neighbours in the sorted map.
  auto after = ranges_.lower_bound(offset);
  if ((after != ranges_.end() && after->first < offset + count) ||
      (after != ranges_.begin() && std::prev(after)->second > offset)) {
    const auto& other =
        (after != ranges_.end() && after->first < offset + count) ? *after : *std::prev(after);
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer offload: gradients [", offset, ", ", offset + count, ") overlap gradients [",
        other.first, ", ", other.second, ") already given this step"));
  }
  // The gradients were produced on the caller's queue.
  PO_RETURN_IF_ERROR(Order(grads_ready_, caller_, compute_));
  PO_RETURN_IF_ERROR(
      ops_->AccumulateSumOfSquaresBf16(compute_, grads, count, partials_.get(), accumulator()));
  const std::int64_t s = options_.subgroup_size;
  for (std::int64_t begin = offset; begin < offset + count;) {
    const std::int64_t x = begin / s;
    const std::int64_t end =
        std::min(offset + count, plan_.layout.offset(x) + plan_.layout.size(x));
    const std::uint16_t* src = grads + (begin - offset);
    const std::int64_t within = begin - plan_.layout.offset(x);
    if (places_[static_cast<std::size_t>(x)] != SubgroupPlace::kCpu) {
      PO_RETURN_IF_ERROR(ops_->Bf16ToFp32(compute_, src, DeviceGrad(x) + within, end - begin));
    } else {
      float* dst = host_grad_.get() + plan_.host_offset[static_cast<std::size_t>(x)] + within;
      for (std::int64_t done = 0; done < end - begin; done += plan_.upcast_chunk) {
        const std::int64_t len = std::min(plan_.upcast_chunk, end - begin - done);
        const int k = static_cast<int>(upcast_round_++ % 2);
        float* chunk = upcast_.get() + k * plan_.upcast_chunk;
        PO_RETURN_IF_ERROR(backend_.QueueWaitEvent(compute_, chunk_free_[k].get()));
        PO_RETURN_IF_ERROR(ops_->Bf16ToFp32(compute_, src + done, chunk, len));
        PO_RETURN_IF_ERROR(Order(upcast_done_[k], compute_, d2h_));
        PO_RETURN_IF_ERROR(Copy(d2h_, dst + done, chunk, len * 4));
        PO_RETURN_IF_ERROR(backend_.RecordEvent(chunk_free_[k].get(), d2h_));
      }
    }
    received_[static_cast<std::size_t>(x)] += end - begin;
    begin = end;
  }
  // The caller may reuse `grads` once compute_ has read them (the D2H reads only our chunks).
  PO_RETURN_IF_ERROR(Order(grads_read_, compute_, caller_));
  ranges_.emplace(offset, offset + count);
  return absl::OkStatus();
}

absl::Status OptimizerOffloadImpl::WaitForGradients() {
  PO_RETURN_IF_ERROR(backend_.RecordEvent(compute_done_.get(), compute_));
  PO_RETURN_IF_ERROR(backend_.RecordEvent(d2h_done_.get(), d2h_));
  PO_RETURN_IF_ERROR(Wait(compute_done_, "gradient upcast"));
  return Wait(d2h_done_, "gradient D2H");
}

void OptimizerOffloadImpl::ResetGradients() {
  std::fill(received_.begin(), received_.end(), 0);
  ranges_.clear();
}

absl::Status OptimizerOffloadImpl::EnqueueGpuLanes(const AdamStepScalars& scalars) {
  const std::int64_t s = std::min(options_.subgroup_size, options_.num_params);
  std::int64_t j = 0;
  for (std::int64_t x = 0; x < num_subgroups(); ++x) {
    const SubgroupPlace place = places_[static_cast<std::size_t>(x)];
    const std::int64_t offset = plan_.layout.offset(x), size = plan_.layout.size(x);
    if (place == SubgroupPlace::kGpuResident) {
      const std::int64_t r = plan_.resident_offset[static_cast<std::size_t>(x)];
      PO_RETURN_IF_ERROR(ops_->Adam(
          compute_, scalars,
          AdamSpan{resident_param_.get() + r, resident_m_.get() + r, resident_v_.get() + r,
                   DeviceGrad(x), device_bf16_ + offset, size}));
      continue;
    }
    if (place != SubgroupPlace::kGpuStaged) continue;
    const int set = static_cast<int>(j++ % 2);
    float* stage[3] = {stage_.get() + (3 * set) * s, stage_.get() + (3 * set + 1) * s,
                       stage_.get() + (3 * set + 2) * s};
    const std::int64_t h = plan_.host_offset[static_cast<std::size_t>(x)];
    float* home[3] = {host_param_.get() + h, host_m_.get() + h, host_v_.get() + h};
    const std::int64_t bytes = size * 4;
    PO_RETURN_IF_ERROR(backend_.QueueWaitEvent(h2d_state_, written_[set].get()));
    for (int a = 0; a < 3; ++a) PO_RETURN_IF_ERROR(Copy(h2d_state_, stage[a], home[a], bytes));
    PO_RETURN_IF_ERROR(Order(loaded_[set], h2d_state_, compute_));
    PO_RETURN_IF_ERROR(ops_->Adam(
        compute_, scalars,
        AdamSpan{stage[0], stage[1], stage[2], DeviceGrad(x), device_bf16_ + offset, size}));
    PO_RETURN_IF_ERROR(Order(updated_[set], compute_, d2h_));
    for (int a = 0; a < 3; ++a) PO_RETURN_IF_ERROR(Copy(d2h_, home[a], stage[a], bytes));
    PO_RETURN_IF_ERROR(backend_.RecordEvent(written_[set].get(), d2h_));
    stats_.h2d_bytes += 3 * bytes;
    stats_.d2h_bytes += 3 * bytes;
  }
  PO_RETURN_IF_ERROR(backend_.RecordEvent(compute_done_.get(), compute_));
  return backend_.RecordEvent(d2h_done_.get(), d2h_);
}

absl::Status OptimizerOffloadImpl::RunCpuLane(const AdamStepScalars& scalars) {
  const std::int64_t s = std::min(options_.subgroup_size, options_.num_params);
  std::int64_t u = 0;
  for (std::int64_t x = 0; x < num_subgroups(); ++x) {
    if (places_[static_cast<std::size_t>(x)] != SubgroupPlace::kCpu) continue;
    const std::int64_t offset = plan_.layout.offset(x), size = plan_.layout.size(x);
    const std::int64_t h = plan_.host_offset[static_cast<std::size_t>(x)];
    const int k = static_cast<int>(u++ % internal::kUploadSlots);
    std::uint16_t* slot = upload_slots_.get() + k * s;
    PO_RETURN_IF_ERROR(Wait(upload_done_[k], "bf16 upload slot"));
    const double start = backend_.NowSeconds();
    PO_RETURN_IF_ERROR(
        cpu_adam_->Update(scalars, AdamSpan{host_param_.get() + h, host_m_.get() + h,
                                            host_v_.get() + h, host_grad_.get() + h, slot, size}));
    stats_.cpu_adam_seconds += backend_.NowSeconds() - start;
    PO_RETURN_IF_ERROR(Copy(upload_, device_bf16_ + offset, slot, size * 2));
    PO_RETURN_IF_ERROR(backend_.RecordEvent(upload_done_[k].get(), upload_));
    stats_.h2d_bytes += 2 * size;
  }
  return backend_.RecordEvent(uploads_done_.get(), upload_);
}

absl::StatusOr<OptimizerStepResult> OptimizerOffloadImpl::Step(float loss_scale) {
  if (!std::isfinite(loss_scale) || !(loss_scale > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer offload: loss_scale = ", loss_scale, " must be finite and > 0"));
  }
  for (std::int64_t x = 0; x < num_subgroups(); ++x) {
    if (received_[static_cast<std::size_t>(x)] != plan_.layout.size(x)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "optimizer offload: Step before all gradients arrived: subgroup ", x, " (parameters [",
          plan_.layout.offset(x), ", ", plan_.layout.offset(x) + plan_.layout.size(x), ")) has ",
          received_[static_cast<std::size_t>(x)], " of ", plan_.layout.size(x)));
    }
  }
  const double t0 = backend_.NowSeconds();
  // The caller's earlier work (which may still read the bf16 parameters) goes first.
  PO_RETURN_IF_ERROR(Order(caller_ready_, caller_, compute_));
  PO_RETURN_IF_ERROR(backend_.QueueWaitEvent(upload_, caller_ready_.get()));
  // The global norm: read the accumulated sum of squares (after every gradient D2H: d2h_ is in
  // order), then zero it for the next step.
  PO_RETURN_IF_ERROR(Order(norm_ready_, compute_, d2h_));
  PO_RETURN_IF_ERROR(Copy(d2h_, norm_host_.get(), accumulator(), sizeof(double)));
  PO_RETURN_IF_ERROR(Order(norm_copied_, d2h_, compute_));
  PO_RETURN_IF_ERROR(backend_.FillAsync(compute_, accumulator(), 0u, sizeof(double)));
  PO_RETURN_IF_ERROR(Wait(norm_copied_, "gradient norm"));

  OptimizerStepResult result;
  result.grad_norm = std::sqrt(*norm_host_.get()) / static_cast<double>(loss_scale);
  stats_ = OptimizerStepStats{};
  if (!std::isfinite(result.grad_norm)) {
    ResetGradients();
    result.step = step_;
    stats_.step_seconds = backend_.NowSeconds() - t0;
    return result;  // applied = false: a loss-scale overflow skips the step
  }
  const double clip = ClipCoefficient(result.grad_norm, options_.max_grad_norm);
  result.grad_scale = static_cast<float>(clip / static_cast<double>(loss_scale));
  PO_ASSIGN_OR_RETURN(const AdamStepScalars scalars,
                      MakeAdamStepScalars(options_.adam, step_ + 1, result.grad_scale));

  const double t1 = backend_.NowSeconds();
  PO_RETURN_IF_ERROR(EnqueueGpuLanes(scalars));
  PO_RETURN_IF_ERROR(RunCpuLane(scalars));
  PO_RETURN_IF_ERROR(Wait(compute_done_, "GPU Adam"));
  PO_RETURN_IF_ERROR(Wait(d2h_done_, "state write-back"));
  PO_RETURN_IF_ERROR(Wait(uploads_done_, "bf16 upload"));
  const double t2 = backend_.NowSeconds();

  ++step_;
  ResetGradients();
  for (SubgroupPlace place : places_) {
    if (place == SubgroupPlace::kCpu) ++stats_.cpu_subgroups;
    if (place == SubgroupPlace::kGpuStaged) ++stats_.gpu_staged_subgroups;
    if (place == SubgroupPlace::kGpuResident) ++stats_.gpu_resident_subgroups;
  }
  stats_.update_seconds = t2 - t1;
  stats_.step_seconds = t2 - t0;
  result.applied = true;
  result.step = step_;
  return result;
}

absl::Status OptimizerOffloadImpl::SetLearningRate(float learning_rate) {
  if (!std::isfinite(learning_rate) || learning_rate < 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer offload: learning rate ", learning_rate, " must be finite and >= 0"));
  }
  options_.adam.learning_rate = learning_rate;
  return absl::OkStatus();
}

absl::Status OptimizerOffloadImpl::SetGpuShare(double share) {
  if (options_.mode != OffloadMode::kInterleaved) {
    return absl::FailedPreconditionError(
        absl::StrCat("optimizer offload: SetGpuShare needs interleaved mode, not ",
                     std::string(OffloadModeName(options_.mode))));
  }
  if (!ranges_.empty()) {
    return absl::FailedPreconditionError(
        "optimizer offload: SetGpuShare while gradients of this step are pending");
  }
  const std::int64_t n = num_subgroups();
  if (!(share >= 0.0 && share <= 1.0) || SubgroupsForShare(n, share) > plan_.staged_slots) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer offload: GPU share ", share, " must be in [0, 1] and need at most ",
                     plan_.staged_slots, " GPU subgroups of ", n, " (max_gpu_share)"));
  }
  places_ = PlaceSubgroups(OffloadMode::kInterleaved, n, share);
  AssignStagedSlots();
  return absl::OkStatus();
}

absl::Status OptimizerOffloadImpl::ReadState(std::int64_t offset, std::int64_t count, float* param,
                                             float* exp_avg, float* exp_avg_sq) {
  if (count <= 0 || offset < 0 || offset > options_.num_params - count) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer offload: ReadState range [", offset, ", ", offset + count,
                     ") is empty or outside the ", options_.num_params, " parameters"));
  }
  float* out[3] = {param, exp_avg, exp_avg_sq};
  for (std::int64_t begin = offset; begin < offset + count;) {
    const std::int64_t x = begin / options_.subgroup_size;
    const std::int64_t end =
        std::min(offset + count, plan_.layout.offset(x) + plan_.layout.size(x));
    const std::int64_t within = begin - plan_.layout.offset(x);
    const std::int64_t bytes = (end - begin) * 4;
    const std::int64_t h = plan_.host_offset[static_cast<std::size_t>(x)];
    const std::int64_t r = plan_.resident_offset[static_cast<std::size_t>(x)];
    const float* host[3] = {host_param_.get(), host_m_.get(), host_v_.get()};
    const float* dev[3] = {resident_param_.get(), resident_m_.get(), resident_v_.get()};
    for (int a = 0; a < 3; ++a) {
      if (out[a] == nullptr) continue;
      if (h >= 0) {
        std::memcpy(out[a] + (begin - offset), host[a] + h + within,
                    static_cast<std::size_t>(bytes));
      } else {
        PO_RETURN_IF_ERROR(Copy(d2h_, out[a] + (begin - offset), dev[a] + r + within, bytes));
      }
    }
    begin = end;
  }
  PO_RETURN_IF_ERROR(backend_.RecordEvent(d2h_done_.get(), d2h_));
  return Wait(d2h_done_, "ReadState");
}

}  // namespace

absl::StatusOr<std::unique_ptr<OptimizerOffload>> OptimizerOffload::Create(
    Backend& backend, const OptimizerOffloadOptions& options,
    std::span<const float> initial_params, std::span<std::uint16_t> device_params_bf16) {
  PO_ASSIGN_OR_RETURN(OffloadPlan plan, internal::PlanOffload(options));
  const auto n = static_cast<std::size_t>(options.num_params);
  if (initial_params.data() == nullptr || initial_params.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer offload: initial_params has ", initial_params.size(), " elements",
                     initial_params.data() == nullptr ? " (null)" : "", " but num_params is ", n));
  }
  if (device_params_bf16.data() == nullptr || device_params_bf16.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer offload: device_params_bf16 has ", device_params_bf16.size(), " elements",
        device_params_bf16.data() == nullptr ? " (null)" : "", " but num_params is ", n));
  }
  PO_RETURN_IF_ERROR(internal::CheckHostMemory(plan, options.host_memory_limit_bytes));
  auto engine = std::make_unique<OptimizerOffloadImpl>(backend, options, std::move(plan),
                                                       device_params_bf16.data());
  // On failure the engine's destructor drains what Init queued and frees what it allocated.
  PO_RETURN_IF_ERROR(engine->Init(initial_params));
  return std::unique_ptr<OptimizerOffload>(std::move(engine));
}

}  // namespace pipeoffload
