// The pipeline split is invisible in the numbers: running the GPT chunk by chunk as a pipeline
// would (p stages x v chunks, boundary activations and gradients passed by hand, every stash
// entry moved to a new address with the old one poisoned, B and W of each chunk in microbatch
// order) gives losses, gradients, parameters and checksums bitwise equal (memcmp) to the
// single-process reference, with split and unsplit backward, tied and untied heads, with and
// without the learning-rate schedule and global-norm clipping (norm combined across stages), and
// with recomputed entries (F keeps the lean or the full retained block, the entry is rebuilt
// into a fresh NaN-filled allocation before its B).
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "examples/gpt/gpt_stage_model.h"
#include "examples/gpt/optimizer_schedule.h"
#include "examples/gpt/reference_trainer.h"
#include "tests/gpt/test_models.h"
#include "tests/testing/catch.h"

namespace pipeoffload::gpt {
namespace {

// A stash entry that can be moved like the runtime's offload does: copied to a new allocation at
// a different alignment, the old bytes overwritten with NaN before they are freed.
class StashEntry {
 public:
  explicit StashEntry(std::int64_t bytes) : bytes_(bytes) { Allocate(0); }
  void* data() { return storage_.data() + shift_; }
  void Move() {
    std::vector<float> old = std::move(storage_);
    const std::size_t old_shift = shift_;
    Allocate(old_shift == 0 ? 1 : 0);
    std::memcpy(data(), old.data() + old_shift, static_cast<std::size_t>(bytes_));
    std::fill(old.begin(), old.end(), std::numeric_limits<float>::quiet_NaN());
  }

 private:
  void Allocate(std::size_t shift) {
    shift_ = shift;
    storage_.assign(static_cast<std::size_t>(bytes_ / 4) + 1 + shift_,
                    std::numeric_limits<float>::quiet_NaN());
  }
  std::int64_t bytes_;
  std::vector<float> storage_;
  std::size_t shift_ = 0;
};

struct Pipeline {
  VirtualStageMap map;  // where virtual stage l lives: stage map.stage_of(l), chunk chunk_of(l)
  std::vector<std::unique_ptr<GptStageModel>> stages;
  GptStageModel& stage_of(int l) { return *stages[static_cast<std::size_t>(map.stage_of(l))]; }
};

Pipeline MakePipeline(const GptConfig& config, int p, int v, Placement placement,
                      const std::shared_ptr<const GptData>& data) {
  Pipeline pipeline{{placement, p, v}, {}};
  for (int s = 0; s < p; ++s) {
    auto model = GptStageModel::Create(config, p, v, s, data, placement);
    REQUIRE(model.ok());
    pipeline.stages.push_back(std::move(model).value());
  }
  return pipeline;
}

// The recompute mode of entry (virtual stage l, mb) when an iteration recomputes: keep, lean and
// full in turn, so each mode meets first, middle, last and layer-less chunks across the shapes.
Recompute ModeOf(bool recompute, int l, int mb) {
  if (!recompute) return Recompute::kNone;
  constexpr Recompute kModes[] = {Recompute::kNone, Recompute::kLean, Recompute::kFull};
  return kModes[(l + mb) % 3];
}

// One iteration in pipeline order. Virtual stage l lives where pipe.map says. All F,
// then B in reverse virtual-stage order; with `split`, every W after every B (per chunk still in
// microbatch order), the latest a schedule may place them. With `recompute`, the entries
// ModeOf picks are kept as retained blocks and rebuilt right before their B.
void RunIteration(Pipeline& pipe, std::int64_t step, bool split, bool recompute = false) {
  const GptConfig& config = pipe.stages[0]->config();
  const int m = config.num_microbatches;
  const int num_virtual = pipe.map.num_virtual_stages();
  const std::size_t boundary = static_cast<std::size_t>(pipe.stages[0]->BoundaryBytes() / 4);
  for (auto& stage : pipe.stages) stage->StartIteration(step);
  // activations[l][mb]: output of virtual stage l; grads[l][mb]: gradient of its input.
  std::vector<std::vector<std::vector<float>>> activations(
      num_virtual, std::vector<std::vector<float>>(m, std::vector<float>(boundary)));
  std::vector<std::vector<std::vector<float>>> grads = activations;
  std::map<std::pair<int, int>, std::unique_ptr<StashEntry>> stash;

  for (int l = 0; l < num_virtual; ++l) {
    GptStageModel& stage = pipe.stage_of(l);
    const int chunk = pipe.map.chunk_of(l);
    for (int mb = 0; mb < m; ++mb) {
      const Recompute mode = ModeOf(recompute, l, mb);
      const std::int64_t bytes = mode == Recompute::kNone ? stage.SavedBytes(chunk, split)
                                                          : stage.RetainedBytes(chunk, mode, split);
      REQUIRE(bytes > 0);
      auto entry = std::make_unique<StashEntry>(bytes);
      const void* input = l == 0 ? nullptr : activations[l - 1][mb].data();
      void* output = l == num_virtual - 1 ? nullptr : activations[l][mb].data();
      if (mode == Recompute::kNone) {
        REQUIRE(stage.Forward(mb, chunk, input, output, entry->data()).ok());
      } else {
        REQUIRE(stage.ForwardRetaining(mb, chunk, input, output, entry->data(), mode).ok());
      }
      entry->Move();  // offload and reload
      stash[{l, mb}] = std::move(entry);
    }
  }
  for (int l = num_virtual - 1; l >= 0; --l) {
    GptStageModel& stage = pipe.stage_of(l);
    const int chunk = pipe.map.chunk_of(l);
    for (int mb = 0; mb < m; ++mb) {
      const Recompute mode = ModeOf(recompute, l, mb);
      if (mode != Recompute::kNone) {  // the runtime's RECOMPUTE: a fresh entry, then free
        auto rebuilt = std::make_unique<StashEntry>(stage.SavedBytes(chunk, split));
        REQUIRE(
            stage.RecomputeSaved(mb, chunk, stash[{l, mb}]->data(), rebuilt->data(), mode).ok());
        stash[{l, mb}]->Move();  // poisons the retained block's bytes
        stash[{l, mb}] = std::move(rebuilt);
      }
      StashEntry& entry = *stash[{l, mb}];
      const void* grad_output = l == num_virtual - 1 ? nullptr : grads[l + 1][mb].data();
      void* grad_input = l == 0 ? nullptr : grads[l][mb].data();
      REQUIRE(stage.Backward(mb, chunk, grad_output, grad_input, entry.data(), !split).ok());
      entry.Move();
    }
  }
  if (split) {
    for (int l = 0; l < num_virtual; ++l) {
      for (int mb = 0; mb < m; ++mb) {
        REQUIRE(pipe.stage_of(l)
                    .BackwardWeight(mb, pipe.map.chunk_of(l), stash[{l, mb}]->data())
                    .ok());
      }
    }
  }
}

// The global-norm clipping scale of a set of stages (every stage's per-tensor sums, combined
// in id order), 1 with clipping off. Records the norm in `norm`.
float ClipScaleOf(const std::vector<GptStageModel*>& stages, double* norm) {
  const float clip_norm = stages.front()->config().optimizer.clip_norm;
  if (clip_norm <= 0.0f) return 1.0f;
  std::vector<TensorSquareSum> sums;
  for (GptStageModel* stage : stages) {
    auto part = stage->GradSquareSums();
    REQUIRE(part.ok());
    sums.insert(sums.end(), part->begin(), part->end());
  }
  auto clip = ClipGlobalNorm(sums, stages.front()->num_tensors(), clip_norm);
  REQUIRE(clip.ok());
  *norm = clip->norm;
  return clip->scale;
}

// The stages' tied-gradient exchange (stage 0 <-> stage p-1), the global gradient norm, then
// every stage's AdamW step with its clipping scale. Returns the norm (NaN with clipping off).
double StepOptimizers(Pipeline& pipe) {
  GptStageModel& first = *pipe.stages.front();
  GptStageModel& last = *pipe.stages.back();
  if (first.NeedsTiedGradExchange()) {
    REQUIRE(last.NeedsTiedGradExchange());
    const std::vector<float> from_first(first.TiedGradPart(),
                                        first.TiedGradPart() + first.TiedGradElements());
    REQUIRE(first.SetPeerTiedGradPart(last.TiedGradPart(), last.TiedGradElements()).ok());
    REQUIRE(last.SetPeerTiedGradPart(from_first.data(), first.TiedGradElements()).ok());
  }
  std::vector<GptStageModel*> stages;
  for (auto& stage : pipe.stages) stages.push_back(stage.get());
  double norm = std::numeric_limits<double>::quiet_NaN();
  const float scale = ClipScaleOf(stages, &norm);
  for (auto& stage : pipe.stages) REQUIRE(stage->OptimizerStep(scale).ok());
  return norm;
}

// Every tensor (mirrors included) of a set of models, keyed by (global id, mirror).
struct TensorRef {
  const float* param;
  const float* grad;
  std::int64_t numel;
};
std::map<std::pair<int, bool>, TensorRef> CollectTensors(
    const std::vector<const GptStageModel*>& models) {
  std::map<std::pair<int, bool>, TensorRef> tensors;
  for (const GptStageModel* model : models) {
    for (int c = 0; c < model->chunks_per_stage(); ++c) {
      const ParameterBlock& block = model->chunk(c).params();
      for (int i = 0; i < static_cast<int>(block.tensors().size()); ++i) {
        const ParamTensor& t = block.tensors()[static_cast<std::size_t>(i)];
        const bool inserted = tensors
                                  .emplace(std::pair{t.id, t.mirror},
                                           TensorRef{block.param(i), block.grad(i), t.spec.numel()})
                                  .second;
        REQUIRE(inserted);  // each tensor lives on exactly one virtual stage
      }
    }
  }
  return tensors;
}

void RequireBitwiseEqual(const std::vector<const GptStageModel*>& pipeline,
                         const GptStageModel& reference, bool grads) {
  const auto got = CollectTensors(pipeline);
  const auto want = CollectTensors({&reference});
  REQUIRE(got.size() == want.size());
  for (const auto& [key, ref] : want) {
    CAPTURE(key.first, key.second, grads);
    REQUIRE(got.count(key) == 1);
    const TensorRef& mine = got.at(key);
    REQUIRE(mine.numel == ref.numel);
    const std::size_t bytes = sizeof(float) * static_cast<std::size_t>(ref.numel);
    CHECK(std::memcmp(grads ? mine.grad : mine.param, grads ? ref.grad : ref.param, bytes) == 0);
  }
}

struct Shape {
  int p, v, n_layer;
  Placement placement = Placement::kLoop;
};

TEST_CASE("pipeline-order chunks are bitwise equal to the single-process reference",
          "[gpt][pipeline]") {
  // Even and uneven splits, one stage holding every chunk, and more virtual stages than layers
  // (virtual stages 3..7 of {4, 2, 3} hold no layers: pure pass-through and a head-only chunk).
  // V placement (zbv, dualpipev): stage 0 holds the first and the last virtual stage, so the
  // tied wte and its mirror share a stage and no exchange happens.
  const Shape shape =
      GENERATE(Shape{2, 2, 4}, Shape{3, 1, 5}, Shape{1, 3, 3}, Shape{4, 2, 9}, Shape{4, 2, 3},
               Shape{2, 2, 4, Placement::kV}, Shape{4, 2, 9, Placement::kV},
               Shape{4, 2, 3, Placement::kV});
  const bool split = GENERATE(false, true);
  const bool tied = GENERATE(false, true);
  // With a warm-up, cosine decay within the 3 steps and a clip that every step triggers.
  const bool scheduled = GENERATE(false, true);
  const bool recompute = GENERATE(false, true);
  CAPTURE(shape.p, shape.v, shape.n_layer, shape.placement == Placement::kV, split, tied,
          scheduled, recompute);

  GptConfig config = testing::PipelineConfig(shape.n_layer, tied);
  if (scheduled) {
    config.optimizer.warmup_steps = 1;
    config.optimizer.decay_steps = 3;
    config.optimizer.min_learning_rate = config.optimizer.learning_rate / 10;
    config.optimizer.clip_norm = 0.05f;
  }
  auto data = std::make_shared<const GptData>(GptData::Synthetic());
  auto reference_or = ReferenceTrainer::Create(config, data);
  REQUIRE(reference_or.ok());
  GptStageModel& reference = (*reference_or)->model();
  Pipeline pipe = MakePipeline(config, shape.p, shape.v, shape.placement, data);
  // The placement reached the chunks: under V stage 0's chunk 1 is the last virtual stage.
  CHECK(pipe.stages[0]->chunk(shape.v - 1).virtual_stage() ==
        (shape.placement == Placement::kV ? 2 * shape.p - 1 : (shape.v - 1) * shape.p));
  std::vector<const GptStageModel*> stages;
  for (auto& s : pipe.stages) stages.push_back(s.get());

  // Same init, independent of the split.
  RequireBitwiseEqual(stages, reference, /*grads=*/false);

  for (std::int64_t step = 0; step < 3; ++step) {
    CAPTURE(step);
    auto want_losses = (*reference_or)->AccumulateGradients(step);
    REQUIRE(want_losses.ok());
    RunIteration(pipe, step, split, recompute);
    const GptStageModel& last = pipe.stage_of(pipe.map.num_virtual_stages() - 1);
    REQUIRE(last.holds_loss());
    REQUIRE(last.losses().size() == want_losses->size());
    CHECK(std::memcmp(last.losses().data(), want_losses->data(),
                      sizeof(double) * want_losses->size()) == 0);
    for (double loss : last.losses()) CHECK(std::isfinite(loss));
    RequireBitwiseEqual(stages, reference, /*grads=*/true);

    const double norm = StepOptimizers(pipe);
    double want_norm = std::numeric_limits<double>::quiet_NaN();
    const float scale = ClipScaleOf({&reference}, &want_norm);
    REQUIRE(reference.OptimizerStep(scale).ok());
    if (scheduled) {
      CHECK(std::memcmp(&norm, &want_norm, sizeof(norm)) == 0);
      CHECK(norm > config.optimizer.clip_norm);  // the clip took effect
      CHECK(scale < 1.0f);
    }
    RequireBitwiseEqual(stages, reference, /*grads=*/false);

    std::vector<TensorHash> hashes;
    for (auto& s : pipe.stages) {
      const std::vector<TensorHash> part = s->ParameterHashes();
      hashes.insert(hashes.end(), part.begin(), part.end());
    }
    auto combined = CombineTensorHashes(hashes, reference.num_tensors());
    REQUIRE(combined.ok());
    auto want = (*reference_or)->Checksum();
    REQUIRE(want.ok());
    CHECK(*combined == *want);
  }
  if (tied) {
    // Both copies of wte took the same steps: still bitwise equal after training.
    const auto tensors = CollectTensors(stages);
    const TensorRef& wte = tensors.at({kTokenEmbeddingId, false});
    const TensorRef& mirror = tensors.at({kTokenEmbeddingId, true});
    CHECK(std::memcmp(wte.param, mirror.param, sizeof(float) * wte.numel) == 0);
  }
}

TEST_CASE("parameters move during training (the equality above is not vacuous)",
          "[gpt][pipeline]") {
  const GptConfig config = testing::PipelineConfig(2, false);
  auto data = std::make_shared<const GptData>(GptData::Synthetic());
  auto trainer = ReferenceTrainer::Create(config, data);
  REQUIRE(trainer.ok());
  auto before = (*trainer)->Checksum();
  REQUIRE(before.ok());
  REQUIRE((*trainer)->TrainStep().ok());
  auto after = (*trainer)->Checksum();
  REQUIRE(after.ok());
  CHECK(*before != *after);
}

}  // namespace
}  // namespace pipeoffload::gpt
