// The calibration probes (pipeoffload/calibrate.h) on the CPU backend: what they call, with
// which buffers, how many times, and that they give back everything they allocate.
#include "pipeoffload/calibrate.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "tests/backend/gated_backend.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

constexpr std::uint32_t kDefaultPattern = 0x3c5a3c5a;  // calibrate.cc's fill

// A StageModel that records its calls and sleeps a fixed time in each, so the measured times
// have a known floor. Forward reads the first word of its input and saved entry as it finds
// them (before writing), Backward the first word of its output gradient.
class RecordingModel final : public StageModel {
 public:
  struct Call {
    bool forward;
    int mb, chunk;
    const void* input;
    const void* output;
    bool with_weight_grad;
    std::uint32_t first_word;  // of the saved entry (F) or the output gradient (B), 0 if null
  };

  std::int64_t SavedBytes(int chunk, bool) const override { return 4096 * (chunk + 1); }
  std::int64_t BoundaryBytes() const override { return 1024; }
  absl::Status Forward(int mb, int chunk, const void* input, void* output, void* saved) override {
    std::this_thread::sleep_for(forward_sleep);
    calls.push_back({true, mb, chunk, input, output, true, Word(saved)});
    if (output != nullptr) std::memset(output, 0, 1024);
    std::memset(saved, 0x11, static_cast<std::size_t>(SavedBytes(chunk, false)));
    return absl::OkStatus();
  }
  absl::Status Backward(int mb, int chunk, const void* grad_output, void* grad_input, void*,
                        bool with_weight_grad) override {
    std::this_thread::sleep_for(backward_sleep);
    calls.push_back({false, mb, chunk, grad_output, grad_input, with_weight_grad,
                     Word(grad_output)});
    if (fail_backward) return absl::InternalError("backward failed on purpose");
    return absl::OkStatus();
  }
  absl::Status BackwardWeight(int, int, void*) override {
    return absl::InternalError("MeasureChunkTimes must not split the backward");
  }

  std::chrono::milliseconds forward_sleep{2};
  std::chrono::milliseconds backward_sleep{5};
  bool fail_backward = false;
  std::vector<Call> calls;

 private:
  static std::uint32_t Word(const void* p) {
    std::uint32_t word = 0;
    if (p != nullptr) std::memcpy(&word, p, sizeof(word));
    return word;
  }
};

struct Rig {
  std::unique_ptr<Backend> cpu = *CreateCpuBackend();
  testing::GatedBackend backend{*cpu};
  RecordingModel model;
};

TEST_CASE("MeasureChunkTimes: untimed + reps calls of F and full B, medians above the floor",
          "[calibrate]") {
  Rig rig;
  ChunkTimingOptions options;
  options.chunk = 1;
  options.mb = 3;
  options.untimed = 1;
  options.reps = 3;
  absl::StatusOr<ChunkTimes> times = MeasureChunkTimes(rig.backend, rig.model, options);
  REQUIRE(times.ok());
  // A sleep lasts at least its duration: the event-timed call cannot be shorter (F sleeps 2 ms,
  // B 5 ms, so swapped figures fail the second check).
  CHECK(times->forward >= 2e-3);
  CHECK(times->backward >= 5e-3);
  REQUIRE(rig.model.calls.size() == 8);  // (1 + 3) x (F, B), alternating
  for (std::size_t i = 0; i < rig.model.calls.size(); ++i) {
    const RecordingModel::Call& call = rig.model.calls[i];
    CAPTURE(i);
    CHECK(call.forward == (i % 2 == 0));
    CHECK(call.mb == 3);
    CHECK(call.chunk == 1);
    CHECK(call.input != nullptr);   // a middle chunk: input / grad_output present
    CHECK(call.output != nullptr);  // output / grad_input present
    CHECK(call.with_weight_grad);
  }
  // The buffers the chunk reads hold the non-zero pattern before the first call.
  CHECK(rig.model.calls[0].first_word == kDefaultPattern);
  CHECK(rig.model.calls[1].first_word == kDefaultPattern);
  // Later forwards find what the previous one wrote: the same entry is reused.
  CHECK(rig.model.calls[2].first_word == 0x11111111u);
  CHECK(rig.backend.live_device_blocks() == 0);
}

TEST_CASE("MeasureChunkTimes: first and last virtual stages get null boundaries",
          "[calibrate]") {
  for (const bool first : {false, true}) {
    Rig rig;
    ChunkTimingOptions options;
    options.has_input = !first;
    options.has_output = first;
    options.untimed = 0;
    options.reps = 1;
    REQUIRE(MeasureChunkTimes(rig.backend, rig.model, options).ok());
    REQUIRE(rig.model.calls.size() == 2);
    CAPTURE(first);
    CHECK((rig.model.calls[0].input == nullptr) == first);    // F's input
    CHECK((rig.model.calls[0].output == nullptr) == !first);  // F's output
    CHECK((rig.model.calls[1].input == nullptr) == !first);   // B's grad_output
    CHECK((rig.model.calls[1].output == nullptr) == first);   // B's grad_input
    CHECK(rig.backend.live_device_blocks() == 0);
  }
}

TEST_CASE("MeasureStageCosts: boundaries follow the placement (V: chunk 1 runs back down)",
          "[calibrate]") {
  // p = 2, v = 2. Loop: stage 0 holds virtual stages 0, 2 and stage 1 holds 1, 3. V: stage 0
  // holds 0, 3 and stage 1 holds 1, 2, so stage 1's chunk 1 is a middle stage (gpt_train
  // --backend cuda once gave it no output: "a required pointer is null").
  for (const Placement placement : {Placement::kLoop, Placement::kV}) {
    for (int stage = 0; stage < 2; ++stage) {
      Rig rig;
      rig.model.forward_sleep = std::chrono::milliseconds(0);
      rig.model.backward_sleep = std::chrono::milliseconds(0);
      StageCostProbe probe;
      probe.untimed = 0;
      probe.reps = 1;
      probe.link_reps = 1;
      const VirtualStageMap map{placement, 2, 2};
      CAPTURE(placement == Placement::kV, stage);
      absl::StatusOr<StageCosts> costs =
          MeasureStageCosts(rig.backend, rig.model, map, stage, false, probe);
      REQUIRE(costs.ok());
      REQUIRE(costs->chunks.size() == 2);
      REQUIRE(rig.model.calls.size() == 4);  // per chunk: F, B
      for (int chunk = 0; chunk < 2; ++chunk) {
        const int virtual_stage = map.virtual_stage(stage, chunk);
        const RecordingModel::Call& forward = rig.model.calls[static_cast<std::size_t>(2 * chunk)];
        CAPTURE(chunk, virtual_stage);
        CHECK((forward.input == nullptr) == (virtual_stage == 0));
        CHECK((forward.output == nullptr) == (virtual_stage == 3));
      }
      CHECK(rig.backend.live_device_blocks() == 0);
    }
  }
}

TEST_CASE("MeasureChunkTimes: the fill callback sees every buffer the chunk reads",
          "[calibrate]") {
  Rig rig;
  std::vector<std::pair<int, std::int64_t>> filled;  // (index, bytes)
  ChunkTimingOptions options;
  options.chunk = 2;
  options.untimed = 0;
  options.reps = 1;
  options.fill = [&](void* device, std::int64_t bytes, int index) {
    filled.push_back({index, bytes});
    std::memset(device, 0x5a, static_cast<std::size_t>(bytes));
    return absl::OkStatus();
  };
  REQUIRE(MeasureChunkTimes(rig.backend, rig.model, options).ok());
  // Saved entry (index 0), input (1), output gradient (4); the input gradient (2) and the
  // output (3) are only written.
  REQUIRE(filled.size() == 3);
  CHECK(filled[0] == std::pair<int, std::int64_t>{0, 3 * 4096});
  CHECK(filled[1] == std::pair<int, std::int64_t>{1, 1024});
  CHECK(filled[2] == std::pair<int, std::int64_t>{4, 1024});
  CHECK(rig.model.calls[0].first_word == 0x5a5a5a5au);
}

TEST_CASE("MeasureChunkTimes: errors name the problem and leak nothing", "[calibrate]") {
  Rig rig;
  ChunkTimingOptions options;
  options.reps = 0;
  absl::Status status = MeasureChunkTimes(rig.backend, rig.model, options).status();
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(status.message()).find("reps 0") != std::string::npos);

  options.reps = 2;
  rig.model.fail_backward = true;
  status = MeasureChunkTimes(rig.backend, rig.model, options).status();
  CHECK(status.code() == absl::StatusCode::kInternal);
  CHECK(std::string(status.message()) == "backward failed on purpose");
  CHECK(rig.backend.live_device_blocks() == 0);

  options.fill = [](void*, std::int64_t, int) { return absl::ResourceExhaustedError("no fill"); };
  status = MeasureChunkTimes(rig.backend, rig.model, options).status();
  CHECK(status.code() == absl::StatusCode::kResourceExhausted);
  CHECK(rig.backend.live_device_blocks() == 0);
}

TEST_CASE("MeasureLink: the CPU backend's copies give finite positive figures",
          "[calibrate]") {
  std::unique_ptr<Backend> cpu = *CreateCpuBackend();
  testing::GatedBackend backend(*cpu);
  absl::StatusOr<LinkFigures> link = MeasureLink(backend, 1 << 20, 3);
  REQUIRE(link.ok());
  for (const double rate : {link->d2h, link->h2d, link->duplex}) {
    CHECK(std::isfinite(rate));
    CHECK(rate > 0.0);
  }
  CHECK(MeasureLink(backend, 100, 3).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(cpu->Stats().bytes_d2h == 2 * 4 * (1 << 20));  // (1 + 3 reps) x (solo + duplex)
  CHECK(backend.live_device_blocks() == 0);
  CHECK(backend.live_host_blocks() == 0);
}

}  // namespace
}  // namespace pipeoffload
