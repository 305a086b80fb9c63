// gpt_train's flags: one table (name, value, help, handler) drives both the parser and --help,
// so the help can never miss a flag. Every bad input is an InvalidArgument naming the flag.
#include "examples/gpt/train_options.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "examples/common/flags.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/compiler.h"

namespace pipeoffload::gpt {
namespace {

using FlagDef = examples::FlagDef<TrainOptions>;
using Handler = FlagDef::Handler;

constexpr std::int64_t kIntMax = std::int64_t{1} << 30;

absl::Status BadValue(std::string_view flag, std::string_view expected, const std::string& got) {
  return examples::BadFlagValue(flag, expected, got);
}
absl::StatusOr<std::int64_t> ParseInt(std::string_view flag, const std::string& text,
                                      std::int64_t lo, std::int64_t hi) {
  return examples::ParseFlagInt(flag, text, lo, hi);
}
absl::StatusOr<double> ParseDouble(std::string_view flag, const std::string& text, double lo,
                                   double hi) {
  return examples::ParseFlagDouble(flag, text, lo, hi);
}
absl::StatusOr<std::int64_t> ParseBytes(std::string_view flag, const std::string& text) {
  return examples::ParseFlagBytes(flag, text);
}

template <typename T>
Handler IntFlag(T TrainOptions::*field, std::string_view flag, std::int64_t lo) {
  return [=](TrainOptions& o, const std::string& value) -> absl::Status {
    PO_ASSIGN_OR_RETURN(const std::int64_t x, ParseInt(flag, value, lo, kIntMax));
    o.*field = static_cast<T>(x);
    return absl::OkStatus();
  };
}

template <typename T>
Handler ConfigInt(T GptConfig::*field, std::string_view flag, std::int64_t lo) {
  return [=](TrainOptions& o, const std::string& value) -> absl::Status {
    PO_ASSIGN_OR_RETURN(const std::int64_t x, ParseInt(flag, value, lo, kIntMax));
    o.config.*field = static_cast<T>(x);
    return absl::OkStatus();
  };
}

Handler StringFlag(std::string TrainOptions::*field, std::string_view flag) {
  return [=](TrainOptions& o, const std::string& value) -> absl::Status {
    if (value.empty()) return BadValue(flag, "a non-empty value", value);
    o.*field = value;
    return absl::OkStatus();
  };
}

const std::vector<FlagDef>& Flags() {
  static const auto* const kFlags = new std::vector<FlagDef>{
      // --- how the job runs ---
      {"transport", "NAME",
       "auto | mpi | local | reference. auto (default): mpi when started by mpirun, else the "
       "single-process reference (local with --backend cuda). local: every stage a thread of "
       "this process. reference: no pipeline (ReferenceTrainer: F then B per microbatch, then "
       "AdamW).",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         static constexpr std::pair<std::string_view, TrainTransport> kNames[] = {
             {"auto", TrainTransport::kAuto},
             {"mpi", TrainTransport::kMpi},
             {"local", TrainTransport::kLocal},
             {"reference", TrainTransport::kReference}};
         for (const auto& [name, value] : kNames) {
           if (v == name) {
             o.transport = value;
             return absl::OkStatus();
           }
         }
         return BadValue("transport", "auto, mpi, local or reference", v);
       }},
      {"backend", "NAME",
       "cpu | cuda. cpu (default): the fp32 GPT on the CPU. cuda: the bf16 GPT on the GPU "
       "(cuBLASLt, own kernels); with --transport local every stage is a thread on ONE GPU, "
       "under mpirun (--transport mpi) one rank per GPU with NCCL between them; without "
       "mpirun, auto means local. Untied embeddings only, head size 64 or 128, C a multiple "
       "of 64, V a multiple of 8. Prints model TFLOP/s per step.",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         if (v == "cpu") {
           o.backend = TrainBackend::kCpu;
         } else if (v == "cuda") {
           o.backend = TrainBackend::kCuda;
         } else {
           return BadValue("backend", "cpu or cuda", v);
         }
         return absl::OkStatus();
       }},
      {"steps", "N", "training steps (default 500).", IntFlag(&TrainOptions::steps, "steps", 0)},
      {"seed", "S", "seed of the parameter init and the microbatch sampling (default 1234).",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         PO_ASSIGN_OR_RETURN(const std::int64_t x, ParseInt("seed", v, 0, INT64_MAX));
         o.config.seed = static_cast<std::uint64_t>(x);
         return absl::OkStatus();
       }},
      {"data", "FILE",
       "train on FILE's bytes (one token per byte) instead of the embedded synthetic corpus.",
       StringFlag(&TrainOptions::data_path, "data")},
      // --- the pipeline ---
      {"schedule", "NAME",
       "1f1b | interleaved | group-interleaved (no offload), or po-h | po-f | selective "
       "(activation offload on top of --family), or auto (the fastest predicted plan, family "
       "and offload share, whose stash peak fits --memory-budget). Default: group-interleaved "
       "when --chunks > 1, else 1f1b.",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         const bool policy = v == "po-h" || v == "po-f" || v == "selective" || v == "auto";
         if (!FamilyFromName(v) && !policy) {
           return BadValue("schedule",
                           "1f1b, interleaved, group-interleaved, po-h, po-f, selective or auto",
                           v);
         }
         o.schedule = v;
         return absl::OkStatus();
       }},
      {"family", "NAME",
       "compute order under an offload policy: 1f1b | interleaved | group-interleaved. "
       "Default group-interleaved when --chunks > 1, else 1f1b.",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         if (!FamilyFromName(v))
           return BadValue("family", "1f1b, interleaved or group-interleaved", v);
         o.family = v;
         return absl::OkStatus();
       }},
      {"stages", "P",
       "pipeline stages p, one rank each. Default: the MPI world size; 4 with --transport "
       "local; the file's with --schedule-file.",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         PO_ASSIGN_OR_RETURN(const std::int64_t x, ParseInt("stages", v, 1, 4096));
         o.stages = static_cast<int>(x);
         o.stages_given = true;
         return absl::OkStatus();
       }},
      {"chunks", "V", "virtual chunks per stage v (1f1b needs 1). Default 1 for 1f1b, else 2.",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         PO_ASSIGN_OR_RETURN(const std::int64_t x, ParseInt("chunks", v, 1, 64));
         o.chunks = static_cast<int>(x);
         o.chunks_given = true;
         return absl::OkStatus();
       }},
      {"group-size", "G",
       "group size g of group-interleaved, ceil(p/2) <= g <= p. Default ceil(p/2).",
       IntFlag(&TrainOptions::group_size, "group-size", 1)},
      {"microbatches", "M", "microbatches per step m; the step's loss is their mean (default 8).",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         PO_ASSIGN_OR_RETURN(const std::int64_t x, ParseInt("microbatches", v, 1, 1 << 16));
         o.config.num_microbatches = static_cast<int>(x);
         o.microbatches_given = true;
         return absl::OkStatus();
       }},
      {"split-backward", "",
       "separate weight-gradient (W) ops, zero-bubble style; the stash then also carries what "
       "W needs.",
       [](TrainOptions& o, const std::string&) {
         o.split_backward = true;
         o.split_given = true;
         return absl::OkStatus();
       }},
      {"offload-fraction", "X",
       "selective: share of the activation volume to offload, 0..1 (longest-lived first).",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         PO_ASSIGN_OR_RETURN(o.offload_fraction, ParseDouble("offload-fraction", v, 0.0, 1.0));
         return absl::OkStatus();
       }},
      {"offload-chunks", "N", "selective: offload chunks 0..N-1 of every stage.",
       IntFlag(&TrainOptions::offload_chunks, "offload-chunks", 0)},
      {"recompute", "MODE",
       "none | lean | full: recompute activations before the backward instead of keeping "
       "them. full keeps each chunk's input (2 C bytes per token on the GPU) and runs its "
       "forward again (one more forward per entry); lean keeps all but the LayerNorm and GELU "
       "outputs (20 C instead of 32 C) and recomputes those. Every entry, or a share (below); "
       "with po-h, po-f or selective the planner may offload what a recomputed entry keeps; "
       "with --schedule auto: the most the planner may use per entry (keep, offload, lean, "
       "full).",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         if (v != "none" && v != "lean" && v != "full") {
           return BadValue("recompute", "none, lean or full", v);
         }
         o.recompute = v == "full"   ? Recompute::kFull
                       : v == "lean" ? Recompute::kLean
                                     : Recompute::kNone;
         return absl::OkStatus();
       }},
      {"recompute-fraction", "X",
       "with --recompute: share of each stage's entries to recompute, (0, 1], longest-lived "
       "first (default 1: all).",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         PO_ASSIGN_OR_RETURN(o.recompute_fraction,
                             ParseDouble("recompute-fraction", v, 0.0, 1.0));
         if (o.recompute_fraction <= 0) return BadValue("recompute-fraction", "in (0, 1]", v);
         return absl::OkStatus();
       }},
      {"recompute-chunks", "N", "with --recompute: recompute every entry of chunks 0..N-1.",
       IntFlag(&TrainOptions::recompute_chunks, "recompute-chunks", 0)},
      {"memory-budget", "BYTES",
       "--schedule auto: each stage's activation (stash) budget, in bytes (suffixes K, M, G, "
       "Ki, Mi, Gi) or as a percentage of the largest stage's stash peak without offload "
       "(e.g. 50%).",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         if (!v.empty() && v.back() == '%') {
           PO_ASSIGN_OR_RETURN(const double percent,
                               ParseDouble("memory-budget", v.substr(0, v.size() - 1), 0.0, 1e6));
           if (percent <= 0) return BadValue("memory-budget", "a positive percentage", v);
           o.memory_budget_share = percent / 100.0;
           o.memory_budget_bytes = 0;
           return absl::OkStatus();
         }
         PO_ASSIGN_OR_RETURN(o.memory_budget_bytes, ParseBytes("memory-budget", v));
         o.memory_budget_share = 0.0;
         return absl::OkStatus();
       }},
      {"schedule-file", "FILE",
       "run the schedule in FILE (pipeoffload.schedule/1 JSON, e.g. from po-schedule --format "
       "json) instead of compiling one; p, v, m and split backward come from the file.",
       StringFlag(&TrainOptions::schedule_file, "schedule-file")},
      // --- the model ---
      {"layers", "N", "transformer blocks (default 8).",
       ConfigInt(&GptConfig::n_layer, "layers", 1)},
      {"embd", "C", "channels (default 64).", ConfigInt(&GptConfig::n_embd, "embd", 1)},
      {"heads", "H",
       "attention heads, dividing C (default 4; with --backend cuda C/64, head size 64).",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         PO_ASSIGN_OR_RETURN(const std::int64_t x, ParseInt("heads", v, 1, kIntMax));
         o.config.n_head = static_cast<int>(x);
         o.heads_given = true;
         return absl::OkStatus();
       }},
      {"seq", "T", "tokens per sequence (default 32).", ConfigInt(&GptConfig::seq_len, "seq", 1)},
      {"batch", "B", "sequences per microbatch (default 4).",
       ConfigInt(&GptConfig::batch_size, "batch", 1)},
      {"vocab", "V", "vocabulary size; byte data needs 256 (default 256).",
       ConfigInt(&GptConfig::vocab_size, "vocab", 2)},
      {"tied", "",
       "tie the LM head to the token embedding (stages 0 and p-1 then exchange its gradient).",
       [](TrainOptions& o, const std::string&) {
         o.config.tied_embeddings = true;
         return absl::OkStatus();
       }},
      {"lr", "X",
       "AdamW peak learning rate (default 0.003, for the small default model; wide models "
       "want less: GPT-3 used 3e-4 at --embd 1024, 2e-4 at 2048, 1.2e-4 at 4096). The rate "
       "of each update follows --warmup-steps and --lr-decay.",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         PO_ASSIGN_OR_RETURN(const double x, ParseDouble("lr", v, 0.0, 10.0));
         o.config.optimizer.learning_rate = static_cast<float>(x);
         return absl::OkStatus();
       }},
      {"warmup-steps", "N",
       "linear learning-rate warm-up: update t of the first N runs at lr * t / N (default "
       "100, also in shorter runs, which then end within it; 0: none). Adam's first updates "
       "move every weight by about lr in the sign of its gradient, and at init those signs "
       "agree across a whole matrix, so a wide model's residual stream jumps by about lr x "
       "fan-in per channel: --embd 2048 at --lr 3e-4 went from loss 6.1 to 12 in one update "
       "without warm-up, and to 10.4 with N = 12.",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         PO_ASSIGN_OR_RETURN(o.config.optimizer.warmup_steps,
                             ParseInt("warmup-steps", v, 0, kIntMax));
         o.warmup_given = true;
         return absl::OkStatus();
       }},
      {"lr-decay", "SHAPE",
       "cosine | none. cosine (default): after the warm-up the rate falls along a half cosine "
       "from --lr to --lr-min at the last step; none: --lr after the warm-up.",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         if (v != "cosine" && v != "none") return BadValue("lr-decay", "cosine or none", v);
         o.lr_decay = v == "cosine";
         o.lr_decay_given = true;
         return absl::OkStatus();
       }},
      {"lr-min", "X", "the rate cosine decay ends at, <= --lr (default --lr / 10).",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         PO_ASSIGN_OR_RETURN(const double x, ParseDouble("lr-min", v, 0.0, 10.0));
         o.config.optimizer.min_learning_rate = static_cast<float>(x);
         o.lr_min_given = true;
         return absl::OkStatus();
       }},
      {"clip-norm", "X",
       "clip the global gradient norm (over every parameter of every stage, combined across "
       "the stages in a fixed order) to X: every gradient times min(1, X / norm) before the "
       "update; 0 turns clipping off (default 1). Each step's line then shows the norm.",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         PO_ASSIGN_OR_RETURN(const double x, ParseDouble("clip-norm", v, 0.0, 1e30));
         o.config.optimizer.clip_norm = static_cast<float>(x);
         return absl::OkStatus();
       }},
      {"weight-decay", "X", "AdamW decoupled weight decay on matrices (default 0).",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         PO_ASSIGN_OR_RETURN(const double x, ParseDouble("weight-decay", v, 0.0, 10.0));
         o.config.optimizer.weight_decay = static_cast<float>(x);
         return absl::OkStatus();
       }},
      {"saved", "LAYOUT",
       "full | lean, with --backend cuda: what each layer saves for its backward. full "
       "(default): 32 C bytes per token; lean: 20 C, recomputing the two LayerNorm outputs and "
       "the GELU from what is kept before the weight gradients (about 5% more layer time at "
       "C 4096, less at larger C), so 37.5% less activation memory to keep or offload.",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         if (v != "full" && v != "lean") return BadValue("saved", "full or lean", v);
         o.lean_saved = v == "lean";
         return absl::OkStatus();
       }},
      // --- optimizer-state offload (cuda) ---
      {"optimizer-offload", "MODE",
       "none | cpu | interleaved | static, with --backend cuda. none (default): AdamW on the "
       "GPU. Otherwise each stage hands its fp32 master, m and v to an optimizer-offload "
       "engine (pinned host memory) per chunk: cpu updates every subgroup on the CPU; "
       "interleaved pulls a share (--gpu-share) of the subgroups to the GPU each step and "
       "updates them there while the CPU does the rest; static keeps that share on the GPU "
       "for good. Gradients cross to the engine in bf16 (rounded once per step from the fp32 "
       "accumulators), and weight decay is not supported then.",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         static constexpr std::pair<std::string_view, TrainOptimizerOffload> kNames[] = {
             {"none", TrainOptimizerOffload::kNone},
             {"cpu", TrainOptimizerOffload::kCpu},
             {"interleaved", TrainOptimizerOffload::kInterleaved},
             {"static", TrainOptimizerOffload::kStatic}};
         for (const auto& [name, value] : kNames) {
           if (v == name) {
             o.optimizer_offload = value;
             return absl::OkStatus();
           }
         }
         return BadValue("optimizer-offload", "none, cpu, interleaved or static", v);
       }},
      {"gpu-share", "R",
       "interleaved: the share of subgroups updated on the GPU each step; static: the share "
       "whose state lives on the GPU. 0..1 (default 0.5).",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         PO_ASSIGN_OR_RETURN(o.gpu_share, ParseDouble("gpu-share", v, 0.0, 1.0));
         o.gpu_share_given = true;
         return absl::OkStatus();
       }},
      {"optimizer-subgroup", "N",
       "parameters per optimizer-offload subgroup (default 16777216; the last subgroup of "
       "each chunk holds the rest).",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         PO_ASSIGN_OR_RETURN(o.optimizer_subgroup,
                             ParseInt("optimizer-subgroup", v, 1, std::int64_t{1} << 40));
         o.subgroup_given = true;
         return absl::OkStatus();
       }},
      // --- the runtime ---
      {"arena-bytes", "BYTES",
       "device memory budget of each stage's arena (suffixes K, M, G, Ki, Mi, Gi). Default: "
       "the plan's stash peak plus the peak of its P2P buffers (their lifetimes across the "
       "stages, which the runtime holds to; --p2p-reserve worst: every P2P buffer of the step), "
       "with slack. A budget below the two peaks together (with worst: below the stash peak) "
       "is an error before training starts.",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         PO_ASSIGN_OR_RETURN(o.arena_bytes, ParseBytes("arena-bytes", v));
         return absl::OkStatus();
       }},
      {"p2p-reserve", "MODE",
       "plan | worst. plan (default): the P2P buffers' lifetimes across the stages bound each "
       "arena's room for them, and the runtime holds to it: it waits for a send once its "
       "receiver is known to have posted the receive (over NCCL, which runs a rank's "
       "transfers in posting order, once the message is known to be consumed). worst: no "
       "such waits, and room for every P2P buffer of the step.",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         if (v != "plan" && v != "worst") return BadValue("p2p-reserve", "plan or worst", v);
         o.p2p_reserve_worst = v == "worst";
         return absl::OkStatus();
       }},
      {"costs", "SOURCE",
       "nominal | measured: what the planner costs a chunk's compute and a transfer with. "
       "measured (default with --backend cuda): before the first step every stage times each "
       "of its chunks' forward and backward (2 untimed and 3 timed calls, events on its compute "
       "queue) and its host link (copies of up to 256 MiB each way), the ranks share the "
       "figures (each stage's own compute, the slowest link) and the schedule is planned in "
       "seconds; with --transport local on one GPU the stages share it, so compute is planned "
       "p times slower and the link split p ways. nominal (default on the CPU): a chunk's F, B "
       "and W take its layer count in units and a transfer a quarter of a chunk's F, right for "
       "the CPU backend's memcpy but far too optimistic on a GPU, where po-f then stalls on its "
       "reloads.",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         if (v != "nominal" && v != "measured") return BadValue("costs", "nominal or measured", v);
         o.measured_costs = v == "measured";
         o.costs_given = true;
         return absl::OkStatus();
       }},
      {"watchdog", "SECONDS",
       "longest any rank waits (for a message, a copy, a peer) before it names what it waits "
       "on and the job stops with an error (default 60).",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         PO_ASSIGN_OR_RETURN(o.watchdog_seconds, ParseDouble("watchdog", v, 0.001, 1e6));
         return absl::OkStatus();
       }},
      {"poison", "",
       "fill released device memory with NaN words, so a read after release fails the step "
       "(on by default in debug builds).",
       [](TrainOptions& o, const std::string&) {
         o.poison = true;
         return absl::OkStatus();
       }},
      {"trace", "FILE",
       "write the last step's measured timeline as a Perfetto / Chrome trace (the simulator's "
       "layout: a process per stage, a track per engine, stash bytes as a counter).",
       StringFlag(&TrainOptions::trace_path, "trace")},
      {"help", "", "print this text and exit.",
       [](TrainOptions& o, const std::string&) {
         o.help = true;
         return absl::OkStatus();
       }},
  };
  return *kFlags;
}

absl::Status CheckCombination(const TrainOptions& o) {
  const std::optional<Family> schedule_family = FamilyFromName(o.schedule);
  if (schedule_family && !o.family.empty() && o.family != o.schedule) {
    return absl::InvalidArgumentError(
        absl::StrCat("--schedule ", o.schedule, " names a family; it conflicts with --family ",
                     o.family, " (--family goes with --schedule po-h, po-f or selective)"));
  }
  const bool selective = o.schedule == "selective";
  if (!selective && (o.offload_fraction > 0 || o.offload_chunks > 0)) {
    return absl::InvalidArgumentError(
        "--offload-fraction and --offload-chunks apply to --schedule selective only");
  }
  if (selective && o.offload_fraction == 0 && o.offload_chunks == 0) {
    return absl::InvalidArgumentError(
        "--schedule selective needs --offload-fraction X (0..1) or --offload-chunks N");
  }
  if (!o.schedule_file.empty() && (!o.schedule.empty() || !o.family.empty() || o.group_size != 0)) {
    return absl::InvalidArgumentError(
        "--schedule-file runs the schedule in the file; drop --schedule, --family and "
        "--group-size");
  }
  if (o.recompute == Recompute::kNone && (o.recompute_fraction != 1.0 || o.recompute_chunks > 0)) {
    return absl::InvalidArgumentError(
        "--recompute-fraction and --recompute-chunks need --recompute lean or full");
  }
  const bool budget = o.memory_budget_bytes > 0 || o.memory_budget_share > 0;
  if (o.schedule == "auto" && !budget) {
    return absl::InvalidArgumentError(
        "--schedule auto needs --memory-budget BYTES or P% (each stage's activation budget)");
  }
  if (o.schedule != "auto" && budget) {
    return absl::InvalidArgumentError("--memory-budget applies to --schedule auto only");
  }
  const bool cuda = o.backend == TrainBackend::kCuda;
  const bool offload = o.optimizer_offload != TrainOptimizerOffload::kNone;
  if (offload && !cuda) {
    return absl::InvalidArgumentError(
        "--optimizer-offload needs --backend cuda (the CPU trainer's optimizer state is in "
        "host memory already)");
  }
  if (o.lean_saved && !cuda) {
    return absl::InvalidArgumentError(
        "--saved lean needs --backend cuda (the CPU GPT keeps its full layout)");
  }
  if (o.gpu_share_given && o.optimizer_offload != TrainOptimizerOffload::kInterleaved &&
      o.optimizer_offload != TrainOptimizerOffload::kStatic) {
    return absl::InvalidArgumentError(
        "--gpu-share applies to --optimizer-offload interleaved or static only");
  }
  if (o.subgroup_given && !offload) {
    return absl::InvalidArgumentError(
        "--optimizer-subgroup applies with --optimizer-offload cpu, interleaved or static only");
  }
  if (cuda && o.config.tied_embeddings) {
    return absl::InvalidArgumentError(
        "--tied is not supported with --backend cuda (the CUDA GPT has untied embeddings only; "
        "its stage model refuses tied ones as Unimplemented)");
  }
  if (cuda && o.transport == TrainTransport::kReference) {
    return absl::InvalidArgumentError(
        "--transport reference is the CPU reference trainer; with --backend cuda use "
        "--transport local or mpi");
  }
  if (offload && o.config.optimizer.weight_decay != 0.0f) {
    return absl::InvalidArgumentError(
        "--weight-decay is not supported with --optimizer-offload (the engine would decay every "
        "parameter; the GPT decays its matrices only)");
  }
  return absl::OkStatus();
}

// The schedule's flags into config.optimizer (see TrainOptions); with --optimizer-offload the
// engines take each step's rate (OptimizerOffload::SetLearningRate).
absl::Status ResolveLearningRate(TrainOptions& o) {
  AdamWConfig& adamw = o.config.optimizer;
  if (o.lr_min_given && !o.lr_decay) {
    return absl::InvalidArgumentError("--lr-min applies to --lr-decay cosine only");
  }
  if (!o.warmup_given) adamw.warmup_steps = kDefaultWarmupSteps;
  adamw.decay_steps = o.lr_decay ? o.steps : 0;
  if (!o.lr_min_given) adamw.min_learning_rate = o.lr_decay ? adamw.learning_rate / 10.0f : 0.0f;
  if (adamw.min_learning_rate > adamw.learning_rate) {
    return absl::InvalidArgumentError(absl::StrCat("--lr-min ", adamw.min_learning_rate,
                                                   " is above --lr ", adamw.learning_rate));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainOptions> ParseTrainOptions(const std::vector<std::string>& args) {
  TrainOptions options;
  options.config.optimizer.clip_norm = kDefaultClipNorm;
  // "--seq-len" is gpt_reference's spelling of --seq.
  PO_RETURN_IF_ERROR(examples::ParseFlags(args, Flags(), options, {{"seq-len", "seq"}}));
  if (options.help) return options;
  PO_RETURN_IF_ERROR(CheckCombination(options));
  PO_RETURN_IF_ERROR(ResolveLearningRate(options));
  if (!options.costs_given) options.measured_costs = options.backend == TrainBackend::kCuda;
  if (options.backend == TrainBackend::kCuda && !options.heads_given) {
    // The CUDA attention takes head sizes 64 and 128 only.
    options.config.n_head = std::max(1, options.config.n_embd / 64);
  }
  return options;
}

std::string TrainHelpText() {
  std::string text =
      "usage: gpt_train [flags]\n"
      "       mpirun -np P gpt_train [flags]\n"
      "\n"
      "Trains the example GPT (fp32 on the CPU; bf16 on GPUs with --backend cuda) as a\n"
      "pipeline of P stages under a compiled schedule, with activation offload when the\n"
      "schedule asks for it, and prints the loss per step, each stage's measured stash peak\n"
      "next to the compiler's prediction, and a checksum of all parameters. On the CPU the\n"
      "checksum is bitwise equal for every schedule and for the single-process reference\n"
      "(plain `gpt_train`, no mpirun); on the GPU, for every schedule and offload policy.\n"
      "\nflags:\n";
  text += examples::FlagsHelp(Flags());
  absl::StrAppend(&text,
                  "\nexamples:\n"
                  "  mpirun -np 4 gpt_train --schedule po-f        # 4 ranks, full offload\n"
                  "  gpt_train --transport local --stages 4 --schedule 1f1b\n"
                  "  gpt_train                                     # single-process reference\n"
                  "  mpirun -np 4 gpt_train --schedule-file plan.json --trace run.json\n"
                  "  gpt_train --backend cuda --transport local --stages 4 --embd 1024 --seq 512 \\\n"
                  "            --schedule po-f --optimizer-offload interleaved --gpu-share 0.3\n"
                  "  mpirun -np 8 gpt_train --backend cuda --schedule po-f  # 8 GPUs, NCCL\n");
  return text;
}

std::string TrainBackendName(TrainBackend backend) {
  return backend == TrainBackend::kCuda ? "cuda" : "cpu";
}

std::string TrainOptimizerOffloadName(TrainOptimizerOffload offload) {
  switch (offload) {
    case TrainOptimizerOffload::kNone:
      return "none";
    case TrainOptimizerOffload::kCpu:
      return "cpu";
    case TrainOptimizerOffload::kInterleaved:
      return "interleaved";
    case TrainOptimizerOffload::kStatic:
      return "static";
  }
  return "?";
}

std::string TrainTransportName(TrainTransport transport) {
  switch (transport) {
    case TrainTransport::kAuto:
      return "auto";
    case TrainTransport::kMpi:
      return "mpi";
    case TrainTransport::kLocal:
      return "local";
    case TrainTransport::kReference:
      return "reference";
  }
  return "?";
}

absl::StatusOr<PipelineSpec> TrainSpec(const TrainOptions& options, int num_stages) {
  std::optional<Family> family = FamilyFromName(options.schedule);
  PipelineSpec spec;
  spec.offload = OffloadPolicy::kNone;
  if (!family) {
    if (!options.schedule.empty()) spec.offload = *OffloadPolicyFromName(options.schedule);
    if (!options.family.empty()) family = FamilyFromName(options.family);
  }
  if (family) {
    spec.family = *family;
    spec.chunks_per_stage =
        options.chunks_given ? options.chunks : (*family == Family::k1F1B ? 1 : 2);
  } else {
    spec.chunks_per_stage = options.chunks_given ? options.chunks : 2;
    spec.family = spec.chunks_per_stage > 1 ? Family::kGroupInterleaved : Family::k1F1B;
  }
  spec.num_stages = num_stages;
  spec.num_microbatches = options.config.num_microbatches;
  spec.group_size = options.group_size;
  spec.split_backward = options.split_backward;
  spec.offload_fraction = options.offload_fraction;
  spec.offload_chunks = options.offload_chunks;
  spec.memory_budget_bytes = options.memory_budget_bytes;  // a share is resolved by PlanSchedule
  spec.recompute = options.recompute;
  spec.recompute_fraction = options.recompute_fraction;
  spec.recompute_chunks = options.recompute_chunks;
  if (absl::Status recompute = CheckRecomputeSpec(spec); !recompute.ok()) {
    return Annotate(recompute, absl::StrCat("--recompute ", RecomputeName(spec.recompute),
                                            " with --schedule ", options.schedule));
  }
  absl::StatusOr<PipelineSpec> resolved = ResolveSpec(spec);
  if (!resolved.ok()) {
    return Annotate(resolved.status(),
                    absl::StrCat("the pipeline asked for (--stages ", num_stages, " --chunks ",
                                 spec.chunks_per_stage, " --microbatches ", spec.num_microbatches,
                                 ", ", std::string(FamilyName(spec.family)), ")"));
  }
  return resolved;
}

}  // namespace pipeoffload::gpt
