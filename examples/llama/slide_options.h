// slide_train's command line: every flag, its parsing (examples/common/flags.h) and its help.
// Pure functions of the arguments; no I/O.
#ifndef PIPEOFFLOAD_EXAMPLES_LLAMA_SLIDE_OPTIONS_H_
#define PIPEOFFLOAD_EXAMPLES_LLAMA_SLIDE_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "examples/llama/llama_data.h"
#include "pipeoffload/layer_sliding.h"

namespace pipeoffload::llama {

enum class SlideBackend : std::uint8_t { kAuto, kCpu, kCuda };

struct SlideTrainOptions {
  // The model.
  std::string model = "tiny";  // --model NAME (LlamaConfigByName)
  std::string config_path;     // --config FILE (a Hugging Face config.json), wins over --model
  std::string load_path;       // --load: a safetensors checkpoint (dir, index or file)
  std::string save_path;       // --save DIR at the end
  std::string save_dtype = "bf16";
  std::uint64_t init_seed = 1234;
  bool model_given = false;

  // Data and batch.
  std::string data_path;  // empty: the embedded synthetic corpus
  DataFormat data_format = DataFormat::kAuto;
  std::uint64_t data_seed = 1;
  int batch = 1;          // sequences per microbatch
  int seq = 256;
  int microbatches = 1;   // gradient accumulation steps per optimizer step
  std::int64_t steps = 20;

  // The optimizer and its schedule.
  float lr = 3e-4f;
  float min_lr = -1.0f;  // cosine decay to this at the last step; < 0: lr / 10
  std::int64_t warmup_steps = 0;
  float weight_decay = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float epsilon = 1e-8f;
  double clip = 1.0;  // max global gradient norm; 0 off

  // The engine.
  SlideBackend backend = SlideBackend::kAuto;
  // 0: the device's free memory less 2 GiB; on the CPU backend what an all-sliding plan needs.
  std::int64_t gpu_memory_budget = 0;
  int slots = 0;
  std::string resident = "auto";  // auto | none | all | a list of unit indices "0,1,33"
  UpdateTiming update_timing = UpdateTiming::kOverlapped;
  int landing_buffers = 0;
  std::int64_t grad_chunk = std::int64_t{1} << 25;
  std::string nvme_dir;
  double nvme_fraction = 0.0;
  double nvme_checkpoints = 0.0;  // SlidingOptions::nvme_checkpoint_fraction
  int cpu_threads = 0;  // CPU Adam threads, 0: every CPU this process may use
  int ce_chunk_rows = 0;

  // Output.
  bool dry_run = false;
  std::string trace_path;
  std::string json_path;
  double assume_tflops = 600.0;        // --dry-run's GPU rate
  double assume_pcie_gbps = 45.0;      // per direction
  double assume_cpu_adam_gparams = 4.5;  // CPU Adam rate while the copy engines run

  bool help = false;
};

// Parses argv[1..]. Errors: InvalidArgument naming the flag (unknown flag, missing value, bad
// number, bad choice, conflicting flags).
[[nodiscard]] absl::StatusOr<SlideTrainOptions> ParseSlideTrainOptions(
    const std::vector<std::string>& args);

std::string SlideTrainHelpText();

}  // namespace pipeoffload::llama

#endif  // PIPEOFFLOAD_EXAMPLES_LLAMA_SLIDE_OPTIONS_H_
