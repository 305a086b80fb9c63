// The model's static structure: validation, the units' tensors and their flat layout, rotary
// frequencies, FLOP counts. The table of named shapes and config.json parsing live in
// llama_config_io.cc.
#include "examples/llama/llama_config.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "lib/base/check.h"

namespace pipeoffload::llama {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view value, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("llama config: ", field, " = ", value, ": ", why));
}

bool PositiveFinite(float x) { return std::isfinite(x) && x > 0.0f; }

// a * b, or -1 when it overflows int64 (inputs non-negative).
std::int64_t CheckedMul(std::int64_t a, std::int64_t b) {
  if (a != 0 && b > std::numeric_limits<std::int64_t>::max() / a) return -1;
  return a * b;
}

}  // namespace

absl::Status ValidateLlamaConfig(const LlamaConfig& c) {
  const struct {
    const char* field;
    int value;
  } positives[] = {{"vocab_size", c.vocab_size},
                   {"hidden_size", c.hidden_size},
                   {"intermediate_size", c.intermediate_size},
                   {"num_hidden_layers", c.num_layers},
                   {"num_attention_heads", c.num_heads},
                   {"num_key_value_heads", c.num_kv_heads},
                   {"head_dim", c.head_dim},
                   {"max_position_embeddings", c.max_position_embeddings}};
  for (const auto& [field, value] : positives) {
    if (value <= 0) return Bad(field, absl::StrCat(value), "must be positive");
  }
  if (c.head_dim % 2 != 0) {
    return Bad("head_dim", absl::StrCat(c.head_dim), "must be even (rotary pairs)");
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return Bad("num_key_value_heads", absl::StrCat(c.num_kv_heads),
               absl::StrCat("must divide num_attention_heads (", c.num_heads, ")"));
  }
  if (!PositiveFinite(c.rms_norm_eps)) {
    return Bad("rms_norm_eps", absl::StrCat(c.rms_norm_eps), "must be finite and > 0");
  }
  if (!PositiveFinite(c.rope_theta)) {
    return Bad("rope_theta", absl::StrCat(c.rope_theta), "must be finite and > 0");
  }
  if (!std::isfinite(c.initializer_range) || c.initializer_range < 0.0f) {
    return Bad("initializer_range", absl::StrCat(c.initializer_range), "must be finite, >= 0");
  }
  if (c.rope_scaling == RopeScaling::kLlama3) {
    if (!PositiveFinite(c.rope_factor)) {
      return Bad("rope_scaling.factor", absl::StrCat(c.rope_factor), "must be finite and > 0");
    }
    if (!PositiveFinite(c.rope_low_freq_factor) || !PositiveFinite(c.rope_high_freq_factor) ||
        !(c.rope_high_freq_factor > c.rope_low_freq_factor)) {
      return Bad("rope_scaling.high_freq_factor", absl::StrCat(c.rope_high_freq_factor),
                 absl::StrCat("must be > low_freq_factor (", c.rope_low_freq_factor,
                              ") > 0, both finite"));
    }
    if (c.rope_original_max_positions <= 0) {
      return Bad("rope_scaling.original_max_position_embeddings",
                 absl::StrCat(c.rope_original_max_positions), "must be positive");
    }
  }
  // Every tensor's element count, and the largest unit, must fit int64 with room to spare
  // (bytes = 4 x elements); the kernels index rows with int, so widths must fit too.
  const std::int64_t q_width = CheckedMul(c.num_heads, c.head_dim);
  const std::int64_t big = std::int64_t{1} << 40;
  if (q_width < 0 || q_width > std::numeric_limits<int>::max()) {
    return Bad("num_attention_heads * head_dim", absl::StrCat(q_width), "too large");
  }
  const std::int64_t widest = std::max<std::int64_t>(
      {c.vocab_size, c.hidden_size, 2 * std::int64_t{c.intermediate_size}, q_width});
  const std::int64_t square = CheckedMul(widest, widest);
  if (square < 0 || square > big) {
    return Bad("hidden_size / intermediate_size / vocab_size",
               absl::StrCat(c.hidden_size, " / ", c.intermediate_size, " / ", c.vocab_size),
               "tensors over 2^40 elements are not supported");
  }
  return absl::OkStatus();
}

std::vector<float> RopeInvFreq(const LlamaConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<float> inv_freq(half);
  for (int i = 0; i < half; ++i) {
    double f = std::pow(static_cast<double>(c.rope_theta), -2.0 * i / c.head_dim);
    if (c.rope_scaling == RopeScaling::kLlama3) {
      // transformers' _compute_llama3_parameters: by wavelength against the original context.
      const double pi = 3.14159265358979323846;
      const double wavelen = 2.0 * pi / f;
      const double low_wavelen = c.rope_original_max_positions / c.rope_low_freq_factor;
      const double high_wavelen = c.rope_original_max_positions / c.rope_high_freq_factor;
      if (wavelen > low_wavelen) {
        f = f / c.rope_factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth =
            (c.rope_original_max_positions / wavelen - c.rope_low_freq_factor) /
            (c.rope_high_freq_factor - c.rope_low_freq_factor);
        f = (1.0 - smooth) * f / c.rope_factor + smooth * f;
      }
    }
    inv_freq[i] = static_cast<float>(f);
  }
  return inv_freq;
}

std::vector<LlamaTensor> UnitTensors(const LlamaConfig& c, int unit) {
  PO_CHECK(unit >= 0 && unit < NumUnits(c));
  std::vector<LlamaTensor> tensors;
  std::int64_t offset = 0;
  auto add = [&](std::string name, std::int64_t rows, std::int64_t cols, bool decay,
                 bool norm) {
    LlamaTensor t;
    t.hf_name = std::move(name);
    t.rows = rows;
    t.cols = cols;
    t.offset = offset;
    t.weight_decay = decay;
    t.is_norm = norm;
    offset += t.numel();
    tensors.push_back(std::move(t));
  };
  const std::int64_t H = c.hidden_size;
  const std::int64_t F = c.intermediate_size;
  const std::int64_t q = std::int64_t{c.num_heads} * c.head_dim;
  const std::int64_t kv = std::int64_t{c.num_kv_heads} * c.head_dim;
  if (unit == EmbeddingUnit()) {
    add("model.embed_tokens.weight", c.vocab_size, H, true, false);
  } else if (unit == HeadUnit(c)) {
    add("model.norm.weight", H, 1, false, true);
    if (!c.tie_word_embeddings) add("lm_head.weight", c.vocab_size, H, true, false);
  } else {
    const std::string p = absl::StrCat("model.layers.", unit - 1, ".");
    add(p + "input_layernorm.weight", H, 1, false, true);
    add(p + "self_attn.q_proj.weight", q, H, true, false);
    add(p + "self_attn.k_proj.weight", kv, H, true, false);
    add(p + "self_attn.v_proj.weight", kv, H, true, false);
    if (c.attention_bias) {
      add(p + "self_attn.q_proj.bias", q, 1, false, false);
      add(p + "self_attn.k_proj.bias", kv, 1, false, false);
      add(p + "self_attn.v_proj.bias", kv, 1, false, false);
    }
    if (c.qk_norm) {
      add(p + "self_attn.q_norm.weight", c.head_dim, 1, false, true);
      add(p + "self_attn.k_norm.weight", c.head_dim, 1, false, true);
    }
    add(p + "self_attn.o_proj.weight", H, q, true, false);
    add(p + "post_attention_layernorm.weight", H, 1, false, true);
    add(p + "mlp.gate_proj.weight", F, H, true, false);
    add(p + "mlp.up_proj.weight", F, H, true, false);
    add(p + "mlp.down_proj.weight", H, F, true, false);
  }
  return tensors;
}

std::int64_t UnitParamCount(const LlamaConfig& c, int unit) {
  std::int64_t count = 0;
  for (const LlamaTensor& t : UnitTensors(c, unit)) count += t.numel();
  return count;
}

std::int64_t TotalParamCount(const LlamaConfig& c) {
  std::int64_t count = 0;
  for (int u = 0; u < NumUnits(c); ++u) count += UnitParamCount(c, u);
  return count;
}

double ModelFlopsPerToken(const LlamaConfig& c, int seq_len) {
  double matrix_params = 0.0;
  for (int u = 1; u < NumUnits(c); ++u) {
    for (const LlamaTensor& t : UnitTensors(c, u)) {
      if (t.cols > 1) matrix_params += static_cast<double>(t.numel());
    }
  }
  if (c.tie_word_embeddings) {
    matrix_params += static_cast<double>(c.vocab_size) * c.hidden_size;  // the head's GEMM
  }
  const double attention =
      4.0 * seq_len * static_cast<double>(c.num_heads) * c.head_dim * c.num_layers;
  return 3.0 * (2.0 * matrix_params + attention);
}

}  // namespace pipeoffload::llama
