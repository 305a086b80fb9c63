// Learning-rate schedule and global-norm clipping of the GPT trainers (optimizer_schedule.h).
#include "examples/gpt/optimizer_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/check.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::gpt {

float LearningRateAt(const AdamWConfig& config, std::int64_t t) {
  PO_CHECK(t >= 1);
  const double lr = config.learning_rate;
  const std::int64_t warmup = config.warmup_steps;
  if (t <= warmup) {
    return static_cast<float>(lr * static_cast<double>(t) / static_cast<double>(warmup));
  }
  if (config.decay_steps == 0) return config.learning_rate;
  if (t >= config.decay_steps) return config.min_learning_rate;
  const double min = config.min_learning_rate;
  const double progress = static_cast<double>(t - warmup) /
                          static_cast<double>(config.decay_steps - warmup);
  return static_cast<float>(min + (lr - min) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress)));
}

std::string DescribeLearningRate(const AdamWConfig& config) {
  const double lr = config.learning_rate;
  if (config.warmup_steps == 0 && config.decay_steps == 0) return absl::StrCat("constant ", lr);
  std::string text = config.warmup_steps > 0
                         ? absl::StrCat("warm-up ", config.warmup_steps, " steps to ", lr)
                         : absl::StrCat("from ", lr);
  if (config.decay_steps > config.warmup_steps) {
    absl::StrAppend(&text, ", cosine to ", static_cast<double>(config.min_learning_rate),
                    " at step ", config.decay_steps);
  } else if (config.decay_steps == 0) {
    absl::StrAppend(&text, ", then constant");
  } else if (config.decay_steps == config.warmup_steps) {  // the run is the warm-up
    absl::StrAppend(&text, " over the whole ", config.decay_steps, "-step run");
  } else {  // decay_steps, the run's length, ends within the warm-up
    absl::StrAppend(&text, " (longer than this ", config.decay_steps, "-step run, which ends at ",
                    static_cast<double>(LearningRateAt(config, config.decay_steps)), ")");
  }
  return text;
}

double SquareSum(const float* x, std::int64_t n) {
  double sum = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    sum += v * v;
  }
  return sum;
}

absl::StatusOr<double> CombineSquareSums(std::vector<TensorSquareSum> sums, int num_tensors) {
  std::sort(sums.begin(), sums.end(),
            [](const TensorSquareSum& a, const TensorSquareSum& b) { return a.id < b.id; });
  if (static_cast<std::int64_t>(sums.size()) != num_tensors) {
    return absl::InvalidArgumentError(absl::StrCat("the gradient norm needs the sums of ",
                                                   num_tensors, " tensors, got ", sums.size()));
  }
  double total = 0.0;
  for (int i = 0; i < num_tensors; ++i) {
    if (sums[static_cast<std::size_t>(i)].id != i) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradient norm: tensor id ", i, " is missing or repeated (found id ",
                       sums[static_cast<std::size_t>(i)].id, ")"));
    }
    total += sums[static_cast<std::size_t>(i)].sum;
  }
  return std::sqrt(total);
}

absl::StatusOr<float> ClipScale(double norm, float clip_norm) {
  if (!std::isfinite(norm)) {
    return absl::DataLossError(absl::StrCat(
        "the global gradient norm is ", norm, ": a gradient overflowed; the update would be NaN"));
  }
  if (clip_norm <= 0.0f || norm <= static_cast<double>(clip_norm)) return 1.0f;
  return static_cast<float>(static_cast<double>(clip_norm) / norm);
}

absl::StatusOr<GlobalClip> ClipGlobalNorm(std::vector<TensorSquareSum> sums, int num_tensors,
                                          float clip_norm) {
  GlobalClip clip;
  PO_ASSIGN_OR_RETURN(clip.norm, CombineSquareSums(std::move(sums), num_tensors));
  PO_ASSIGN_OR_RETURN(clip.scale, ClipScale(clip.norm, clip_norm));
  return clip;
}

}  // namespace pipeoffload::gpt
