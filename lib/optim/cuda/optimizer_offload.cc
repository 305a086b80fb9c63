// The optimizer-offload engine (include/pipeoffload/optimizer_offload.h).
//
// Invariants:
//  - Everything is allocated in Create (plan first: offload_plan.h); Step, AddGradients and
//    SetGpuShare allocate nothing on the host's pinned heap or the device.
//  - Streams: compute_ (sum of squares, upcasts, Adam kernels), d2h_ (fp32 gradients of host
//    subgroups, write-back of staged state), h2d_state_ (prefetch of staged state) and
//    upload_ (bf16 of host subgroups). The caller's stream orders against them by events only.
//  - Gradient path: upcast chunk k in {0, 1} is reused only after chunk_free_[k] (its D2H) has
//    completed: compute_ waits for it before the next upcast into it.
//  - Staged subgroup j uses staging set s = j % 2: its prefetch waits written_[s] (the
//    write-back of subgroup j - 2), its kernel waits loaded_[s], its write-back waits
//    updated_[s]. So GPU optimizer state never exceeds two subgroups' worth, and EVERY staged
//    subgroup, the last one included, is written back before Step returns.
//  - Upload slot k is refilled by the CPU only after upload_done_[k] has completed (host wait).
//  - Step returns only after every lane has finished, so between steps no engine work is in
//    flight except gradient-path work from AddGradients.
#include "pipeoffload/optimizer_offload.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
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
#include "lib/backend/cuda/cuda_status.h"
#include "lib/base/status_macros.h"
#include "lib/optim/cuda/adam_kernel.h"
#include "lib/optim/cuda/cuda_resources.h"
#include "lib/optim/cuda/offload_plan.h"
#include "lib/optim/cuda/update_model.h"
#include "pipeoffload/adam.h"

namespace pipeoffload {
namespace {

using internal::DeviceArray;
using internal::OffloadPlan;
using internal::PinnedArray;
using internal::UniqueEvent;
using internal::UniqueStream;

static_assert(internal::kPlanSumBlock == kSumOfSquaresBlock, "plan and kernel disagree");

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

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
  OptimizerOffloadImpl(const OptimizerOffloadOptions& options, OffloadPlan plan,
                       std::uint16_t* device_bf16)
      : options_(options),
        plan_(std::move(plan)),
        places_(plan_.places),
        device_bf16_(device_bf16),
        received_(static_cast<std::size_t>(plan_.layout.num_subgroups()), 0) {}

  absl::Status Init(std::span<const float> initial);

  absl::Status AddGradients(const std::uint16_t* grads, std::int64_t offset, std::int64_t count,
                            void* stream) override;
  absl::Status WaitForGradients() override;
  absl::StatusOr<OptimizerStepResult> Step(float loss_scale, void* stream) override;
  absl::Status SetGpuShare(double share) override;
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
  template <typename T, bool kPinned>
  absl::Status Alloc(internal::CudaArray<T, kPinned>& array, std::int64_t count, const char* what) {
    PO_RETURN_IF_ERROR(array.Allocate(count, what));
    if (count > 0) ++allocations_;
    return absl::OkStatus();
  }
  // Device fp32 gradients of subgroup x (GPU-updated this step).
  float* DeviceGrad(std::int64_t x) const {
    const std::int64_t resident = plan_.resident_offset[static_cast<std::size_t>(x)];
    if (resident >= 0) return device_grad_.get() + resident;
    return device_grad_.get() + staged_slot_[static_cast<std::size_t>(x)] * options_.subgroup_size;
  }
  void AssignStagedSlots();
  absl::Status Wait(cudaEvent_t event, const char* what) {
    return internal::WaitForEvent(event, options_.timeout_seconds, what);
  }
  absl::Status EnqueueGpuLanes(const AdamStepScalars& scalars);
  absl::Status RunCpuLane(const AdamStepScalars& scalars);
  void ResetGradients();

  const OptimizerOffloadOptions options_;
  const OffloadPlan plan_;
  std::vector<SubgroupPlace> places_;
  std::vector<std::int64_t> staged_slot_;  // per subgroup: device grad slot, or -1
  std::uint16_t* const device_bf16_;       // (num_params) bf16, the caller's
  std::unique_ptr<CpuAdam> cpu_adam_;
  std::int64_t allocations_ = 0;
  std::int64_t step_ = 0;
  OptimizerStepStats stats_;

  // Gradient bookkeeping of the current step: elements received per subgroup and the ranges.
  std::vector<std::int64_t> received_;
  std::map<std::int64_t, std::int64_t> ranges_;  // begin -> end, disjoint
  std::int64_t upcast_round_ = 0;                // which upcast chunk is next

  PinnedArray<float> host_param_, host_m_, host_v_, host_grad_;  // (host_params)
  PinnedArray<std::uint16_t> upload_slots_;                      // (kUploadSlots, subgroup) bf16
  PinnedArray<double> norm_host_;                                // (1)
  DeviceArray<float> resident_param_, resident_m_, resident_v_;  // (resident_params)
  DeviceArray<float> stage_;        // (staging_sets, 3, subgroup): p, m, v
  DeviceArray<float> device_grad_;  // resident grads, or (staged_slots, subgroup)
  DeviceArray<float> upcast_;       // (2, upcast_chunk)
  DeviceArray<double> partials_;    // (sum-of-squares partials + 1 accumulator)

  UniqueStream compute_, d2h_, h2d_state_, upload_;
  UniqueEvent producer_ready_, grads_read_, caller_ready_, norm_ready_, grads_landed_;
  UniqueEvent upcast_done_[2], chunk_free_[2];
  UniqueEvent loaded_[2], updated_[2], written_[2];
  UniqueEvent upload_done_[internal::kUploadSlots];
  UniqueEvent compute_done_, d2h_done_, uploads_done_;
};

void OptimizerOffloadImpl::AssignStagedSlots() {
  staged_slot_.assign(places_.size(), -1);
  std::int64_t next = 0;
  for (std::size_t x = 0; x < places_.size(); ++x) {
    if (places_[x] == SubgroupPlace::kGpuStaged) staged_slot_[x] = next++;
  }
}

absl::Status OptimizerOffloadImpl::Init(std::span<const float> initial) {
  PO_ASSIGN_OR_RETURN(cpu_adam_, CpuAdam::Create(options_.cpu));
  const std::int64_t s = std::min(options_.subgroup_size, options_.num_params);
  PO_RETURN_IF_ERROR(Alloc(host_param_, plan_.host_params, "fp32 master parameters"));
  PO_RETURN_IF_ERROR(Alloc(host_m_, plan_.host_params, "Adam m"));
  PO_RETURN_IF_ERROR(Alloc(host_v_, plan_.host_params, "Adam v"));
  PO_RETURN_IF_ERROR(Alloc(host_grad_, plan_.host_params, "fp32 gradients"));
  PO_RETURN_IF_ERROR(Alloc(upload_slots_, plan_.pinned_upload_bytes / 2, "bf16 upload slots"));
  PO_RETURN_IF_ERROR(Alloc(norm_host_, 1, "the gradient norm"));
  PO_RETURN_IF_ERROR(Alloc(resident_param_, plan_.resident_params, "resident parameters"));
  PO_RETURN_IF_ERROR(Alloc(resident_m_, plan_.resident_params, "resident Adam m"));
  PO_RETURN_IF_ERROR(Alloc(resident_v_, plan_.resident_params, "resident Adam v"));
  PO_RETURN_IF_ERROR(Alloc(stage_, plan_.staging_sets * 3 * s, "staging sets"));
  PO_RETURN_IF_ERROR(Alloc(device_grad_, plan_.device_grad_bytes / 4, "device fp32 gradients"));
  PO_RETURN_IF_ERROR(Alloc(upcast_, 2 * plan_.upcast_chunk, "gradient upcast staging"));
  // The partials of one AddGradients range (at most num_params) and the accumulator last.
  PO_RETURN_IF_ERROR(Alloc(partials_, SumOfSquaresPartialCount(options_.num_params) + 1,
                           "sum-of-squares scratch"));
  for (UniqueStream* stream : {&compute_, &d2h_, &h2d_state_, &upload_}) {
    PO_RETURN_IF_ERROR(stream->Create());
  }
  for (UniqueEvent* event :
       {&producer_ready_, &grads_read_, &caller_ready_, &norm_ready_, &grads_landed_,
        &upcast_done_[0], &upcast_done_[1], &chunk_free_[0], &chunk_free_[1], &loaded_[0],
        &loaded_[1], &updated_[0], &updated_[1], &written_[0], &written_[1], &compute_done_,
        &d2h_done_, &uploads_done_}) {
    PO_RETURN_IF_ERROR(event->Create());
  }
  for (UniqueEvent& event : upload_done_) PO_RETURN_IF_ERROR(event.Create());
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
    const auto bytes = static_cast<std::size_t>(plan_.resident_params) * sizeof(float);
    PO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(resident_param_.get(), initial.data() + first, bytes,
                                            cudaMemcpyHostToDevice, compute_.get()));
    PO_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(resident_m_.get(), 0, bytes, compute_.get()));
    PO_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(resident_v_.get(), 0, bytes, compute_.get()));
  }
  PO_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
      partials_.get(), 0, static_cast<std::size_t>(partials_.count()) * 8, compute_.get()));
  PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(compute_done_.get(), compute_.get()));
  PO_RETURN_IF_ERROR(Wait(compute_done_.get(), "initial state upload"));

  // The bf16 parameters: FloatToBf16Bits of the masters, converted on the host into the first
  // upload slot (kGpu has no pinned memory: a pageable buffer, which cudaMemcpyAsync has
  // staged before it returns) and copied up one subgroup at a time.
  std::vector<std::uint16_t> pageable;
  std::uint16_t* staging = upload_slots_.get();
  if (staging == nullptr) {
    pageable.resize(static_cast<std::size_t>(s));
    staging = pageable.data();
  }
  for (std::int64_t x = 0; x < plan_.layout.num_subgroups(); ++x) {
    const std::int64_t begin = plan_.layout.offset(x), size = plan_.layout.size(x);
    PO_RETURN_IF_ERROR(Wait(uploads_done_.get(), "initial bf16 upload"));
    ParallelFor(size, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) staging[i] = FloatToBf16Bits(initial[begin + i]);
    });
    PO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_bf16_ + begin, staging,
                                            static_cast<std::size_t>(size) * 2,
                                            cudaMemcpyHostToDevice, upload_.get()));
    PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(uploads_done_.get(), upload_.get()));
  }
  return Wait(uploads_done_.get(), "initial bf16 upload");
}

absl::Status OptimizerOffloadImpl::AddGradients(const std::uint16_t* grads, std::int64_t offset,
                                                std::int64_t count, void* stream) {
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
  internal::ScopedDevice device;
  PO_RETURN_IF_ERROR(device.Enter(options_.device));
  const auto caller = static_cast<cudaStream_t>(stream);
  cudaStream_t compute = compute_.get();
  PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(producer_ready_.get(), caller));
  PO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute, producer_ready_.get(), 0));
  double* accumulator = partials_.get() + partials_.count() - 1;
  PO_RETURN_IF_ERROR(LaunchSumOfSquaresBf16(grads, count, partials_.get(), accumulator,
                                            SumMode::kAccumulate, compute));
  const std::int64_t s = options_.subgroup_size;
  for (std::int64_t begin = offset; begin < offset + count;) {
    const std::int64_t x = begin / s;
    const std::int64_t end =
        std::min(offset + count, plan_.layout.offset(x) + plan_.layout.size(x));
    const std::uint16_t* src = grads + (begin - offset);
    const std::int64_t within = begin - plan_.layout.offset(x);
    if (places_[static_cast<std::size_t>(x)] != SubgroupPlace::kCpu) {
      PO_RETURN_IF_ERROR(LaunchBf16ToFp32(src, DeviceGrad(x) + within, end - begin, compute));
    } else {
      float* dst = host_grad_.get() + plan_.host_offset[static_cast<std::size_t>(x)] + within;
      for (std::int64_t done = 0; done < end - begin; done += plan_.upcast_chunk) {
        const std::int64_t len = std::min(plan_.upcast_chunk, end - begin - done);
        const int k = static_cast<int>(upcast_round_++ % 2);
        float* chunk = upcast_.get() + k * plan_.upcast_chunk;
        PO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute, chunk_free_[k].get(), 0));
        PO_RETURN_IF_ERROR(LaunchBf16ToFp32(src + done, chunk, len, compute));
        PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(upcast_done_[k].get(), compute));
        PO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(d2h_.get(), upcast_done_[k].get(), 0));
        PO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst + done, chunk,
                                                static_cast<std::size_t>(len) * sizeof(float),
                                                cudaMemcpyDeviceToHost, d2h_.get()));
        PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(chunk_free_[k].get(), d2h_.get()));
      }
    }
    received_[static_cast<std::size_t>(x)] += end - begin;
    begin = end;
  }
  // The caller may reuse `grads` once compute_ has read them (the D2H reads only our chunks).
  PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(grads_read_.get(), compute));
  PO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(caller, grads_read_.get(), 0));
  ranges_.emplace(offset, offset + count);
  return absl::OkStatus();
}

absl::Status OptimizerOffloadImpl::WaitForGradients() {
  internal::ScopedDevice device;
  PO_RETURN_IF_ERROR(device.Enter(options_.device));
  PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(compute_done_.get(), compute_.get()));
  PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(grads_landed_.get(), d2h_.get()));
  PO_RETURN_IF_ERROR(Wait(compute_done_.get(), "gradient upcast"));
  return Wait(grads_landed_.get(), "gradient D2H");
}

void OptimizerOffloadImpl::ResetGradients() {
  std::fill(received_.begin(), received_.end(), 0);
  ranges_.clear();
}

absl::Status OptimizerOffloadImpl::EnqueueGpuLanes(const AdamStepScalars& scalars) {
  const std::int64_t s = std::min(options_.subgroup_size, options_.num_params);
  cudaStream_t compute = compute_.get();
  std::int64_t j = 0;
  for (std::int64_t x = 0; x < num_subgroups(); ++x) {
    const SubgroupPlace place = places_[static_cast<std::size_t>(x)];
    const std::int64_t offset = plan_.layout.offset(x), size = plan_.layout.size(x);
    if (place == SubgroupPlace::kGpuResident) {
      const std::int64_t r = plan_.resident_offset[static_cast<std::size_t>(x)];
      PO_RETURN_IF_ERROR(LaunchAdamUpdate(
          scalars,
          AdamSpan{resident_param_.get() + r, resident_m_.get() + r, resident_v_.get() + r,
                   DeviceGrad(x), device_bf16_ + offset, size},
          compute));
      continue;
    }
    if (place != SubgroupPlace::kGpuStaged) continue;
    const int set = static_cast<int>(j++ % 2);
    float* stage[3] = {stage_.get() + (3 * set) * s, stage_.get() + (3 * set + 1) * s,
                       stage_.get() + (3 * set + 2) * s};
    const std::int64_t h = plan_.host_offset[static_cast<std::size_t>(x)];
    float* home[3] = {host_param_.get() + h, host_m_.get() + h, host_v_.get() + h};
    const auto bytes = static_cast<std::size_t>(size) * sizeof(float);
    PO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(h2d_state_.get(), written_[set].get(), 0));
    for (int a = 0; a < 3; ++a) {
      PO_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(stage[a], home[a], bytes, cudaMemcpyHostToDevice, h2d_state_.get()));
    }
    PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(loaded_[set].get(), h2d_state_.get()));
    PO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute, loaded_[set].get(), 0));
    PO_RETURN_IF_ERROR(LaunchAdamUpdate(
        scalars, AdamSpan{stage[0], stage[1], stage[2], DeviceGrad(x), device_bf16_ + offset, size},
        compute));
    PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(updated_[set].get(), compute));
    PO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(d2h_.get(), updated_[set].get(), 0));
    for (int a = 0; a < 3; ++a) {
      PO_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(home[a], stage[a], bytes, cudaMemcpyDeviceToHost, d2h_.get()));
    }
    PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(written_[set].get(), d2h_.get()));
    stats_.h2d_bytes += 3 * static_cast<std::int64_t>(bytes);
    stats_.d2h_bytes += 3 * static_cast<std::int64_t>(bytes);
  }
  PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(compute_done_.get(), compute));
  PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(d2h_done_.get(), d2h_.get()));
  return absl::OkStatus();
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
    PO_RETURN_IF_ERROR(Wait(upload_done_[k].get(), "bf16 upload slot"));
    const double start = Now();
    PO_RETURN_IF_ERROR(
        cpu_adam_->Update(scalars, AdamSpan{host_param_.get() + h, host_m_.get() + h,
                                            host_v_.get() + h, host_grad_.get() + h, slot, size}));
    stats_.cpu_adam_seconds += Now() - start;
    PO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_bf16_ + offset, slot,
                                            static_cast<std::size_t>(size) * 2,
                                            cudaMemcpyHostToDevice, upload_.get()));
    PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(upload_done_[k].get(), upload_.get()));
    stats_.h2d_bytes += 2 * size;
  }
  PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(uploads_done_.get(), upload_.get()));
  return absl::OkStatus();
}

absl::StatusOr<OptimizerStepResult> OptimizerOffloadImpl::Step(float loss_scale, void* stream) {
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
  const double t0 = Now();
  internal::ScopedDevice device;
  PO_RETURN_IF_ERROR(device.Enter(options_.device));
  cudaStream_t compute = compute_.get();
  // The caller's earlier work (which may still read the bf16 parameters) goes first.
  PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(caller_ready_.get(), static_cast<cudaStream_t>(stream)));
  PO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute, caller_ready_.get(), 0));
  PO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(upload_.get(), caller_ready_.get(), 0));
  // The global norm: read the accumulated sum of squares, then zero it for the next step.
  double* accumulator = partials_.get() + partials_.count() - 1;
  PO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(norm_host_.get(), accumulator, sizeof(double),
                                          cudaMemcpyDeviceToHost, compute));
  PO_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(accumulator, 0, sizeof(double), compute));
  PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(norm_ready_.get(), compute));
  PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(grads_landed_.get(), d2h_.get()));
  PO_RETURN_IF_ERROR(Wait(norm_ready_.get(), "gradient norm"));
  PO_RETURN_IF_ERROR(Wait(grads_landed_.get(), "gradient D2H"));

  OptimizerStepResult result;
  result.grad_norm = std::sqrt(*norm_host_.get()) / static_cast<double>(loss_scale);
  stats_ = OptimizerStepStats{};
  if (!std::isfinite(result.grad_norm)) {
    ResetGradients();
    result.step = step_;
    stats_.step_seconds = Now() - t0;
    return result;  // applied = false: a loss-scale overflow skips the step
  }
  const double clip = ClipCoefficient(result.grad_norm, options_.max_grad_norm);
  result.grad_scale = static_cast<float>(clip / static_cast<double>(loss_scale));
  PO_ASSIGN_OR_RETURN(const AdamStepScalars scalars,
                      MakeAdamStepScalars(options_.adam, step_ + 1, result.grad_scale));

  const double t1 = Now();
  PO_RETURN_IF_ERROR(EnqueueGpuLanes(scalars));
  PO_RETURN_IF_ERROR(RunCpuLane(scalars));
  PO_RETURN_IF_ERROR(Wait(compute_done_.get(), "GPU Adam"));
  PO_RETURN_IF_ERROR(Wait(d2h_done_.get(), "state write-back"));
  PO_RETURN_IF_ERROR(Wait(uploads_done_.get(), "bf16 upload"));
  const double t2 = Now();

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
  internal::ScopedDevice device;
  PO_RETURN_IF_ERROR(device.Enter(options_.device));
  float* out[3] = {param, exp_avg, exp_avg_sq};
  for (std::int64_t begin = offset; begin < offset + count;) {
    const std::int64_t x = begin / options_.subgroup_size;
    const std::int64_t end =
        std::min(offset + count, plan_.layout.offset(x) + plan_.layout.size(x));
    const std::int64_t within = begin - plan_.layout.offset(x);
    const auto bytes = static_cast<std::size_t>(end - begin) * sizeof(float);
    const std::int64_t h = plan_.host_offset[static_cast<std::size_t>(x)];
    const std::int64_t r = plan_.resident_offset[static_cast<std::size_t>(x)];
    const float* host[3] = {host_param_.get(), host_m_.get(), host_v_.get()};
    const float* dev[3] = {resident_param_.get(), resident_m_.get(), resident_v_.get()};
    for (int a = 0; a < 3; ++a) {
      if (out[a] == nullptr) continue;
      if (h >= 0) {
        std::memcpy(out[a] + (begin - offset), host[a] + h + within, bytes);
      } else {
        PO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out[a] + (begin - offset), dev[a] + r + within,
                                                bytes, cudaMemcpyDeviceToHost, d2h_.get()));
      }
    }
    begin = end;
  }
  PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(d2h_done_.get(), d2h_.get()));
  return Wait(d2h_done_.get(), "ReadState");
}

}  // namespace

absl::StatusOr<std::unique_ptr<OptimizerOffload>> OptimizerOffload::Create(
    const OptimizerOffloadOptions& options, std::span<const float> initial_params,
    std::span<std::uint16_t> device_params_bf16) {
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
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || options.device >= count) {
    static_cast<void>(cudaGetLastError());
    return absl::FailedPreconditionError(absl::StrCat(
        "optimizer offload: CUDA device ", options.device, " is not available (",
        error == cudaSuccess ? absl::StrCat(count, " visible")
                             : absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorName(error)),
        ")"));
  }
  internal::ScopedDevice device;
  PO_RETURN_IF_ERROR(device.Enter(options.device));
  std::size_t free_bytes = 0, total_bytes = 0;
  PO_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (plan.device_bytes() > static_cast<std::int64_t>(free_bytes)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("optimizer offload: the GPU state needs ", plan.device_bytes(), " bytes (",
                     internal::FormatBytes(static_cast<double>(plan.device_bytes())),
                     ": fp32 state ", plan.device_state_bytes, ", fp32 gradients ",
                     plan.device_grad_bytes, ", scratch ", plan.device_scratch_bytes,
                     ") but device ", options.device, " has ", free_bytes, " bytes free"));
  }
  auto engine =
      std::make_unique<OptimizerOffloadImpl>(options, std::move(plan), device_params_bf16.data());
  PO_RETURN_IF_ERROR(engine->Init(initial_params));
  return std::unique_ptr<OptimizerOffload>(std::move(engine));
}

}  // namespace pipeoffload
