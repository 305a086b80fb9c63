// LocalPipeline (pipeline.h): the stages of one process, opened and run on threads of their own.
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/pipeline.h"

namespace pipeoffload {
namespace {

// Runs body(d) for every stage on a thread of its own; returns the lowest failing stage's
// error, annotated with the stage, or every stage's value.
template <typename T, typename Body>
absl::StatusOr<std::vector<T>> OnThreads(int num_stages, const Body& body) {
  std::vector<std::optional<absl::StatusOr<T>>> results(static_cast<std::size_t>(num_stages));
  std::vector<std::thread> threads;
  for (int d = 0; d < num_stages; ++d) {
    threads.emplace_back([&, d] { results[static_cast<std::size_t>(d)] = body(d); });
  }
  for (std::thread& thread : threads) thread.join();
  std::vector<T> values;
  for (int d = 0; d < num_stages; ++d) {
    absl::StatusOr<T>& result = *results[static_cast<std::size_t>(d)];
    if (!result.ok()) return Annotate(result.status(), absl::StrCat("stage ", d));
    values.push_back(*std::move(result));
  }
  return values;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalPipeline>> LocalPipeline::Open(
    const StageOptions& options, const std::vector<StageModel*>& models,
    const std::vector<Backend*>& backends) {
  const int p = static_cast<int>(models.size());
  if (p < 1 || (!backends.empty() && backends.size() != models.size())) {
    return absl::InvalidArgumentError(absl::StrCat("LocalPipeline: ", models.size(),
                                                   " models and ", backends.size(), " backends"));
  }
  if (options.backend != nullptr || options.transport != nullptr || options.group != nullptr) {
    return absl::InvalidArgumentError(
        "LocalPipeline sets each stage's backend, transport and group; leave them null");
  }
  const double timeout = options.executor.wait_timeout_seconds;
  std::unique_ptr<LocalPipeline> pipeline(new LocalPipeline());
  if (backends.empty()) {
    PO_ASSIGN_OR_RETURN(pipeline->transports_, CreateLocalTransports(p));
  } else {
    PO_ASSIGN_OR_RETURN(pipeline->transports_, CreateLocalTransports(backends, timeout));
  }
  // The set-up gathers wait for the slowest stage's phase (measuring, compiling), each of whose
  // waits the watchdog bounds: a few periods always suffice.
  PO_ASSIGN_OR_RETURN(pipeline->groups_, CreateLocalRankGroups(p, 3 * timeout + 30));
  LocalPipeline& self = *pipeline;
  absl::StatusOr<std::vector<std::unique_ptr<PipelineStage>>> stages =
      OnThreads<std::unique_ptr<PipelineStage>>(p, [&](int d) {
        const auto i = static_cast<std::size_t>(d);
        StageOptions mine = options;
        mine.backend = backends.empty() ? nullptr : backends[i];
        mine.transport = self.transports_[i].get();
        mine.group = self.groups_[i].get();
        return PipelineStage::Open(mine, *models[i]);
      });
  if (!stages.ok()) return stages.status();
  pipeline->stages_ = *std::move(stages);
  return pipeline;
}

LocalPipeline::~LocalPipeline() = default;

absl::StatusOr<std::vector<IterationStats>> LocalPipeline::Run() {
  return OnThreads<IterationStats>(num_stages(), [&](int d) { return stage(d).Run(); });
}

}  // namespace pipeoffload
