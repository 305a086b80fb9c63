// The GPT trainers' learning-rate schedule and global gradient-norm clipping: one definition
// that the single-process reference, the CPU pipeline stages and the CUDA stages all use, so
// every trainer takes the same rate at every update and clips by the same norm.
//
// The global norm does not depend on how the model is cut into stages: each tensor's sum of
// squares is taken on its own (in a fixed order within the tensor), and the sums are added in
// global tensor-id order. Any set of stages' per-tensor sums, concatenated in any order, give
// the single-process bits (the way CombineTensorHashes gives the checksum).
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_OPTIMIZER_SCHEDULE_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_OPTIMIZER_SCHEDULE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "examples/gpt/gpt_config.h"

namespace pipeoffload::gpt {

// The learning rate of update t (1-based: the first update is t = 1), computed in double and
// rounded once:
//   t <= warmup_steps:            learning_rate * t / warmup_steps (linear warm-up)
//   decay_steps == 0:             learning_rate
//   warmup_steps < t < decay:     min + (learning_rate - min) * (1 + cos(pi * progress)) / 2,
//                                 progress = (t - warmup_steps) / (decay_steps - warmup_steps)
//   t >= decay_steps:             min_learning_rate
// REQUIRES: t >= 1.
float LearningRateAt(const AdamWConfig& config, std::int64_t t);

// "constant 0.003", "warm-up 20 steps to 0.0003, cosine to 3e-05 at step 200", "warm-up 12
// steps to 0.0003, then 3e-05" (decay_steps within the warm-up), for reports.
std::string DescribeLearningRate(const AdamWConfig& config);

// One tensor's sum of squared gradients.
struct TensorSquareSum {
  int id = 0;  // global id (index into GptTensorSpecs)
  double sum = 0.0;
};

// The sum over i < n of double(x[i])^2, in index order (the CPU GPT's per-tensor sum).
double SquareSum(const float* x, std::int64_t n);

// The global L2 norm: the square root of the tensors' sums added in id order. Every id in
// [0, num_tensors) exactly once; InvalidArgument naming the first id missing, repeated or out
// of range otherwise.
[[nodiscard]] absl::StatusOr<double> CombineSquareSums(std::vector<TensorSquareSum> sums,
                                                       int num_tensors);

// What every gradient is multiplied by: min(1, clip_norm / norm) (1 when clip_norm is 0, i.e.
// clipping is off). DataLoss for a norm that is not finite (an overflow: the update would be
// NaN everywhere), naming the norm.
[[nodiscard]] absl::StatusOr<float> ClipScale(double norm, float clip_norm);

// CombineSquareSums then ClipScale: the step's global norm and gradient scale from every
// stage's sums. Errors: theirs.
struct GlobalClip {
  double norm = 0.0;
  float scale = 1.0f;
};
[[nodiscard]] absl::StatusOr<GlobalClip> ClipGlobalNorm(std::vector<TensorSquareSum> sums,
                                                        int num_tensors, float clip_norm);

}  // namespace pipeoffload::gpt

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_OPTIMIZER_SCHEDULE_H_
