// Writing a LlamaConfig as a Hugging Face config.json (the reading side, ParseHfConfig, and the
// table of named shapes are declared in llama_config.h). Pure functions; no I/O.
#ifndef PIPEOFFLOAD_EXAMPLES_LLAMA_LLAMA_CONFIG_IO_H_
#define PIPEOFFLOAD_EXAMPLES_LLAMA_LLAMA_CONFIG_IO_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "examples/llama/llama_config.h"

namespace pipeoffload::llama {

// OK when HfConfigJson can write `config` so that ParseHfConfig reads back the same
// architecture: ValidateLlamaConfig passes, model_type is one of llama, mistral, qwen2, qwen3,
// and qk_norm is on exactly for qwen3 (transformers gives every Qwen3 layer q/k norms and no
// other of these families any). Errors: InvalidArgument naming the field.
[[nodiscard]] absl::Status CheckHfExpressible(const LlamaConfig& config);

// A config.json that transformers loads as `config.model_type`'s *ForCausalLM
// (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM) and that
// ParseHfConfig reads back field for field (name excepted: a parsed config is "config.json").
// Every field ParseHfConfig reads is written explicitly, none left to a class default; floats
// are written as the shortest decimal that reads back to the same float. `torch_dtype` is the
// dtype of the weights saved beside it ("bfloat16", "float16", "float32").
// Sliding-window attention is written off ("sliding_window": null), as the model here computes
// full causal attention. REQUIRES: CheckHfExpressible(config).ok().
std::string HfConfigJson(const LlamaConfig& config, std::string_view torch_dtype = "bfloat16");

}  // namespace pipeoffload::llama

#endif  // PIPEOFFLOAD_EXAMPLES_LLAMA_LLAMA_CONFIG_IO_H_
