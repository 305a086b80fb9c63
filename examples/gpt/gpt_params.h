// Parameter storage for one virtual stage: values, gradient accumulators and AdamW moments of
// the tensors it holds, in one contiguous block each. Also the AdamW step and the parameter
// checksum, which work tensor by tensor so that any split of the model gives the same bits.
//
// Init is parallel but its bits depend on nothing but (seed, tensor id): each tensor is cut into
// fixed blocks of kInitBlock elements and block b draws from its own stream InitBlockSeed(seed,
// id, b); block 0's stream is the tensor's whole stream of the serial init this replaced, so a
// tensor of at most kInitBlock elements (every tensor of the small models the tests and goldens
// use) keeps exactly its old values.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_GPT_PARAMS_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_GPT_PARAMS_H_

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "absl/status/statusor.h"
#include "examples/gpt/gpt_config.h"
#include "examples/gpt/optimizer_schedule.h"
#include "lib/base/fnv1a.h"

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

// FNV-1a 64 (lib/base/fnv1a.h): the hash of tensors and checksums.
using internal::Fnv1a64;
using internal::kFnvOffsetBasis;
using internal::kFnvPrime;

// Elements per init block (see the top of this file).
inline constexpr std::int64_t kInitBlock = std::int64_t{1} << 20;
// The seed of block `block` of tensor `id`'s init: DeriveSeed({seed, id}) for block 0 (the
// serial stream of before), DeriveSeed({seed, id, block}) after it.
std::uint64_t InitBlockSeed(std::uint64_t seed, int id, std::int64_t block);

// A float array that starts zeroed, taken from calloc: the C library gets large ones from the
// OS as untouched zero pages, so an array that is never written (the gradients and moments of
// the host block a CUDA chunk is initialized from) costs neither a fill pass nor resident
// memory. Copyable and movable like a vector; no resizing.
class ZeroedFloats {
 public:
  ZeroedFloats() = default;
  explicit ZeroedFloats(std::int64_t size);  // PO_CHECKs that calloc succeeded
  ZeroedFloats(const ZeroedFloats& other);
  ZeroedFloats& operator=(const ZeroedFloats& other);
  ZeroedFloats(ZeroedFloats&& other) noexcept;
  ZeroedFloats& operator=(ZeroedFloats&& other) noexcept;
  ~ZeroedFloats() { std::free(data_); }

  float* data() { return data_; }
  const float* data() const { return data_; }
  std::int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  float* begin() { return data_; }
  float* end() { return data_ + size_; }

 private:
  float* data_ = nullptr;
  std::int64_t size_ = 0;
};

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
  // Allocates the four arrays and initializes the parameters from `seed`: N(0, init_std) drawn
  // block by block (InitBlockSeed), or init_value, so values depend on neither the split nor
  // the threads, and a mirror gets the bits of its original. Gradients and moments start at
  // zero (and stay unmapped until written: ZeroedFloats). `threads` workers draw the blocks:
  // 0 takes std::thread::hardware_concurrency(); never more than there are kInitBlock's worth
  // of elements, and a block of at most kInitBlock elements is drawn on the calling thread.
  void Allocate(std::uint64_t seed, int threads = 0);

  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  // Local index of tensor `id` (first non-mirror, else mirror), or -1.
  int Find(int id, bool mirror) const;

  float* param(int local) { return params_.data() + tensors_[local].offset; }
  const float* param(int local) const { return params_.data() + tensors_[local].offset; }
  float* grad(int local) { return grads_.data() + tensors_[local].offset; }
  const float* grad(int local) const { return grads_.data() + tensors_[local].offset; }
  std::int64_t numel() const { return params_.size(); }

  void ZeroGrad();
  // Every gradient (mirrors too) times `scale`: global-norm clipping's coefficient.
  void ScaleGrads(float scale);
  // SquareSum of each non-mirror tensor's gradient (optimizer_schedule.h), in tensor order.
  std::vector<TensorSquareSum> GradSquareSums() const;
  // One AdamW step (t = 1, 2, ...) on every tensor from its accumulated gradient, at
  // config.learning_rate (the caller applies the schedule: LearningRateAt).
  void AdamWStep(const AdamWConfig& config, std::int64_t t);
  // Hashes of the non-mirror tensors.
  std::vector<TensorHash> Hashes() const;

 private:
  std::vector<ParamTensor> tensors_;
  ZeroedFloats params_;
  ZeroedFloats grads_;
  ZeroedFloats m_;  // AdamW first moment
  ZeroedFloats v_;  // AdamW second moment
};

}  // namespace pipeoffload::gpt

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_GPT_PARAMS_H_
