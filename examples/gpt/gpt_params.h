// Parameter storage for one virtual stage: values, gradient accumulators and AdamW moments of
// the tensors it holds, in one contiguous block each. Also the AdamW step and the parameter
// checksum, which work tensor by tensor so that any split of the model gives the same bits.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_GPT_PARAMS_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_GPT_PARAMS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "examples/gpt/gpt_config.h"

namespace pipeoffload::gpt {

// One tensor of a ParameterBlock.
struct ParamTensor {
  int id = 0;  // global id: index into GptTensorSpecs()
  TensorSpec spec;
  std::int64_t offset = 0;  // in floats, into each of the block's arrays
  // A copy of tensor `id` held by a second virtual stage (the tied LM head on the last virtual
  // stage mirrors wte of virtual stage 0). Excluded from checksums; kept equal by giving both
  // copies the same summed gradient and the same AdamW step.
  bool mirror = false;
};

// FNV-1a 64 (Fowler, Noll, Vo): offset basis and prime from the published parameters.
inline constexpr std::uint64_t kFnvOffsetBasis = 0xCBF29CE484222325ull;
inline constexpr std::uint64_t kFnvPrime = 0x100000001B3ull;
std::uint64_t Fnv1a64(const void* data, std::int64_t bytes, std::uint64_t hash = kFnvOffsetBasis);

// A tensor's global id and the FNV-1a hash of its parameter bytes.
struct TensorHash {
  int id = 0;
  std::uint64_t hash = 0;
};

// The model checksum: FNV-1a over (id, hash) of every tensor in global-id order. Any set of
// stages' ParameterHashes() may be concatenated in any order; the result equals the
// single-process checksum. InvalidArgument if an id is missing, repeated or out of range.
[[nodiscard]] absl::StatusOr<std::uint64_t> CombineTensorHashes(std::vector<TensorHash> hashes,
                                                                int num_tensors);

class ParameterBlock {
 public:
  ParameterBlock() = default;

  // Adds tensor `id` of `specs`; call before Allocate().
  void Add(int id, const TensorSpec& spec, bool mirror);
  // Allocates the four arrays and initializes the parameters from `seed`: each tensor draws from
  // its own stream DeriveSeed({seed, id}), so values do not depend on the split, and a mirror
  // gets the bits of its original. Gradients and moments start at zero.
  void Allocate(std::uint64_t seed);

  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  // Local index of tensor `id` (first non-mirror, else mirror), or -1.
  int Find(int id, bool mirror) const;

  float* param(int local) { return params_.data() + tensors_[local].offset; }
  const float* param(int local) const { return params_.data() + tensors_[local].offset; }
  float* grad(int local) { return grads_.data() + tensors_[local].offset; }
  const float* grad(int local) const { return grads_.data() + tensors_[local].offset; }
  std::int64_t numel() const { return static_cast<std::int64_t>(params_.size()); }

  void ZeroGrad();
  // One AdamW step (t = 1, 2, ...) on every tensor from its accumulated gradient.
  void AdamWStep(const AdamWConfig& config, std::int64_t t);
  // Hashes of the non-mirror tensors.
  std::vector<TensorHash> Hashes() const;

 private:
  std::vector<ParamTensor> tensors_;
  std::vector<float> params_;
  std::vector<float> grads_;
  std::vector<float> m_;  // AdamW first moment
  std::vector<float> v_;  // AdamW second moment
};

}  // namespace pipeoffload::gpt

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_GPT_PARAMS_H_
