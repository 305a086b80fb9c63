// CalibrateUpdateRates (update_calibration.h). Each rate is the median of `repeats` timings;
// copies and device kernels are timed with backend events recorded around them on their own
// queue (EventTime: the backend's clock), CpuAdam with the backend's host clock (NowSeconds).
// Contention is measured the way the engine creates it: CpuAdam on one set of host arrays while
// the copy queues move other host buffers both ways.
//
// Teardown: the destructor drains the three queues (an event recorded on each, waited for)
// before the buffers go back to the backend, so an error in the middle of a measurement never
// frees memory a queued copy still uses. The drain events are created before anything is
// enqueued, so they exist whenever there is something to drain.
#include "lib/optim/update_calibration.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/optim/backend_owners.h"
#include "lib/optim/offload_device_ops.h"

namespace pipeoffload {
namespace {

using internal::BackendArray;
using internal::OffloadDeviceOps;
using internal::OwnedEvent;

// Bounds every wait: a copy of a few hundred MB or one Adam pass takes well under a second.
constexpr double kWaitSeconds = 120.0;
// Two events can carry the same time on a coarse clock (the CPU backend's compute queue runs a
// tiny kernel between two reads of the host clock); a rate must stay finite.
constexpr double kMinSeconds = 1e-9;
constexpr bool kHost = true;
constexpr bool kDevice = false;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds between two events recorded on one queue.
class Timer {
 public:
  [[nodiscard]] absl::Status Create(Backend& backend) {
    backend_ = &backend;
    PO_RETURN_IF_ERROR(start_.Create(backend));
    return stop_.Create(backend);
  }
  [[nodiscard]] absl::Status Start(Queue queue) {
    return backend_->RecordEvent(start_.get(), queue);
  }
  [[nodiscard]] absl::Status Stop(Queue queue) { return backend_->RecordEvent(stop_.get(), queue); }
  // Once Stop's capture has completed (waited for here, bounded).
  [[nodiscard]] absl::StatusOr<double> Seconds() {
    PO_RETURN_IF_ERROR(backend_->WaitEvent(stop_.get(), kWaitSeconds));
    PO_ASSIGN_OR_RETURN(const double start, backend_->EventTime(start_.get()));
    PO_ASSIGN_OR_RETURN(const double stop, backend_->EventTime(stop_.get()));
    return std::max(stop - start, kMinSeconds);
  }

 private:
  Backend* backend_ = nullptr;
  OwnedEvent start_, stop_;
};

class Calibration {
 public:
  Calibration(Backend& backend, const CalibrationOptions& o)
      : backend_(backend),
        o_(o),
        compute_(backend.queue(QueueKind::kCompute)),
        h2d_(backend.queue(QueueKind::kH2D)),
        d2h_(backend.queue(QueueKind::kD2H)) {}
  Calibration(const Calibration&) = delete;
  Calibration& operator=(const Calibration&) = delete;
  ~Calibration();

  absl::StatusOr<UpdateRates> Run();

 private:
  absl::Status Allocate();
  // Records an event on each queue and waits for all: nothing of ours is in flight after.
  absl::Status Drain();
  // `h2d_copies` and `d2h_copies` copies of copy_bytes_ on the H2D and D2H queues (either may
  // be 0), enqueued together; returns the seconds of each queue.
  absl::StatusOr<std::pair<double, double>> Copies(int h2d_copies, int d2h_copies);
  absl::Status EnqueueCopy(Queue queue) {
    if (queue == h2d_) {
      return backend_.CopyAsync(h2d_, dev_copy_in_.get(), copy_src_.get(), copy_bytes_);
    }
    return backend_.CopyAsync(d2h_, copy_dst_.get(), dev_copy_out_.get(), copy_bytes_);
  }
  absl::StatusOr<double> CpuAdamSeconds();
  absl::StatusOr<double> DeviceAdamSeconds();
  absl::StatusOr<double> UpcastSeconds();

  Backend& backend_;
  const CalibrationOptions o_;
  const Queue compute_, h2d_, d2h_;
  std::int64_t copy_bytes_ = 0;
  std::unique_ptr<CpuAdam> cpu_;
  std::unique_ptr<OffloadDeviceOps> ops_;
  OwnedEvent drained_[3];
  Timer h2d_timer_, d2h_timer_, compute_timer_;
  BackendArray<float> host_p_, host_m_, host_v_, host_g_, copy_src_, copy_dst_;
  BackendArray<std::uint16_t> host_bf16_;
  BackendArray<float> dev_p_, dev_m_, dev_v_, dev_g_, dev_copy_in_, dev_copy_out_;
  BackendArray<std::uint16_t> dev_bf16_;
  BackendArray<double> dev_partials_;
};

Calibration::~Calibration() {
  if (absl::Status drained = Drain(); !drained.ok()) {
    std::fprintf(stderr, "pipeoffload: calibration teardown frees memory that queued work may "
                 "use: %s\n", std::string(drained.message()).c_str());
  }
}

absl::Status Calibration::Drain() {
  const Queue queues[] = {compute_, h2d_, d2h_};
  for (int i = 0; i < 3; ++i) {
    if (!drained_[i].created()) return absl::OkStatus();  // failed before anything was enqueued
  }
  for (int i = 0; i < 3; ++i) {
    PO_RETURN_IF_ERROR(backend_.RecordEvent(drained_[i].get(), queues[i]));
  }
  for (int i = 0; i < 3; ++i) {
    PO_RETURN_IF_ERROR(backend_.WaitEvent(drained_[i].get(), kWaitSeconds));
  }
  return absl::OkStatus();
}

absl::Status Calibration::Allocate() {
  const std::int64_t n = o_.params;
  const struct {
    BackendArray<float>* array;
    bool host;
    const char* what;
  } floats[] = {{&host_p_, kHost, "host fp32 params"},    {&host_m_, kHost, "host Adam m"},
                {&host_v_, kHost, "host Adam v"},         {&host_g_, kHost, "host gradients"},
                {&copy_src_, kHost, "H2D copy source"},   {&copy_dst_, kHost, "D2H copy target"},
                {&dev_p_, kDevice, "device fp32 params"}, {&dev_m_, kDevice, "device Adam m"},
                {&dev_v_, kDevice, "device Adam v"},      {&dev_g_, kDevice, "device gradients"},
                {&dev_copy_in_, kDevice, "H2D copy target"},
                {&dev_copy_out_, kDevice, "D2H copy source"}};
  for (const auto& f : floats) PO_RETURN_IF_ERROR(f.array->Allocate(backend_, f.host, n, f.what));
  // Even counts, so FillAsync (whole 4-byte words) covers the bf16 arrays.
  const std::int64_t bf16_count = n + n % 2;
  PO_RETURN_IF_ERROR(host_bf16_.Allocate(backend_, kHost, bf16_count, "host bf16 params"));
  PO_RETURN_IF_ERROR(dev_bf16_.Allocate(backend_, kDevice, bf16_count, "device bf16 gradients"));
  // The upcast's scratch and, last, its accumulator.
  PO_RETURN_IF_ERROR(dev_partials_.Allocate(backend_, kDevice, OffloadDeviceOps::PartialsFor(n) + 1,
                                            "sum-of-squares partials"));

  // Zeros everywhere but the host gradients (CpuAdam's inputs as in a step); the device
  // arrays on the compute queue, waited for so no fill is timed with the first copies.
  for (BackendArray<float>* a : {&host_p_, &host_m_, &host_v_, &copy_src_, &copy_dst_}) {
    std::memset(a->get(), 0, static_cast<std::size_t>(n) * sizeof(float));
  }
  std::fill(host_g_.get(), host_g_.get() + n, 1e-3f);
  std::memset(host_bf16_.get(), 0, static_cast<std::size_t>(bf16_count) * 2);
  for (BackendArray<float>* a :
       {&dev_p_, &dev_m_, &dev_v_, &dev_g_, &dev_copy_in_, &dev_copy_out_}) {
    PO_RETURN_IF_ERROR(backend_.FillAsync(compute_, a->get(), 0, n * 4));
  }
  PO_RETURN_IF_ERROR(backend_.FillAsync(compute_, dev_bf16_.get(), 0, bf16_count * 2));
  PO_RETURN_IF_ERROR(backend_.FillAsync(compute_, dev_partials_.get(), 0,
                                        dev_partials_.count() * 8));
  return Drain();
}

absl::StatusOr<std::pair<double, double>> Calibration::Copies(int h2d_copies, int d2h_copies) {
  if (h2d_copies > 0) PO_RETURN_IF_ERROR(h2d_timer_.Start(h2d_));
  if (d2h_copies > 0) PO_RETURN_IF_ERROR(d2h_timer_.Start(d2h_));
  for (int i = 0; i < std::max(h2d_copies, d2h_copies); ++i) {
    if (i < h2d_copies) PO_RETURN_IF_ERROR(EnqueueCopy(h2d_));
    if (i < d2h_copies) PO_RETURN_IF_ERROR(EnqueueCopy(d2h_));
  }
  if (h2d_copies > 0) PO_RETURN_IF_ERROR(h2d_timer_.Stop(h2d_));
  if (d2h_copies > 0) PO_RETURN_IF_ERROR(d2h_timer_.Stop(d2h_));
  std::pair<double, double> seconds{0.0, 0.0};
  if (h2d_copies > 0) {
    PO_ASSIGN_OR_RETURN(seconds.first, h2d_timer_.Seconds());
  }
  if (d2h_copies > 0) {
    PO_ASSIGN_OR_RETURN(seconds.second, d2h_timer_.Seconds());
  }
  return seconds;
}

absl::StatusOr<double> Calibration::CpuAdamSeconds() {
  const AdamStepScalars scalars = *MakeAdamStepScalars(AdamOptions{}, 1);
  const double start = backend_.NowSeconds();
  PO_RETURN_IF_ERROR(cpu_->Update(scalars, AdamSpan{host_p_.get(), host_m_.get(), host_v_.get(),
                                                    host_g_.get(), host_bf16_.get(), o_.params}));
  return std::max(backend_.NowSeconds() - start, kMinSeconds);
}

absl::StatusOr<double> Calibration::DeviceAdamSeconds() {
  const AdamStepScalars scalars = *MakeAdamStepScalars(AdamOptions{}, 1);
  PO_RETURN_IF_ERROR(compute_timer_.Start(compute_));
  PO_RETURN_IF_ERROR(ops_->Adam(compute_, scalars,
                                AdamSpan{dev_p_.get(), dev_m_.get(), dev_v_.get(), dev_g_.get(),
                                         dev_bf16_.get(), o_.params}));
  PO_RETURN_IF_ERROR(compute_timer_.Stop(compute_));
  return compute_timer_.Seconds();
}

// The engine's gradient path on the device: the norm's sum of squares, then the upcast.
absl::StatusOr<double> Calibration::UpcastSeconds() {
  PO_RETURN_IF_ERROR(compute_timer_.Start(compute_));
  PO_RETURN_IF_ERROR(ops_->AccumulateSumOfSquaresBf16(
      compute_, dev_bf16_.get(), o_.params, dev_partials_.get(),
      dev_partials_.get() + dev_partials_.count() - 1));
  PO_RETURN_IF_ERROR(ops_->Bf16ToFp32(compute_, dev_bf16_.get(), dev_g_.get(), o_.params));
  PO_RETURN_IF_ERROR(compute_timer_.Stop(compute_));
  return compute_timer_.Seconds();
}

absl::StatusOr<UpdateRates> Calibration::Run() {
  const std::int64_t n = o_.params;
  copy_bytes_ = 4 * n;
  PO_ASSIGN_OR_RETURN(cpu_, CpuAdam::Create(o_.cpu));
  PO_ASSIGN_OR_RETURN(ops_, internal::CreateOffloadDeviceOps(backend_, o_.cpu));
  for (OwnedEvent& event : drained_) PO_RETURN_IF_ERROR(event.Create(backend_));
  for (Timer* t : {&h2d_timer_, &d2h_timer_, &compute_timer_}) {
    PO_RETURN_IF_ERROR(t->Create(backend_));
  }
  PO_RETURN_IF_ERROR(Allocate());

  const double bytes2 = 2.0 * static_cast<double>(copy_bytes_);  // two copies per timing
  UpdateRates r;
  std::vector<double> cpu, h2d, d2h, h2d_duplex, d2h_duplex, gpu, upcast;
  PO_RETURN_IF_ERROR(CpuAdamSeconds().status());  // warm-up: page faults, thread start
  PO_RETURN_IF_ERROR(Copies(1, 1).status());
  for (int i = 0; i < o_.repeats; ++i) {
    PO_ASSIGN_OR_RETURN(const double c, CpuAdamSeconds());
    cpu.push_back(static_cast<double>(n) / c);
    PO_ASSIGN_OR_RETURN(const auto alone_h2d, Copies(2, 0));
    h2d.push_back(bytes2 / alone_h2d.first);
    PO_ASSIGN_OR_RETURN(const auto alone_d2h, Copies(0, 2));
    d2h.push_back(bytes2 / alone_d2h.second);
    PO_ASSIGN_OR_RETURN(const auto duplex, Copies(2, 2));
    h2d_duplex.push_back(bytes2 / duplex.first);
    d2h_duplex.push_back(bytes2 / duplex.second);
    PO_ASSIGN_OR_RETURN(const double g, DeviceAdamSeconds());
    gpu.push_back(static_cast<double>(n) / g);
    PO_ASSIGN_OR_RETURN(const double u, UpcastSeconds());
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
    for (int k = 0; k < cover; ++k) {
      PO_RETURN_IF_ERROR(EnqueueCopy(h2d_));
      PO_RETURN_IF_ERROR(EnqueueCopy(d2h_));
    }
    PO_ASSIGN_OR_RETURN(const double c, CpuAdamSeconds());
    cpu_loaded.push_back(static_cast<double>(n) / c);
    PO_RETURN_IF_ERROR(Copies(1, 1).status());  // in queue order after the cover: drains it

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
    const double h2d_loaded = bytes2 / loaded->first;
    const double d2h_loaded = bytes2 / loaded->second;
    pcie_factor.push_back((h2d_loaded + d2h_loaded) / (r.h2d_duplex + r.d2h_duplex));
  }
  r.cpu_adam_with_pcie = std::min(Median(cpu_loaded), r.cpu_adam);
  r.pcie_factor_with_cpu = std::clamp(Median(pcie_factor), 0.05, 1.0);
  PO_RETURN_IF_ERROR(CheckUpdateRates(r));
  return r;
}

}  // namespace

absl::StatusOr<UpdateRates> CalibrateUpdateRates(Backend& backend,
                                                 const CalibrationOptions& options) {
  if (options.params <= 0 || options.params > kMaxCalibrationParams) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration: params = ", options.params, " must be in (0, ",
                     kMaxCalibrationParams, "] (kMaxCalibrationParams)"));
  }
  if (options.repeats <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration: repeats = ", options.repeats, " must be > 0"));
  }
  Calibration calibration(backend, options);
  absl::StatusOr<UpdateRates> rates = calibration.Run();
  if (!rates.ok()) return Annotate(rates.status(), "calibration");
  return rates;
}

}  // namespace pipeoffload
