// copy_bench: host <-> device copy bandwidth of one GPU, the ceilings activation offload runs
// against (DESIGN.md section 6; reference/hardware.md measured 55 GB/s each way pinned, 89 GB/s
// with both directions at once, 19 GB/s pageable).
//
// Benchmarks (--benchmarks=a,b,...; default all, in this order):
//   h2d           pinned host -> device, one stream
//   d2h           device -> pinned host, one stream
//   duplex        h2d and d2h at once on two streams: total, and each direction
//   pageable_h2d  pageable (malloc'd) host -> device, for contrast
// Flags: --size_mib=N (1024) --reps=N (10) --warmup=N (2) --device=N (0) --csv=PATH
//        --commit=TEXT (recorded in the CSV) --smoke (64 MiB, 3 reps, 1 warm-up); --help lists
//        them (the table CopyBenchFlags), bad flags exit 2.
// Pinned copies are timed with CUDA events on their streams; the pageable copy with the host
// clock around a synchronous cudaMemcpy, since the driver stages it through its own buffers.
// Each figure is the median of --reps timed runs after --warmup untimed ones; min and max are
// printed too. No L2 flush: a 1 GiB copy is 17x the H200's 60 MB L2. GB/s is 1e9 bytes/s.
// Prints a markdown table; exits 77 when no GPU is usable (CTest's skip code).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "examples/common/flags.h"
#include "lib/backend/cuda/cuda_check.h"
#include "lib/base/status_macros.h"

namespace {

constexpr int kNoGpuExitCode = 77;
constexpr double kOneWayPeakGBs = 55.0;  // pinned, one direction: reference/hardware.md
constexpr double kDuplexPeakGBs = 89.0;  // both directions at once, total: same source

struct Options {
  std::int64_t size_mib = 1024;
  int reps = 10;
  int warmup = 2;
  int device = 0;
  std::string csv;
  std::string commit = "unknown";
  std::vector<std::string> benchmarks = {"h2d", "d2h", "duplex", "pageable_h2d"};
  bool help = false;
};

struct Row {
  std::string name;
  double peak_gbs = 0.0;
  double bytes_per_rep = 0.0;   // bytes one rep moves (both directions for the duplex total)
  std::vector<double> seconds;  // one per timed rep
};

using Flag = pipeoffload::examples::FlagDef<Options>;

const std::vector<Flag>& CopyBenchFlags() {
  using pipeoffload::examples::IntFlag;
  using pipeoffload::examples::TextFlag;
  static const auto* const kFlags = new std::vector<Flag>{
      {"benchmarks", "NAME,...",
       "h2d, d2h, duplex, pageable_h2d: the benchmarks to run, in this order (default all).",
       [](Options& o, const std::string& value) -> absl::Status {
         static const std::vector<std::string_view> kNames = {"h2d", "d2h", "duplex",
                                                              "pageable_h2d"};
         PO_ASSIGN_OR_RETURN(const std::vector<int> items,
                             pipeoffload::examples::ParseFlagChoices("benchmarks", value, kNames));
         o.benchmarks.clear();
         for (const int i : items) o.benchmarks.emplace_back(kNames[static_cast<std::size_t>(i)]);
         return absl::OkStatus();
       }},
      IntFlag("size_mib", "N", "buffer size in MiB (default 1024).", &Options::size_mib, 1,
              1 << 16),
      IntFlag("reps", "N", "timed runs, the median printed with min and max (default 10).",
              &Options::reps, 1, 10000),
      IntFlag("warmup", "N", "untimed runs before them (default 2).", &Options::warmup, 0, 10000),
      IntFlag("device", "N", "the GPU (default 0).", &Options::device, 0, 1024),
      TextFlag("csv", "PATH", "also write the rows as CSV here.", &Options::csv),
      TextFlag("commit", "TEXT", "recorded in the CSV (default unknown).", &Options::commit),
      {"smoke", "", "64 MiB, 3 reps, 1 warm-up (the CTest run).",
       [](Options& o, const std::string&) {
         o.size_mib = 64;
         o.reps = 3;
         o.warmup = 1;
         return absl::OkStatus();
       }},
      pipeoffload::examples::HelpFlag(&Options::help),
  };
  return *kFlags;
}

constexpr char kHelpHeader[] =
    "usage: copy_bench [flags]\n"
    "\n"
    "Host <-> device copy bandwidth of one GPU (pinned h2d, d2h, duplex; pageable h2d), the\n"
    "ceilings activation offload runs against. Prints a markdown table; exits 77 when no GPU\n"
    "is usable.\n";

std::string HelpText() {
  return pipeoffload::examples::FlagsHelpText(kHelpHeader, CopyBenchFlags());
}

absl::StatusOr<Options> Parse(int argc, char** argv) {
  Options options;
  PO_RETURN_IF_ERROR(pipeoffload::examples::ParseFlags(pipeoffload::examples::FlagArgs(argc, argv),
                                                       CopyBenchFlags(), options));
  return options;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double ElapsedSeconds(cudaEvent_t start, cudaEvent_t stop) {
  float ms = 0.0f;
  PO_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  return 1e-3 * static_cast<double>(ms);
}

struct PinnedDeleter {
  void operator()(void* ptr) const { PO_CUDA_LOG_IF_ERROR(cudaFreeHost(ptr)); }
};
struct DeviceDeleter {
  void operator()(void* ptr) const { PO_CUDA_LOG_IF_ERROR(cudaFree(ptr)); }
};
using PinnedPtr = std::unique_ptr<void, PinnedDeleter>;
using DevicePtr = std::unique_ptr<void, DeviceDeleter>;

class Bench {
 public:
  explicit Bench(const Options& options) : bytes_(options.size_mib << 20) {
    void* ptr = nullptr;
    PO_CUDA_CHECK(cudaHostAlloc(&ptr, static_cast<std::size_t>(bytes_), cudaHostAllocDefault));
    host_up_.reset(ptr);
    PO_CUDA_CHECK(cudaHostAlloc(&ptr, static_cast<std::size_t>(bytes_), cudaHostAllocDefault));
    host_down_.reset(ptr);
    PO_CUDA_CHECK(cudaMalloc(&ptr, static_cast<std::size_t>(bytes_)));
    device_up_.reset(ptr);
    PO_CUDA_CHECK(cudaMalloc(&ptr, static_cast<std::size_t>(bytes_)));
    device_down_.reset(ptr);
    // Touch every page so no first-use cost lands in a timed run.
    std::memset(host_up_.get(), 0x5A, static_cast<std::size_t>(bytes_));
    std::memset(host_down_.get(), 0, static_cast<std::size_t>(bytes_));
    PO_CUDA_CHECK(cudaMemset(device_down_.get(), 0x3C, static_cast<std::size_t>(bytes_)));
    for (cudaStream_t& stream : streams_) {
      PO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    }
    for (cudaEvent_t& event : events_) PO_CUDA_CHECK(cudaEventCreate(&event));
    PO_CUDA_CHECK(cudaDeviceSynchronize());
  }

  ~Bench() {
    for (cudaEvent_t event : events_) PO_CUDA_LOG_IF_ERROR(cudaEventDestroy(event));
    for (cudaStream_t stream : streams_) PO_CUDA_LOG_IF_ERROR(cudaStreamDestroy(stream));
  }

  std::int64_t bytes() const { return bytes_; }

  // One pinned copy on stream 0, timed by events around it.
  double OneWay(bool to_device) {
    PO_CUDA_CHECK(cudaEventRecord(events_[0], streams_[0]));
    if (to_device) {
      PO_CUDA_CHECK(cudaMemcpyAsync(device_up_.get(), host_up_.get(), Size(),
                                    cudaMemcpyHostToDevice, streams_[0]));
    } else {
      PO_CUDA_CHECK(cudaMemcpyAsync(host_down_.get(), device_down_.get(), Size(),
                                    cudaMemcpyDeviceToHost, streams_[0]));
    }
    PO_CUDA_CHECK(cudaEventRecord(events_[1], streams_[0]));
    PO_CUDA_CHECK(cudaEventSynchronize(events_[1]));
    return ElapsedSeconds(events_[0], events_[1]);
  }

  // H2D on stream 0 and D2H on stream 1, released together by one start event. Returns the
  // total time and each direction's time since the start.
  void Duplex(double* total, double* h2d, double* d2h) {
    PO_CUDA_CHECK(cudaEventRecord(events_[0], streams_[0]));
    PO_CUDA_CHECK(cudaStreamWaitEvent(streams_[1], events_[0], 0));
    PO_CUDA_CHECK(cudaMemcpyAsync(device_up_.get(), host_up_.get(), Size(),
                                  cudaMemcpyHostToDevice, streams_[0]));
    PO_CUDA_CHECK(cudaMemcpyAsync(host_down_.get(), device_down_.get(), Size(),
                                  cudaMemcpyDeviceToHost, streams_[1]));
    PO_CUDA_CHECK(cudaEventRecord(events_[1], streams_[0]));
    PO_CUDA_CHECK(cudaEventRecord(events_[2], streams_[1]));
    PO_CUDA_CHECK(cudaEventSynchronize(events_[1]));
    PO_CUDA_CHECK(cudaEventSynchronize(events_[2]));
    *h2d = ElapsedSeconds(events_[0], events_[1]);
    *d2h = ElapsedSeconds(events_[0], events_[2]);
    *total = std::max(*h2d, *d2h);
  }

  // A synchronous copy from pageable memory, timed on the host clock.
  double Pageable() {
    if (pageable_.empty()) pageable_.assign(static_cast<std::size_t>(bytes_), 0x77);
    const auto start = std::chrono::steady_clock::now();
    PO_CUDA_CHECK(cudaMemcpy(device_up_.get(), pageable_.data(), Size(), cudaMemcpyHostToDevice));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  // The copies moved real bytes: a pattern up and back down must come back intact.
  bool Verify() {
    auto* up = static_cast<unsigned char*>(host_up_.get());
    for (std::int64_t i = 0; i < bytes_; i += 4093) up[i] = static_cast<unsigned char>(i * 31);
    PO_CUDA_CHECK(cudaMemcpy(device_down_.get(), host_up_.get(), Size(), cudaMemcpyHostToDevice));
    PO_CUDA_CHECK(cudaMemcpy(host_down_.get(), device_down_.get(), Size(), cudaMemcpyDeviceToHost));
    return std::memcmp(host_up_.get(), host_down_.get(), Size()) == 0;
  }

 private:
  std::size_t Size() const { return static_cast<std::size_t>(bytes_); }

  const std::int64_t bytes_;
  PinnedPtr host_up_, host_down_;
  DevicePtr device_up_, device_down_;
  std::vector<unsigned char> pageable_;
  cudaStream_t streams_[2] = {nullptr, nullptr};
  cudaEvent_t events_[3] = {nullptr, nullptr, nullptr};
};

std::vector<Row> Run(Bench& bench, const Options& options) {
  const double bytes = static_cast<double>(bench.bytes());
  std::vector<Row> rows;
  for (const std::string& name : options.benchmarks) {
    if (name == "duplex") {
      Row total{"duplex total", kDuplexPeakGBs, 2 * bytes, {}};
      Row up{"duplex h2d", kDuplexPeakGBs / 2, bytes, {}};
      Row down{"duplex d2h", kDuplexPeakGBs / 2, bytes, {}};
      for (int rep = 0; rep < options.warmup + options.reps; ++rep) {
        double t = 0.0, h = 0.0, d = 0.0;
        bench.Duplex(&t, &h, &d);
        if (rep < options.warmup) continue;
        total.seconds.push_back(t);
        up.seconds.push_back(h);
        down.seconds.push_back(d);
      }
      rows.push_back(total);
      rows.push_back(up);
      rows.push_back(down);
      continue;
    }
    Row row{name, kOneWayPeakGBs, bytes, {}};
    for (int rep = 0; rep < options.warmup + options.reps; ++rep) {
      const double seconds = name == "h2d"   ? bench.OneWay(/*to_device=*/true)
                             : name == "d2h" ? bench.OneWay(/*to_device=*/false)
                                             : bench.Pageable();
      if (rep >= options.warmup) row.seconds.push_back(seconds);
    }
    rows.push_back(row);
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  const absl::StatusOr<Options> parsed = Parse(argc, argv);
  if (const std::optional<int> exit =
          pipeoffload::examples::FlagsExitCode("copy_bench", parsed, HelpText)) {
    return *exit;  // --help, or bad flags (2)
  }
  const Options& options = *parsed;
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count <= options.device) {
    std::fprintf(stderr, "copy_bench: SKIPPED: no usable GPU %d (cudaGetDeviceCount: %s, %d)\n",
                 options.device, error == cudaSuccess ? "ok" : cudaGetErrorString(error), count);
    return kNoGpuExitCode;
  }
  PO_CUDA_CHECK(cudaSetDevice(options.device));
  cudaDeviceProp properties{};
  PO_CUDA_CHECK(cudaGetDeviceProperties(&properties, options.device));
  int driver = 0, runtime = 0;
  PO_CUDA_CHECK(cudaDriverGetVersion(&driver));
  PO_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));

  Bench bench(options);
  const std::vector<Row> rows = Run(bench, options);
  const bool verified = bench.Verify();

  std::printf("copy_bench on %s (device %d, driver %d, runtime %d), %s, commit %s\n",
              properties.name, options.device, driver, runtime, date, options.commit.c_str());
  std::printf("buffers %lld MiB, median of %d reps after %d warm-up; data verified: %s\n\n",
              static_cast<long long>(options.size_mib), options.reps, options.warmup,
              verified ? "yes" : "NO");
  std::printf("| benchmark | median ms | median GB/s | min GB/s | max GB/s | %% of peak | "
              "peak GB/s |\n|---|---|---|---|---|---|---|\n");
  std::FILE* csv = options.csv.empty() ? nullptr : std::fopen(options.csv.c_str(), "w");
  if (!options.csv.empty() && csv == nullptr) {
    std::fprintf(stderr, "copy_bench: cannot write %s\n", options.csv.c_str());
    return 1;
  }
  if (csv != nullptr) {
    std::fprintf(csv, "# commit=%s date=%s device=%s size_mib=%lld reps=%d warmup=%d\n",
                 options.commit.c_str(), date, properties.name,
                 static_cast<long long>(options.size_mib), options.reps, options.warmup);
    std::fprintf(csv, "benchmark,median_ms,median_gbs,min_gbs,max_gbs,percent_of_peak,peak_gbs\n");
  }
  for (const Row& row : rows) {
    const double median = Median(row.seconds);
    const auto [fastest, slowest] = std::minmax_element(row.seconds.begin(), row.seconds.end());
    const double gbs = row.bytes_per_rep / median / 1e9;
    const double min_gbs = row.bytes_per_rep / *slowest / 1e9;
    const double max_gbs = row.bytes_per_rep / *fastest / 1e9;
    const double percent = 100.0 * gbs / row.peak_gbs;
    std::printf("| %s | %.2f | %.1f | %.1f | %.1f | %.0f%% | %.1f |\n", row.name.c_str(),
                1e3 * median, gbs, min_gbs, max_gbs, percent, row.peak_gbs);
    if (csv != nullptr) {
      std::fprintf(csv, "%s,%.4f,%.3f,%.3f,%.3f,%.1f,%.1f\n", row.name.c_str(), 1e3 * median,
                   gbs, min_gbs, max_gbs, percent, row.peak_gbs);
    }
  }
  if (csv != nullptr) std::fclose(csv);
  return verified ? 0 : 1;
}
