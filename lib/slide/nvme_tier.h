// Adam m, v of some sliding units on NVMe (SlidingOptions::nvme_dir / nvme_fraction), and for
// bf16 models the low halves of their split masters (adam.h's SplitMaster; the high halves are
// the pinned upload copies and stay in host memory): each such unit has a place in one
// NvmeStore file; two pinned staging sets take turns, so while the CPU
// updates unit u from one set, the other is written back (the previous unit) and then filled
// with the next unit's state (a prefetch in the update order).
//
// Invariants: a staging set holds at most one unit; Acquire(u) returns u's m, v in a set whose
// read has completed (waiting for the prefetch, or reading now); Release(u) starts the write
// back and the set is reused only after that write completed; the file never holds a state
// older than the last Release. Called from the update thread only.
#ifndef PIPEOFFLOAD_LIB_SLIDE_NVME_TIER_H_
#define PIPEOFFLOAD_LIB_SLIDE_NVME_TIER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/slide/recorder.h"
#include "pipeoffload/backend.h"

namespace pipeoffload {
class NvmeStore;
}

namespace pipeoffload::internal {

class NvmeTier {
 public:
  struct State {
    float* exp_avg = nullptr;
    float* exp_avg_sq = nullptr;
    std::uint16_t* master_lo = nullptr;  // with_master_lo only
  };

  // counts[u] > 0 for units on NVMe (0 otherwise); `order`: the units in the order their
  // updates usually come (prefetch order); `with_master_lo`: each unit's record also holds its
  // masters' low halves. Creates the file (zero state), two staging sets of the largest unit's
  // state from `backend`'s host memory.
  // Errors: the store's (missing, read-only or full directory); ResourceExhausted for staging.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<NvmeTier>> Create(
      Backend& backend, const std::string& dir, const std::vector<std::int64_t>& counts,
      std::vector<int> order, bool with_master_lo, double timeout_seconds,
      SlideRecorder& recorder);
  ~NvmeTier();

  [[nodiscard]] absl::StatusOr<State> Acquire(int unit);
  [[nodiscard]] absl::Status Release(int unit);
  // Waits for every write; then reads a unit's state synchronously (tests, save); a null
  // destination skips that array; unit -1 only waits.
  [[nodiscard]] absl::Status Read(int unit, float* exp_avg, float* exp_avg_sq,
                                  std::uint16_t* master_lo = nullptr);
  // Waits for every write, then writes a unit's master low halves (count elements)
  // synchronously (SetUnitParams); a staged copy of the unit is dropped so the next Acquire
  // reads the file. REQUIRES with_master_lo.
  [[nodiscard]] absl::Status WriteMasterLo(int unit, const std::uint16_t* master_lo);

  std::int64_t file_bytes() const;
  std::int64_t staging_bytes() const;
  std::string Describe() const;  // backend, O_DIRECT or not

 private:
  NvmeTier() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_SLIDE_NVME_TIER_H_
