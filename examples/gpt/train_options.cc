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
#include "lib/base/status_macros.h"
#include "pipeoffload/compiler.h"

namespace pipeoffload::gpt {
namespace {

using Handler = std::function<absl::Status(TrainOptions&, const std::string&)>;

struct FlagDef {
  std::string_view name;        // without the leading "--"
  std::string_view value_name;  // empty for switches
  std::string_view help;
  Handler handler;
};

constexpr std::int64_t kIntMax = std::int64_t{1} << 30;

absl::Status BadValue(std::string_view flag, std::string_view expected, const std::string& got) {
  return absl::InvalidArgumentError(absl::StrCat("--", std::string(flag), " expects ",
                                                 std::string(expected), ", got '", got, "'"));
}

absl::StatusOr<std::int64_t> ParseInt(std::string_view flag, const std::string& text,
                                      std::int64_t lo, std::int64_t hi) {
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || errno != 0 || *end != '\0' || value < lo || value > hi) {
    return BadValue(flag, absl::StrCat("an integer in [", lo, ", ", hi, "]"), text);
  }
  return static_cast<std::int64_t>(value);
}

absl::StatusOr<double> ParseDouble(std::string_view flag, const std::string& text, double lo,
                                   double hi) {
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || errno != 0 || *end != '\0' || !std::isfinite(value) || value < lo ||
      value > hi) {
    return BadValue(flag, absl::StrCat("a number in [", lo, ", ", hi, "]"), text);
  }
  return value;
}

// Bytes with an optional suffix: K, M, G (powers of 1000) or Ki, Mi, Gi (powers of 1024).
absl::StatusOr<std::int64_t> ParseBytes(std::string_view flag, const std::string& text) {
  static constexpr std::pair<std::string_view, std::int64_t> kSuffixes[] = {
      {"Ki", 1024}, {"Mi", 1024 * 1024}, {"Gi", 1024 * 1024 * 1024},
      {"K", 1000},  {"M", 1000 * 1000},  {"G", 1000 * 1000 * 1000}};
  std::string digits = text;
  std::int64_t scale = 1;
  for (const auto& [suffix, factor] : kSuffixes) {
    if (digits.size() > suffix.size() &&
        std::string_view(digits).substr(digits.size() - suffix.size()) == suffix) {
      digits.resize(digits.size() - suffix.size());
      scale = factor;
      break;
    }
  }
  constexpr std::int64_t kMaxBytes = std::int64_t{1} << 50;
  absl::StatusOr<std::int64_t> base = ParseInt(flag, digits, 1, kMaxBytes / scale);
  if (!base.ok()) {
    return BadValue(flag, "a positive byte count (suffixes K, M, G, Ki, Mi, Gi)", text);
  }
  return *base * scale;
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
       "single-process reference. local: every stage a thread of this process. reference: "
       "no pipeline (ReferenceTrainer: F then B per microbatch, then AdamW).",
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
       "(activation offload on top of --family). Default: group-interleaved when --chunks > 1, "
       "else 1f1b.",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         const bool policy = v == "po-h" || v == "po-f" || v == "selective";
         if (!FamilyFromName(v) && !policy) {
           return BadValue("schedule",
                           "1f1b, interleaved, group-interleaved, po-h, po-f or selective", v);
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
      {"schedule-file", "FILE",
       "run the schedule in FILE (pipeoffload.schedule/1 JSON, e.g. from po-schedule --format "
       "json) instead of compiling one; p, v, m and split backward come from the file.",
       StringFlag(&TrainOptions::schedule_file, "schedule-file")},
      // --- the model ---
      {"layers", "N", "transformer blocks (default 8).",
       ConfigInt(&GptConfig::n_layer, "layers", 1)},
      {"embd", "C", "channels (default 64).", ConfigInt(&GptConfig::n_embd, "embd", 1)},
      {"heads", "H", "attention heads, dividing C (default 4).",
       ConfigInt(&GptConfig::n_head, "heads", 1)},
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
      {"lr", "X", "AdamW learning rate (default 0.003).",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         PO_ASSIGN_OR_RETURN(const double x, ParseDouble("lr", v, 0.0, 10.0));
         o.config.optimizer.learning_rate = static_cast<float>(x);
         return absl::OkStatus();
       }},
      {"weight-decay", "X", "AdamW decoupled weight decay on matrices (default 0).",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         PO_ASSIGN_OR_RETURN(const double x, ParseDouble("weight-decay", v, 0.0, 10.0));
         o.config.optimizer.weight_decay = static_cast<float>(x);
         return absl::OkStatus();
       }},
      // --- the runtime ---
      {"arena-bytes", "BYTES",
       "device memory budget of each stage's arena (suffixes K, M, G, Ki, Mi, Gi). Default: "
       "the plan's stash peak plus every P2P buffer it could hold, with slack. A budget below "
       "the plan's stash peak is an error before training starts; one that holds the stash "
       "but not the P2P buffers fails the first step.",
       [](TrainOptions& o, const std::string& v) -> absl::Status {
         PO_ASSIGN_OR_RETURN(o.arena_bytes, ParseBytes("arena-bytes", v));
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
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainOptions> ParseTrainOptions(const std::vector<std::string>& args) {
  TrainOptions options;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "-h") {
      options.help = true;
      continue;
    }
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", arg, "'; flags start with -- (see --help)"));
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (const std::size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    if (name == "seq-len") name = "seq";  // gpt_reference's spelling
    const FlagDef* def = nullptr;
    for (const FlagDef& candidate : Flags()) {
      if (candidate.name == name) def = &candidate;
    }
    if (def == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (see --help)"));
    }
    if (def->value_name.empty()) {
      if (value) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      }
      value = "";
    } else if (!value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " needs a value (", std::string(def->value_name), ")"));
      }
      value = args[++i];
    }
    PO_RETURN_IF_ERROR(def->handler(options, *value));
  }
  if (options.help) return options;
  PO_RETURN_IF_ERROR(CheckCombination(options));
  return options;
}

std::string TrainHelpText() {
  std::string text =
      "usage: gpt_train [flags]\n"
      "       mpirun -np P gpt_train [flags]\n"
      "\n"
      "Trains the example GPT (fp32, CPU) as a pipeline of P stages under a compiled schedule,\n"
      "with activation offload when the schedule asks for it, and prints the loss per step,\n"
      "each stage's measured stash peak next to the compiler's prediction, and a checksum of\n"
      "all parameters that is bitwise equal for every schedule and for the single-process\n"
      "reference (plain `gpt_train`, no mpirun).\n"
      "\nflags:\n";
  constexpr std::size_t kHelpColumn = 27;  // where each flag's text starts
  constexpr std::size_t kWidth = 100;      // wrap the text at this column
  for (const FlagDef& def : Flags()) {
    std::string line = absl::StrCat("  --", std::string(def.name));
    if (!def.value_name.empty()) absl::StrAppend(&line, " ", std::string(def.value_name));
    line.resize(std::max(line.size() + 1, kHelpColumn), ' ');
    std::string_view words = def.help;
    while (!words.empty()) {
      const std::size_t space = words.find(' ');
      const std::string_view word = words.substr(0, space);
      words = space == std::string_view::npos ? std::string_view() : words.substr(space + 1);
      const std::size_t newline = line.rfind('\n');
      const std::size_t used = line.size() - (newline == std::string::npos ? 0 : newline + 1);
      if (used + word.size() >= kWidth && used > kHelpColumn) {
        line.back() = '\n';
        line.append(kHelpColumn, ' ');
      }
      absl::StrAppend(&line, std::string(word), " ");
    }
    line.back() = '\n';
    text += line;
  }
  absl::StrAppend(&text,
                  "\nexamples:\n"
                  "  mpirun -np 4 gpt_train --schedule po-f        # 4 ranks, full offload\n"
                  "  gpt_train --transport local --stages 4 --schedule 1f1b\n"
                  "  gpt_train                                     # single-process reference\n"
                  "  mpirun -np 4 gpt_train --schedule-file plan.json --trace run.json\n");
  return text;
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
