// A StageModel for the package consumers that runs on any Backend through the public API only:
// virtual stage 0 fills each microbatch's activation with a word naming the microbatch, every
// chunk copies it on (and into its stash entry), and every backward copies the entry back as
// the input gradient, all on the backend's compute queue. Where device memory is host
// memory (the CPU backend) it also reads what arrives and counts words that are not the
// microbatch's: a stash entry that came back from host memory wrong, or a message lost.
#ifndef PIPEOFFLOAD_TESTS_PACKAGE_RELAY_MODEL_H_
#define PIPEOFFLOAD_TESTS_PACKAGE_RELAY_MODEL_H_

#include <cstdint>

#include "pipeoffload/backend.h"
#include "pipeoffload/stage_model.h"

namespace relay {

inline constexpr std::int64_t kWords = 64;  // (kWords) uint32 per activation and stash entry
inline constexpr std::int64_t kBytes = kWords * 4;

// The word every activation, stash entry and gradient of microbatch `mb` holds.
inline std::uint32_t Word(int mb) { return 0xC0DE0000u + static_cast<std::uint32_t>(mb); }

class RelayModel final : public pipeoffload::StageModel {
 public:
  explicit RelayModel(pipeoffload::Backend& backend) : backend_(backend) {}

  std::int64_t SavedBytes(int, bool) const override { return kBytes; }
  std::int64_t BoundaryBytes() const override { return kBytes; }

  absl::Status Forward(int mb, int, const void* input, void* output, void* saved) override {
    ++forwards_;
    const pipeoffload::Queue compute = backend_.queue(pipeoffload::QueueKind::kCompute);
    absl::Status status = input == nullptr ? backend_.FillAsync(compute, saved, Word(mb), kBytes)
                                           : backend_.CopyAsync(compute, saved, input, kBytes);
    if (status.ok() && output != nullptr) {
      status = backend_.CopyAsync(compute, output, saved, kBytes);
    }
    Check(mb, saved);
    return status;
  }

  absl::Status Backward(int mb, int, const void* grad_output, void* grad_input, void* saved,
                        bool) override {
    ++backwards_;
    Check(mb, saved);  // after OFFLOAD / RELOAD: the entry as F left it
    if (grad_output != nullptr) Check(mb, grad_output);
    if (grad_input == nullptr) return absl::OkStatus();
    return backend_.CopyAsync(backend_.queue(pipeoffload::QueueKind::kCompute), grad_input,
                              saved, kBytes);
  }

  absl::Status BackwardWeight(int, int, void*) override {
    return absl::UnimplementedError("the relay model does not split W");
  }

  int forwards() const { return forwards_; }
  int backwards() const { return backwards_; }
  int wrong_words() const { return wrong_words_; }

 private:
  // The CPU backend's compute queue is the calling thread: enqueued work is done here.
  void Check(int mb, const void* words) {
    if (!backend_.DeviceMemoryIsHostAccessible()) return;
    for (std::int64_t i = 0; i < kWords; ++i) {
      wrong_words_ += static_cast<const std::uint32_t*>(words)[i] != Word(mb);
    }
  }

  pipeoffload::Backend& backend_;
  int forwards_ = 0;
  int backwards_ = 0;
  int wrong_words_ = 0;
};

}  // namespace relay

#endif  // PIPEOFFLOAD_TESTS_PACKAGE_RELAY_MODEL_H_
