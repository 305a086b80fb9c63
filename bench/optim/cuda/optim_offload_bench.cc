// optim_offload_bench: the update phase of the optimizer-state offload (issue 6), measured and
// predicted, for every way of placing the state:
//   interleaved r   Deep Optimizer States: share r of the subgroups staged through the GPU each
//                   step (r = 0 is the CPU-only, ZeRO-Offload-style baseline), r swept in steps of
//                   --share-step plus the model's best r
//   static s        TwinFlow style: the last s of the subgroups live on the GPU for good
//   gpu             everything on the GPU (when it fits)
// Steps: 1. calibrate the model's rates on the engines' CUDA backend
// (lib/optim/update_calibration.h); 2. run optimizer steps on synthetic bf16 gradients
// (AddGradients of the whole range, WaitForGradients, then Step) and
// report per configuration the median update phase (OptimizerStepStats::update_seconds) of
// --steps steps after --warmup, GPU memory and PCIe GB/s. Steps run in rounds (one step of each
// configuration per round), so slow phases of a shared host hit all configurations alike.
// Phase 1 is the sweep; the model's rates are then fitted to its r = 0, 1 and 0.5 rows
// (FitRatesToSteps; marked [fit], where the fitted prediction is exact by construction).
// Phase 2 measures, side by side, the fitted model's r, the calibration-only model's r and the
// sweep's best r again. Every row shows both predictions.
//
// Host memory: interleaved keeps fp32 p, m, v and grads pinned, 16 B/param (+ the 4 B/param
// pageable initial values of this benchmark), so the H200 host's 125 GiB RAM caps --params at
// about 4e9 (64 GB pinned); 8e9 does not fit there. GB = 1e9 B.
//
// Flags: --params=N (2e9)  --subgroup=N (2^24)  --steps=N (3)  --warmup=N (1)
//        --share-step=X (0.1)  --static=0.25,0.5 (empty: none)  --no-gpu  --threads=N (0: all)
//        --calib-params=N (2^26)  --smoke (2^22 params, 2^18 subgroups, 1 step)
//        --help lists them (the table OffloadBenchFlags); bad flags exit 2.
// Prints markdown on stdout.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "examples/common/flags.h"
#include "lib/backend/cuda/cuda_check.h"
#include "lib/optim/update_calibration.h"
#include "lib/optim/update_model.h"
#include "pipeoffload/cuda.h"
#include "pipeoffload/optimizer_offload.h"

namespace pipeoffload {
namespace {

// What CTest's SKIP_RETURN_CODE turns into "skipped" (tests/gpu/CMakeLists.txt uses the same).
constexpr int kNoGpuExitCode = 77;

struct Flags {
  std::int64_t params = 2'000'000'000;
  std::int64_t subgroup = std::int64_t{1} << 24;
  int steps = 3;
  int warmup = 1;
  double share_step = 0.1;
  std::vector<double> statics = {0.25, 0.5};
  bool no_gpu = false;
  int threads = 0;
  std::int64_t calib_params = std::int64_t{1} << 26;
  std::string command;
  bool help = false;
};

using Flag = examples::FlagDef<Flags>;

// Counts take a number (2e9 as well as 2000000000), as they always have.
constexpr double kMaxCount = 1e15;

const std::vector<Flag>& OffloadBenchFlags() {
  using examples::RealFlag;
  static const auto* const kFlags = new std::vector<Flag>{
      RealFlag("params", "N", "parameters (default 2e9).", &Flags::params, 1, kMaxCount),
      RealFlag("subgroup", "N", "parameters per subgroup (default 2^24).", &Flags::subgroup, 1,
               kMaxCount),
      RealFlag("steps", "N", "timed optimizer steps per configuration (default 3).",
               &Flags::steps, 1, 1e6),
      RealFlag("warmup", "N", "untimed steps before them (default 1).", &Flags::warmup, 0, 1e6),
      RealFlag("share-step", "X", "the interleaved sweep's step of r (default 0.1).",
               &Flags::share_step, 0.001, 1e6),
      {"static", "S,S,...",
       "static shares to run, each in [0, 1] (default 0.25,0.5; empty: none).",
       [](Flags& f, const std::string& value) -> absl::Status {
         f.statics.clear();
         for (const absl::string_view item : absl::StrSplit(value, ',', absl::SkipEmpty())) {
           PO_ASSIGN_OR_RETURN(const double share,
                               examples::ParseFlagDouble("static", std::string(item), 0.0, 1.0));
           f.statics.push_back(share);
         }
         return absl::OkStatus();
       }},
      examples::SwitchFlag("no-gpu", "skip the all-GPU configuration.", &Flags::no_gpu),
      RealFlag("threads", "N", "CPU Adam threads (default 0: all).", &Flags::threads, 0, 1e6),
      RealFlag("calib-params", "N", "parameters of the calibration runs (default 2^26).",
               &Flags::calib_params, 1024, kMaxCount),
      {"smoke", "", "2^22 params, 2^18 subgroups, 1 step, 2^20 calibration params.",
       [](Flags& f, const std::string&) {
         f.params = std::int64_t{1} << 22;
         f.subgroup = std::int64_t{1} << 18;
         f.steps = 1;
         f.calib_params = std::int64_t{1} << 20;
         return absl::OkStatus();
       }},
      examples::HelpFlag(&Flags::help),
  };
  return *kFlags;
}

constexpr char kHelpHeader[] =
    "usage: optim_offload_bench [flags]\n"
    "\n"
    "The update phase of the optimizer-state offload, measured and predicted, for every\n"
    "placement of the state: interleaved r (swept by --share-step, plus the model's best r),\n"
    "static s (--static), all on the GPU. Prints markdown on stdout; exits 77 without a GPU.\n";

std::string HelpText() { return examples::FlagsHelpText(kHelpHeader, OffloadBenchFlags()); }

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  f.command = examples::CommandLine(argc, argv);
  PO_RETURN_IF_ERROR(examples::ParseFlags(examples::FlagArgs(argc, argv), OffloadBenchFlags(), f));
  return f;
}

template <typename T>
void Require(const absl::StatusOr<T>& value, const char* what) {
  if (!value.ok()) {
    std::fprintf(stderr, "optim_offload_bench: %s: %s\n", what, value.status().ToString().c_str());
    std::exit(1);
  }
}
void Require(const absl::Status& status, const char* what) {
  Require(absl::StatusOr<int>(status.ok() ? absl::StatusOr<int>(0) : status), what);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Row {
  std::string config;
  OffloadMode mode = OffloadMode::kInterleaved;
  double share = 0.0;
  int gpu_subgroups = 0;
  double seconds = 0.0;           // median update phase
  double cpu_adam_seconds = 0.0;  // median time inside CpuAdam::Update
  double grad_seconds = 0.0;      // median gradient path (backward side)
  UpdatePrediction calibrated;    // the model on the micro-benchmark rates
  UpdatePrediction fitted;        // the model on the rates fitted to r = 0, 1 and 0.5
  double state_gb = 0.0;          // GPU optimizer state this configuration needs
  double grad_gb = 0.0;           // GPU fp32 gradients it needs
  double h2d_gbps = 0.0;
  double d2h_gbps = 0.0;
};

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Sample {
  double update = 0.0, cpu = 0.0, grad = 0.0, h2d_gbps = 0.0, d2h_gbps = 0.0;
};

// One training-step's worth of optimizer work: the gradients of every parameter (the gradient
// path, timed to WaitForGradients), then Step.
Sample StepOnce(const Flags& flags, OptimizerOffload& engine, const std::uint16_t* grads) {
  const auto start = std::chrono::steady_clock::now();
  Require(engine.AddGradients(grads, 0, flags.params), "AddGradients");
  Require(engine.WaitForGradients(), "WaitForGradients");
  Sample sample;
  sample.grad = Seconds(start, std::chrono::steady_clock::now());
  Require(engine.Step(1.0f), "Step");
  const OptimizerStepStats stats = engine.last_step_stats();
  sample.update = stats.update_seconds;
  sample.cpu = stats.cpu_adam_seconds;
  sample.h2d_gbps = static_cast<double>(stats.h2d_bytes) / stats.update_seconds / 1e9;
  sample.d2h_gbps = static_cast<double>(stats.d2h_bytes) / stats.update_seconds / 1e9;
  return sample;
}

// Measures every row on `engine` in rounds: each round runs one step of each row in turn
// (SetGpuShare first in kInterleaved), so a slow phase of the host (another tenant, a
// frequency change) hits every row alike instead of the rows measured while it lasted. The
// first --warmup rounds are not timed; each row reports the median of the --steps others.
void MeasureRounds(const Flags& flags, OptimizerOffload& engine, const std::uint16_t* grads,
                   std::vector<Row>& rows) {
  std::vector<std::vector<Sample>> samples(rows.size());
  for (int round = 0; round < flags.warmup + flags.steps; ++round) {
    for (std::size_t i = 0; i < rows.size(); ++i) {
      if (rows[i].mode == OffloadMode::kInterleaved) {
        Require(engine.SetGpuShare(rows[i].share), "SetGpuShare");
      }
      const Sample sample = StepOnce(flags, engine, grads);
      if (round >= flags.warmup) samples[i].push_back(sample);
    }
  }
  const double s = static_cast<double>(std::min(flags.subgroup, flags.params));
  const OptimizerMemory memory = engine.memory();
  for (std::size_t i = 0; i < rows.size(); ++i) {
    Row& row = rows[i];
    auto median = [&](double Sample::*field) {
      std::vector<double> v;
      for (const Sample& x : samples[i]) v.push_back(x.*field);
      return Median(v);
    };
    row.seconds = median(&Sample::update);
    row.cpu_adam_seconds = median(&Sample::cpu);
    row.grad_seconds = median(&Sample::grad);
    row.h2d_gbps = median(&Sample::h2d_gbps);
    row.d2h_gbps = median(&Sample::d2h_gbps);
    if (row.mode == OffloadMode::kInterleaved) {
      Require(engine.SetGpuShare(row.share), "SetGpuShare");
    }
    int gpu = 0;
    for (SubgroupPlace place : engine.placement()) gpu += place != SubgroupPlace::kCpu;
    row.gpu_subgroups = gpu;
    // What this configuration needs on the GPU (the sweep's engine allocates for r up to 1):
    // staged subgroups need two staging sets and their fp32 gradients; resident ones all.
    if (row.mode == OffloadMode::kInterleaved) {
      row.state_gb = std::min(gpu, 2) * 12.0 * s / 1e9;
      row.grad_gb = gpu * 4.0 * s / 1e9;
    } else {
      row.state_gb = static_cast<double>(memory.device_state_bytes) / 1e9;
      row.grad_gb = static_cast<double>(memory.device_grad_bytes) / 1e9;
    }
    std::fprintf(stderr, "%s r=%.3f: %.3f s\n", row.config.c_str(), row.share, row.seconds);
  }
}

Row NewRow(const std::string& config, OffloadMode mode, double share) {
  Row row;
  row.config = config;
  row.mode = mode;
  row.share = share;
  return row;
}

OptimizerOffloadOptions EngineOptions(const Flags& flags, OffloadMode mode, double share) {
  OptimizerOffloadOptions o;
  o.num_params = flags.params;
  o.subgroup_size = flags.subgroup;
  o.mode = mode;
  o.gpu_share = share;
  o.cpu.threads = flags.threads;
  o.adam.weight_decay = 0.01f;
  if (mode == OffloadMode::kInterleaved) o.max_gpu_share = 1.0;
  return o;
}

int Main(int argc, char** argv) {
  const absl::StatusOr<Flags> parsed = ParseFlags(argc, argv);
  if (const std::optional<int> exit =
          examples::FlagsExitCode("optim_offload_bench", parsed, HelpText)) {
    return *exit;  // --help, or bad flags (2)
  }
  const Flags& flags = *parsed;
  const SubgroupLayout layout{flags.params, flags.subgroup};
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "optim_offload_bench: SKIPPED: no usable CUDA device\n");
    return kNoGpuExitCode;
  }
  cudaDeviceProp prop{};
  PO_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  // The engines run on a CUDA backend of device 0, as a trainer's stage does.
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCudaBackend({0});
  Require(backend, "CUDA backend");
  const std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::printf("## Optimizer-state offload: update phase\n\n");
  std::printf("%s, %s, %u host threads. Command: `%s`\n\n", date, prop.name,
              std::thread::hardware_concurrency(), flags.command.c_str());
  std::printf("%lld params in %lld subgroups of %lld; median of %d steps after %d warm-up.\n\n",
              static_cast<long long>(flags.params), static_cast<long long>(layout.num_subgroups()),
              static_cast<long long>(flags.subgroup), flags.steps, flags.warmup);

  CalibrationOptions calibration;
  calibration.params = flags.calib_params;
  calibration.cpu.threads = flags.threads;
  const auto calib_start = std::chrono::steady_clock::now();
  const absl::StatusOr<UpdateRates> rates = CalibrateUpdateRates(**backend, calibration);
  Require(rates, "calibration");
  std::printf("Calibration (%.1f s, %lld params): %s\n\n",
              Seconds(calib_start, std::chrono::steady_clock::now()),
              static_cast<long long>(flags.calib_params), FormatUpdateRates(*rates).c_str());
  const absl::StatusOr<UpdatePrediction> best_calibrated = BestInterleavedShare(*rates, layout);
  Require(best_calibrated, "model");
  std::fflush(stdout);

  // Device buffers the trainer would own: bf16 params and grads (every grad 0x3C3C ~ 0.0115).
  void* params_bf16 = nullptr;
  void* grads_bf16 = nullptr;
  PO_CUDA_CHECK(cudaMalloc(&params_bf16, static_cast<std::size_t>(flags.params) * 2));
  PO_CUDA_CHECK(cudaMalloc(&grads_bf16, static_cast<std::size_t>(flags.params) * 2));
  PO_CUDA_CHECK(cudaMemset(grads_bf16, 0x3C, static_cast<std::size_t>(flags.params) * 2));
  const std::vector<float> initial(static_cast<std::size_t>(flags.params), 0.01f);
  const std::span<std::uint16_t> device_params(static_cast<std::uint16_t*>(params_bf16),
                                               static_cast<std::size_t>(flags.params));
  const auto* grads = static_cast<const std::uint16_t*>(grads_bf16);

  std::vector<Row> rows;
  UpdateRates fitted = *rates;
  Row best_again;         // phase 2's re-measurement of the sweep's best share
  Row fitted_choice;      // phase 2: the fitted model's r
  Row calibrated_choice;  // phase 2: the calibration-only model's r
  {
    const auto create_start = std::chrono::steady_clock::now();
    auto engine = OptimizerOffload::Create(
        **backend, EngineOptions(flags, OffloadMode::kInterleaved, 0.0), initial, device_params);
    Require(engine, "create interleaved engine");
    std::printf("Interleaved engine created in %.1f s (%.1f GB pinned).\n\n",
                Seconds(create_start, std::chrono::steady_clock::now()),
                static_cast<double>((*engine)->memory().pinned_host_bytes) / 1e9);
    std::fflush(stdout);
    // Phase 1: the sweep, in rounds. The model is then fitted to r = 0, 1 and 0.5 ([fit]).
    std::vector<Row> sweep;
    const int steps = static_cast<int>(std::lround(1.0 / flags.share_step));
    for (int k = 0; k <= steps; ++k) {
      const double share = k == steps ? 1.0 : std::min(1.0, k * flags.share_step);
      const bool fit_point = k == 0 || k == steps || std::abs(share - 0.5) < 1e-9;
      const std::string name = k == 0 ? "cpu only (interleaved r=0)" : "interleaved";
      sweep.push_back(NewRow(fit_point ? name + " [fit]" : name, OffloadMode::kInterleaved, share));
    }
    if (std::none_of(sweep.begin(), sweep.end(),
                     [](const Row& r) { return std::abs(r.share - 0.5) < 1e-9; })) {
      sweep.push_back(NewRow("interleaved [fit]", OffloadMode::kInterleaved, 0.5));  // for the fit
    }
    MeasureRounds(flags, **engine, grads, sweep);
    double cpu_only = 0.0, all_staged = 0.0;
    MeasuredStep mixed;
    const Row* best_of_sweep = &sweep.front();
    for (const Row& row : sweep) {
      if (row.share == 0.0) cpu_only = row.seconds;
      if (row.share == 1.0) all_staged = row.seconds;
      if (std::abs(row.share - 0.5) < 1e-9) mixed = MeasuredStep{0.5, row.seconds};  // present
      if (row.seconds < best_of_sweep->seconds) best_of_sweep = &row;
    }
    const absl::StatusOr<UpdateRates> fit =
        FitRatesToSteps(*rates, layout, cpu_only, all_staged, &mixed);
    if (fit.ok()) {
      fitted = *fit;
      std::printf("Rates fitted to the measured r = 0, 1 and 0.5 steps: %s\n\n",
                  FormatUpdateRates(fitted).c_str());
    } else {
      std::printf("Fit failed (%s); the fitted columns use the calibration.\n\n",
                  fit.status().ToString().c_str());
    }
    const absl::StatusOr<UpdatePrediction> best = BestInterleavedShare(fitted, layout);
    Require(best, "model");
    // Phase 2, in rounds of its own: both models' r against the sweep's best r, measured
    // side by side (so the comparison does not depend on when phase 1 ran).
    std::vector<Row> choices = {
        NewRow("interleaved (model's r, fitted)", OffloadMode::kInterleaved, best->share),
        NewRow("interleaved (model's r, calibrated)", OffloadMode::kInterleaved,
               best_calibrated->share),
        NewRow("interleaved (sweep's best r, again)", OffloadMode::kInterleaved,
               best_of_sweep->share)};
    MeasureRounds(flags, **engine, grads, choices);
    fitted_choice = choices[0];
    calibrated_choice = choices[1];
    best_again = choices[2];
    rows = sweep;
    rows.insert(rows.end(), choices.begin(), choices.end());
  }
  for (double s : flags.statics) {
    auto engine = OptimizerOffload::Create(
        **backend, EngineOptions(flags, OffloadMode::kStatic, s), initial, device_params);
    if (!engine.ok()) {
      std::printf("static %.2f: not run: %s\n\n", s, engine.status().ToString().c_str());
      continue;
    }
    std::vector<Row> one = {NewRow("static (TwinFlow)", OffloadMode::kStatic, s)};
    MeasureRounds(flags, **engine, grads, one);
    rows.push_back(one.front());
  }
  if (!flags.no_gpu) {
    auto engine = OptimizerOffload::Create(
        **backend, EngineOptions(flags, OffloadMode::kGpu, 1.0), initial, device_params);
    if (!engine.ok()) {
      std::printf("gpu: not run: %s\n\n", engine.status().ToString().c_str());
    } else {
      std::vector<Row> one = {NewRow("gpu (all state on the GPU)", OffloadMode::kGpu, 1.0)};
      MeasureRounds(flags, **engine, grads, one);
      rows.push_back(one.front());
    }
  }
  for (Row& row : rows) {
    auto cal = PredictUpdate(*rates, layout, row.mode, row.share);
    auto fit = PredictUpdate(fitted, layout, row.mode, row.share);
    Require(cal, "model");
    Require(fit, "model");
    row.calibrated = *cal;
    row.fitted = *fit;
  }

  auto order = [](const Row& r) {
    if (r.mode == OffloadMode::kStatic) return 2;
    if (r.mode == OffloadMode::kGpu) return 3;
    const bool phase2 =
        r.config.find("model") != std::string::npos || r.config.find("again") != std::string::npos;
    return phase2 ? 1 : 0;
  };
  std::stable_sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) {
    return order(a) != order(b) ? order(a) < order(b) : a.share < b.share;
  });
  const double cpu_seconds = rows.front().seconds;  // r = 0 sorts first
  std::printf(
      "| configuration | r | GPU subgroups | update s | predicted s: calibrated / fitted | "
      "speed-up vs cpu | CPU Adam s (fitted) | GPU opt. state GB | GPU fp32 grads GB | H2D GB/s | "
      "D2H GB/s | grad path s (predicted) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf(
        "| %s | %.3f | %d | %.3f | %.3f (%+.1f%%) / %.3f (%+.1f%%) | %.2fx | %.3f (%.3f) | %.2f | "
        "%.2f | %.1f | %.1f | %.3f (%.3f) |\n",
        r.config.c_str(), r.share, r.gpu_subgroups, r.seconds, r.calibrated.seconds,
        100.0 * (r.calibrated.seconds - r.seconds) / r.seconds, r.fitted.seconds,
        100.0 * (r.fitted.seconds - r.seconds) / r.seconds, cpu_seconds / r.seconds,
        r.cpu_adam_seconds, r.fitted.cpu_busy_seconds, r.state_gb, r.grad_gb, r.h2d_gbps,
        r.d2h_gbps, r.grad_seconds, r.fitted.grad_path_seconds);
  }
  double worst_fitted = 0.0;
  for (const Row& r : rows) {
    if (r.mode == OffloadMode::kInterleaved && r.config.find("[fit]") == std::string::npos) {
      worst_fitted = std::max(worst_fitted, std::abs(r.fitted.seconds - r.seconds) / r.seconds);
    }
  }
  std::printf(
      "\nMeasured side by side: the sweep's best r = %.3f took %.3f s (%.2fx vs cpu only); the "
      "fitted model's r = %.3f took %.3f s (%+.1f%%), the calibration-only model's r = %.3f "
      "took %.3f s (%+.1f%%). Worst |fitted prediction error| over the interleaved rows not "
      "used by the fit: %.1f%%.\n",
      best_again.share, best_again.seconds, cpu_seconds / best_again.seconds, fitted_choice.share,
      fitted_choice.seconds,
      100.0 * (fitted_choice.seconds - best_again.seconds) / best_again.seconds,
      calibrated_choice.share, calibrated_choice.seconds,
      100.0 * (calibrated_choice.seconds - best_again.seconds) / best_again.seconds,
      100.0 * worst_fitted);
  PO_CUDA_CHECK(cudaFree(params_bf16));
  PO_CUDA_CHECK(cudaFree(grads_bf16));
  return 0;
}

}  // namespace
}  // namespace pipeoffload

int main(int argc, char** argv) { return pipeoffload::Main(argc, argv); }
