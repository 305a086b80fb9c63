// Hugging Face checkpoints of the Llama example's models: loading and saving parameters one
// layer-sliding unit at a time through caller callbacks (the caller owns where parameters
// live: host arrays, a sliding store), with every tensor named and shaped as transformers'
// LlamaForCausalLM / Qwen2 / Qwen3 / Mistral state dicts (UnitTensors' hf_name).
#ifndef PIPEOFFLOAD_EXAMPLES_LLAMA_LLAMA_CHECKPOINT_H_
#define PIPEOFFLOAD_EXAMPLES_LLAMA_LLAMA_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "examples/llama/llama_config.h"
#include "examples/llama/safetensors.h"

namespace pipeoffload::llama {

// transformers' save_pretrained default, max_shard_size="5GB" (5 * 10^9 bytes; diffusers PR
// #8445 moved to the same default "to establish a common default" with transformers).
inline constexpr std::int64_t kDefaultMaxShardBytes = 5'000'000'000;

// Receives unit `unit`'s flat parameters (UnitParamCount floats in UnitTensors order). The span
// is valid only during the call.
using SetUnitFn = std::function<absl::Status(int unit, std::span<const float> params)>;
// Fills unit `unit`'s flat parameters (the span arrives filled with NaN, so a value the
// callback forgets shows up).
using GetUnitFn = std::function<absl::Status(int unit, std::span<float> params)>;

// OK when the checkpoint at `path` (see SafetensorsCheckpoint::Open: a directory, an index, or a
// .safetensors file) holds every tensor of UnitTensors(config, u) for every unit, each with the
// HF shape ([rows] for vectors, [rows, cols] for matrices) and a BF16 / F16 / F32 dtype. Extra
// tensors are ignored, lm_head.weight included when the config is tied. Reads headers only.
// Errors: SafetensorsCheckpoint::Open's (bad headers, truncated files); InvalidArgument naming
// the tensor, the file (or the checkpoint, for a missing tensor) and both shapes.
[[nodiscard]] absl::Status CheckLlamaCheckpoint(const std::string& path, const LlamaConfig& config);

// CheckLlamaCheckpoint, then for each unit in order reads its tensors into one unit-sized fp32
// buffer (bf16 / fp16 widened exactly) and calls set_unit(u, buffer). Nothing is handed to
// set_unit unless the whole checkpoint validated. `threads` >= 1 readers split each unit's
// elements between them (pread on shared descriptors). REQUIRES: ValidateLlamaConfig(config).
// Errors: CheckLlamaCheckpoint's; DataLoss when a read fails; InvalidArgument for threads < 1;
// set_unit's status, annotated with the unit, which stops the load.
[[nodiscard]] absl::Status LoadLlamaCheckpoint(const std::string& path, const LlamaConfig& config,
                                               const SetUnitFn& set_unit, int threads = 1);

// Writes a checkpoint transformers can load with from_pretrained(dir): config.json
// (HfConfigJson, torch_dtype matching `dtype`) and model.safetensors, or, past
// `max_shard_bytes` (<= 0: never), model-0000i-of-0000n.safetensors + the index. Units are
// fetched in order with get_unit into one unit-sized buffer and converted with
// round-to-nearest-even. Everything is written into a temporary sibling directory that is
// renamed to `dir` at the end, so `dir` either does not appear or is complete.
// `dir` must not exist or be an empty directory (then it is replaced); its parent must exist.
// REQUIRES nothing; validates. Errors: CheckHfExpressible's; InvalidArgument for a dtype other
// than BF16 / F16 / F32; FailedPrecondition when `dir` exists and is not an empty directory;
// get_unit's status annotated with the unit; file-system errors naming the file. On any error
// the temporary directory is removed and `dir` is as before.
[[nodiscard]] absl::Status SaveLlamaCheckpoint(
    const std::string& dir, const LlamaConfig& config, const GetUnitFn& get_unit,
    SafetensorsDtype dtype = SafetensorsDtype::kBF16,
    std::int64_t max_shard_bytes = kDefaultMaxShardBytes);

}  // namespace pipeoffload::llama

#endif  // PIPEOFFLOAD_EXAMPLES_LLAMA_LLAMA_CHECKPOINT_H_
