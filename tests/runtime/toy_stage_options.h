// The toy model's shape and the stage options of the tests that open it through the way in
// (pipeline_stage_test.cc, fault_injection_test.cc).
#ifndef PIPEOFFLOAD_TESTS_RUNTIME_TOY_STAGE_OPTIONS_H_
#define PIPEOFFLOAD_TESTS_RUNTIME_TOY_STAGE_OPTIONS_H_

#include "pipeoffload/pipeline.h"
#include "pipeoffload/schedule.h"
#include "tests/runtime/toy_model.h"

namespace pipeoffload::testing {

inline constexpr int kToyStageWidth = 16;
// Chunk c saves 8 * (c + 1) more words: chunks differ in size.
inline constexpr int kToyStageExtraWords = 8;
inline constexpr double kToyStageTimeout = 30.0;

// The toy model of `spec`'s shape.
inline ToyConfig ToyStageConfig(const PipelineSpec& spec) {
  return ToyConfig{spec.num_stages, spec.chunks_per_stage, spec.num_microbatches, kToyStageWidth,
                   kToyStageExtraWords};
}

// Open's options for `spec`: every wait bounded, released memory poisoned (a read after release
// shows up as DataLoss).
inline StageOptions ToyStageOptions(const PipelineSpec& spec) {
  StageOptions options;
  options.spec = spec;
  options.executor.wait_timeout_seconds = kToyStageTimeout;
  options.poison_on_free = true;
  return options;
}

}  // namespace pipeoffload::testing

#endif  // PIPEOFFLOAD_TESTS_RUNTIME_TOY_STAGE_OPTIONS_H_
