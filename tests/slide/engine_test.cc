// The layer-sliding engine on the CPU backend against the plain trainer of the same CPU Llama:
// bitwise equal parameters, Adam moments, losses and norms over several steps, for every slot
// count, placement, microbatch count, tied and untied heads, clipping, the ZeRO-Offload-style
// timing, the NVMe tier and copy engines that stall at random; byte counts; errors.
#include <cstdlib>
#include <filesystem>
#include <string>

#include "examples/llama/llama_config.h"
#include "examples/llama/llama_cpu_model.h"
#include "examples/llama/llama_init.h"
#include "examples/llama/plain_trainer.h"
#include "lib/slide/program.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/layer_sliding.h"
#include "tests/llama/cpu_test_models.h"
#include "tests/slide/nvme_test_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

using llama::LlamaConfig;
using llama::LlamaCpuModel;
using llama::LlamaCpuModelOptions;
using llama::PlainTrainer;
using llama::PlainTrainerOptions;
using llama::TokenData;
using llama::testing::ExpectBitwiseEqual;

constexpr int kSteps = 3;

// The "tiny" shape, smaller still so a case runs in well under a second: H 32, 3 layers.
LlamaConfig SmallLlama(bool tied, bool qwen) {
  LlamaConfig c;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.tie_word_embeddings = tied;
  c.qk_norm = qwen;
  c.attention_bias = qwen;
  return c;
}

struct Case {
  std::string name;
  LlamaConfig config;
  SlidingOptions options;  // budget 0: large enough for everything the placement asks
  CpuBackendOptions backend;
};

SlidingOptions BaseOptions(int microbatches) {
  SlidingOptions o;
  o.num_microbatches = microbatches;
  o.adam.weight_decay = 0.1f;
  o.cpu.threads = 2;
  o.grad_chunk_elements = 1000;  // several chunks per unit: chunked D2H and CPU Adam
  o.timeout_seconds = 60.0;
  return o;
}

std::vector<UnitPlace> AllSliding(const LlamaConfig& c) {
  return std::vector<UnitPlace>(static_cast<std::size_t>(llama::NumUnits(c)), UnitPlace::kSliding);
}

std::string TempDir() {
  const char* env = std::getenv("PO_NVME_TEST_DIR");
  std::filesystem::path dir = env != nullptr ? env : std::filesystem::current_path() / "build";
  if (!std::filesystem::is_directory(dir)) dir = std::filesystem::temp_directory_path();
  return dir.string();
}

// Runs kSteps steps of the engine and of the plain trainer from the same initial parameters
// and compares everything bitwise.
void RunAgainstPlain(const Case& c) {
  INFO("case " << c.name);
  const TokenData data = TokenData::Synthetic();
  const int M = c.options.num_microbatches;
  LlamaCpuModelOptions model_options;
  model_options.batch_size = 2;
  model_options.seq_len = 16;
  model_options.max_microbatches = M;
  model_options.data_seed = 5;
  model_options.ce_chunk_rows = 8;
  absl::StatusOr<std::unique_ptr<LlamaCpuModel>> plain_model =
      LlamaCpuModel::Create(c.config, data, model_options);
  absl::StatusOr<std::unique_ptr<LlamaCpuModel>> slide_model =
      LlamaCpuModel::Create(c.config, data, model_options);
  REQUIRE(plain_model.ok());
  REQUIRE(slide_model.ok());

  PlainTrainerOptions plain_options;
  plain_options.num_microbatches = M;
  plain_options.adam = c.options.adam;
  plain_options.max_grad_norm = c.options.max_grad_norm;
  plain_options.cpu.threads = 1;  // another thread count than the engine's: same bits
  absl::StatusOr<std::unique_ptr<PlainTrainer>> plain =
      PlainTrainer::Create(**plain_model, plain_options);
  REQUIRE(plain.ok());

  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend(c.backend);
  REQUIRE(backend.ok());
  SlidingOptions options = c.options;
  if (options.gpu_memory_budget_bytes == 0) options.gpu_memory_budget_bytes = std::int64_t{1} << 32;
  absl::StatusOr<std::unique_ptr<LayerSlidingEngine>> engine =
      LayerSlidingEngine::Create(**backend, **slide_model, options);
  INFO(engine.status().message());
  REQUIRE(engine.ok());
  const SlidingPlan& plan = (*engine)->plan();
  if (!c.options.placement.empty()) CHECK(plan.placement == c.options.placement);

  const int U = llama::NumUnits(c.config);
  for (int u = 0; u < U; ++u) {
    const std::vector<float> init = llama::InitUnitParams(c.config, u, 77);
    REQUIRE((*plain)->SetUnitParams(u, init).ok());
    REQUIRE((*engine)->SetUnitParams(u, init).ok());
  }
  for (int step = 0; step < kSteps; ++step) {
    const float lr = 2e-3f * static_cast<float>(step + 1);
    absl::StatusOr<llama::PlainStepResult> want = (*plain)->Step(lr);
    REQUIRE(want.ok());
    absl::StatusOr<SlidingStepResult> got = (*engine)->Step({lr});
    INFO("step " << step << ": " << got.status().message());
    REQUIRE(got.ok());
    absl::StatusOr<double> loss = (*slide_model)->StepLoss();
    REQUIRE(loss.ok());
    CHECK(*loss == want->loss);
    CHECK(got->grad_norm == want->grad_norm);
    CHECK(got->clip_coefficient == want->clip_coefficient);
    CHECK(got->applied == want->applied);
    CHECK(got->step == want->step);
  }
  for (int u = 0; u < U; ++u) {
    const auto n = static_cast<std::size_t>(llama::UnitParamCount(c.config, u));
    std::vector<float> params(n), m(n), v(n);
    REQUIRE((*engine)->GetUnitParams(u, params).ok());
    REQUIRE((*engine)->GetUnitOptimizerState(u, m, v).ok());
    const std::string unit = std::string(UnitPlaceName(plan.placement[static_cast<std::size_t>(u)])) +
                             " unit " + std::to_string(u);
    ExpectBitwiseEqual(unit + " params", params.data(), (*plain)->params(u).data(),
                       static_cast<std::int64_t>(n));
    ExpectBitwiseEqual(unit + " m", m.data(), (*plain)->exp_avg(u).data(),
                       static_cast<std::int64_t>(n));
    ExpectBitwiseEqual(unit + " v", v.data(), (*plain)->exp_avg_sq(u).data(),
                       static_cast<std::int64_t>(n));
  }
  // Every unit's state was written back at every step.
  CHECK((*engine)->unit_update_counts() == std::vector<std::int64_t>(static_cast<std::size_t>(U), kSteps));
}

TEST_CASE("sliding equals the plain trainer bitwise: slot counts and microbatches",
          "[slide][engine]") {
  for (int slots : {1, 2, 3, 5}) {
    for (int M : {1, 3}) {
      Case c{"all sliding, " + std::to_string(slots) + " slots, M " + std::to_string(M),
             SmallLlama(false, false), BaseOptions(M), {}};
      c.options.num_slots = slots;
      c.options.placement = AllSliding(c.config);
      RunAgainstPlain(c);
    }
  }
}

TEST_CASE("sliding equals the plain trainer bitwise: placements, tied heads, Qwen layers",
          "[slide][engine]") {
  const LlamaConfig untied = SmallLlama(false, false);
  const LlamaConfig tied = SmallLlama(true, false);
  const LlamaConfig qwen = SmallLlama(true, true);
  Case mixed{"embed and layer.0 resident", untied, BaseOptions(2), {}};
  mixed.options.placement = AllSliding(untied);
  mixed.options.placement[0] = mixed.options.placement[1] = UnitPlace::kResident;
  RunAgainstPlain(mixed);
  Case resident{"all resident", untied, BaseOptions(2), {}};
  resident.options.all_resident = true;
  RunAgainstPlain(resident);
  Case tied_sliding{"tied, all sliding", tied, BaseOptions(2), {}};
  tied_sliding.options.placement = AllSliding(tied);
  tied_sliding.options.num_slots = 2;
  RunAgainstPlain(tied_sliding);
  Case tied_resident{"tied, embed + head resident", tied, BaseOptions(2), {}};
  tied_resident.options.placement = AllSliding(tied);
  tied_resident.options.placement.front() = tied_resident.options.placement.back() = UnitPlace::kResident;
  RunAgainstPlain(tied_resident);
  Case qwen_case{"qk_norm + biases, tied", qwen, BaseOptions(1), {}};
  qwen_case.options.placement = AllSliding(qwen);
  RunAgainstPlain(qwen_case);
}

TEST_CASE("sliding equals the plain trainer bitwise: clipping and update timing",
          "[slide][engine]") {
  const LlamaConfig c = SmallLlama(true, false);
  for (double max_norm : {0.05, 10.0}) {  // active and inactive clipping
    Case clip{"clip " + std::to_string(max_norm), c, BaseOptions(2), {}};
    clip.options.max_grad_norm = max_norm;
    clip.options.placement = AllSliding(c);
    clip.options.placement[1] = UnitPlace::kResident;
    RunAgainstPlain(clip);
  }
  Case after{"ZeRO-Offload timing", c, BaseOptions(2), {}};
  after.options.update_timing = UpdateTiming::kAfterBackward;
  after.options.placement = AllSliding(c);
  RunAgainstPlain(after);
  Case landing{"one landing buffer", c, BaseOptions(1), {}};
  landing.options.landing_buffers = 1;
  landing.options.placement = AllSliding(c);
  RunAgainstPlain(landing);
}

TEST_CASE("sliding equals the plain trainer bitwise: copy engines that stall at random",
          "[slide][engine]") {
  const LlamaConfig c = SmallLlama(false, false);
  for (std::uint64_t seed : {1u, 2u}) {
    Case delayed{"delays seed " + std::to_string(seed), c, BaseOptions(2), {}};
    delayed.backend.min_copy_delay_seconds = 0.0;
    delayed.backend.max_copy_delay_seconds = 0.002;
    delayed.backend.fault_seed = seed;
    delayed.options.num_slots = 2;
    delayed.options.placement = AllSliding(c);
    delayed.options.max_grad_norm = seed == 2 ? 0.05 : 0.0;
    RunAgainstPlain(delayed);
  }
}

TEST_CASE("sliding equals the plain trainer bitwise with m, v on the NVMe tier",
          "[slide][engine]") {
  const LlamaConfig c = SmallLlama(false, false);
  for (double fraction : {0.5, 1.0}) {
    for (double max_norm : {0.0, 0.05}) {
      Case nvme{"nvme " + std::to_string(fraction), c, BaseOptions(2), {}};
      nvme.options.nvme_dir = TempDir();
      nvme.options.nvme_fraction = fraction;
      nvme.options.max_grad_norm = max_norm;
      nvme.options.placement = AllSliding(c);
      RunAgainstPlain(nvme);
    }
  }
}

TEST_CASE("sliding equals the plain trainer bitwise with checkpoints on the NVMe tier",
          "[slide][engine]") {
  // 5 layers: checkpoints of units 1..4, M = 3: 6 or 12 on the drive through a ring of 4.
  LlamaConfig c = SmallLlama(false, false);
  c.num_layers = 5;
  const testing::TestDir dir;
  for (int slots : {1, 2, 3}) {
    for (double state : {0.0, 1.0}) {
      for (double checkpoints : {0.5, 1.0}) {
        Case nvme{"slots " + std::to_string(slots) + ", m, v on NVMe " + std::to_string(state) +
                      ", checkpoints on NVMe " + std::to_string(checkpoints),
                  c, BaseOptions(3), {}};
        nvme.options.num_slots = slots;
        nvme.options.nvme_dir = dir.path();
        nvme.options.nvme_fraction = state;
        nvme.options.nvme_checkpoint_fraction = checkpoints;
        nvme.options.max_grad_norm = slots == 2 ? 0.05 : 0.0;
        nvme.options.placement = AllSliding(c);
        RunAgainstPlain(nvme);
      }
    }
  }
  // Copy engines that stall at random, the planner's placement.
  for (std::uint64_t seed : {3u, 4u}) {
    Case delayed{"checkpoints on NVMe, delays seed " + std::to_string(seed), c, BaseOptions(3), {}};
    delayed.backend.max_copy_delay_seconds = 0.002;
    delayed.backend.fault_seed = seed;
    delayed.options.nvme_dir = dir.path();
    delayed.options.nvme_checkpoint_fraction = 1.0;
    RunAgainstPlain(delayed);
  }
  CHECK(dir.Entries().empty());  // the engines' files were unlinked
}

TEST_CASE("sliding moves the bytes the program says", "[slide][engine]") {
  const LlamaConfig c = SmallLlama(false, false);
  const TokenData data = TokenData::Synthetic();
  LlamaCpuModelOptions model_options;
  model_options.batch_size = 2;
  model_options.seq_len = 16;
  model_options.max_microbatches = 2;
  absl::StatusOr<std::unique_ptr<LlamaCpuModel>> model = LlamaCpuModel::Create(c, data, model_options);
  REQUIRE(model.ok());
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  REQUIRE(backend.ok());
  SlidingOptions options = BaseOptions(2);
  options.gpu_memory_budget_bytes = std::int64_t{1} << 32;
  options.num_slots = 2;
  options.placement = AllSliding(c);
  options.record_trace = true;
  absl::StatusOr<std::unique_ptr<LayerSlidingEngine>> engine =
      LayerSlidingEngine::Create(**backend, **model, options);
  REQUIRE(engine.ok());
  const SlidingModelShape& shape = (*model)->Shape();
  internal::SlideProgramOptions program_options;
  program_options.num_microbatches = 2;
  program_options.upload_distance = 1;  // the CPU backend's (two slots)
  program_options.grads_out_distance = 1;
  absl::StatusOr<internal::SlideProgram> program =
      internal::BuildSlideProgram(shape, (*engine)->plan(), program_options);
  REQUIRE(program.ok());
  const int U = llama::NumUnits(c);
  const std::int64_t act = shape.activation_bytes;
  std::int64_t params = 0;
  for (int u = 0; u < U; ++u) params += llama::UnitParamCount(c, u);
  const std::int64_t checkpoints = (U - 3) * 2 * act;  // units 1 .. U-3, 2 microbatches
  std::vector<SlideRecord> all;
  for (int step = 0; step < 3; ++step) {
    absl::StatusOr<SlidingStepResult> result = (*engine)->Step({1e-3f});
    REQUIRE(result.ok());
    // H2D: every upload (fp32 parameters) and every checkpoint back; D2H: every gradient and
    // every checkpoint out.
    CHECK(result->h2d_bytes == program->upload_elements * 4 + checkpoints);
    CHECK(result->d2h_bytes == params * 4 + checkpoints);
    // Each engine's work is on record: compute, both copy directions, the CPU Adam.
    int per_engine[kNumSlideEngines] = {};
    for (const SlideRecord& record : result->records) {
      ++per_engine[static_cast<int>(record.engine)];
      CHECK(record.end >= record.start);
    }
    CHECK(per_engine[static_cast<int>(SlideEngineKind::kCompute)] >= (U - 1) * 2 + U * 2);
    CHECK(per_engine[static_cast<int>(SlideEngineKind::kH2D)] > 0);
    CHECK(per_engine[static_cast<int>(SlideEngineKind::kD2H)] > 0);
    all.insert(all.end(), result->records.begin(), result->records.end());
  }
  REQUIRE((*engine)->Flush().ok());
  // The CPU updates of step 1 are on record by step 3 (they may finish after their Step).
  const std::string trace = SlideRecordsToTraceJson(all);
  CHECK(trace.find("\"cat\":\"CPU Adam\"") != std::string::npos);
  CHECK(trace.find("\"name\":\"upload layer.1\"") != std::string::npos);
  CHECK(trace.find("\"name\":\"F layer.2 mb1\"") != std::string::npos);

  // Checkpoints on NVMe: the same PCIe bytes (through the staging ring), and each checkpoint on
  // the drive written once and read once per step; the host pins the ring instead of them.
  const testing::TestDir dir;
  options.nvme_dir = dir.path();
  options.nvme_checkpoint_fraction = 0.5;  // of units 1, 2: unit 1
  absl::StatusOr<std::unique_ptr<LayerSlidingEngine>> drive =
      LayerSlidingEngine::Create(**backend, **model, options);
  INFO(drive.status().ToString());
  REQUIRE(drive.ok());
  const SlidingPlan& plan = (*drive)->plan();
  CHECK(plan.nvme_checkpoints == std::vector<bool>{false, true, false, false, false});
  REQUIRE(plan.checkpoint_staging_buffers == 2);  // min(4, 2 checkpoints)
  REQUIRE(act % 4096 == 0);                       // whole O_DIRECT records
  CHECK(plan.nvme_bytes == 2 * act);
  // Unit 1's 2 checkpoints leave pinned memory, 2 staging buffers of one checkpoint each come.
  const std::int64_t off_host = 2 * act, staging = 2 * act;
  CHECK(plan.host_pinned_bytes == (*engine)->plan().host_pinned_bytes - off_host + staging);
  for (int step = 0; step < 3; ++step) {
    absl::StatusOr<SlidingStepResult> result = (*drive)->Step({1e-3f});
    INFO(result.status().ToString());
    REQUIRE(result.ok());
    CHECK(result->h2d_bytes == program->upload_elements * 4 + checkpoints);
    CHECK(result->d2h_bytes == params * 4 + checkpoints);
    CHECK(result->nvme_checkpoint_bytes == 2 * 2 * act);
    std::int64_t nvme_records = 0, nvme_bytes = 0;
    for (const SlideRecord& record : result->records) {
      if (record.engine != SlideEngineKind::kNvme) continue;
      ++nvme_records;
      nvme_bytes += record.bytes;
      CHECK(record.unit == 1);
    }
    CHECK(nvme_records == 4);
    CHECK(nvme_bytes == 4 * act);
  }
  CHECK((*engine)->setup_stats().nvme.empty());
  CHECK((*drive)->setup_stats().nvme.find("checkpoints: ") == 0);
}

// The small Llama with tokens for one microbatch of 16, for the error cases.
std::unique_ptr<LlamaCpuModel> OneMicrobatchModel() {
  LlamaCpuModelOptions model_options;
  model_options.seq_len = 16;
  absl::StatusOr<std::unique_ptr<LlamaCpuModel>> model =
      LlamaCpuModel::Create(SmallLlama(false, false), TokenData::Synthetic(), model_options);
  REQUIRE(model.ok());
  return *std::move(model);
}

TEST_CASE("sliding refuses a missing or read-only directory for checkpoints on NVMe at Create",
          "[slide][engine]") {
  const std::unique_ptr<LlamaCpuModel> model = OneMicrobatchModel();
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  REQUIRE(backend.ok());
  const testing::TestDir dir;
  SlidingOptions options = BaseOptions(1);
  options.gpu_memory_budget_bytes = std::int64_t{1} << 30;
  options.nvme_checkpoint_fraction = 1.0;
  options.nvme_dir = dir.path() + "/absent";
  const absl::Status missing = LayerSlidingEngine::Create(**backend, *model, options).status();
  CHECK(missing.code() == absl::StatusCode::kNotFound);
  CHECK(std::string(missing.message()).find("the NVMe checkpoint tier (--nvme-dir)") !=
        std::string::npos);
  options.nvme_dir = "/proc/self";
  const absl::Status read_only = LayerSlidingEngine::Create(**backend, *model, options).status();
  CHECK(read_only.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(read_only.message()).find("read-only or not writable") != std::string::npos);
  // The directory is left as it was; a good one then works.
  CHECK(dir.Entries().empty());
  options.nvme_dir = dir.path();
  CHECK(LayerSlidingEngine::Create(**backend, *model, options).ok());
}

TEST_CASE("sliding refuses a budget too small for one unit before training", "[slide][engine]") {
  const std::unique_ptr<LlamaCpuModel> model = OneMicrobatchModel();
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  REQUIRE(backend.ok());
  SlidingOptions options = BaseOptions(1);
  options.gpu_memory_budget_bytes = 4096;
  const absl::StatusOr<std::unique_ptr<LayerSlidingEngine>> engine =
      LayerSlidingEngine::Create(**backend, *model, options);
  REQUIRE(engine.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(engine.status().message()).find("the minimum, with one slot, is") !=
        std::string::npos);
  // A model call that fails names the unit and microbatch, and the engine stays failed.
  options.gpu_memory_budget_bytes = std::int64_t{1} << 30;
  options.num_microbatches = 2;  // the model holds tokens for 1: its BeginStep refuses 2
  absl::StatusOr<std::unique_ptr<LayerSlidingEngine>> bad =
      LayerSlidingEngine::Create(**backend, *model, options);
  REQUIRE(bad.ok());
  const absl::StatusOr<SlidingStepResult> step = (*bad)->Step({1e-3f});
  REQUIRE(!step.ok());
  CHECK(std::string(step.status().message()).find("begin_step") != std::string::npos);
  CHECK((*bad)->Step({1e-3f}).status().code() == absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace pipeoffload
