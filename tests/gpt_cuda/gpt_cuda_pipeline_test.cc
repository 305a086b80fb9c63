// The CUDA GPT as a pipeline on one GPU (stages as threads, local transport over device memory,
// one CUDA backend and PipelineStage per stage: LocalPipeline, pipeoffload/pipeline.h):
//  - po-f activation offload vs no offload: every parameter bitwise equal after two training
//    steps, and the losses too (offload moves bytes, never changes them);
//  - the executor's measured stash peak on every stage equals the compiler's prediction, and
//    po-f really offloaded (bytes moved, stage 0's peak below the no-offload peak), so the
//    equality above is not vacuous;
//  - released arena blocks are poisoned, so a stash entry read after its release would turn
//    into NaN losses instead of passing;
//  - the interleaved schedule with a split backward (W ops) and po-f ends with the same bits as
//    1F1B without offload: the GPU kernels are deterministic whatever the split;
//  - recompute (every entry, full or lean, split or not) under the executor: peaks as predicted
//    and below keeping's (lean: on stage 0), full with keeping's bits, lean with its first
//    step's losses; with po-f on top the retained blocks go to the host and back, bits
//    unchanged.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "examples/gpt/cuda/gpt_cuda_stage_model.h"
#include "examples/gpt/cuda/gpt_layer_stack.h"
#include "examples/gpt/gpt_data.h"
#include "pipeoffload/compiler.h"
#include "pipeoffload/pipeline.h"
#include "tests/gpt_cuda/gpt_cuda_test_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload::gpt::cuda {
namespace {

using model_testing::ValueOrFail;

constexpr int kSteps = 2;

GptConfig PipelineConfig() {
  GptConfig config;
  config.vocab_size = 256;
  config.seq_len = 64;
  config.n_embd = 128;
  config.n_head = 2;
  config.n_layer = 4;
  config.batch_size = 2;
  config.num_microbatches = 4;
  return config;
}

// What every stage of these rigs is opened with: `spec` compiled on nominal costs (a chunk's F,
// B and W take one unit; an entry crosses the host link in a quarter of one) and the models'
// exact bytes, so the predicted stash peaks are exact; released arena blocks poisoned.
StageOptions OneGpuOptions(const PipelineSpec& spec) {
  StageOptions options;
  options.spec = spec;
  options.costs.source = CostSource::kNominal;
  options.poison_on_free = true;
  options.executor.wait_timeout_seconds = 120.0;
  return options;
}

struct RunResult {
  std::vector<std::vector<TensorHash>> hashes;  // [stage]
  std::vector<std::vector<double>> losses;      // [step], last stage's
  std::vector<std::int64_t> measured_peak;      // [stage], max over steps
  std::vector<std::int64_t> predicted_peak;     // [stage]
  std::vector<std::int64_t> offloaded;          // [stage], bytes in the last step
  int recompute_ops = 0;                        // RECOMPUTE / RECOMPUTE_LEAN in the schedule
};

RunResult TrainOnOneGpu(int stages, Family family, int chunks, bool split, OffloadPolicy policy,
                        bool lean_saved = false, Recompute recompute = Recompute::kNone) {
  const GptConfig config = PipelineConfig();
  const int num_stages = stages;  // p
  auto data = std::make_shared<const GptData>(GptData::Synthetic());
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<GptCudaStageModel>> models;
  // zbv and dualpipev lay chunk 1 of stage d on virtual stage 2p - 1 - d (ResolveSpec's v).
  const Placement placement = family == Family::kZbv || family == Family::kDualPipeV
                                  ? Placement::kV
                                  : Placement::kLoop;
  for (int d = 0; d < num_stages; ++d) {
    backends.push_back(testing::NewCudaBackend());
    models.push_back(ValueOrFail(GptCudaStageModel::Create(
        *backends.back(), config, num_stages, chunks, d, data,
        GptCudaStageOptions{.lean_saved = lean_saved,
                            .recompute = recompute != Recompute::kNone,
                            .placement = placement})));
  }
  PipelineSpec spec;
  spec.family = family;
  spec.num_stages = num_stages;
  spec.num_microbatches = config.num_microbatches;
  spec.chunks_per_stage = chunks;
  spec.split_backward = split;
  spec.offload = policy;
  spec.recompute = recompute;
  std::vector<Backend*> backend_ptrs;
  std::vector<StageModel*> model_ptrs;
  for (int d = 0; d < num_stages; ++d) {
    backend_ptrs.push_back(backends[static_cast<std::size_t>(d)].get());
    model_ptrs.push_back(models[static_cast<std::size_t>(d)].get());
  }
  auto rig = ValueOrFail(LocalPipeline::Open(OneGpuOptions(spec), model_ptrs, backend_ptrs));
  const Schedule schedule = rig->stage(0).schedule();
  RunResult result;
  for (const StageProgram& program : schedule.stages) {
    for (const Op& op : program.ops) result.recompute_ops += IsRecompute(op.kind) ? 1 : 0;
  }
  result.measured_peak.assign(num_stages, 0);
  result.offloaded.assign(num_stages, 0);
  for (const StagePrediction& stage : schedule.predictions->stages) {
    result.predicted_peak.push_back(stage.peak_bytes);
  }
  for (int step = 0; step < kSteps; ++step) {
    for (auto& model : models) PO_MODEL_TEST_OK(model->StartIteration(step));
    const std::vector<IterationStats> stats = ValueOrFail(rig->Run());
    for (const IterationStats& stage : stats) {
      auto& peak = result.measured_peak[static_cast<std::size_t>(stage.stage)];
      peak = std::max(peak, stage.stash_high_water_bytes);
      result.offloaded[static_cast<std::size_t>(stage.stage)] = stage.offloaded_bytes;
    }
    for (auto& model : models) {  // the last stage, or stage 0 under V placement
      if (model->holds_loss()) result.losses.push_back(ValueOrFail(model->Losses()));
    }
    REQUIRE(result.losses.size() == static_cast<std::size_t>(step) + 1);
    for (auto& model : models) PO_MODEL_TEST_OK(model->OptimizerStep());
  }
  for (auto& model : models) result.hashes.push_back(ValueOrFail(model->ParameterHashes()));
  rig.reset();
  std::printf("[pipeline] %s p=%d v=%d split=%d %s: losses step0 %.5f step1 %.5f; peaks",
              std::string(FamilyName(family)).c_str(), stages, chunks, split ? 1 : 0,
              std::string(OffloadPolicyName(policy)).c_str(), result.losses[0][0],
              result.losses[1][0]);
  for (int d = 0; d < num_stages; ++d) {
    std::printf(" stage %d %lld/%lld (offloaded %lld)", d,
                static_cast<long long>(result.measured_peak[static_cast<std::size_t>(d)]),
                static_cast<long long>(result.predicted_peak[static_cast<std::size_t>(d)]),
                static_cast<long long>(result.offloaded[static_cast<std::size_t>(d)]));
  }
  std::printf("\n");
  std::fflush(stdout);
  return result;
}

bool SameHashes(const RunResult& a, const RunResult& b) {
  // Stage by stage the tensors differ between splits, so compare the sorted union.
  std::vector<std::pair<int, std::uint64_t>> left, right;
  for (const auto& stage : a.hashes) {
    for (const TensorHash& h : stage) left.push_back({h.id, h.hash});
  }
  for (const auto& stage : b.hashes) {
    for (const TensorHash& h : stage) right.push_back({h.id, h.hash});
  }
  std::sort(left.begin(), left.end());
  std::sort(right.begin(), right.end());
  return left == right;
}

void CheckPeaksMatchPredictions(const RunResult& run) {
  REQUIRE(run.measured_peak.size() == run.predicted_peak.size());
  for (std::size_t d = 0; d < run.measured_peak.size(); ++d) {
    INFO("stage " << d);
    CHECK(run.measured_peak[d] == run.predicted_peak[d]);
  }
}

TEST_CASE("po-f offload on one GPU: parameters bitwise equal to no offload, peaks as predicted",
          "[gpt_cuda][gpt_cuda_pipeline]") {
  // p = 4, m = 4: po-f plans stage 0 down from 4 resident entries to 2.
  const RunResult plain = TrainOnOneGpu(4, Family::k1F1B, 1, false, OffloadPolicy::kNone);
  const RunResult offload = TrainOnOneGpu(4, Family::k1F1B, 1, false, OffloadPolicy::kFull);
  CheckPeaksMatchPredictions(plain);
  CheckPeaksMatchPredictions(offload);
  // po-f moved bytes and lowered stage 0's peak: the comparison below is not vacuous.
  CHECK(offload.offloaded[0] > 0);
  CHECK(offload.measured_peak[0] < plain.measured_peak[0]);
  CHECK(plain.offloaded[0] == 0);
  for (const auto& step : plain.losses) {
    for (double loss : step) CHECK(std::isfinite(loss));
  }
  CHECK(offload.losses == plain.losses);  // bitwise: doubles summed from the same floats
  CHECK(SameHashes(offload, plain));
  REQUIRE(offload.hashes.size() == plain.hashes.size());
  for (std::size_t d = 0; d < plain.hashes.size(); ++d) {
    REQUIRE(offload.hashes[d].size() == plain.hashes[d].size());
    for (std::size_t t = 0; t < plain.hashes[d].size(); ++t) {
      INFO("stage " << d << " tensor " << plain.hashes[d][t].id);
      CHECK(offload.hashes[d][t].hash == plain.hashes[d][t].hash);
    }
  }
}

TEST_CASE("interleaved + split backward + po-f on one GPU ends with 1F1B's bits",
          "[gpt_cuda][gpt_cuda_pipeline]") {
  // Both split the 4 layers into 4 virtual stages of one layer: p = 4, v = 1 and p = 2, v = 2.
  const RunResult plain = TrainOnOneGpu(4, Family::k1F1B, 1, false, OffloadPolicy::kNone);
  const RunResult split = TrainOnOneGpu(2, Family::kInterleaved, 2, true, OffloadPolicy::kFull);
  CheckPeaksMatchPredictions(split);
  CHECK(split.offloaded[0] > 0);
  CHECK(split.losses == plain.losses);
  CHECK(SameHashes(split, plain));
}

TEST_CASE("zbv and dualpipev (V placement) on one GPU end with 1F1B's bits",
          "[gpt_cuda][gpt_cuda_pipeline]") {
  // p = 2, v = 2 under V: virtual stages 0 and 3 on stage 0, 1 and 2 on stage 1, one layer each,
  // so the same 4 one-layer virtual stages as 1F1B at p = 4; with and without po-f.
  const RunResult plain = TrainOnOneGpu(4, Family::k1F1B, 1, false, OffloadPolicy::kNone);
  for (const Family family : {Family::kZbv, Family::kDualPipeV}) {
    for (const OffloadPolicy policy : {OffloadPolicy::kNone, OffloadPolicy::kFull}) {
      INFO(FamilyName(family) << " " << OffloadPolicyName(policy));
      const RunResult v = TrainOnOneGpu(2, family, 2, true, policy);
      CheckPeaksMatchPredictions(v);
      CHECK(v.losses == plain.losses);
      CHECK(SameHashes(v, plain));
    }
  }
}

TEST_CASE("lean saved activations: po-f and split backward end with lean 1F1B's bits, in less memory",
          "[gpt_cuda][gpt_cuda_pipeline]") {
  const RunResult full = TrainOnOneGpu(4, Family::k1F1B, 1, false, OffloadPolicy::kNone);
  const RunResult plain = TrainOnOneGpu(4, Family::k1F1B, 1, false, OffloadPolicy::kNone, true);
  const RunResult split =
      TrainOnOneGpu(2, Family::kInterleaved, 2, true, OffloadPolicy::kFull, /*lean_saved=*/true);
  CheckPeaksMatchPredictions(plain);
  CheckPeaksMatchPredictions(split);
  CHECK(split.offloaded[0] > 0);
  CHECK(split.losses == plain.losses);
  CHECK(SameHashes(split, plain));
  // The same model, keeping 12 of every 32 bytes per token less on each stage.
  for (std::size_t d = 0; d < full.measured_peak.size(); ++d) {
    INFO("stage " << d);
    CHECK(plain.measured_peak[d] < full.measured_peak[d]);
  }
  REQUIRE(plain.losses.size() == full.losses.size());
  for (std::size_t step = 0; step < full.losses.size(); ++step) {
    REQUIRE(plain.losses[step].size() == full.losses[step].size());
    for (std::size_t i = 0; i < full.losses[step].size(); ++i) {
      // Only the fc-proj weight gradient may differ (GELU recomputed by our kernel): the loss
      // of the first step is bitwise the same, later ones within bf16 noise.
      if (step == 0) CHECK(plain.losses[step][i] == full.losses[step][i]);
      CHECK(plain.losses[step][i] == Approx(full.losses[step][i]).epsilon(1e-3));
    }
  }
}

TEST_CASE(
    "recompute on one GPU: full ends with no recompute's bits, lean its first losses; "
    "peaks as predicted and lower",
    "[gpt_cuda][gpt_cuda_pipeline][gpt_cuda_recompute]") {
  const bool split = GENERATE(false, true);
  CAPTURE(split);
  const RunResult keep = TrainOnOneGpu(2, Family::kInterleaved, 2, split, OffloadPolicy::kNone);
  const RunResult full = TrainOnOneGpu(2, Family::kInterleaved, 2, split, OffloadPolicy::kNone,
                                       false, Recompute::kFull);
  const RunResult lean = TrainOnOneGpu(2, Family::kInterleaved, 2, split, OffloadPolicy::kNone,
                                       false, Recompute::kLean);
  for (const RunResult* run : {&full, &lean}) {
    CheckPeaksMatchPredictions(*run);
    CHECK(run->recompute_ops == 2 * 2 * PipelineConfig().num_microbatches);  // every entry
  }
  // Full keeps a fraction of an entry: lower everywhere. Lean keeps 20 of 32 C bytes and, while
  // an entry is rebuilt, holds its lean block and the full entry at once: lower on stage 0, which
  // has the most entries in flight (on the last stage, with few, that moment may top keeping).
  // Unsplit, B reads the lean blocks of chunks without the head in place
  // (BackwardReadsRetained; no RecomputeSaved, so nothing here may count on one): those entries
  // hold their lean block alone until B, and setup tells the compiler so.
  for (std::size_t d = 0; d < keep.measured_peak.size(); ++d) {
    INFO("stage " << d);
    CHECK(full.measured_peak[d] < keep.measured_peak[d]);
  }
  CHECK(lean.measured_peak[0] < keep.measured_peak[0]);
  CHECK(keep.recompute_ops == 0);
  CHECK(full.measured_peak[0] < lean.measured_peak[0]);  // the input alone vs 20 of 32 C
  // Full recompute reruns the same kernels: every loss and parameter bit as keeping.
  CHECK(full.losses == keep.losses);
  CHECK(SameHashes(full, keep));
  // Lean rebuilds gelu(fch) from the bf16 fch (in B or in RecomputeSaved, the same kernel):
  // step 0's losses (forward only) are the same bits; later ones within bf16 noise of the
  // fc-proj weight gradient's last bits.
  REQUIRE(lean.losses.size() == keep.losses.size());
  for (std::size_t i = 0; i < keep.losses[0].size(); ++i) {
    CHECK(lean.losses[0][i] == keep.losses[0][i]);
    CHECK(lean.losses[1][i] == Approx(keep.losses[1][i]).epsilon(1e-3));
  }
}

TEST_CASE(
    "recompute with po-f on one GPU: retained blocks go to the host and back, the bits of "
    "recompute alone, peaks as predicted",
    "[gpt_cuda][gpt_cuda_pipeline][gpt_cuda_recompute]") {
  // Issue 16's lever: F keeps the retained block, po-f offloads it, RECOMPUTE* reads it back.
  const bool split = GENERATE(false, true);
  CAPTURE(split);
  for (const Recompute mode : {Recompute::kFull, Recompute::kLean}) {
    CAPTURE(RecomputeName(mode));
    const RunResult alone = TrainOnOneGpu(2, Family::kInterleaved, 2, split,
                                          OffloadPolicy::kNone, false, mode);
    const RunResult offloaded = TrainOnOneGpu(2, Family::kInterleaved, 2, split,
                                              OffloadPolicy::kFull, false, mode);
    CheckPeaksMatchPredictions(offloaded);
    CHECK(offloaded.recompute_ops == alone.recompute_ops);
    CHECK(offloaded.offloaded[0] > 0);
    CHECK(offloaded.measured_peak[0] <= alone.measured_peak[0]);
    // Copies move bytes only: every loss and parameter bit as recomputing without them.
    CHECK(offloaded.losses == alone.losses);
    CHECK(SameHashes(offloaded, alone));
  }
}

TEST_CASE("The benchmark's layer stack runs under the executor, with and without offload",
          "[gpt_cuda][gpt_cuda_stack]") {
  LayerStackShape shape;
  shape.hidden = 256;
  shape.heads = 4;
  shape.seq = 128;
  shape.layers_per_chunk = 2;
  // Full and lean saved activations: po-f must leave every gradient bit as no offload does.
  shape.lean_saved = GENERATE(false, true);
  CAPTURE(shape.lean_saved);
  LayerStackShape full_shape = shape;
  full_shape.lean_saved = false;
  if (shape.lean_saved) CHECK(shape.SavedBytes() < full_shape.SavedBytes());
  std::vector<std::vector<std::uint64_t>> no_offload_hashes;  // [stage]
  for (const OffloadPolicy policy : {OffloadPolicy::kNone, OffloadPolicy::kFull}) {
    constexpr int p = 4;
    std::vector<std::unique_ptr<Backend>> backends;
    std::vector<std::unique_ptr<StageModel>> models;
    for (int d = 0; d < p; ++d) {
      backends.push_back(testing::NewCudaBackend());
      models.push_back(ValueOrFail(CreateCudaGptLayerStack(*backends.back(), shape)));
      CHECK(models.back()->SavedBytes(0, false) == shape.SavedBytes());
      CHECK(models.back()->BoundaryBytes() == shape.BoundaryBytes());
    }
    PipelineSpec spec;
    spec.num_stages = p;
    spec.num_microbatches = 2 * p;
    spec.offload = policy;
    std::vector<Backend*> backend_ptrs;
    std::vector<StageModel*> model_ptrs;
    for (int d = 0; d < p; ++d) {
      backend_ptrs.push_back(backends[static_cast<std::size_t>(d)].get());
      model_ptrs.push_back(models[static_cast<std::size_t>(d)].get());
    }
    auto rig = ValueOrFail(LocalPipeline::Open(OneGpuOptions(spec), model_ptrs, backend_ptrs));
    const Schedule schedule = rig->stage(0).schedule();
    for (int step = 0; step < 2; ++step) {
      const std::vector<IterationStats> stats = ValueOrFail(rig->Run());
      for (const IterationStats& stage : stats) {
        INFO(OffloadPolicyName(policy) << " step " << step << " stage " << stage.stage);
        CHECK(stage.stash_high_water_bytes ==
              schedule.predictions->stages[static_cast<std::size_t>(stage.stage)].peak_bytes);
      }
      if (policy == OffloadPolicy::kFull) CHECK(stats[0].offloaded_bytes > 0);
    }
    rig.reset();
    // The gradients accumulated over both steps (no optimizer): bitwise the same with offload.
    for (int d = 0; d < p; ++d) {
      const std::vector<std::uint64_t> hashes =
          ValueOrFail(LayerStackGradHashes(*models[static_cast<std::size_t>(d)]));
      CHECK(hashes.size() == 12u * static_cast<std::size_t>(shape.layers_per_chunk));
      if (policy == OffloadPolicy::kNone) {
        no_offload_hashes.push_back(hashes);
      } else {
        INFO("stage " << d);
        CHECK(hashes == no_offload_hashes[static_cast<std::size_t>(d)]);
      }
    }
  }
}

}  // namespace
}  // namespace pipeoffload::gpt::cuda
