// slide_train's flags: one table drives the parser and --help (examples/common/flags.h).
#include "examples/llama/slide_options.h"

#include <algorithm>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "examples/common/flags.h"
#include "examples/llama/llama_config.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::llama {
namespace {

using examples::ParseFlagBytes;
using examples::ParseFlagDouble;
using examples::ParseFlagInt;
using FlagDef = examples::FlagDef<SlideTrainOptions>;
using Handler = FlagDef::Handler;

constexpr std::int64_t kIntMax = std::int64_t{1} << 30;

template <typename T>
Handler Int(T SlideTrainOptions::*field, std::string_view flag, std::int64_t lo,
            std::int64_t hi = kIntMax) {
  return [=](SlideTrainOptions& o, const std::string& v) -> absl::Status {
    PO_ASSIGN_OR_RETURN(const std::int64_t x, ParseFlagInt(flag, v, lo, hi));
    o.*field = static_cast<T>(x);
    return absl::OkStatus();
  };
}

template <typename T>
Handler Real(T SlideTrainOptions::*field, std::string_view flag, double lo, double hi) {
  return [=](SlideTrainOptions& o, const std::string& v) -> absl::Status {
    PO_ASSIGN_OR_RETURN(const double x, ParseFlagDouble(flag, v, lo, hi));
    o.*field = static_cast<T>(x);
    return absl::OkStatus();
  };
}

Handler Text(std::string SlideTrainOptions::*field, std::string_view flag) {
  return [=](SlideTrainOptions& o, const std::string& v) -> absl::Status {
    if (v.empty()) return examples::BadFlagValue(flag, "a non-empty value", v);
    o.*field = v;
    return absl::OkStatus();
  };
}

const std::vector<FlagDef>& Flags() {
  static const auto* const kFlags = new std::vector<FlagDef>{
      // --- the model ---
      {"model", "NAME",
       "a shape by name (tiny, tiny-tied, llama3-8b, llama3.1-8b, llama3.2-1b, llama3.2-3b, "
       "llama2-7b, llama2-13b, mistral-7b, qwen2.5-7b, qwen3-4b, qwen3-8b, qwen3-14b, ...; "
       "default tiny). The values are the models' Hugging Face config.json ones.",
       [](SlideTrainOptions& o, const std::string& v) -> absl::Status {
         if (v.empty()) return examples::BadFlagValue("model", "a model name", v);
         if (const absl::StatusOr<LlamaConfig> known = LlamaConfigByName(v); !known.ok()) {
           return absl::InvalidArgumentError(absl::StrCat("--model: ", known.status().message()));
         }
         o.model = v;
         o.model_given = true;
         return absl::OkStatus();
       }},
      {"config", "FILE", "a Hugging Face config.json (llama, mistral, qwen2, qwen3); wins over "
                         "--model. With --load DIR and neither flag, DIR/config.json is used.",
       Text(&SlideTrainOptions::config_path, "config")},
      {"load", "PATH", "start from a safetensors checkpoint (a directory with model.safetensors "
                       "or model.safetensors.index.json, or one .safetensors file; bf16, fp16 or "
                       "fp32). Default: random init (--init-seed).",
       Text(&SlideTrainOptions::load_path, "load")},
      {"save", "DIR", "write the trained model there at the end (config.json and safetensors, "
                      "sharded past 5 GB; DIR must not exist or be empty).",
       Text(&SlideTrainOptions::save_path, "save")},
      {"save-dtype", "TYPE", "bf16 (default), fp16 or fp32.",
       [](SlideTrainOptions& o, const std::string& v) -> absl::Status {
         PO_ASSIGN_OR_RETURN(const int i, examples::ParseFlagChoice("save-dtype", v, {"bf16", "fp16", "fp32"}));
         o.save_dtype = i == 0 ? "bf16" : i == 1 ? "fp16" : "fp32";
         return absl::OkStatus();
       }},
      {"init-seed", "N", "seed of the random init (default 1234).",
       Int(&SlideTrainOptions::init_seed, "init-seed", 0, std::numeric_limits<std::int64_t>::max())},
      // --- data ---
      {"data", "FILE", "training tokens: bytes (each byte a token), or a token file (see "
                       "--data-format). Default: the embedded synthetic English-like corpus.",
       Text(&SlideTrainOptions::data_path, "data")},
      {"data-format", "FORMAT",
       "auto (default: llm.c header if present, else bytes) | bytes | u16 | u32 (raw "
       "little-endian ids, nanoGPT's .bin) | llmc (llm.c's 256-int32 header).",
       [](SlideTrainOptions& o, const std::string& v) -> absl::Status {
         const absl::StatusOr<DataFormat> format = ParseDataFormat(v);
         if (!format.ok()) {
           return examples::BadFlagValue("data-format", "auto, bytes, u16, u32 or llmc", v);
         }
         o.data_format = *format;
         return absl::OkStatus();
       }},
      {"data-seed", "N", "seed of the microbatch sampling (default 1).",
       Int(&SlideTrainOptions::data_seed, "data-seed", 0, std::numeric_limits<std::int64_t>::max())},
      {"batch", "B", "sequences per microbatch (default 1).",
       Int(&SlideTrainOptions::batch, "batch", 1, 1 << 16)},
      {"seq", "T", "tokens per sequence (default 256).", Int(&SlideTrainOptions::seq, "seq", 1, 1 << 20)},
      {"microbatches", "M",
       "microbatches per optimizer step (gradient accumulation inside each layer: parameters "
       "cross PCIe once per step whatever M; default 1). Tokens per step: B * T * M.",
       Int(&SlideTrainOptions::microbatches, "microbatches", 1, 1 << 12)},
      {"steps", "N", "optimizer steps (default 20).", Int(&SlideTrainOptions::steps, "steps", 1, kIntMax)},
      // --- optimizer ---
      {"lr", "X", "peak learning rate (default 3e-4).", Real(&SlideTrainOptions::lr, "lr", 0.0, 10.0)},
      {"min-lr", "X", "the cosine schedule ends here at the last step (default: --lr / 10; = --lr: "
                      "constant).",
       Real(&SlideTrainOptions::min_lr, "min-lr", 0.0, 10.0)},
      {"warmup-steps", "N", "linear warm-up from 0 over the first N steps (default 0).",
       Int(&SlideTrainOptions::warmup_steps, "warmup-steps", 0, kIntMax)},
      {"weight-decay", "X", "AdamW decoupled weight decay of the matrices (norms and biases "
                            "never decay; default 0).",
       Real(&SlideTrainOptions::weight_decay, "weight-decay", 0.0, 1.0)},
      {"beta1", "X", "Adam beta1 (default 0.9).", Real(&SlideTrainOptions::beta1, "beta1", 0.0, 0.9999999)},
      {"beta2", "X", "Adam beta2 (default 0.95).", Real(&SlideTrainOptions::beta2, "beta2", 0.0, 0.9999999)},
      {"eps", "X", "Adam epsilon (default 1e-8).", Real(&SlideTrainOptions::epsilon, "eps", 0.0, 1.0)},
      {"clip", "X",
       "clip the global gradient norm to X, exactly (default 1.0; 0: off). Clipping makes the "
       "CPU updates wait for the norm at the end of the backward (they then overlap the next "
       "forward instead: docs/sliding.md says what that costs) and parks every sliding unit's "
       "gradients in pinned memory.",
       Real(&SlideTrainOptions::clip, "clip", 0.0, 1e30)},
      // --- engine ---
      {"backend", "NAME", "auto (default: cuda when a GPU is visible) | cpu (the fp32 model, "
                          "threads as copy engines: what CI runs) | cuda (bf16 on the GPU).",
       [](SlideTrainOptions& o, const std::string& v) -> absl::Status {
         PO_ASSIGN_OR_RETURN(const int i, examples::ParseFlagChoice("backend", v, {"auto", "cpu", "cuda"}));
         o.backend = static_cast<SlideBackend>(i);
         return absl::OkStatus();
       }},
      {"gpu-memory-budget", "BYTES",
       "everything the engine and the model may allocate on the device (suffixes K M G Ki Mi "
       "Gi; e.g. 24GiB). Default: the device's free memory less 2 GiB (on the CPU backend: "
       "what an all-sliding plan needs, so every unit slides). The plan fails before training, naming the minimum, when too small.",
       [](SlideTrainOptions& o, const std::string& v) -> absl::Status {
         std::string text = v;
         if (text.size() > 1 && text.back() == 'B') text.pop_back();  // "24GiB" and "24Gi"
         PO_ASSIGN_OR_RETURN(o.gpu_memory_budget, ParseFlagBytes("gpu-memory-budget", text));
         return absl::OkStatus();
       }},
      {"slots", "N", "layer slots in the GPU's ring (default: planned, up to 3; 1 works, "
                     "without overlap).",
       Int(&SlideTrainOptions::slots, "slots", 1, 1024)},
      {"resident", "LIST",
       "units kept on the GPU with their optimizer state (updated by the GPU Adam): auto "
       "(default: what the budget holds, chosen to take the most off the CPU Adam's critical "
       "path: the lowest units, and the head unless it slides last; docs/sliding.md), none, all (the "
       "all-on-GPU baseline), or unit indices, e.g. 0,1,2 (0 = embedding, 1..L = layers, L+1 = "
       "head).",
       [](SlideTrainOptions& o, const std::string& v) -> absl::Status {
         // The indices' range needs the model (RunSlideTrain checks it); their syntax does not.
         if (v != "auto" && v != "none" && v != "all") {
           for (const absl::string_view part : absl::StrSplit(v, ',')) {
             if (part.empty() || !std::all_of(part.begin(), part.end(), absl::ascii_isdigit)) {
               return examples::BadFlagValue(
                   "resident", "auto, none, all or unit indices separated by commas", v);
             }
           }
         }
         o.resident = v;
         return absl::OkStatus();
       }},
      {"update-timing", "NAME",
       "overlapped (default: the CPU updates each layer while the GPU works on the next) | "
       "after-backward (ZeRO-Offload style: every CPU update after the whole backward, the "
       "baseline).",
       [](SlideTrainOptions& o, const std::string& v) -> absl::Status {
         PO_ASSIGN_OR_RETURN(const int i, examples::ParseFlagChoice("update-timing", v,
                                                                   {"overlapped", "after-backward"}));
         o.update_timing = i == 0 ? UpdateTiming::kOverlapped : UpdateTiming::kAfterBackward;
         return absl::OkStatus();
       }},
      {"landing-buffers", "N", "pinned buffers for gradients in flight to the CPU Adam (default "
                               "3: one holds the top sliding unit's, whose update waits for the "
                               "next forward; clipping parks all instead).",
       Int(&SlideTrainOptions::landing_buffers, "landing-buffers", 1, 1024)},
      {"grad-chunk", "N", "elements per gradient D2H chunk the CPU Adam consumes as it lands "
                          "(default 33554432).",
       Int(&SlideTrainOptions::grad_chunk, "grad-chunk", 1024, std::int64_t{1} << 40)},
      {"nvme-dir", "DIR", "a directory on a local drive for the NVMe tier (Adam m, v and the "
                          "fp32 masters' low halves of --nvme-fraction of the sliding layers, "
                          "leaving 2 B per parameter on the host; O_DIRECT, io_uring). The "
                          "drive's bandwidth is measured there first (up to 2 GiB written and "
                          "read back; --dry-run too, for its prediction).",
       Text(&SlideTrainOptions::nvme_dir, "nvme-dir")},
      {"nvme-fraction", "X", "share of the sliding units whose state lives on NVMe, the top ones "
                             "first (default 0; needs --nvme-dir).",
       Real(&SlideTrainOptions::nvme_fraction, "nvme-fraction", 0.0, 1.0)},
      {"nvme-checkpoints", "X", "share of the checkpointed layers whose activation checkpoints "
                                "(M per layer) live on NVMe instead of pinned host memory, the "
                                "lowest first, staged through up to 4 pinned buffers (default 0; "
                                "needs --nvme-dir).",
       Real(&SlideTrainOptions::nvme_checkpoints, "nvme-checkpoints", 0.0, 1.0)},
      {"cpu-threads", "N", "CPU Adam threads (default: every CPU but one, which issues the device work).",
       Int(&SlideTrainOptions::cpu_threads, "cpu-threads", 1, 1024)},
      {"ce-chunk", "ROWS", "rows per chunk of the fused linear cross-entropy (default: "
                           "automatic; B*T materialises the logits).",
       Int(&SlideTrainOptions::ce_chunk_rows, "ce-chunk", 1, kIntMax)},
      // --- output ---
      {"dry-run", "", "print the plan (slots, placement, bytes per tier, a predicted step) and "
                      "exit; needs no GPU.",
       [](SlideTrainOptions& o, const std::string&) -> absl::Status {
         o.dry_run = true;
         return absl::OkStatus();
       }},
      {"trace", "FILE", "write every engine's work of the run (compute, H2D, D2H, CPU Adam) "
                        "as Perfetto / Chrome trace JSON (ui.perfetto.dev).",
       Text(&SlideTrainOptions::trace_path, "trace")},
      {"json", "FILE", "append one JSON line with the run's summary (benchmarks read it).",
       Text(&SlideTrainOptions::json_path, "json")},
      {"assume-tflops", "X", "--dry-run: the GPU's bf16 rate (default 600).",
       Real(&SlideTrainOptions::assume_tflops, "assume-tflops", 1e-3, 1e6)},
      {"assume-pcie", "GBPS", "--dry-run: PCIe GB/s per direction (default 45).",
       Real(&SlideTrainOptions::assume_pcie_gbps, "assume-pcie", 1e-3, 1e6)},
      {"assume-cpu-adam", "G", "--dry-run: CPU Adam G params/s while the copy engines run (default 4.5, "
                                 "the H200 host's 15 threads).",
       Real(&SlideTrainOptions::assume_cpu_adam_gparams, "assume-cpu-adam", 1e-3, 1e6)},
      {"help", "", "print this text and exit.",
       [](SlideTrainOptions& o, const std::string&) -> absl::Status {
         o.help = true;
         return absl::OkStatus();
       }},
  };
  return *kFlags;
}

}  // namespace

absl::StatusOr<SlideTrainOptions> ParseSlideTrainOptions(const std::vector<std::string>& args) {
  SlideTrainOptions o;
  PO_RETURN_IF_ERROR(examples::ParseFlags(args, Flags(), o));
  if (o.help) return o;
  if (o.nvme_fraction > 0.0 && o.nvme_dir.empty()) {
    return absl::InvalidArgumentError("--nvme-fraction needs --nvme-dir");
  }
  if (o.nvme_checkpoints > 0.0 && o.nvme_dir.empty()) {
    return absl::InvalidArgumentError("--nvme-checkpoints needs --nvme-dir");
  }
  if (!o.nvme_dir.empty() && o.nvme_fraction == 0.0 && o.nvme_checkpoints == 0.0) {
    return absl::InvalidArgumentError(
        "--nvme-dir needs --nvme-fraction X > 0 (the share of layers whose m, v go there) or "
        "--nvme-checkpoints X > 0 (the share of layers whose checkpoints go there)");
  }
  if (o.min_lr < 0.0f) o.min_lr = o.lr / 10.0f;
  if (o.min_lr > o.lr) {
    return absl::InvalidArgumentError("--min-lr must not exceed --lr");
  }
  if (o.warmup_steps > o.steps) {
    return absl::InvalidArgumentError("--warmup-steps must not exceed --steps");
  }
  if (o.resident == "all" && o.slots != 0) {
    return absl::InvalidArgumentError("--slots applies to sliding units; --resident all has none");
  }
  return o;
}

std::string SlideTrainHelpText() {
  std::string text =
      "usage: slide_train [flags]\n"
      "\n"
      "Fully fine-tunes a Llama-architecture model (Llama, Mistral, Qwen2, Qwen3) on one GPU by\n"
      "layer sliding: the GPU holds a ring of layer slots and the units the budget keeps\n"
      "resident; fp32 master weights and Adam state of the others live in host memory (and\n"
      "optionally NVMe), and the CPU updates each layer while the GPU works on the next.\n"
      "Prints one line per step: loss, learning rate, gradient norm, step time, tokens/s,\n"
      "model TFLOP/s, GPU memory in use against the budget, host memory.\n"
      "\nflags:\n";
  text += examples::FlagsHelp(Flags());
  text +=
      "\nexamples:\n"
      "  slide_train --backend cpu --steps 50                     # tiny model, CI-sized\n"
      "  slide_train --model llama3-8b --gpu-memory-budget 24GiB --seq 2048 --batch 1 \\\n"
      "              --microbatches 8 --steps 10 --clip 0\n"
      "  slide_train --model llama3-8b --gpu-memory-budget 24GiB --dry-run\n"
      "  slide_train --model llama3-8b --gpu-memory-budget 24GiB --nvme-dir /mnt/nvme \\\n"
      "              --nvme-checkpoints 1 --dry-run      # checkpoints on the drive\n"
      "  slide_train --load ./my-llama --data tokens.bin --data-format u32 --save ./tuned\n";
  return text;
}

}  // namespace pipeoffload::llama
