// What gpt_train's ranks tell each other over their RankGroup, as bytes (lib/base/byte_wire.h):
// a step's losses and measured stats, gradient sums of squares, parameter hashes.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_WIRE_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_WIRE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/gpt/gpt_params.h"
#include "examples/gpt/optimizer_schedule.h"
#include "lib/base/byte_wire.h"
#include "pipeoffload/runtime.h"

namespace pipeoffload::gpt {

using internal::ByteReader;
using internal::ByteWriter;

// One rank's account of one step: whether its iteration ran, the losses it computed (the
// stage holding the last virtual stage; empty elsewhere) and its measured stats. The stats'
// per-op timeline and memory samples travel only when `with_timeline` (the trace's step).
struct StepReport {
  absl::Status status;
  std::vector<double> losses;
  IterationStats stats;
};
std::string EncodeStepReport(const StepReport& report, bool with_timeline);
[[nodiscard]] absl::StatusOr<StepReport> DecodeStepReport(std::string_view bytes);

// Hashes of a rank's parameter tensors plus the bytes of its model state.
std::string EncodeHashes(const std::vector<TensorHash>& hashes, std::int64_t model_state_bytes);
[[nodiscard]] absl::Status DecodeHashes(std::string_view bytes, std::vector<TensorHash>* hashes,
                                        std::int64_t* model_state_bytes);

// A rank's per-tensor gradient sums of squares (global-norm clipping).
std::string EncodeSquareSums(const std::vector<TensorSquareSum>& sums);
[[nodiscard]] absl::Status DecodeSquareSums(std::string_view bytes,
                                            std::vector<TensorSquareSum>* sums);

}  // namespace pipeoffload::gpt

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_WIRE_H_
