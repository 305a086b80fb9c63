// gpt_train's flags: every flag the issue names parses and is in --help; the defaults pick the
// schedule the issue asks for; every bad flag is an InvalidArgument naming the flag.
#include "examples/gpt/train_options.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "examples/gpt/optimizer_schedule.h"
#include "examples/gpt/train_stage.h"
#include "tests/testing/catch.h"

namespace pipeoffload::gpt {
namespace {

absl::StatusOr<TrainOptions> Parse(std::vector<std::string> args) {
  return ParseTrainOptions(args);
}

PipelineSpec SpecOf(std::vector<std::string> args, int stages = 4) {
  absl::StatusOr<TrainOptions> options = Parse(std::move(args));
  REQUIRE(options.ok());
  absl::StatusOr<PipelineSpec> spec = TrainSpec(*options, stages);
  INFO(spec.status().ToString());
  REQUIRE(spec.ok());
  return *spec;
}

TEST_CASE("gpt_train defaults: group-interleaved v=2 on the GPT default model",
          "[train][options]") {
  absl::StatusOr<TrainOptions> options = Parse({});
  REQUIRE(options.ok());
  CHECK(options->steps == 500);
  CHECK(options->transport == TrainTransport::kAuto);
  CHECK(options->arena_bytes == 0);
  CHECK(options->watchdog_seconds == 60.0);
  CHECK(options->config.n_layer == GptConfig{}.n_layer);
  CHECK(options->config.num_microbatches == GptConfig{}.num_microbatches);
  const PipelineSpec spec = SpecOf({});
  CHECK(spec.family == Family::kGroupInterleaved);
  CHECK(spec.chunks_per_stage == 2);
  CHECK(spec.group_size == 2);  // ceil(p / 2), resolved by the compiler
  CHECK(spec.offload == OffloadPolicy::kNone);
  CHECK(spec.num_stages == 4);
  CHECK(spec.num_microbatches == 8);
  CHECK_FALSE(spec.split_backward);
}

TEST_CASE("--schedule picks the family or the offload policy on top of --family",
          "[train][options]") {
  PipelineSpec spec = SpecOf({"--schedule", "1f1b"});
  CHECK(spec.family == Family::k1F1B);
  CHECK(spec.chunks_per_stage == 1);
  CHECK(spec.offload == OffloadPolicy::kNone);

  spec = SpecOf({"--schedule", "interleaved"});
  CHECK(spec.family == Family::kInterleaved);
  CHECK(spec.chunks_per_stage == 2);

  spec = SpecOf({"--chunks", "1"});
  CHECK(spec.family == Family::k1F1B);

  spec = SpecOf({"--schedule", "po-f"});
  CHECK(spec.family == Family::kGroupInterleaved);
  CHECK(spec.offload == OffloadPolicy::kFull);

  spec = SpecOf({"--schedule", "po-h", "--family", "1f1b"});
  CHECK(spec.family == Family::k1F1B);
  CHECK(spec.chunks_per_stage == 1);
  CHECK(spec.offload == OffloadPolicy::kHalf);

  spec = SpecOf({"--schedule", "selective", "--offload-chunks", "1", "--chunks", "3",
                 "--group-size", "3", "--microbatches", "12", "--split-backward"});
  CHECK(spec.offload == OffloadPolicy::kSelective);
  CHECK(spec.offload_chunks == 1);
  CHECK(spec.chunks_per_stage == 3);
  CHECK(spec.group_size == 3);
  CHECK(spec.num_microbatches == 12);
  CHECK(spec.split_backward);

  spec = SpecOf({"--schedule=selective", "--offload-fraction=0.25"});
  CHECK(spec.offload_fraction == 0.25);
}

TEST_CASE("model, run and runtime flags land in the options", "[train][options]") {
  absl::StatusOr<TrainOptions> o = Parse({"--layers",
                                          "3",
                                          "--embd",
                                          "24",
                                          "--heads",
                                          "3",
                                          "--seq",
                                          "16",
                                          "--batch",
                                          "5",
                                          "--vocab",
                                          "200",
                                          "--tied",
                                          "--lr",
                                          "0.01",
                                          "--seed",
                                          "99",
                                          "--steps",
                                          "7",
                                          "--data",
                                          "corpus.txt",
                                          "--arena-bytes",
                                          "3Mi",
                                          "--watchdog",
                                          "2.5",
                                          "--trace",
                                          "t.json",
                                          "--poison",
                                          "--transport",
                                          "local",
                                          "--weight-decay",
                                          "0.1",
                                          "--seq-len",
                                          "12"});
  INFO(o.status().ToString());
  REQUIRE(o.ok());
  CHECK(o->config.n_layer == 3);
  CHECK(o->config.n_embd == 24);
  CHECK(o->config.n_head == 3);
  CHECK(o->config.seq_len == 12);  // --seq-len is --seq's alias; the later flag wins
  CHECK(o->config.batch_size == 5);
  CHECK(o->config.vocab_size == 200);
  CHECK(o->config.tied_embeddings);
  CHECK(o->config.optimizer.learning_rate == 0.01f);
  CHECK(o->config.optimizer.weight_decay == 0.1f);
  CHECK(o->config.seed == 99u);
  CHECK(o->steps == 7);
  CHECK(o->data_path == "corpus.txt");
  CHECK(o->arena_bytes == 3 * 1024 * 1024);
  CHECK(o->watchdog_seconds == 2.5);
  CHECK(o->trace_path == "t.json");
  CHECK(o->poison);
  CHECK(o->transport == TrainTransport::kLocal);

  CHECK(Parse({"--arena-bytes", "2K"})->arena_bytes == 2000);
  CHECK(Parse({"--arena-bytes", "5G"})->arena_bytes == 5'000'000'000);
  CHECK(Parse({"--arena-bytes", "4096"})->arena_bytes == 4096);
}

TEST_CASE("--help lists every flag the issue names, and each one parses", "[train][options]") {
  const std::string help = TrainHelpText();
  // flag, and a value for it ("" for switches)
  const std::vector<std::pair<std::string, std::string>> flags = {{"schedule", "po-f"},
                                                                  {"family", "1f1b"},
                                                                  {"stages", "4"},
                                                                  {"chunks", "2"},
                                                                  {"group-size", "2"},
                                                                  {"microbatches", "8"},
                                                                  {"split-backward", ""},
                                                                  {"offload-fraction", "0"},
                                                                  {"offload-chunks", "0"},
                                                                  {"steps", "3"},
                                                                  {"seed", "5"},
                                                                  {"data", "f"},
                                                                  {"layers", "4"},
                                                                  {"embd", "16"},
                                                                  {"heads", "2"},
                                                                  {"seq", "8"},
                                                                  {"batch", "2"},
                                                                  {"tied", ""},
                                                                  {"lr", "0.001"},
                                                                  {"arena-bytes", "1Mi"},
                                                                  {"trace", "t.json"},
                                                                  {"watchdog", "10"},
                                                                  {"schedule-file", "s.json"},
                                                                  {"transport", "mpi"},
                                                                  {"poison", ""},
                                                                  {"vocab", "256"},
                                                                  {"weight-decay", "0"},
                                                                  {"backend", "cpu"},
                                                                  {"costs", "measured"},
                                                                  {"help", ""}};
  for (const auto& [flag, value] : flags) {
    CAPTURE(flag);
    CHECK(help.find("--" + flag + " ") != std::string::npos);
    std::vector<std::string> args = {"--" + flag};
    if (!value.empty()) args.push_back(value);
    const absl::StatusOr<TrainOptions> parsed = Parse(args);
    CHECK(parsed.status().ToString() == "OK");
  }
  CHECK(Parse({"-h"})->help);
}

TEST_CASE("--costs: measured by default on GPUs, nominal on the CPU, an explicit choice wins",
          "[train][options]") {
  CHECK_FALSE(Parse({})->measured_costs);
  CHECK(Parse({"--backend", "cuda"})->measured_costs);
  CHECK_FALSE(Parse({"--backend", "cuda", "--costs", "nominal"})->measured_costs);
  CHECK(Parse({"--costs", "measured"})->measured_costs);
  CHECK(Parse({"--costs=measured", "--backend", "cpu"})->measured_costs);
  const absl::Status bad = Parse({"--costs", "fast"}).status();
  CHECK(bad.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(bad.message()).find("--costs expects nominal or measured, got 'fast'") !=
        std::string::npos);
  CHECK(TrainHelpText().find("--costs SOURCE") != std::string::npos);
}

TEST_CASE("bad flags are InvalidArgument naming the flag and what it expects", "[train][options]") {
  struct Case {
    std::vector<std::string> args;
    std::string expected;  // a substring of the message
  };
  const std::vector<Case> cases = {
      {{"--bogus"}, "unknown flag --bogus"},
      {{"stray"}, "unexpected argument 'stray'"},
      {{"--steps"}, "--steps needs a value"},
      {{"--steps", "-1"}, "--steps expects an integer in [0,"},
      {{"--steps", "3x"}, "got '3x'"},
      {{"--stages", "0"}, "--stages expects an integer in [1,"},
      {{"--lr", "fast"}, "--lr expects a number"},
      {{"--lr", "nan"}, "--lr expects a number"},
      {{"--watchdog", "0"}, "--watchdog expects a number in [0.001"},
      {{"--schedule", "zb-v"}, "--schedule expects 1f1b, interleaved, group-interleaved, po-h"},
      {{"--family", "po-f"}, "--family expects 1f1b, interleaved or group-interleaved"},
      {{"--transport", "tcp"}, "--transport expects auto, mpi, local or reference"},
      {{"--arena-bytes", "0"}, "--arena-bytes expects a positive byte count"},
      {{"--arena-bytes", "12Q"}, "--arena-bytes expects a positive byte count"},
      {{"--offload-fraction", "1.5"}, "--offload-fraction expects a number in [0, 1]"},
      {{"--tied=yes"}, "--tied takes no value"},
      {{"--data", ""}, "--data expects a non-empty value"},
      {{"--schedule", "1f1b", "--family", "interleaved"}, "conflicts with --family"},
      {{"--offload-fraction", "0.5"}, "apply to --schedule selective only"},
      {{"--schedule", "po-f", "--offload-chunks", "1"}, "apply to --schedule selective only"},
      {{"--schedule", "selective"}, "needs --offload-fraction X (0..1) or --offload-chunks N"},
      {{"--schedule-file", "s.json", "--schedule", "po-f"}, "drop --schedule"},
      {{"--backend", "gpu"}, "--backend expects cpu or cuda, got 'gpu'"},
      {{"--schedule", "auto"}, "--schedule auto needs --memory-budget BYTES or P%"},
      {{"--memory-budget", "1G"}, "--memory-budget applies to --schedule auto only"},
      {{"--schedule", "auto", "--memory-budget", "0%"}, "--memory-budget expects a positive"},
      {{"--schedule", "auto", "--memory-budget", "x%"}, "--memory-budget expects a number"},
      {{"--schedule", "auto", "--memory-budget", "0"}, "--memory-budget expects a positive byte"},
      {{"--backend", "cuda", "--optimizer-offload", "disk"},
       "--optimizer-offload expects none, cpu, interleaved or static, got 'disk'"},
      {{"--backend", "cuda", "--optimizer-offload", "interleaved", "--gpu-share", "1.5"},
       "--gpu-share expects a number in [0, 1]"},
      {{"--backend", "cuda", "--optimizer-offload", "cpu", "--optimizer-subgroup", "0"},
       "--optimizer-subgroup expects an integer in [1,"},
      {{"--optimizer-offload", "cpu"}, "--optimizer-offload needs --backend cuda"},
      {{"--backend", "cuda", "--optimizer-offload", "cpu", "--gpu-share", "0.5"},
       "--gpu-share applies to --optimizer-offload interleaved or static only"},
      {{"--backend", "cuda", "--gpu-share", "0.5"}, "--gpu-share applies to"},
      {{"--backend", "cuda", "--optimizer-subgroup", "1024"},
       "--optimizer-subgroup applies with --optimizer-offload"},
      {{"--backend", "cuda", "--tied"}, "--tied is not supported with --backend cuda"},
      {{"--backend", "cuda", "--transport", "reference"},
       "--transport reference is the CPU reference trainer"},
      {{"--backend", "cuda", "--optimizer-offload", "cpu", "--weight-decay", "0.1"},
       "--weight-decay is not supported with --optimizer-offload"},
      {{"--backend", "cuda", "--saved", "half"}, "--saved expects full or lean, got 'half'"},
      {{"--saved", "lean"}, "--saved lean needs --backend cuda"},
      {{"--p2p-reserve", "all"}, "--p2p-reserve expects plan or worst, got 'all'"},
      {{"--warmup-steps", "-1"}, "--warmup-steps expects an integer in [0,"},
      {{"--lr-decay", "linear"}, "--lr-decay expects cosine or none, got 'linear'"},
      {{"--lr-min", "0.01"}, "--lr-min 0.01 is above --lr 0.003"},
      {{"--lr-decay", "none", "--lr-min", "1e-4"}, "--lr-min applies to --lr-decay cosine only"},
      {{"--clip-norm", "-1"}, "--clip-norm expects a number in [0,"},
      {{"--backend", "cuda", "--optimizer-offload", "cpu", "--lr-min", "0.01"},
       "--lr-min 0.01 is above --lr 0.003"},
  };
  for (const Case& c : cases) {
    const absl::StatusOr<TrainOptions> parsed = Parse(c.args);
    CAPTURE(c.args, parsed.status().ToString());
    REQUIRE_FALSE(parsed.ok());
    CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(parsed.status().message()).find(c.expected) != std::string::npos);
  }
}

TEST_CASE("--backend and the optimizer-offload flags land in the options", "[train][options]") {
  absl::StatusOr<TrainOptions> cpu = Parse({});
  REQUIRE(cpu.ok());
  CHECK(cpu->backend == TrainBackend::kCpu);
  CHECK(cpu->optimizer_offload == TrainOptimizerOffload::kNone);
  CHECK(cpu->config.n_head == 4);  // the CPU default is unchanged

  // With cuda the default head count gives the CUDA attention's head size 64; --heads wins.
  absl::StatusOr<TrainOptions> cuda = Parse({"--backend", "cuda", "--embd", "256"});
  REQUIRE(cuda.ok());
  CHECK(cuda->backend == TrainBackend::kCuda);
  CHECK(cuda->config.n_head == 4);
  cuda = Parse({"--backend", "cuda", "--embd", "1024"});
  REQUIRE(cuda.ok());
  CHECK(cuda->config.n_head == 16);
  cuda = Parse({"--backend", "cuda", "--embd", "1024", "--heads", "8"});
  REQUIRE(cuda.ok());
  CHECK(cuda->config.n_head == 8);
  cuda = Parse({"--heads", "8", "--backend", "cuda", "--embd", "1024"});  // any order
  REQUIRE(cuda.ok());
  CHECK(cuda->config.n_head == 8);

  const std::vector<std::pair<std::string, TrainOptimizerOffload>> modes = {
      {"none", TrainOptimizerOffload::kNone},
      {"cpu", TrainOptimizerOffload::kCpu},
      {"interleaved", TrainOptimizerOffload::kInterleaved},
      {"static", TrainOptimizerOffload::kStatic}};
  for (const auto& [name, mode] : modes) {
    CAPTURE(name);
    absl::StatusOr<TrainOptions> parsed = Parse({"--backend", "cuda", "--optimizer-offload", name});
    REQUIRE(parsed.ok());
    CHECK(parsed->optimizer_offload == mode);
    CHECK(TrainOptimizerOffloadName(mode) == name);
    CHECK(parsed->gpu_share == 0.5);
    CHECK(parsed->optimizer_subgroup == std::int64_t{1} << 24);
  }
  absl::StatusOr<TrainOptions> shared =
      Parse({"--backend", "cuda", "--optimizer-offload", "interleaved", "--gpu-share", "0.3",
             "--optimizer-subgroup", "1000"});
  REQUIRE(shared.ok());
  CHECK(shared->gpu_share == 0.3);
  CHECK(shared->optimizer_subgroup == 1000);
  shared = Parse({"--backend", "cuda", "--optimizer-offload", "static", "--gpu-share", "0"});
  REQUIRE(shared.ok());
  CHECK(shared->gpu_share == 0.0);
  CHECK_FALSE(shared->lean_saved);
  absl::StatusOr<TrainOptions> lean = Parse({"--backend", "cuda", "--saved", "lean"});
  REQUIRE(lean.ok());
  CHECK(lean->lean_saved);
  lean = Parse({"--backend", "cuda", "--saved", "lean", "--saved", "full"});
  REQUIRE(lean.ok());
  CHECK_FALSE(lean->lean_saved);
  const std::string help = TrainHelpText();
  for (const char* flag : {"--optimizer-offload MODE", "--gpu-share R", "--optimizer-subgroup N",
                           "--backend NAME", "--memory-budget BYTES", "--saved LAYOUT"}) {
    CAPTURE(flag);
    CHECK(help.find(flag) != std::string::npos);
  }
}

TEST_CASE("the learning-rate schedule and clipping flags: defaults and overrides",
          "[train][options]") {
  // Defaults: warm-up 100 steps, cosine to lr / 10 at the last step, clip at 1.
  absl::StatusOr<TrainOptions> o = Parse({"--steps", "500", "--lr", "3e-4"});
  REQUIRE(o.ok());
  const AdamWConfig* adamw = &o->config.optimizer;
  CHECK(adamw->warmup_steps == 100);
  CHECK(adamw->decay_steps == 500);
  CHECK(adamw->min_learning_rate == 3e-4f / 10.0f);
  CHECK(adamw->clip_norm == kDefaultClipNorm);
  o = Parse({"--steps", "12"});
  REQUIRE(o.ok());
  // A short run keeps the full warm-up (it ends within it): update 1's rate is what matters.
  CHECK(o->config.optimizer.warmup_steps == kDefaultWarmupSteps);
  CHECK(DescribeLearningRate(o->config.optimizer) ==
        "warm-up 100 steps to 0.003 (longer than this 12-step run, which ends at 0.00036)");
  o = Parse({"--steps", "100"});
  REQUIRE(o.ok());
  CHECK(DescribeLearningRate(o->config.optimizer) ==
        "warm-up 100 steps to 0.003 over the whole 100-step run");

  o = Parse({"--steps", "50", "--warmup-steps", "5", "--lr-min", "1e-4", "--clip-norm", "0.5"});
  REQUIRE(o.ok());
  adamw = &o->config.optimizer;
  CHECK(adamw->warmup_steps == 5);
  CHECK(adamw->decay_steps == 50);
  CHECK(adamw->min_learning_rate == 1e-4f);
  CHECK(adamw->clip_norm == 0.5f);
  o = Parse({"--warmup-steps", "0", "--lr-decay", "none", "--clip-norm", "0"});
  REQUIRE(o.ok());
  adamw = &o->config.optimizer;
  CHECK(adamw->warmup_steps == 0);
  CHECK(adamw->decay_steps == 0);
  CHECK(adamw->min_learning_rate == 0.0f);
  CHECK(adamw->clip_norm == 0.0f);
  CHECK(LearningRateAt(*adamw, 1) == adamw->learning_rate);

  // Optimizer offload: the engines take each step's rate, so the defaults are the same.
  o = Parse({"--backend", "cuda", "--optimizer-offload", "interleaved", "--steps", "200"});
  REQUIRE(o.ok());
  adamw = &o->config.optimizer;
  CHECK(adamw->warmup_steps == 100);
  CHECK(adamw->decay_steps == 200);
  CHECK(adamw->min_learning_rate == adamw->learning_rate / 10.0f);
  CHECK(adamw->clip_norm == kDefaultClipNorm);
  o = Parse({"--backend", "cuda", "--optimizer-offload", "cpu", "--warmup-steps", "0",
             "--lr-decay", "none"});
  CHECK(o.ok());

  const std::string help = TrainHelpText();
  for (const char* flag : {"--warmup-steps N", "--lr-decay SHAPE", "--lr-min X", "--clip-norm X"}) {
    CAPTURE(flag);
    CHECK(help.find(flag) != std::string::npos);
  }
}

TEST_CASE("model FLOP per step: the pipeline_bench convention plus the head", "[train][options]") {
  GptConfig config;
  config.n_layer = 2;
  config.n_embd = 64;
  config.seq_len = 32;
  config.vocab_size = 256;
  config.batch_size = 3;
  config.num_microbatches = 5;
  // Per sequence: 2 x (72 * 64^2 * 32 + 12 * 32^2 * 64) + 6 * 32 * 64 * 256; times 15.
  const double per_sequence = 2 * (72.0 * 4096 * 32 + 12.0 * 1024 * 64) + 6.0 * 32 * 64 * 256;
  CHECK(ModelFlopsPerStep(config) == per_sequence * 15);
}

TEST_CASE("a spec the compiler rejects names the pipeline flags", "[train][options]") {
  absl::StatusOr<TrainOptions> options =
      Parse({"--schedule", "interleaved", "--microbatches", "6"});
  REQUIRE(options.ok());
  const absl::StatusOr<PipelineSpec> spec = TrainSpec(*options, 4);
  REQUIRE_FALSE(spec.ok());
  CHECK(spec.status().code() == absl::StatusCode::kInvalidArgument);
  const std::string message(spec.status().message());
  CAPTURE(message);
  CHECK(message.find("--stages 4 --chunks 2 --microbatches 6, interleaved") != std::string::npos);
  CHECK(message.find("num_microbatches") != std::string::npos);

  options = Parse({"--schedule", "1f1b", "--chunks", "2"});
  REQUIRE(options.ok());
  CHECK(TrainSpec(*options, 4).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("--recompute lands in the spec; its share flags need it", "[train][options]") {
  absl::StatusOr<TrainOptions> options =
      Parse({"--schedule", "interleaved", "--recompute", "lean", "--recompute-fraction", "0.5"});
  REQUIRE(options.ok());
  CHECK(options->recompute == Recompute::kLean);
  absl::StatusOr<PipelineSpec> spec = TrainSpec(*options, 4);
  REQUIRE(spec.ok());
  CHECK(spec->recompute == Recompute::kLean);
  CHECK(spec->recompute_fraction == 0.5);
  CHECK(spec->recompute_chunks == 0);

  options = Parse({"--recompute", "full", "--recompute-chunks", "1"});
  REQUIRE(options.ok());
  spec = TrainSpec(*options, 4);
  REQUIRE(spec.ok());
  CHECK(spec->recompute == Recompute::kFull);
  CHECK(spec->recompute_chunks == 1);
  CHECK(Parse({})->recompute == Recompute::kNone);

  const auto fails = [](std::vector<std::string> args, const std::string& text) {
    const absl::StatusOr<TrainOptions> bad = Parse(std::move(args));
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(bad.status().message()).find(text) != std::string::npos);
  };
  fails({"--recompute", "some"}, "none, lean or full");
  fails({"--recompute-fraction", "0.5"}, "need --recompute lean or full");
  fails({"--recompute", "full", "--recompute-fraction", "0"}, "(0, 1]");
  // Recompute beside an offload policy: the planner may offload what F keeps.
  options = Parse({"--schedule", "po-f", "--recompute", "full"});
  REQUIRE(options.ok());
  const absl::StatusOr<PipelineSpec> mixed = TrainSpec(*options, 4);
  REQUIRE(mixed.ok());
  CHECK(mixed->offload == OffloadPolicy::kFull);
  CHECK(mixed->recompute == Recompute::kFull);
}

}  // namespace
}  // namespace pipeoffload::gpt
