// CalibrateUpdateRates (calibrate.h). Each rate is the median of `repeats` timings; copies and
// kernels are timed with CUDA events on their own stream, CpuAdam with the host clock.
// Contention is measured the way the engine creates it: CpuAdam on one set of host arrays while
// the copy engines move other pinned buffers both ways.
#include "lib/optim/cuda/calibrate.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/backend/cuda/cuda_status.h"
#include "lib/base/status_macros.h"
#include "lib/optim/cuda/adam_kernel.h"
#include "lib/optim/cuda/cuda_resources.h"

namespace pipeoffload {
namespace {

using internal::DeviceArray;
using internal::PinnedArray;
using internal::UniqueStream;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double HostNow() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A timing event pair on one stream.
class Timer {
 public:
  absl::Status Init() {
    PO_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start_));
    PO_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop_));
    return absl::OkStatus();
  }
  ~Timer() {
    if (start_ != nullptr) PO_CUDA_LOG_IF_ERROR(cudaEventDestroy(start_));
    if (stop_ != nullptr) PO_CUDA_LOG_IF_ERROR(cudaEventDestroy(stop_));
  }
  absl::Status Start(cudaStream_t s) {
    PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(start_, s));
    return absl::OkStatus();
  }
  absl::Status Stop(cudaStream_t s) {
    PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop_, s));
    return absl::OkStatus();
  }
  // Seconds between Start and Stop, once Stop has completed.
  absl::StatusOr<double> Seconds() {
    PO_RETURN_IF_ERROR(internal::WaitForEvent(stop_, 120.0, "calibration"));
    float ms = 0.0f;
    PO_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start_, stop_));
    return ms * 1e-3;
  }

 private:
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

class Calibration {
 public:
  explicit Calibration(const CalibrationOptions& o) : o_(o) {}

  absl::StatusOr<UpdateRates> Run();

 private:
  // `copies` copies of `bytes` on each of the H2D and D2H streams (either may be 0), started
  // together; returns the seconds of each stream.
  absl::StatusOr<std::pair<double, double>> Copies(int h2d_copies, int d2h_copies);
  absl::StatusOr<double> CpuAdamSeconds();

  const CalibrationOptions o_;
  std::int64_t copy_bytes_ = 0;
  std::unique_ptr<CpuAdam> cpu_;
  PinnedArray<float> host_p_, host_m_, host_v_, host_g_, copy_src_, copy_dst_;
  PinnedArray<std::uint16_t> host_bf16_;
  DeviceArray<float> dev_p_, dev_m_, dev_v_, dev_g_, dev_copy_in_, dev_copy_out_;
  DeviceArray<std::uint16_t> dev_bf16_;
  DeviceArray<double> dev_partials_;
  UniqueStream h2d_, d2h_, compute_;
  Timer h2d_timer_, d2h_timer_, compute_timer_;
};

absl::StatusOr<std::pair<double, double>> Calibration::Copies(int h2d_copies, int d2h_copies) {
  const auto bytes = static_cast<std::size_t>(copy_bytes_);
  if (h2d_copies > 0) PO_RETURN_IF_ERROR(h2d_timer_.Start(h2d_.get()));
  if (d2h_copies > 0) PO_RETURN_IF_ERROR(d2h_timer_.Start(d2h_.get()));
  for (int i = 0; i < std::max(h2d_copies, d2h_copies); ++i) {
    if (i < h2d_copies) {
      PO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev_copy_in_.get(), copy_src_.get(), bytes,
                                              cudaMemcpyHostToDevice, h2d_.get()));
    }
    if (i < d2h_copies) {
      PO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(copy_dst_.get(), dev_copy_out_.get(), bytes,
                                              cudaMemcpyDeviceToHost, d2h_.get()));
    }
  }
  std::pair<double, double> seconds{0.0, 0.0};
  if (h2d_copies > 0) {
    PO_RETURN_IF_ERROR(h2d_timer_.Stop(h2d_.get()));
    PO_ASSIGN_OR_RETURN(seconds.first, h2d_timer_.Seconds());
  }
  if (d2h_copies > 0) {
    PO_RETURN_IF_ERROR(d2h_timer_.Stop(d2h_.get()));
    PO_ASSIGN_OR_RETURN(seconds.second, d2h_timer_.Seconds());
  }
  return seconds;
}

absl::StatusOr<double> Calibration::CpuAdamSeconds() {
  const AdamStepScalars scalars = *MakeAdamStepScalars(AdamOptions{}, 1);
  const double start = HostNow();
  PO_RETURN_IF_ERROR(cpu_->Update(scalars, AdamSpan{host_p_.get(), host_m_.get(), host_v_.get(),
                                                    host_g_.get(), host_bf16_.get(), o_.params}));
  return HostNow() - start;
}

absl::StatusOr<UpdateRates> Calibration::Run() {
  const std::int64_t n = o_.params;
  copy_bytes_ = 4 * n;
  PO_ASSIGN_OR_RETURN(cpu_, CpuAdam::Create(o_.cpu));
  for (auto* a : {&host_p_, &host_m_, &host_v_, &host_g_, &copy_src_, &copy_dst_}) {
    PO_RETURN_IF_ERROR(a->Allocate(n, "calibration"));
    std::memset(a->get(), 0, static_cast<std::size_t>(n) * 4);
  }
  std::fill(host_g_.get(), host_g_.get() + n, 1e-3f);
  PO_RETURN_IF_ERROR(host_bf16_.Allocate(n, "calibration"));
  for (auto* a : {&dev_p_, &dev_m_, &dev_v_, &dev_g_, &dev_copy_in_, &dev_copy_out_}) {
    PO_RETURN_IF_ERROR(a->Allocate(n, "calibration"));
    PO_CUDA_RETURN_IF_ERROR(cudaMemset(a->get(), 0, static_cast<std::size_t>(n) * 4));
  }
  PO_RETURN_IF_ERROR(dev_bf16_.Allocate(n, "calibration"));
  PO_CUDA_RETURN_IF_ERROR(cudaMemset(dev_bf16_.get(), 0, static_cast<std::size_t>(n) * 2));
  PO_RETURN_IF_ERROR(dev_partials_.Allocate(SumOfSquaresPartialCount(n) + 1, "calibration"));
  for (UniqueStream* s : {&h2d_, &d2h_, &compute_}) PO_RETURN_IF_ERROR(s->Create());
  for (Timer* t : {&h2d_timer_, &d2h_timer_, &compute_timer_}) PO_RETURN_IF_ERROR(t->Init());

  UpdateRates r;
  std::vector<double> cpu, h2d, d2h, h2d_duplex, d2h_duplex, gpu, upcast;
  PO_RETURN_IF_ERROR(CpuAdamSeconds().status());  // warm-up: page faults, thread start
  PO_RETURN_IF_ERROR(Copies(1, 1).status());
  for (int i = 0; i < o_.repeats; ++i) {
    PO_ASSIGN_OR_RETURN(const double c, CpuAdamSeconds());
    cpu.push_back(static_cast<double>(n) / c);
    PO_ASSIGN_OR_RETURN(const auto alone_h2d, Copies(2, 0));
    h2d.push_back(2.0 * static_cast<double>(copy_bytes_) / alone_h2d.first);
    PO_ASSIGN_OR_RETURN(const auto alone_d2h, Copies(0, 2));
    d2h.push_back(2.0 * static_cast<double>(copy_bytes_) / alone_d2h.second);
    PO_ASSIGN_OR_RETURN(const auto duplex, Copies(2, 2));
    h2d_duplex.push_back(2.0 * static_cast<double>(copy_bytes_) / duplex.first);
    d2h_duplex.push_back(2.0 * static_cast<double>(copy_bytes_) / duplex.second);

    const AdamStepScalars scalars = *MakeAdamStepScalars(AdamOptions{}, 1);
    PO_RETURN_IF_ERROR(compute_timer_.Start(compute_.get()));
    PO_RETURN_IF_ERROR(LaunchAdamUpdate(
        scalars,
        AdamSpan{dev_p_.get(), dev_m_.get(), dev_v_.get(), dev_g_.get(), dev_bf16_.get(), n},
        compute_.get()));
    PO_RETURN_IF_ERROR(compute_timer_.Stop(compute_.get()));
    PO_ASSIGN_OR_RETURN(const double g, compute_timer_.Seconds());
    gpu.push_back(static_cast<double>(n) / g);
    PO_RETURN_IF_ERROR(compute_timer_.Start(compute_.get()));
    PO_RETURN_IF_ERROR(LaunchSumOfSquaresBf16(dev_bf16_.get(), n, dev_partials_.get(),
                                              dev_partials_.get() + dev_partials_.count() - 1,
                                              SumMode::kOverwrite, compute_.get()));
    PO_RETURN_IF_ERROR(LaunchBf16ToFp32(dev_bf16_.get(), dev_g_.get(), n, compute_.get()));
    PO_RETURN_IF_ERROR(compute_timer_.Stop(compute_.get()));
    PO_ASSIGN_OR_RETURN(const double u, compute_timer_.Seconds());
    upcast.push_back(static_cast<double>(n) / u);
  }
  r.cpu_adam = Median(cpu);
  r.h2d = Median(h2d);
  r.d2h = Median(d2h);
  r.h2d_duplex = std::min(Median(h2d_duplex), r.h2d);
  r.d2h_duplex = std::min(Median(d2h_duplex), r.d2h);
  r.gpu_adam = Median(gpu);
  r.upcast = Median(upcast);

  // CpuAdam while both copy directions run: enough copies to outlast it (twice its alone time).
  std::vector<double> cpu_loaded, pcie_factor;
  const double duplex_copy_seconds = static_cast<double>(copy_bytes_) / r.h2d_duplex;
  const int cover = std::max(
      2, static_cast<int>(2.0 * (static_cast<double>(n) / r.cpu_adam) / duplex_copy_seconds) + 1);
  for (int i = 0; i < o_.repeats; ++i) {
    const auto bytes = static_cast<std::size_t>(copy_bytes_);
    for (int k = 0; k < cover; ++k) {
      PO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev_copy_in_.get(), copy_src_.get(), bytes,
                                              cudaMemcpyHostToDevice, h2d_.get()));
      PO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(copy_dst_.get(), dev_copy_out_.get(), bytes,
                                              cudaMemcpyDeviceToHost, d2h_.get()));
    }
    PO_ASSIGN_OR_RETURN(const double c, CpuAdamSeconds());
    cpu_loaded.push_back(static_cast<double>(n) / c);
    PO_RETURN_IF_ERROR(Copies(1, 1).status());  // in stream order after the cover: drains it

    // Duplex copies while CpuAdam runs in a loop on another thread.
    std::atomic<bool> stop{false};
    absl::Status cpu_status;
    std::thread cpu_thread([&] {
      while (!stop.load() && cpu_status.ok()) cpu_status = CpuAdamSeconds().status();
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    absl::StatusOr<std::pair<double, double>> loaded = Copies(2, 2);
    stop.store(true);
    cpu_thread.join();
    PO_RETURN_IF_ERROR(cpu_status);
    PO_RETURN_IF_ERROR(loaded.status());
    const double h2d_loaded = 2.0 * static_cast<double>(copy_bytes_) / loaded->first;
    const double d2h_loaded = 2.0 * static_cast<double>(copy_bytes_) / loaded->second;
    pcie_factor.push_back((h2d_loaded + d2h_loaded) / (r.h2d_duplex + r.d2h_duplex));
  }
  r.cpu_adam_with_pcie = std::min(Median(cpu_loaded), r.cpu_adam);
  r.pcie_factor_with_cpu = std::clamp(Median(pcie_factor), 0.05, 1.0);
  PO_RETURN_IF_ERROR(CheckUpdateRates(r));
  return r;
}

}  // namespace

absl::StatusOr<UpdateRates> CalibrateUpdateRates(const CalibrationOptions& options) {
  if (options.params <= 0 || options.repeats <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("calibration: params = ", options.params,
                                                   " and repeats = ", options.repeats,
                                                   " must be > 0"));
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || options.device >= count) {
    static_cast<void>(cudaGetLastError());
    return absl::FailedPreconditionError(
        absl::StrCat("calibration: CUDA device ", options.device, " is not available"));
  }
  internal::ScopedDevice device;
  PO_RETURN_IF_ERROR(device.Enter(options.device));
  Calibration calibration(options);
  return calibration.Run();
}

}  // namespace pipeoffload
