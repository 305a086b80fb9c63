// Test data for the CPU Adam tests: owned arrays behind an AdamSpan, each starting a chosen
// number of floats past a 64-byte boundary, filled from a seed (the values depend only on the
// seed and index, never on the offsets), and bitwise comparisons that describe the first
// difference.
#ifndef PIPEOFFLOAD_TESTS_OPTIM_ADAM_TEST_DATA_H_
#define PIPEOFFLOAD_TESTS_OPTIM_ADAM_TEST_DATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "pipeoffload/adam.h"

namespace pipeoffload::testing {

// Where each array starts, in elements past a 64-byte boundary.
struct ArrayOffsets {
  int param = 0;
  int exp_avg = 0;
  int exp_avg_sq = 0;
  int grad = 0;
  int bf16 = 0;
  int grad_bf16 = 0;
};

// Offsets that put every array at a different misalignment (none 64-, 32- or 16-byte aligned).
inline constexpr ArrayOffsets kUnaligned = {1, 3, 6, 5, 7, 3};

// Owns the storage of one AdamSpan. Not copyable (the span points into it).
class AdamBuffers {
 public:
  AdamBuffers(std::int64_t count, ArrayOffsets offsets);
  AdamBuffers(const AdamBuffers&) = delete;
  AdamBuffers& operator=(const AdamBuffers&) = delete;

  std::int64_t count() const { return count_; }
  float* param() { return param_; }
  float* exp_avg() { return exp_avg_; }
  float* exp_avg_sq() { return exp_avg_sq_; }
  float* grad() { return grad_; }
  std::uint16_t* bf16() { return bf16_; }
  std::uint16_t* grad_bf16() { return grad_bf16_; }

  // The span over all `count` elements; param_bf16 only when `with_bf16`; the gradient from
  // grad_bf16() when `bf16_grad`, else from grad().
  AdamSpan Span(bool with_bf16, bool bf16_grad = false);

  // Random optimizer state from `seed`: params of magnitude 0.05..1 with a few zeros and
  // denormals, m around 0, v >= 0 with some zeros; bf16 set to 0xdead.
  void FillState(std::uint64_t seed);
  // Random gradients from `seed`, mostly N(0, 1) times 10^U(-4, 1), with zeros of both signs,
  // denormals and a few huge values (whose squares overflow v to +inf).
  void FillGrad(std::uint64_t seed);
  // bf16 gradients from `seed` into grad_bf16(), and their exact fp32 values into grad() (so the
  // fp32 path on grad() is the reference for the bf16 path): FillGrad's distribution rounded to
  // bf16, with bf16 subnormals, zeros of both signs and huge values; when `non_finite`, also
  // infinities of both signs and NaNs (quiet and signalling payloads, both signs).
  void FillGradBf16(std::uint64_t seed, bool non_finite);
  // Copies every array's contents (not the padding) from `other` (same count).
  void CopyFrom(AdamBuffers& other);
  // Copies only the gradients, fp32 and bf16, from `other` (same count).
  void CopyGradFrom(AdamBuffers& other);

 private:
  std::int64_t count_;
  std::vector<float> storage_;
  std::vector<std::uint16_t> bf16_storage_;
  std::vector<std::uint16_t> grad_bf16_storage_;
  float* param_;
  float* exp_avg_;
  float* exp_avg_sq_;
  float* grad_;
  std::uint16_t* bf16_;
  std::uint16_t* grad_bf16_;
};

// Index of the first element whose bits differ, or -1.
std::int64_t FirstBitDifference(const float* a, const float* b, std::int64_t count);
std::int64_t FirstBitDifference(const std::uint16_t* a, const std::uint16_t* b,
                                std::int64_t count);

// "" when every array of `got` has the bits of `want` (bf16 only when `with_bf16`), else a
// description of the first difference: array, index, both values and bit patterns.
std::string CompareBuffers(AdamBuffers& want, AdamBuffers& got, bool with_bf16);

// The bit pattern of a float, and back.
std::uint32_t Bits(float value);
float FromBits(std::uint32_t bits);

}  // namespace pipeoffload::testing

#endif  // PIPEOFFLOAD_TESTS_OPTIM_ADAM_TEST_DATA_H_
