// slide_train's driver (slide_train.h).
#include "examples/llama/slide_train.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <optional>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "examples/llama/llama_checkpoint.h"
#include "examples/llama/llama_config.h"
#include "examples/llama/llama_config_io.h"
#include "examples/llama/llama_cpu_model.h"
#include "examples/llama/llama_init.h"
#include "examples/llama/slide_device.h"
#include "lib/base/status_macros.h"
#include "lib/slide/nvme_store.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/layer_sliding.h"

namespace pipeoffload::llama {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// VmRSS and VmHWM of /proc/self/status, in bytes (-1 when unknown).
std::pair<std::int64_t, std::int64_t> HostMemory() {
  std::ifstream status("/proc/self/status");
  std::string line;
  std::int64_t rss = -1, hwm = -1;
  while (std::getline(status, line)) {
    long long kib = 0;
    if (std::sscanf(line.c_str(), "VmRSS: %lld kB", &kib) == 1) rss = kib * 1024;
    if (std::sscanf(line.c_str(), "VmHWM: %lld kB", &kib) == 1) hwm = kib * 1024;
  }
  return {rss, hwm};
}

absl::StatusOr<LlamaConfig> ResolveConfig(const SlideTrainOptions& o) {
  if (!o.config_path.empty()) return ParseHfConfigFile(o.config_path);
  if (!o.model_given && !o.load_path.empty()) {
    const std::filesystem::path config = std::filesystem::path(o.load_path) / "config.json";
    std::error_code error;
    if (std::filesystem::is_regular_file(config, error)) return ParseHfConfigFile(config.string());
  }
  return LlamaConfigByName(o.model);
}

absl::StatusOr<TokenData> LoadData(const SlideTrainOptions& o) {
  if (o.data_path.empty()) return TokenData::Synthetic();
  return TokenData::FromFile(o.data_path, o.data_format);
}

// --save's destination, checked before any work so that a run never trains only to find it
// cannot save: SaveLlamaCheckpoint's rule (DIR does not exist or is an empty directory) and a
// parent directory it can create DIR in.
absl::Status CheckSaveDestination(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::path path(dir);
  while (path.has_relative_path() && !path.has_filename()) path = path.parent_path();  // "a/b/"
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (fs::exists(status)) {
    if (!fs::is_directory(status)) {
      return absl::FailedPreconditionError(
          absl::StrCat("--save '", dir, "' exists and is not a directory"));
    }
    if (!fs::is_empty(path, error) || error) {
      return absl::FailedPreconditionError(
          absl::StrCat("--save '", dir, "' exists and is not empty; refusing to overwrite ",
                       "(choose a new directory)"));
    }
    return absl::OkStatus();
  }
  const fs::path parent = path.has_parent_path() ? path.parent_path() : fs::path(".");
  if (!fs::is_directory(parent, error)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--save '", dir, "': its parent '", parent.string(), "' is not an existing directory"));
  }
  if (::access(parent.c_str(), W_OK) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("--save '", dir, "': cannot write in '",
                                                    parent.string(), "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// --resident as a placement (empty: planned).
absl::Status ApplyResident(const SlideTrainOptions& o, int num_units, SlidingOptions& s) {
  if (o.resident == "auto") return absl::OkStatus();
  if (o.resident == "all") {
    s.all_resident = true;
    return absl::OkStatus();
  }
  s.placement.assign(static_cast<std::size_t>(num_units), UnitPlace::kSliding);
  if (o.resident == "none") return absl::OkStatus();
  for (absl::string_view part : absl::StrSplit(o.resident, ',')) {
    int unit = -1;
    if (!absl::SimpleAtoi(part, &unit) || unit < 0 || unit >= num_units) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--resident expects auto, none, all or unit indices in [0, ", num_units,
          ") separated by commas, got '", o.resident, "'"));
    }
    s.placement[static_cast<std::size_t>(unit)] = UnitPlace::kResident;
  }
  return absl::OkStatus();
}

std::string Gib(std::int64_t bytes) {
  if (bytes < (std::int64_t{1} << 30)) return absl::StrFormat("%.3g MiB", bytes / 1048576.0);
  return absl::StrFormat("%.2f GiB", bytes / kGiB);
}

// The drive behind --nvme-dir, measured through the engine's own I/O path before anything is
// allocated (so a missing, read-only or full directory fails here, before training): up to
// 2 GiB written and read back. Prints one line.
absl::StatusOr<NvmeBandwidth> MeasureNvmeDrive(const SlideTrainOptions& o,
                                               const SlidingPlan& plan, std::ostream& out) {
  NvmeStoreOptions probe;
  probe.dir = o.nvme_dir;
  const std::int64_t align = NvmeStore::kAlignment;
  probe.capacity_bytes = std::clamp<std::int64_t>((plan.nvme_bytes + align - 1) / align * align,
                                                  std::int64_t{64} << 20, std::int64_t{2} << 30);
  absl::StatusOr<NvmeBandwidth> bandwidth = MeasureNvmeBandwidth(probe);
  if (!bandwidth.ok()) {
    return Annotate(bandwidth.status(), absl::StrCat("--nvme-dir ", o.nvme_dir));
  }
  out << absl::StrFormat("nvme: %s written at %.2f GB/s, read at %.2f GB/s (%s, %s)\n",
                         Gib(bandwidth->bytes), bandwidth->write_gb_per_s,
                         bandwidth->read_gb_per_s, bandwidth->backend,
                         bandwidth->direct_io ? "O_DIRECT" : "buffered")
      << std::flush;
  return bandwidth;
}

// --dry-run's step estimate: each engine's work at the assumed rates (the NVMe tier's at the
// rates just measured). A lower bound: the step is at least the busiest engine's time (plus
// what cannot overlap, which the trace shows).
void PrintEstimate(const SlideTrainOptions& o, const LlamaConfig& config,
                   const SlidingModelShape& shape, const SlidingPlan& plan,
                   const std::optional<NvmeBandwidth>& nvme, std::ostream& out) {
  const double tokens = static_cast<double>(o.batch) * o.seq * o.microbatches;
  double decoder_matrix = 0.0, sliding_params = 0.0, resident_params = 0.0, upload = 0.0;
  for (int u = 0; u < NumUnits(config); ++u) {
    const double n = static_cast<double>(shape.units[static_cast<std::size_t>(u)].param_count);
    (plan.placement[static_cast<std::size_t>(u)] == UnitPlace::kSliding ? sliding_params
                                                                        : resident_params) += n;
    if (plan.placement[static_cast<std::size_t>(u)] == UnitPlace::kSliding) upload += 2 * n;
    if (u != EmbeddingUnit() && u != HeadUnit(config)) decoder_matrix += n;
  }
  const double model_flops = ModelFlopsPerToken(config, o.seq) * tokens;
  const double recompute = 2.0 * decoder_matrix * tokens +
                           4.0 * o.seq * config.num_heads * config.head_dim * config.num_layers * tokens;
  const double dtype = static_cast<double>(SlideDtypeBytes(shape.param_dtype));
  const double checkpoints =
      static_cast<double>(std::max(0, NumUnits(config) - 3)) * o.microbatches * shape.activation_bytes;
  const double gpu = (model_flops + recompute) / (o.assume_tflops * 1e12);
  const double h2d = (upload * dtype / 2 + checkpoints) / (o.assume_pcie_gbps * 1e9);
  const double d2h = (sliding_params * dtype + checkpoints) / (o.assume_pcie_gbps * 1e9);
  const double cpu = sliding_params / (o.assume_cpu_adam_gparams * 1e9);
  // Every step reads and writes back all of the tier's m, v and writes and reads back each of
  // its checkpoints once, on one drive.
  const double drive =
      nvme.has_value() && plan.nvme_bytes > 0
          ? plan.nvme_bytes / (nvme->read_gb_per_s * 1e9) + plan.nvme_bytes / (nvme->write_gb_per_s * 1e9)
          : 0.0;
  const double step = std::max({gpu, h2d, d2h, cpu, drive});
  out << absl::StrFormat(
      "predicted step (lower bound, each engine alone at --assume-* rates): GPU %.3f s "
      "(%.1f TFLOP incl. recompute at %.0f TFLOP/s), H2D %.3f s, D2H %.3f s, CPU Adam %.3f s "
      "(%.2fG sliding params at %.2fG/s)%s -> >= %.3f s, <= %.0f tokens/s, <= %.1f model "
      "TFLOP/s\n",
      gpu, (model_flops + recompute) / 1e12, o.assume_tflops, h2d, d2h, cpu,
      sliding_params / 1e9, o.assume_cpu_adam_gparams,
      drive > 0.0 ? absl::StrFormat(", NVMe %.3f s (%s of state and checkpoints each way)",
                                    drive, Gib(plan.nvme_bytes))
                  : std::string(),
      step, tokens / step, model_flops / step / 1e12);
}

std::string StepLine(std::int64_t step, std::int64_t steps, double loss, float lr,
                     const SlidingStepResult& r, double seconds, double tokens, double flops,
                     std::int64_t device_bytes, std::int64_t budget) {
  const auto [rss, hwm] = HostMemory();
  std::string line = absl::StrFormat(
      "step %d/%d | loss %.4f | lr %.2e | norm %.3f", step, steps, loss, lr, r.grad_norm);
  if (r.clip_coefficient < 1.0f) absl::StrAppendFormat(&line, " (clip x%.3f)", r.clip_coefficient);
  if (!r.applied) absl::StrAppend(&line, " (SKIPPED: non-finite)");
  absl::StrAppendFormat(&line, " | %.3f s | %.0f tok/s | %.4g TFLOP/s", seconds,
                        tokens / seconds, flops / seconds / 1e12);
  if (device_bytes >= 0) {
    absl::StrAppendFormat(&line, " | GPU %.2f/%.2f GiB", device_bytes / kGiB, budget / kGiB);
  }
  absl::StrAppendFormat(&line, " | host %.2f GiB (peak %.2f) | cpu adam %.2f s, waits %.2f s",
                        rss / kGiB, hwm / kGiB, r.cpu_adam_seconds, r.gpu_wait_seconds);
  if (r.nvme_checkpoint_bytes > 0) {
    absl::StrAppend(&line, " | NVMe checkpoints ", Gib(r.nvme_checkpoint_bytes));
  }
  return line;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace

float ScheduledLearningRate(const SlideTrainOptions& o, std::int64_t step) {
  if (step < o.warmup_steps) {
    return o.lr * static_cast<float>(step + 1) / static_cast<float>(o.warmup_steps);
  }
  const std::int64_t decay_steps = std::max<std::int64_t>(1, o.steps - o.warmup_steps - 1);
  const double progress =
      std::min(1.0, static_cast<double>(step - o.warmup_steps) / static_cast<double>(decay_steps));
  const double pi = 3.14159265358979323846;
  return static_cast<float>(o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(pi * progress)));
}

absl::StatusOr<SlideTrainSummary> RunSlideTrain(const SlideTrainOptions& o, std::ostream& out) {
  const double start = Now();
  PO_ASSIGN_OR_RETURN(const LlamaConfig config, ResolveConfig(o));
  PO_ASSIGN_OR_RETURN(const TokenData data, LoadData(o));
  PO_RETURN_IF_ERROR(data.CheckCompatible(config.vocab_size, o.seq));
  if (!o.load_path.empty()) PO_RETURN_IF_ERROR(CheckLlamaCheckpoint(o.load_path, config));
  if (!o.save_path.empty()) PO_RETURN_IF_ERROR(CheckSaveDestination(o.save_path));
  // auto: the GPU when there is one; a dry run plans the GPU run wherever the build has CUDA.
  const bool cuda = o.backend == SlideBackend::kCuda ||
                    (o.backend == SlideBackend::kAuto &&
                     (CudaGpuAvailable() || (o.dry_run && CudaInBuild())));
  const int num_units = NumUnits(config);
  const double tokens = static_cast<double>(o.batch) * o.seq * o.microbatches;
  const double flops_per_step = ModelFlopsPerToken(config, o.seq) * tokens;
  out << absl::StrFormat(
      "model %s (%s): %s parameters, %d layers, H %d, %d/%d heads, F %d, V %d%s\n",
      config.name, config.model_type,
      TotalParamCount(config) >= 1e9 ? absl::StrFormat("%.2fB", TotalParamCount(config) / 1e9)
                                      : absl::StrFormat("%.3gM", TotalParamCount(config) / 1e6),
      config.num_layers,
      config.hidden_size, config.num_heads, config.num_kv_heads, config.intermediate_size,
      config.vocab_size, config.tie_word_embeddings ? ", tied head" : "");
  out << absl::StrFormat("data %s: %d tokens; step = %d microbatches x %d x %d = %.0f tokens\n",
                         data.name(), data.size(), o.microbatches, o.batch, o.seq, tokens);

  SlideModelOptions model_options;
  model_options.batch = o.batch;
  model_options.seq = o.seq;
  model_options.microbatches = o.microbatches;
  model_options.data_seed = o.data_seed;
  model_options.ce_chunk_rows = o.ce_chunk_rows;

  // The device first (its free memory is the default budget), then the model on it.
  std::unique_ptr<Backend> backend;
  std::function<std::int64_t()> device_in_use = [] { return std::int64_t{-1}; };
  std::int64_t budget = o.gpu_memory_budget;
  if (cuda && !o.dry_run) {
    PO_ASSIGN_OR_RETURN(SlideGpu gpu, OpenCudaGpu());
    backend = std::move(gpu.backend);
    device_in_use = gpu.bytes_in_use;
    if (budget == 0) budget = gpu.free_bytes - (std::int64_t{2} << 30);
    out << absl::StrFormat("device %s: %s total, %s free\n", gpu.name, Gib(gpu.total_bytes),
                           Gib(gpu.free_bytes));
  } else if (!cuda) {
    PO_ASSIGN_OR_RETURN(backend, CreateCpuBackend());
  } else if (budget == 0) {
    budget = std::int64_t{141} * 1000 * 1000 * 1000 - (std::int64_t{2} << 30);  // an H200
  }

  std::unique_ptr<SlidingModel> model;
  SlidingModelShape shape;
  if (cuda) {
    if (o.dry_run) {
      PO_ASSIGN_OR_RETURN(shape, PlanCudaLlamaShape(config, model_options));
    } else {
      PO_ASSIGN_OR_RETURN(model, CreateCudaLlama(*backend, config, data, model_options));
      shape = model->Shape();
    }
  } else {
    LlamaCpuModelOptions cpu_options;
    cpu_options.batch_size = o.batch;
    cpu_options.seq_len = o.seq;
    cpu_options.max_microbatches = o.microbatches;
    cpu_options.data_seed = o.data_seed;
    cpu_options.ce_chunk_rows = o.ce_chunk_rows;
    PO_ASSIGN_OR_RETURN(std::unique_ptr<LlamaCpuModel> cpu_model,
                        LlamaCpuModel::Create(config, data, cpu_options));
    shape = cpu_model->Shape();
    model = std::move(cpu_model);
  }

  if (!cuda && budget == 0) {
    // The CPU backend has no device to fill: by default it slides every unit through the ring,
    // as a GPU too small for the model would (the budget of an all-sliding plan).
    SlidingOptions probe;
    probe.gpu_memory_budget_bytes = std::int64_t{1} << 50;
    probe.num_microbatches = o.microbatches;
    probe.num_slots = o.slots;
    probe.placement.assign(static_cast<std::size_t>(num_units), UnitPlace::kSliding);
    PO_ASSIGN_OR_RETURN(const SlidingPlan all_sliding, PlanSliding(shape, probe));
    budget = all_sliding.device_total_bytes;
  }
  SlidingOptions sliding;
  sliding.gpu_memory_budget_bytes = budget;
  sliding.num_microbatches = o.microbatches;
  sliding.num_slots = o.slots;
  PO_RETURN_IF_ERROR(ApplyResident(o, num_units, sliding));
  sliding.update_timing = o.update_timing;
  sliding.adam.learning_rate = o.lr;
  sliding.adam.beta1 = o.beta1;
  sliding.adam.beta2 = o.beta2;
  sliding.adam.epsilon = o.epsilon;
  sliding.adam.weight_decay = o.weight_decay;
  sliding.max_grad_norm = o.clip;
  // CPU Adam takes every CPU but one: the engine's thread must keep enqueueing device work.
  sliding.cpu.threads = o.cpu_threads > 0 ? o.cpu_threads
                                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency() - 1));
  sliding.grad_chunk_elements = o.grad_chunk;
  sliding.landing_buffers = o.landing_buffers;
  sliding.nvme_dir = o.nvme_dir;
  sliding.nvme_fraction = o.nvme_fraction;
  sliding.nvme_checkpoint_fraction = o.nvme_checkpoints;
  sliding.record_trace = !o.trace_path.empty();

  PO_ASSIGN_OR_RETURN(const SlidingPlan plan, PlanSliding(shape, sliding));
  out << absl::StrFormat("plan (budget %s, %s backend):\n", Gib(budget), cuda ? "cuda" : "cpu")
      << plan.Describe(shape);
  std::optional<NvmeBandwidth> nvme_bandwidth;
  if (!o.nvme_dir.empty()) {
    PO_ASSIGN_OR_RETURN(nvme_bandwidth, MeasureNvmeDrive(o, plan, out));
  }
  if (o.dry_run) {
    PrintEstimate(o, config, shape, plan, nvme_bandwidth, out);
    return SlideTrainSummary{};
  }

  out << "setup: creating the engine (pinning host memory takes a while for large models)\n"
      << std::flush;
  PO_ASSIGN_OR_RETURN(std::unique_ptr<LayerSlidingEngine> engine,
                      LayerSlidingEngine::Create(*backend, *model, sliding));
  const SlidingSetupStats setup = engine->setup_stats();
  out << absl::StrFormat(
      "setup: engine in %.1f s: device arena %s; pinned host %s in %.1f s; pageable host %s%s\n",
      setup.seconds, Gib(setup.device_bytes), Gib(setup.pinned_bytes), setup.pin_seconds,
      Gib(setup.pageable_bytes), setup.nvme.empty() ? "" : absl::StrCat("; NVMe: ", setup.nvme))
      << std::flush;

  const double init_start = Now();
  if (!o.load_path.empty()) {
    const int threads = static_cast<int>(std::max(1u, std::min(8u, std::thread::hardware_concurrency())));
    PO_RETURN_IF_ERROR(LoadLlamaCheckpoint(
        o.load_path, config,
        [&](int unit, std::span<const float> values) { return engine->SetUnitParams(unit, values); },
        threads));
    out << absl::StrFormat("setup: loaded %s in %.1f s\n", o.load_path, Now() - init_start);
  } else {
    std::vector<float> buffer;
    const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    for (int u = 0; u < num_units; ++u) {
      buffer.resize(static_cast<std::size_t>(UnitParamCount(config, u)));
      InitUnitParams(config, u, o.init_seed, buffer.data(), threads);
      PO_RETURN_IF_ERROR(engine->SetUnitParams(u, buffer));
    }
    out << absl::StrFormat("setup: random init (seed %d) in %.1f s; setup total %.1f s\n",
                           o.init_seed, Now() - init_start, Now() - start);
  }
  out << std::flush;

  SlideTrainSummary summary;
  std::vector<SlideRecord> records;
  for (std::int64_t step = 0; step < o.steps; ++step) {
    const float lr = ScheduledLearningRate(o, step);
    const double step_start = Now();
    PO_ASSIGN_OR_RETURN(SlidingStepResult result, engine->Step({lr}));
    PO_ASSIGN_OR_RETURN(const double loss, model->StepLoss());
    const double seconds = Now() - step_start;
    if (!std::isfinite(loss) || !std::isfinite(result.grad_norm)) {
      return absl::DataLossError(absl::StrFormat(
          "step %d: loss %f, gradient norm %f: training diverged%s", step + 1, loss,
          result.grad_norm,
          o.clip > 0 ? " (the step was skipped; lower --lr)"
                     : " (without --clip the update already ran: lower --lr or clip)"));
    }
    const std::int64_t device_bytes = device_in_use();
    summary.device_peak_bytes = std::max(summary.device_peak_bytes, device_bytes);
    summary.losses.push_back(loss);
    summary.step_seconds.push_back(seconds);
    out << StepLine(step + 1, o.steps, loss, lr, result, seconds, tokens, flops_per_step,
                    device_bytes, budget)
        << "\n"
        << std::flush;
    records.insert(records.end(), result.records.begin(), result.records.end());
  }
  PO_RETURN_IF_ERROR(engine->Flush());
  summary.host_peak_bytes = HostMemory().second;
  const std::vector<double> timed(summary.step_seconds.size() > 1 ? summary.step_seconds.begin() + 1
                                                                  : summary.step_seconds.begin(),
                                  summary.step_seconds.end());
  summary.median_step_seconds = Median(timed);
  summary.tokens_per_second = tokens / summary.median_step_seconds;
  summary.model_tflops = flops_per_step / summary.median_step_seconds / 1e12;
  out << absl::StrFormat(
      "summary: median step %.3f s (steps 2..%d), %.0f tokens/s, %.4g model TFLOP/s; loss "
      "%.4f -> %.4f (unigram entropy of the data %.4f); GPU peak %s of %s; host peak %s\n",
      summary.median_step_seconds, o.steps, summary.tokens_per_second, summary.model_tflops,
      summary.losses.front(), summary.losses.back(), data.UnigramEntropyNats(),
      Gib(summary.device_peak_bytes), Gib(budget), Gib(summary.host_peak_bytes));

  if (!o.trace_path.empty()) {
    std::ofstream trace(o.trace_path);
    trace << SlideRecordsToTraceJson(records);
    if (!trace) return absl::InternalError(absl::StrCat("cannot write --trace ", o.trace_path));
    out << "trace: " << records.size() << " records in " << o.trace_path << "\n";
  }
  if (!o.json_path.empty()) {
    std::ofstream json(o.json_path, std::ios::app);
    json << absl::StrFormat(
        "{\"model\":\"%s\",\"backend\":\"%s\",\"batch\":%d,\"seq\":%d,\"microbatches\":%d,"
        "\"tokens_per_step\":%.0f,\"budget_bytes\":%d,\"resident\":\"%s\",\"resident_units\":%d,"
        "\"slots\":%d,\"update_timing\":\"%s\",\"clip\":%g,\"nvme_fraction\":%g,"
        "\"nvme_checkpoints\":%g,"
        "\"median_step_s\":%.6f,\"tokens_per_s\":%.1f,\"model_tflops\":%.2f,"
        "\"device_peak_bytes\":%d,\"host_peak_bytes\":%d,\"first_loss\":%.6f,\"last_loss\":%.6f,"
        "\"setup_s\":%.2f,\"pin_s\":%.2f,\"pinned_bytes\":%d,\"pageable_bytes\":%d}\n",
        config.name, cuda ? "cuda" : "cpu", o.batch, o.seq, o.microbatches, tokens, budget,
        o.resident, plan.resident_units(), static_cast<int>(plan.slot_elements.size()),
        o.update_timing == UpdateTiming::kOverlapped ? "overlapped" : "after-backward", o.clip,
        o.nvme_fraction, o.nvme_checkpoints, summary.median_step_seconds, summary.tokens_per_second,
        summary.model_tflops, summary.device_peak_bytes, summary.host_peak_bytes,
        summary.losses.front(), summary.losses.back(), setup.seconds, setup.pin_seconds,
        setup.pinned_bytes, setup.pageable_bytes);
    if (!json) return absl::InternalError(absl::StrCat("cannot write --json ", o.json_path));
  }
  if (!o.save_path.empty()) {
    const SafetensorsDtype dtype = o.save_dtype == "fp32"   ? SafetensorsDtype::kF32
                                   : o.save_dtype == "fp16" ? SafetensorsDtype::kF16
                                                            : SafetensorsDtype::kBF16;
    const double save_start = Now();
    PO_RETURN_IF_ERROR(SaveLlamaCheckpoint(
        o.save_path, config,
        [&](int unit, std::span<float> values) { return engine->GetUnitParams(unit, values); },
        dtype));
    out << absl::StrFormat("saved %s (%s) in %.1f s\n", o.save_path, o.save_dtype, Now() - save_start);
  }
  return summary;
}

}  // namespace pipeoffload::llama
