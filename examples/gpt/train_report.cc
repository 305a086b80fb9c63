// gpt_train's printed lines and trace file (see train_report.h).
#include "examples/gpt/train_report.h"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "examples/gpt/optimizer_schedule.h"
#include "pipeoffload/trace.h"

namespace pipeoffload::gpt {

double MeanLoss(const std::vector<double>& losses) {
  double sum = 0.0;
  for (double loss : losses) sum += loss;
  return losses.empty() ? 0.0 : sum / static_cast<double>(losses.size());
}

void PrintDataAndModel(std::FILE* out, const GptData& data, const GptConfig& c) {
  std::fprintf(
      out, "data: %s, %" PRId64 " bytes, unigram entropy %.4f nats (%.4f bits) per token\n",
      data.name().c_str(), data.size(), data.UnigramEntropyNats(), data.UnigramEntropyBits());
  std::fprintf(out,
               "model: %d layers, C %d, %d heads, T %d, V %d, %s head; B %d x m %d per step, "
               "seed %" PRIu64 "\n",
               c.n_layer, c.n_embd, c.n_head, c.seq_len, c.vocab_size,
               c.tied_embeddings ? "tied" : "untied", c.batch_size, c.num_microbatches, c.seed);
  const AdamWConfig& o = c.optimizer;
  std::string clip = o.clip_norm > 0.0f
                         ? absl::StrCat("global gradient norm clipped to ", o.clip_norm)
                         : std::string("no gradient clipping");
  std::fprintf(out,
               "optimizer: AdamW beta1 %g beta2 %g eps %g weight decay %g; lr %s; %s\n",
               static_cast<double>(o.beta1), static_cast<double>(o.beta2),
               static_cast<double>(o.epsilon), static_cast<double>(o.weight_decay),
               DescribeLearningRate(o).c_str(), clip.c_str());
}

void PrintPlan(std::FILE* out, const Schedule& schedule, const std::string& transport_name,
               bool seconds) {
  const PipelineSpec& s = schedule.spec;
  std::fprintf(out,
               "pipeline: %d stages over %s, %s v=%d g=%d m=%d, offload %s, split backward %s\n",
               s.num_stages, transport_name.c_str(), std::string(FamilyName(s.family)).c_str(),
               s.chunks_per_stage, s.group_size, s.num_microbatches,
               std::string(OffloadPolicyName(s.offload)).c_str(), s.split_backward ? "on" : "off");
  if (!schedule.predictions.has_value()) return;
  const Predictions& p = *schedule.predictions;
  std::string peaks;
  for (const StagePrediction& stage : p.stages) {
    absl::StrAppend(&peaks, peaks.empty() ? "" : " ", stage.peak_bytes, " (",
                    stage.peak_bytes_without_offload, ")");
  }
  std::fprintf(out,
               seconds ? "plan: predicted step %.4f s (%.4f without offload), bubble "
                         "%.3f; stash peak bytes per stage (without offload): %s\n"
                       : "plan: predicted step %.3f layer-forward units (%.3f without offload), "
                         "bubble %.3f; stash peak bytes per stage (without offload): %s\n",
               p.step_time, p.step_time_without_offload, p.bubble_ratio, peaks.c_str());
  for (const std::string& warning : p.warnings) {
    std::fprintf(out, "plan warning: %s\n", warning.c_str());
  }
  // An offload policy that lowers no peak is memory traffic for nothing: say why and what helps.
  std::int64_t peak = 0;
  std::int64_t peak_without = 0;
  for (const StagePrediction& stage : p.stages) {
    peak = std::max(peak, stage.peak_bytes);
    peak_without = std::max(peak_without, stage.peak_bytes_without_offload);
  }
  if (s.offload != OffloadPolicy::kNone && !p.stages.empty() && peak >= peak_without) {
    std::fprintf(out,
                 "plan warning: offload %s leaves the largest stash peak at %" PRId64
                 " bytes: at these costs no entry that sets it can reach the host and come back "
                 "within its lifetime; more chunks per stage (--chunks) make shorter entries\n",
                 std::string(OffloadPolicyName(s.offload)).c_str(), peak);
  }
}

void PrintStep(std::FILE* out, std::int64_t step, double loss, double seconds,
               double flops_per_gpu, double learning_rate, double grad_norm) {
  std::fprintf(out, "step %" PRId64 " loss %.9g time %.3f s", step, loss, seconds);
  if (flops_per_gpu > 0 && seconds > 0) {
    std::fprintf(out, ", model %.1f TFLOP/s per GPU", flops_per_gpu / seconds / 1e12);
  }
  if (learning_rate >= 0) std::fprintf(out, ", lr %.4g", learning_rate);
  if (std::isfinite(grad_norm)) std::fprintf(out, ", grad norm %.4g", grad_norm);
  std::fprintf(out, "\n");
  std::fflush(out);
}

void PrintStageTable(std::FILE* out, const TrainResult& result) {
  const bool ran = !result.losses.empty();
  for (const StageSummary& s : result.stages) {
    const bool equal = s.stash_peak_bytes == s.predicted_stash_peak_bytes;
    const char* verdict = !ran ? "no step ran" : equal ? "equal" : "MISMATCH";
    std::fprintf(out,
                 "stage %d: stash peak %" PRId64 " B measured, %" PRId64
                 " B predicted (%s); p2p peak %" PRId64 " B, other arena %" PRId64
                 " B, arena budget %" PRId64 " B; host pool peak %" PRId64 " B (predicted %" PRId64
                 "), offloaded %" PRId64 " B/step (predicted %" PRId64 "); model state %" PRId64
                 " B outside the arena; compute %.3f s, wait %.3f s per step\n",
                 s.stage, s.stash_peak_bytes, s.predicted_stash_peak_bytes, verdict,
                 s.p2p_peak_bytes, s.other_arena_peak_bytes, s.arena_budget_bytes,
                 s.host_peak_bytes, s.predicted_host_bytes, s.offloaded_bytes,
                 s.predicted_offloaded_bytes, s.model_state_bytes, s.compute_seconds,
                 s.wait_seconds);
  }
  for (const StageSummary& s : result.stages) {
    if (s.description.empty()) continue;
    std::fprintf(out, "stage %d runs on: %s; optimizer step %.4f s\n", s.stage,
                 s.description.c_str(), s.optimizer_seconds);
  }
  if (!result.stages.empty() && ran) {
    std::fprintf(out, "%s\n",
                 result.peaks_match
                     ? "stash peaks: measured == predicted on every stage"
                     : "stash peaks: MISMATCH between measured and predicted (a runtime or "
                       "compiler bug; see the stage lines)");
  }
  const std::size_t n = result.step_seconds.size();
  if (n > 1) {
    double sum = 0.0;
    for (std::size_t i = 1; i < n; ++i) sum += result.step_seconds[i];
    std::fprintf(out, "mean step time %.4f s over steps 1..%zu\n", sum / static_cast<double>(n - 1),
                 n - 1);
  }
}

void PrintChecksum(std::FILE* out, std::uint64_t checksum) {
  std::fprintf(out, "checksum 0x%016llx\n", static_cast<unsigned long long>(checksum));
  std::fflush(out);
}

absl::Status WriteTraceFile(const std::string& path, const Schedule& schedule,
                            const std::vector<IterationStats>& stats) {
  absl::StatusOr<Timeline> timeline = MeasuredTimeline(stats);
  if (!timeline.ok()) return timeline.status();
  const std::string json = TimelineToTraceJson(schedule, *timeline, /*microseconds_per_unit=*/1e6);
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << json;
  file.close();
  if (!file) {
    return absl::UnavailableError(
        absl::StrCat("cannot write trace file ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

std::string DescribeCosts(const std::vector<StageCosts>& stages, int stages_per_device) {
  std::string text = "costs: measured, per stage F / B ms (mean over its chunks):";
  for (std::size_t d = 0; d < stages.size(); ++d) {
    const ChunkTimes mean = MeanChunkTimes(stages[d]);
    absl::StrAppendFormat(&text, "%s %.2f / %.2f", d == 0 ? "" : ",", 1e3 * mean.forward,
                          1e3 * mean.backward);
  }
  const LinkFigures link = SlowestLink(stages);
  absl::StrAppendFormat(&text, "; host link (slowest stage) D2H %.1f, H2D %.1f, duplex %.1f GB/s",
                        link.d2h / 1e9, link.h2d / 1e9, link.duplex / 1e9);
  if (stages_per_device > 1) {
    absl::StrAppend(&text, "; the ", stages_per_device,
                    " stages share one device: planned with compute x", stages_per_device,
                    " and the link split ", stages_per_device, " ways");
  }
  return text;
}

}  // namespace pipeoffload::gpt
