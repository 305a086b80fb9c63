// Parameter storage, deterministic init, AdamW and checksums for the GPT example.
#include "examples/gpt/gpt_params.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "examples/gpt/rng.h"
#include "lib/base/check.h"

namespace pipeoffload::gpt {

absl::StatusOr<std::uint64_t> CombineTensorHashes(std::vector<TensorHash> hashes, int num_tensors) {
  std::sort(hashes.begin(), hashes.end(),
            [](const TensorHash& a, const TensorHash& b) { return a.id < b.id; });
  if (static_cast<std::int64_t>(hashes.size()) != num_tensors) {
    return absl::InvalidArgumentError(absl::StrCat("checksum needs the hashes of ", num_tensors,
                                                   " tensors, got ", hashes.size()));
  }
  std::uint64_t hash = kFnvOffsetBasis;
  for (int i = 0; i < num_tensors; ++i) {
    if (hashes[i].id != i) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checksum: tensor id ", i, " is missing or repeated (found id ", hashes[i].id, ")"));
    }
    // Little-endian bytes of (id, hash), so the value is the same on any host.
    unsigned char bytes[12];
    for (int b = 0; b < 4; ++b) bytes[b] = static_cast<unsigned char>(hashes[i].id >> (8 * b));
    for (int b = 0; b < 8; ++b) {
      bytes[4 + b] = static_cast<unsigned char>(hashes[i].hash >> (8 * b));
    }
    hash = Fnv1a64(bytes, sizeof(bytes), hash);
  }
  return hash;
}

std::uint64_t InitBlockSeed(std::uint64_t seed, int id, std::int64_t block) {
  const auto tensor = static_cast<std::uint64_t>(id);
  return block == 0 ? DeriveSeed({seed, tensor})
                    : DeriveSeed({seed, tensor, static_cast<std::uint64_t>(block)});
}

ZeroedFloats::ZeroedFloats(std::int64_t size) : size_(size) {
  PO_CHECK(size >= 0);
  if (size == 0) return;
  data_ = static_cast<float*>(std::calloc(static_cast<std::size_t>(size), sizeof(float)));
  PO_CHECK_MSG(data_ != nullptr, absl::StrCat("out of host memory for ", size, " floats"));
}

ZeroedFloats::ZeroedFloats(const ZeroedFloats& other) : ZeroedFloats(other.size_) {
  if (size_ > 0) std::memcpy(data_, other.data_, static_cast<std::size_t>(size_) * sizeof(float));
}

ZeroedFloats& ZeroedFloats::operator=(const ZeroedFloats& other) {
  if (this != &other) *this = ZeroedFloats(other);
  return *this;
}

ZeroedFloats::ZeroedFloats(ZeroedFloats&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

ZeroedFloats& ZeroedFloats::operator=(ZeroedFloats&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void ParameterBlock::Add(int id, const TensorSpec& spec, bool mirror) {
  PO_CHECK_MSG(params_.empty(), "ParameterBlock::Add after Allocate");
  ParamTensor tensor;
  tensor.id = id;
  tensor.spec = spec;
  tensor.mirror = mirror;
  tensor.offset = tensors_.empty() ? 0 : tensors_.back().offset + tensors_.back().spec.numel();
  tensors_.push_back(std::move(tensor));
}

int ParameterBlock::Find(int id, bool mirror) const {
  for (int i = 0; i < static_cast<int>(tensors_.size()); ++i) {
    if (tensors_[i].id == id && tensors_[i].mirror == mirror) return i;
  }
  return -1;
}

void ParameterBlock::Allocate(std::uint64_t seed, int threads) {
  const std::int64_t total =
      tensors_.empty() ? 0 : tensors_.back().offset + tensors_.back().spec.numel();
  params_ = ZeroedFloats(total);
  grads_ = ZeroedFloats(total);
  m_ = ZeroedFloats(total);
  v_ = ZeroedFloats(total);
  // The work: every block of every tensor, in tensor order. Blocks are independent (each has
  // its own stream), so any worker may take any block.
  struct Block {
    const ParamTensor* tensor;
    std::int64_t index;
  };
  std::vector<Block> blocks;
  for (const ParamTensor& tensor : tensors_) {
    for (std::int64_t b = 0; b * kInitBlock < tensor.spec.numel(); ++b) {
      blocks.push_back({&tensor, b});
    }
  }
  auto fill = [this, seed](const Block& block) {
    const ParamTensor& tensor = *block.tensor;
    const std::int64_t begin = block.index * kInitBlock;
    const std::int64_t end = std::min(tensor.spec.numel(), begin + kInitBlock);
    float* p = params_.data() + tensor.offset;
    if (tensor.spec.init_std > 0.0f) {
      Rng rng(InitBlockSeed(seed, tensor.id, block.index));
      const double std = tensor.spec.init_std;
      for (std::int64_t i = begin; i < end; ++i) p[i] = static_cast<float>(std * rng.Normal());
    } else {
      std::fill(p + begin, p + end, tensor.spec.init_value);
    }
  };
  // Workers: at most one per kInitBlock elements, so a small model is drawn on this thread.
  const std::int64_t hardware = std::max(1u, std::thread::hardware_concurrency());
  const std::int64_t workers =
      std::min({threads > 0 ? std::int64_t{threads} : hardware,
                static_cast<std::int64_t>(blocks.size()), (total + kInitBlock - 1) / kInitBlock});
  if (workers <= 1) {
    for (const Block& block : blocks) fill(block);
    return;
  }
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i = next.fetch_add(1); i < blocks.size(); i = next.fetch_add(1)) {
      fill(blocks[i]);
    }
  };
  std::vector<std::thread> pool;
  for (std::int64_t w = 1; w < workers; ++w) pool.emplace_back(work);
  work();  // the calling thread is a worker too
  for (std::thread& thread : pool) thread.join();
}

void ParameterBlock::ZeroGrad() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

void ParameterBlock::ScaleGrads(float scale) {
  for (float& g : grads_) g *= scale;
}

std::vector<TensorSquareSum> ParameterBlock::GradSquareSums() const {
  std::vector<TensorSquareSum> sums;
  for (const ParamTensor& tensor : tensors_) {
    if (tensor.mirror) continue;
    sums.push_back({tensor.id, SquareSum(grads_.data() + tensor.offset, tensor.spec.numel())});
  }
  return sums;
}

void ParameterBlock::AdamWStep(const AdamWConfig& config, std::int64_t t) {
  PO_CHECK(t >= 1);
  // Bias corrections (Kingma & Ba 2015, Algorithm 1), in double once per step.
  const float correction1 =
      static_cast<float>(1.0 - std::pow(static_cast<double>(config.beta1), static_cast<double>(t)));
  const float correction2 =
      static_cast<float>(1.0 - std::pow(static_cast<double>(config.beta2), static_cast<double>(t)));
  const float b1 = config.beta1;
  const float b2 = config.beta2;
  const float lr = config.learning_rate;
  const float eps = config.epsilon;
  for (const ParamTensor& tensor : tensors_) {
    // Decoupled weight decay (Loshchilov & Hutter 2019, Algorithm 2, line 12): p -= lr * wd * p.
    const float wd = tensor.spec.weight_decay ? config.weight_decay : 0.0f;
    float* p = params_.data() + tensor.offset;
    const float* g = grads_.data() + tensor.offset;
    float* m = m_.data() + tensor.offset;
    float* v = v_.data() + tensor.offset;
    const std::int64_t n = tensor.spec.numel();
    for (std::int64_t i = 0; i < n; ++i) {
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
      const float m_hat = m[i] / correction1;
      const float v_hat = v[i] / correction2;
      p[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + wd * p[i]);
    }
  }
}

std::vector<TensorHash> ParameterBlock::Hashes() const {
  std::vector<TensorHash> hashes;
  for (const ParamTensor& tensor : tensors_) {
    if (tensor.mirror) continue;
    hashes.push_back({tensor.id, Fnv1a64(params_.data() + tensor.offset,
                                         tensor.spec.numel() * std::int64_t{sizeof(float)})});
  }
  return hashes;
}

}  // namespace pipeoffload::gpt
