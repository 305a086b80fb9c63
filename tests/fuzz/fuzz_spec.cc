// libFuzzer target: the spec space. The input's bytes choose a PipelineSpec (every family and
// offload policy, split backward, group size, offload fraction and chunks, memory budget) and a
// few cost-model fields; Compile must either refuse it with a Status or emit a schedule that
// Validate accepts and Simulate times finitely. The shape is bounded (p <= 16, m <= 64, v <= 4:
// at most 4,096 entries) so that one input plans in well under libFuzzer's -timeout and
// -rss_limit_mb; the large shapes' cost is bounded in the compiler itself (families.h limits).
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "pipeoffload/compiler.h"
#include "pipeoffload/validate.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

// Takes bytes from the input front to back; zeros past its end.
class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  std::uint8_t Byte() { return at_ < size_ ? data_[at_++] : 0; }
  std::uint32_t Word() {
    std::uint32_t out = 0;
    for (int i = 0; i < 4; ++i) out = (out << 8) | Byte();
    return out;
  }
  // A double from 8 bytes: any bit pattern, NaN and infinities included.
  double AnyDouble() {
    std::uint64_t bits = 0;
    for (int i = 0; i < 8; ++i) bits = (bits << 8) | Byte();
    double out = 0;
    std::memcpy(&out, &bits, sizeof(out));
    return out;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t at_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pipeoffload;
  Bytes in(data, size);
  PipelineSpec spec;
  spec.num_stages = 1 + in.Byte() % 16;
  spec.num_microbatches = 1 + in.Byte() % 64;
  spec.chunks_per_stage = 1 + in.Byte() % 4;
  const std::uint8_t family = in.Byte();  // the high bit asks for v placement, any family
  spec.family = static_cast<Family>(family % 5);
  spec.placement = (family & 0x80) != 0 ? Placement::kV : Placement::kLoop;
  spec.offload = static_cast<OffloadPolicy>(in.Byte() % 5);
  spec.split_backward = (in.Byte() & 1) != 0;
  spec.group_size = in.Byte() % 18;  // 0 (the default) and out-of-range values too
  spec.offload_fraction = (in.Byte() % 11) / 10.0;
  spec.offload_chunks = in.Byte() % 5;
  spec.memory_budget_bytes = static_cast<std::int64_t>(in.Word()) << (in.Byte() % 24);
  spec.strict = (in.Byte() & 1) != 0;

  CostModel cost = UnitCostModel(0.25 * (in.Byte() % 9));
  const std::uint8_t which = in.Byte();
  // Usually sane costs, sometimes arbitrary bit patterns in one field.
  if (which & 1) cost.forward_time = 0.5 + (in.Byte() % 8);
  if (which & 2) cost.backward_time = (in.Byte() % 8);
  if (which & 4) cost.activation_bytes = static_cast<std::int64_t>(in.Word()) << (in.Byte() % 40);
  if (which & 8) cost.host_link_group_size = 1 + static_cast<int>(in.Word() % 0x7FFFFFFF);
  if (which & 16) cost.d2h_bandwidth = in.AnyDouble();
  if (which & 32) cost.p2p_latency = in.AnyDouble();
  cost.shared_copy_engine = (which & 64) != 0;
  cost.p2p_shares_host_link = (which & 128) != 0;

  absl::StatusOr<Schedule> schedule = Compile(spec, cost);
  if (!schedule.ok()) return 0;
  PO_FUZZ_CHECK(Validate(*schedule).ok(), "the compiler emitted an invalid schedule");
  PO_FUZZ_CHECK(schedule->predictions.has_value(), "a compiled schedule without predictions");
  fuzzing::SimulateChecked(*schedule, cost);
  return 0;
}
