// Runs the relay model (relay_model.h) as a pipeline through the installed package's way in
// (pipeline.h's LocalPipeline): p = 2 stages, v = 2 chunks, m = 4 microbatches,
// group-interleaved with full offload, one stage per given backend; two iterations, and checks
// what the runtime promises exactly: every chunk's forward and backward ran once, the stash
// peak and the offloaded bytes are the compiler's predictions to the byte, and (where the
// model can read device memory) every word arrived intact. Prints what it finds; returns the
// process exit code (0 when every check held).
#ifndef PIPEOFFLOAD_TESTS_PACKAGE_RELAY_PIPELINE_H_
#define PIPEOFFLOAD_TESTS_PACKAGE_RELAY_PIPELINE_H_

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "pipeoffload/pipeline.h"
#include "relay_model.h"

namespace relay {

inline int Report(const char* who, const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", who, what.c_str());
  return 1;
}

inline int RunRelayPipeline(const char* who, const std::vector<pipeoffload::Backend*>& backends) {
  constexpr int kChunks = 2, kMicrobatches = 4, kIterations = 2;
  pipeoffload::PipelineSpec spec;
  spec.family = pipeoffload::Family::kGroupInterleaved;
  spec.num_stages = static_cast<int>(backends.size());
  spec.num_microbatches = kMicrobatches;
  spec.chunks_per_stage = kChunks;
  spec.offload = pipeoffload::OffloadPolicy::kFull;
  pipeoffload::StageOptions options;
  options.spec = spec;

  std::vector<std::unique_ptr<RelayModel>> models;
  std::vector<pipeoffload::StageModel*> model_pointers;
  for (pipeoffload::Backend* backend : backends) {
    models.push_back(std::make_unique<RelayModel>(*backend));
    model_pointers.push_back(models.back().get());
  }
  auto pipeline = pipeoffload::LocalPipeline::Open(options, model_pointers, backends);
  if (!pipeline.ok()) return Report(who, "Open: " + pipeline.status().ToString());
  const pipeoffload::Predictions& predicted = *(*pipeline)->stage(0).schedule().predictions;
  std::int64_t offloaded = 0;
  for (int iteration = 0; iteration < kIterations; ++iteration) {
    auto stats = (*pipeline)->Run();
    if (!stats.ok()) return Report(who, "Run: " + stats.status().ToString());
    for (int d = 0; d < spec.num_stages; ++d) {
      const pipeoffload::StagePrediction& stage = predicted.stages[d];
      const pipeoffload::IterationStats& measured = (*stats)[d];
      if (measured.stash_high_water_bytes != stage.peak_bytes ||
          measured.offloaded_bytes != stage.offloaded_bytes ||
          measured.reloaded_bytes != stage.offloaded_bytes) {
        return Report(who, "stage " + std::to_string(d) + ": stash peak " +
                               std::to_string(measured.stash_high_water_bytes) + " (predicted " +
                               std::to_string(stage.peak_bytes) + "), offloaded " +
                               std::to_string(measured.offloaded_bytes) + " / reloaded " +
                               std::to_string(measured.reloaded_bytes) + " (predicted " +
                               std::to_string(stage.offloaded_bytes) + ")");
      }
      offloaded += measured.offloaded_bytes;
    }
  }
  if (offloaded == 0) return Report(who, "the plan offloaded nothing: the test tests nothing");
  for (std::size_t d = 0; d < models.size(); ++d) {
    const int expected = kIterations * kChunks * kMicrobatches;
    if (models[d]->forwards() != expected || models[d]->backwards() != expected ||
        models[d]->wrong_words() != 0) {
      return Report(who, "stage " + std::to_string(d) + ": " +
                             std::to_string(models[d]->forwards()) + " forwards, " +
                             std::to_string(models[d]->backwards()) + " backwards (expected " +
                             std::to_string(expected) + " each), " +
                             std::to_string(models[d]->wrong_words()) + " wrong words");
    }
  }
  std::printf("%s: %d iterations of %zu stages on %s, %lld bytes offloaded, stash peaks as "
              "predicted\n", who, kIterations, backends.size(), backends[0]->Name().c_str(),
              static_cast<long long>(offloaded));
  return 0;
}

}  // namespace relay

#endif  // PIPEOFFLOAD_TESTS_PACKAGE_RELAY_PIPELINE_H_
