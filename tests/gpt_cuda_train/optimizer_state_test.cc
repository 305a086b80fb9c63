// Where the CUDA GPT's optimizer state lives (issue 6: offload must free the GPU's copy):
//  - GptCudaStageModel created without optimizer state holds no fp32 master, m or v (12 bytes
//    per padded parameter less than with it, to the byte), refuses the GPU AdamW, DownloadMaster
//    and ParameterHashes with a FailedPrecondition that says why, and hands out its masters at
//    creation once (bitwise the CPU init's); DropOptimizerState takes a model created with it to
//    the same place and gives the memory back to the device (cudaMemGetInfo);
//  - CreateCudaTrainStage per --optimizer-offload mode: the GPU optimizer state is the model's
//    12 B/param with none, 0 with cpu, the engine's two staging subgroups with interleaved and
//    the resident share with static; and the device memory measured across creation shrinks by
//    the model's state, less what the engines add.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "examples/gpt/cuda/gpt_cuda_stage_model.h"
#include "examples/gpt/gpt_data.h"
#include "examples/gpt/gpt_params.h"
#include "examples/gpt/train_cuda/train_stage_cuda.h"
#include "examples/gpt/train_options.h"
#include "pipeoffload/cuda.h"
#include "tests/testing/catch.h"

namespace pipeoffload::gpt {
namespace {

using cuda::GptCudaStageModel;
using cuda::GptCudaStageOptions;

constexpr std::int64_t kSubgroup = 4096;

bool Contains(const absl::Status& status, const std::string& text) {
  return std::string(status.message()).find(text) != std::string::npos;
}

std::int64_t FreeDeviceBytes() {
  std::size_t free_bytes = 0, total_bytes = 0;
  REQUIRE(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess);
  return static_cast<std::int64_t>(free_bytes);
}

// A GPT whose per-stage state (tens of MB) stands well above cudaMalloc's rounding.
TrainOptions Options(const std::string& offload) {
  std::istringstream flags(
      "--backend cuda --transport local --stages 2 --schedule 1f1b --chunks 1 --embd 512 "
      "--layers 2 --seq 64 --batch 1 --microbatches 2 --steps 1 --watchdog 120");
  std::vector<std::string> args{std::istream_iterator<std::string>(flags), {}};
  args.insert(args.end(), {"--optimizer-offload", offload});
  if (offload != "none") args.insert(args.end(), {"--optimizer-subgroup", "4096"});
  absl::StatusOr<TrainOptions> options = ParseTrainOptions(args);
  INFO(options.status().ToString());
  REQUIRE(options.ok());
  return *options;
}

std::int64_t PaddedParams(GptCudaStageModel& model) {
  std::int64_t n = 0;
  for (int c = 0; c < model.chunks_per_stage(); ++c) n += model.chunk(c).params().padded_elements();
  return n;
}

TEST_CASE("a CUDA stage model without optimizer state holds none and refuses the GPU AdamW",
          "[cuda_train][optimizer_state]") {
  const GptConfig config = Options("cpu").config;
  auto data = std::make_shared<const GptData>(GptData::Synthetic());
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCudaBackend();
  INFO(backend.status().ToString());
  REQUIRE(backend.ok());
  absl::StatusOr<std::unique_ptr<GptCudaStageModel>> with =
      GptCudaStageModel::Create(**backend, config, 2, 1, 0, data,
                                GptCudaStageOptions{.with_optimizer_state = true});
  INFO(with.status().ToString());
  REQUIRE(with.ok());
  absl::StatusOr<std::unique_ptr<GptCudaStageModel>> without =
      GptCudaStageModel::Create(**backend, config, 2, 1, 0, data,
                                GptCudaStageOptions{.with_optimizer_state = false});
  INFO(without.status().ToString());
  REQUIRE(without.ok());

  const std::int64_t n = PaddedParams(**with);
  REQUIRE(n > 1000000);
  CHECK((*with)->has_optimizer_state());
  CHECK((*with)->optimizer_state_bytes() == 12 * n);
  CHECK_FALSE((*without)->has_optimizer_state());
  CHECK((*without)->optimizer_state_bytes() == 0);
  CHECK((*with)->device_bytes() - (*without)->device_bytes() == 12 * n);

  // The masters handed out are the GPU master of the model with state, bitwise, and that is the
  // CPU init (the token embedding, id 0, drawn here from the same seed).
  absl::StatusOr<std::vector<float>> masters = (*without)->TakeInitialMasters(0);
  INFO(masters.status().ToString());
  REQUIRE(masters.ok());
  REQUIRE(static_cast<std::int64_t>(masters->size()) == n);
  absl::StatusOr<std::vector<float>> gpu_masters = (*with)->DownloadMasters(0);
  REQUIRE(gpu_masters.ok());
  CHECK(std::memcmp(masters->data(), gpu_masters->data(), static_cast<std::size_t>(n) * 4) == 0);
  const std::vector<TensorSpec> specs = GptTensorSpecs(config);
  ParameterBlock cpu;
  cpu.Add(0, specs[0], false);
  cpu.Allocate(config.seed);
  const cuda::DeviceParameters& params = (*without)->chunk(0).params();
  const int wte = params.Find(0);
  REQUIRE(wte >= 0);
  CHECK(std::memcmp(masters->data() + params.tensors()[static_cast<std::size_t>(wte)].offset,
                    cpu.param(0), static_cast<std::size_t>(specs[0].numel()) * 4) == 0);
  // Same bf16 working copies.
  absl::StatusOr<std::vector<float>> w1 = (*with)->DownloadWeight(0);
  absl::StatusOr<std::vector<float>> w2 = (*without)->DownloadWeight(0);
  REQUIRE((w1.ok() && w2.ok()));
  CHECK(*w1 == *w2);

  // Taken once; a model with state has none to take; a bad chunk is named.
  absl::Status again = (*without)->TakeInitialMasters(0).status();
  CHECK(again.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Contains(again, "already taken"));
  CHECK((*with)->TakeInitialMasters(0).status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK((*without)->TakeInitialMasters(3).status().code() == absl::StatusCode::kInvalidArgument);

  // No GPU AdamW, no master to read, and the messages say why.
  absl::Status step = (*without)->OptimizerStep();
  INFO(step.ToString());
  CHECK(step.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Contains(step, "created without it"));
  CHECK(Contains(step, "optimizer-offload engine"));
  absl::Status read = (*without)->DownloadMaster(0).status();
  CHECK(read.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Contains(read, "created without it"));
  CHECK((*without)->ParameterHashes().status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK((*without)->DownloadMasters(0).status().code() == absl::StatusCode::kFailedPrecondition);

  // Dropping gives the 12 B/param back to the device.
  REQUIRE((*with)->Synchronize().ok());
  const std::int64_t free_before = FreeDeviceBytes();
  const std::int64_t bytes_before = (*with)->device_bytes();
  REQUIRE((*with)->DropOptimizerState().ok());
  const std::int64_t freed = FreeDeviceBytes() - free_before;
  INFO("freed " << freed << " B for " << 12 * n << " B of state");
  CHECK(freed >= 12 * n - (std::int64_t{4} << 20));  // cudaMalloc rounds to 2 MiB pages
  CHECK((*with)->device_bytes() == bytes_before - 12 * n);
  CHECK((*with)->optimizer_state_bytes() == 0);
  CHECK_FALSE((*with)->has_optimizer_state());
  absl::Status dropped = (*with)->OptimizerStep();
  CHECK(dropped.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Contains(dropped, "dropped by DropOptimizerState"));
  CHECK(Contains((*with)->DownloadMaster(0).status(), "optimizer-offload engine"));
  CHECK((*with)->DropOptimizerState().ok());  // again: nothing left, OK
}

TEST_CASE("CreateCudaTrainStage: GPU optimizer state per --optimizer-offload mode",
          "[cuda_train][optimizer_state]") {
  auto data = std::make_shared<const GptData>(GptData::Synthetic());
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCudaBackend();
  REQUIRE(backend.ok());
  auto memory_of = [&](const std::string& mode, std::int64_t* params) {
    const TrainOptions options = Options(mode);
    TrainStageSpec spec;
    spec.config = options.config;
    spec.num_stages = 2;
    spec.chunks_per_stage = 1;
    spec.stage = 0;
    spec.data = data;
    absl::StatusOr<std::unique_ptr<TrainStage>> stage =
        CreateCudaTrainStage(options, spec, **backend, /*cpu_threads=*/2);
    INFO(mode << ": " << stage.status().ToString());
    REQUIRE(stage.ok());
    auto& model = dynamic_cast<GptCudaStageModel&>((*stage)->model());
    *params = PaddedParams(model);
    absl::StatusOr<CudaStageMemory> memory = GetCudaStageMemory(**stage);
    REQUIRE(memory.ok());
    CHECK(memory->model_optimizer_bytes == model.optimizer_state_bytes());
    CHECK((*stage)->ModelStateBytes() ==
          memory->model_bytes + memory->engine_state_bytes + memory->engine_other_bytes);
    const std::string description = (*stage)->Describe();
    INFO(description);
    CHECK(description.find("GPU optimizer state " +
                           std::to_string(memory->optimizer_state_bytes()) + " B") !=
          std::string::npos);
    std::printf("[optimizer_state] %-11s model %lld B (optimizer %lld B), engines %lld B state + "
                "%lld B other, measured %lld B\n",
                mode.c_str(), static_cast<long long>(memory->model_bytes),
                static_cast<long long>(memory->model_optimizer_bytes),
                static_cast<long long>(memory->engine_state_bytes),
                static_cast<long long>(memory->engine_other_bytes),
                static_cast<long long>(memory->measured_bytes));
    return *memory;
  };
  std::int64_t n = 0;
  // A first creation loads the CUDA modules the later ones use (lazy loading takes device
  // memory at a module's first launch), so the measured ones below compare like with like.
  static_cast<void>(memory_of("cpu", &n));
  const CudaStageMemory none = memory_of("none", &n);
  const CudaStageMemory cpu = memory_of("cpu", &n);
  const CudaStageMemory interleaved = memory_of("interleaved", &n);
  const CudaStageMemory resident = memory_of("static", &n);
  REQUIRE(n > 1000000);

  CHECK(none.model_optimizer_bytes == 12 * n);
  CHECK(none.engine_state_bytes == 0);
  CHECK(none.optimizer_state_bytes() == 12 * n);

  CHECK(cpu.optimizer_state_bytes() == 0);
  CHECK(cpu.model_bytes == none.model_bytes - 12 * n);
  // Two staging sets of one subgroup's p, m and v.
  CHECK(interleaved.model_optimizer_bytes == 0);
  CHECK(interleaved.engine_state_bytes == 2 * 12 * kSubgroup);
  // The resident half of the subgroups (whole subgroups, so within one of half).
  CHECK(resident.model_optimizer_bytes == 0);
  CHECK(resident.engine_state_bytes % 12 == 0);
  CHECK(std::abs(resident.engine_state_bytes / 12 - n / 2) <= kSubgroup);

  // Measured: without the model's state the stage takes that much less device memory, less
  // what the cpu engine adds (its bf16 gradient copy and scratch); slack for 2 MiB rounding.
  const std::int64_t expected_saving = 12 * n - cpu.engine_other_bytes;
  INFO("measured none " << none.measured_bytes << " B, cpu " << cpu.measured_bytes
                        << " B; expected saving " << expected_saving << " B");
  REQUIRE(expected_saving > (std::int64_t{16} << 20));
  CHECK(none.measured_bytes - cpu.measured_bytes >= expected_saving - (std::int64_t{8} << 20));
  CHECK(none.measured_bytes - cpu.measured_bytes <= expected_saving + (std::int64_t{8} << 20));
}

}  // namespace
}  // namespace pipeoffload::gpt
