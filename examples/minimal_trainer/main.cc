// The smallest complete pipeline trainer, on the public API only (pipeoffload/pipeline.h): a toy
// model cut into p * v virtual stages, each y = w * x + b elementwise, learns y = 2 x + 1
// (composed over the stages) with SGD, under a planned schedule that offloads activations
// (po-f). Every stage is a thread on its own CPU backend; swap the backend for a CUDA one
// (pipeoffload/cuda.h) and launch the kernels on its compute stream to run on a GPU.
// Run: build/examples/minimal_trainer [steps]. Prints the loss per step; exits 1 on an error and
// 2 when the loss did not fall below a tenth of the first step's (CTest runs it).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "pipeoffload/pipeline.h"

namespace {

using pipeoffload::StageModel;

constexpr int kStages = 2;        // p: threads
constexpr int kChunks = 2;        // v: chunks per stage
constexpr int kMicrobatches = 4;  // m
constexpr int kWidth = 256;       // n: floats per activation
constexpr float kLearningRate = 0.05f;

float Input(int mb, int i) { return std::sin(0.1f * static_cast<float>(i) + 0.7f * mb); }

// One stage's chunks. Chunk c is virtual stage c * p + stage. The stash entry of (mb, chunk)
// is the chunk's input x (n floats): what its backward needs. The runtime may move it to host
// memory and back in between, so the model keeps no pointer to it.
class ToyStage final : public StageModel {
 public:
  ToyStage()
      : w_(kChunks, std::vector<float>(kWidth, 1.0f)),
        b_(kChunks, std::vector<float>(kWidth, 0.0f)), gw_(w_), gb_(b_) {}

  std::int64_t SavedBytes(int, bool) const override { return kWidth * sizeof(float); }
  std::int64_t BoundaryBytes() const override { return kWidth * sizeof(float); }

  absl::Status Forward(int mb, int c, const void* input, void* output, void* saved) override {
    float* x = static_cast<float*>(saved);
    for (int i = 0; i < kWidth; ++i) {
      x[i] = input != nullptr ? static_cast<const float*>(input)[i] : Input(mb, i);
    }
    if (output == nullptr) {  // the last virtual stage: the loss
      for (int i = 0; i < kWidth; ++i) {
        const float err = Y(c, x, i) - (2.0f * Input(mb, i) + 1.0f);
        loss_ += 0.5 * err * err / (kWidth * kMicrobatches);
      }
      return absl::OkStatus();
    }
    for (int i = 0; i < kWidth; ++i) static_cast<float*>(output)[i] = Y(c, x, i);
    return absl::OkStatus();
  }

  absl::Status Backward(int mb, int c, const void* grad_output, void* grad_input, void* saved,
                        bool) override {
    const float* x = static_cast<const float*>(saved);
    for (int i = 0; i < kWidth; ++i) {
      const float dy = grad_output != nullptr ? static_cast<const float*>(grad_output)[i]
                                              : Y(c, x, i) - (2.0f * Input(mb, i) + 1.0f);
      gw_[c][i] += dy * x[i];
      gb_[c][i] += dy;
      if (grad_input != nullptr) static_cast<float*>(grad_input)[i] = w_[c][i] * dy;
    }
    return absl::OkStatus();
  }

  absl::Status BackwardWeight(int, int, void*) override {
    return absl::UnimplementedError("this model does not split W");
  }

  // SGD on the step's mean gradient; zeroes the gradients and returns the loss it had.
  double Step() {
    for (int c = 0; c < kChunks; ++c) {
      for (int i = 0; i < kWidth; ++i) {
        w_[c][i] -= kLearningRate * gw_[c][i] / kMicrobatches;
        b_[c][i] -= kLearningRate * gb_[c][i] / kMicrobatches;
        gw_[c][i] = gb_[c][i] = 0.0f;
      }
    }
    const double loss = loss_;
    loss_ = 0.0;
    return loss;
  }

 private:
  float Y(int c, const float* x, int i) const { return w_[c][i] * x[i] + b_[c][i]; }

  std::vector<std::vector<float>> w_, b_, gw_, gb_;  // [chunk][n]
  double loss_ = 0.0;  // this step's, on the stage that holds the last virtual stage
};

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "minimal_trainer: %s\n", std::string(status.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 30;
  pipeoffload::PipelineSpec spec;
  spec.family = pipeoffload::Family::kGroupInterleaved;
  spec.num_stages = kStages;
  spec.num_microbatches = kMicrobatches;
  spec.chunks_per_stage = kChunks;
  spec.offload = pipeoffload::OffloadPolicy::kFull;  // po-f: offload what the plan can hide

  pipeoffload::StageOptions options;
  options.spec = spec;  // compiled on nominal costs and the models' exact stash sizes
  std::vector<std::unique_ptr<ToyStage>> stages;
  std::vector<StageModel*> models;
  for (int d = 0; d < kStages; ++d) {
    stages.push_back(std::make_unique<ToyStage>());
    models.push_back(stages.back().get());
  }
  absl::StatusOr<std::unique_ptr<pipeoffload::LocalPipeline>> pipeline =
      pipeoffload::LocalPipeline::Open(options, models);
  if (!pipeline.ok()) return Fail(pipeline.status());
  const pipeoffload::Schedule& schedule = (*pipeline)->stage(0).schedule();
  for (int d = 0; d < kStages; ++d) {
    const pipeoffload::StagePrediction& stage = schedule.predictions->stages[d];
    std::printf("stage %d: stash peak %lld bytes (%lld without offload), offloads %lld bytes\n",
                d, static_cast<long long>(stage.peak_bytes),
                static_cast<long long>(stage.peak_bytes_without_offload),
                static_cast<long long>(stage.offloaded_bytes));
  }
  double first = 0.0, last = 0.0;
  for (int step = 0; step < steps; ++step) {
    absl::StatusOr<std::vector<pipeoffload::IterationStats>> stats = (*pipeline)->Run();
    if (!stats.ok()) return Fail(stats.status());
    double loss = 0.0;
    for (auto& stage : stages) loss += stage->Step();  // only the last stage has a loss
    std::printf("step %d loss %.6f (stage 0 stash peak %lld bytes)\n", step, loss,
                static_cast<long long>((*stats)[0].stash_high_water_bytes));
    if (step == 0) first = loss;
    last = loss;
  }
  return last < 0.1 * first ? 0 : 2;
}
