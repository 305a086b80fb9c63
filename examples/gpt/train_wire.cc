// Encoding of what gpt_train's ranks exchange (see train_wire.h).
#include "examples/gpt/train_wire.h"

namespace pipeoffload::gpt {

std::string EncodeStepReport(const StepReport& report, bool with_timeline) {
  ByteWriter w;
  w.PutStatus(report.status);
  w.PutVector(report.losses);
  const IterationStats& s = report.stats;
  w.Put(s.stage);
  w.Put(s.start_time);
  w.Put(s.end_time);
  w.Put(s.stash_high_water_bytes);
  w.Put(s.stash_physical_high_water_bytes);
  w.Put(s.stash_high_water_entries);
  w.Put(s.p2p_high_water_bytes);
  w.Put(s.other_high_water_bytes);
  w.Put(s.host_high_water_bytes);
  w.Put(s.offloaded_bytes);
  w.Put(s.reloaded_bytes);
  w.Put(s.compute_seconds);
  w.Put(s.wait_seconds);
  w.Put(s.release_wait_seconds);
  w.PutVector(with_timeline ? s.ops : std::vector<TimedOp>{});
  w.PutVector(with_timeline ? s.memory : std::vector<MemorySample>{});
  return w.Take();
}

absl::StatusOr<StepReport> DecodeStepReport(std::string_view bytes) {
  ByteReader r(bytes);
  StepReport report;
  IterationStats& s = report.stats;
  r.GetStatus(&report.status);
  r.GetVector(&report.losses);
  r.Get(&s.stage);
  r.Get(&s.start_time);
  r.Get(&s.end_time);
  r.Get(&s.stash_high_water_bytes);
  r.Get(&s.stash_physical_high_water_bytes);
  r.Get(&s.stash_high_water_entries);
  r.Get(&s.p2p_high_water_bytes);
  r.Get(&s.other_high_water_bytes);
  r.Get(&s.host_high_water_bytes);
  r.Get(&s.offloaded_bytes);
  r.Get(&s.reloaded_bytes);
  r.Get(&s.compute_seconds);
  r.Get(&s.wait_seconds);
  r.Get(&s.release_wait_seconds);
  r.GetVector(&s.ops);
  r.GetVector(&s.memory);
  if (absl::Status done = r.Finish("step report"); !done.ok()) return done;
  return report;
}

std::string EncodeHashes(const std::vector<TensorHash>& hashes, std::int64_t model_state_bytes) {
  ByteWriter w;
  w.PutVector(hashes);
  w.Put(model_state_bytes);
  return w.Take();
}

absl::Status DecodeHashes(std::string_view bytes, std::vector<TensorHash>* hashes,
                          std::int64_t* model_state_bytes) {
  ByteReader r(bytes);
  r.GetVector(hashes);
  r.Get(model_state_bytes);
  return r.Finish("parameter hashes");
}

std::string EncodeSquareSums(const std::vector<TensorSquareSum>& sums) {
  ByteWriter w;
  w.PutVector(sums);
  return w.Take();
}

absl::Status DecodeSquareSums(std::string_view bytes, std::vector<TensorSquareSum>* sums) {
  ByteReader r(bytes);
  r.GetVector(sums);
  return r.Finish("gradient sums of squares");
}

}  // namespace pipeoffload::gpt
