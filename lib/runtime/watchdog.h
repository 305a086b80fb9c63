// The watchdog: every wait of the executor is bounded, and an expired wait becomes one message
// that names the stage, the op waited for (with its peer) and the op that needed it, e.g.
// "stage 2 waited 10.0 s for RECV_B3.1<-3 (before B3.1, op 17)". A rank stuck on a lost peer
// or a broken program therefore reports itself instead of hanging.
#ifndef PIPEOFFLOAD_LIB_RUNTIME_WATCHDOG_H_
#define PIPEOFFLOAD_LIB_RUNTIME_WATCHDOG_H_

#include <string>

#include "absl/status/status.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload::internal {

class Watchdog {
 public:
  Watchdog(int stage, double timeout_seconds) : stage_(stage), timeout_(timeout_seconds) {}

  double timeout_seconds() const { return timeout_; }

  // Turns the result of a wait into the executor's error: a DeadlineExceeded becomes the
  // watchdog message above (the cause appended after ": "); any other error is annotated with
  // "stage S, op I (X)" of the current op; OK stays OK.
  [[nodiscard]] absl::Status Check(const absl::Status& wait_result, const Op& waited_for,
                                   const Op& current, int current_index) const;

  // "stage S, op I (X)": the prefix of every error the executor returns for an op.
  std::string Where(const Op& current, int current_index) const;

 private:
  const int stage_;
  const double timeout_;
};

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_RUNTIME_WATCHDOG_H_
