// slide_train in-process on the CPU backend: the command line (every flag of --help parses and
// sets its field, every bad input is an InvalidArgument naming the flag, the help's examples
// parse), and the driver: per-step lines and the summary, learning, determinism, --dry-run
// (plans without training, a named 8B shape without allocating it), --save / --load (the loaded
// model's loss is bit for bit the trained one's), --data token files, --json and --trace, and
// the errors that must stop a run before it trains and leave nothing written.
#include "examples/llama/slide_train.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "examples/llama/llama_data.h"
#include "examples/llama/slide_device.h"
#include "examples/llama/slide_options.h"
#include "tests/llama/io_test_util.h"
#include "tests/slide/nvme_test_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload::llama {
namespace {

using testing::AppendLittleEndian;
using testing::CheckError;
using testing::TempDir;
using testing::WriteBytes;

using Args = std::vector<std::string>;

// The tiny model at CI size: 32 tokens a step on the CPU backend.
Args Small(Args more) {
  Args args = {"--backend", "cpu", "--model", "tiny", "--seq", "32"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

SlideTrainOptions Parse(const Args& args) {
  absl::StatusOr<SlideTrainOptions> options = ParseSlideTrainOptions(args);
  INFO("args: " << absl::StrJoin(args, " ") << "\nstatus: " << options.status().ToString());
  REQUIRE(options.ok());
  return *options;
}

struct Run {
  absl::StatusOr<SlideTrainSummary> summary;
  std::string out;
};

Run RunArgs(const Args& args) {
  const SlideTrainOptions options = Parse(args);
  std::ostringstream out;
  absl::StatusOr<SlideTrainSummary> summary = RunSlideTrain(options, out);
  return {std::move(summary), out.str()};
}

// A run that must succeed.
SlideTrainSummary Train(const Args& args, std::string* out = nullptr) {
  Run run = RunArgs(args);
  INFO("args: " << absl::StrJoin(args, " ") << "\nstatus: " << run.summary.status().ToString()
                << "\noutput:\n"
                << run.out);
  REQUIRE(run.summary.ok());
  if (out != nullptr) *out = run.out;
  return *std::move(run.summary);
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

std::vector<std::string> LinesStartingWith(const std::string& text, const std::string& prefix) {
  std::vector<std::string> lines;
  for (const std::string& line : Lines(text)) {
    if (line.rfind(prefix, 0) == 0) lines.push_back(line);
  }
  return lines;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Nothing of a run's training: no engine setup, no step.
void CheckTrainedNothing(const std::string& out) {
  INFO("output:\n" << out);
  CHECK(LinesStartingWith(out, "setup:").empty());
  CHECK(LinesStartingWith(out, "step ").empty());
  CHECK(LinesStartingWith(out, "summary:").empty());
}

bool Exists(const std::string& path) {
  std::error_code ignored;
  return std::filesystem::exists(path, ignored);
}

// VmHWM of /proc/self/status in bytes.
std::int64_t HostPeakBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    long long kib = 0;
    if (std::sscanf(line.c_str(), "VmHWM: %lld kB", &kib) == 1) return kib * 1024;
  }
  FAIL("no VmHWM in /proc/self/status");
  return -1;
}

// Token ids as a raw little-endian uint16 file (nanoGPT's .bin).
void WriteU16Tokens(const std::string& path, const std::vector<std::uint32_t>& tokens) {
  std::string bytes;
  for (std::uint32_t t : tokens) AppendLittleEndian(&bytes, static_cast<std::uint16_t>(t));
  WriteBytes(path, bytes);
}

// The embedded corpus' tokens, through TokenData's public API: the one window of T = size - 1
// starts at 0, so its tokens and its last target are the whole corpus.
std::vector<std::uint32_t> SyntheticTokens() {
  const TokenData data = TokenData::Synthetic();
  const int T = static_cast<int>(data.size() - 1);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(T)), targets(tokens.size());
  data.Microbatch(1, 0, 0, 1, T, tokens.data(), targets.data());
  std::vector<std::uint32_t> all(tokens.begin(), tokens.end());
  all.push_back(static_cast<std::uint32_t>(targets.back()));
  return all;
}

// ---- the command line --------------------------------------------------------------------

// One flag with a value that differs from the default, and what it must set.
struct FlagCase {
  Args args;  // the flag first
  std::function<bool(const SlideTrainOptions&)> sets;
};

std::vector<FlagCase> FlagCases() {
  using O = SlideTrainOptions;
  return {
      {{"--model", "llama3-8b"},
       [](const O& o) { return o.model == "llama3-8b" && o.model_given; }},
      {{"--config", "/x/config.json"},
       [](const O& o) { return o.config_path == "/x/config.json"; }},
      {{"--load", "/x/ckpt"}, [](const O& o) { return o.load_path == "/x/ckpt"; }},
      {{"--save", "/x/out"}, [](const O& o) { return o.save_path == "/x/out"; }},
      {{"--save-dtype", "fp16"}, [](const O& o) { return o.save_dtype == "fp16"; }},
      {{"--init-seed", "7"}, [](const O& o) { return o.init_seed == 7; }},
      {{"--data", "/x/tokens.bin"}, [](const O& o) { return o.data_path == "/x/tokens.bin"; }},
      {{"--data-format", "u16"}, [](const O& o) { return o.data_format == DataFormat::kU16; }},
      {{"--data-seed", "9"}, [](const O& o) { return o.data_seed == 9; }},
      {{"--batch", "2"}, [](const O& o) { return o.batch == 2; }},
      {{"--seq", "64"}, [](const O& o) { return o.seq == 64; }},
      {{"--microbatches", "3"}, [](const O& o) { return o.microbatches == 3; }},
      {{"--steps", "5"}, [](const O& o) { return o.steps == 5; }},
      {{"--lr", "0.01"}, [](const O& o) { return o.lr == 0.01f && o.min_lr == 0.01f / 10.0f; }},
      {{"--min-lr", "1e-4"}, [](const O& o) { return o.min_lr == 1e-4f; }},
      {{"--warmup-steps", "2"}, [](const O& o) { return o.warmup_steps == 2; }},
      {{"--weight-decay", "0.1"}, [](const O& o) { return o.weight_decay == 0.1f; }},
      {{"--beta1", "0.8"}, [](const O& o) { return o.beta1 == 0.8f; }},
      {{"--beta2", "0.99"}, [](const O& o) { return o.beta2 == 0.99f; }},
      {{"--eps", "1e-6"}, [](const O& o) { return o.epsilon == 1e-6f; }},
      {{"--clip", "0"}, [](const O& o) { return o.clip == 0.0; }},
      {{"--backend", "cpu"}, [](const O& o) { return o.backend == SlideBackend::kCpu; }},
      {{"--gpu-memory-budget", "24GiB"},
       [](const O& o) { return o.gpu_memory_budget == std::int64_t{24} << 30; }},
      {{"--slots", "2"}, [](const O& o) { return o.slots == 2; }},
      {{"--resident", "0,1,5"}, [](const O& o) { return o.resident == "0,1,5"; }},
      {{"--update-timing", "after-backward"},
       [](const O& o) { return o.update_timing == UpdateTiming::kAfterBackward; }},
      {{"--landing-buffers", "4"}, [](const O& o) { return o.landing_buffers == 4; }},
      {{"--grad-chunk", "4096"}, [](const O& o) { return o.grad_chunk == 4096; }},
      {{"--nvme-dir", "/x/nvme", "--nvme-fraction", "0.5"},
       [](const O& o) { return o.nvme_dir == "/x/nvme"; }},
      {{"--nvme-fraction", "0.25", "--nvme-dir", "/x/nvme"},
       [](const O& o) { return o.nvme_fraction == 0.25; }},
      {{"--nvme-checkpoints", "0.5", "--nvme-dir", "/x/nvme"},
       [](const O& o) { return o.nvme_checkpoints == 0.5; }},
      {{"--cpu-threads", "3"}, [](const O& o) { return o.cpu_threads == 3; }},
      {{"--ce-chunk", "16"}, [](const O& o) { return o.ce_chunk_rows == 16; }},
      {{"--dry-run"}, [](const O& o) { return o.dry_run; }},
      {{"--trace", "/x/t.json"}, [](const O& o) { return o.trace_path == "/x/t.json"; }},
      {{"--json", "/x/j.jsonl"}, [](const O& o) { return o.json_path == "/x/j.jsonl"; }},
      {{"--assume-tflops", "100"}, [](const O& o) { return o.assume_tflops == 100.0; }},
      {{"--assume-pcie", "20"}, [](const O& o) { return o.assume_pcie_gbps == 20.0; }},
      {{"--assume-cpu-adam", "1.5"}, [](const O& o) { return o.assume_cpu_adam_gparams == 1.5; }},
      {{"--help"}, [](const O& o) { return o.help; }},
  };
}

// The flags the help lists, one entry each: the lines "  --name ...".
std::set<std::string> HelpEntries(const std::string& help) {
  std::set<std::string> names;
  const std::regex entry("^  --([a-z0-9-]+)");
  for (const std::string& line : Lines(help)) {
    std::smatch m;
    if (std::regex_search(line, m, entry)) names.insert(m[1].str());
  }
  return names;
}

TEST_CASE("slide_train: every flag of --help parses and sets its option", "[llama][slide_train]") {
  const SlideTrainOptions defaults = Parse({});
  CHECK_FALSE(defaults.help);
  CHECK(defaults.min_lr == defaults.lr / 10.0f);
  const std::vector<FlagCase> cases = FlagCases();
  std::set<std::string> covered;
  for (const FlagCase& c : cases) {
    INFO(c.args[0]);
    covered.insert(c.args[0].substr(2));
    CHECK_FALSE(c.sets(defaults));  // else the case proves nothing
    CHECK(c.sets(Parse(c.args)));
    if (c.args.size() >= 2) {  // --flag=value is the same
      Args joined = c.args;
      joined[0] += "=" + joined[1];
      joined.erase(joined.begin() + 1);
      CHECK(c.sets(Parse(joined)));
    }
  }
  // The help lists exactly these flags: one the parser gains without a case here, or one the
  // help loses, fails.
  const std::string help = SlideTrainHelpText();
  CHECK(HelpEntries(help) == covered);
  // Every --token the help's prose and examples mention is a flag.
  const std::regex token("--([a-z0-9][a-z0-9-]*)");
  int mentions = 0;
  for (auto it = std::sregex_iterator(help.begin(), help.end(), token);
       it != std::sregex_iterator(); ++it) {
    INFO("the help mentions --" << (*it)[1]);
    CHECK(covered.count((*it)[1].str()) == 1);
    ++mentions;
  }
  CHECK(mentions > static_cast<int>(covered.size()));
  CHECK(Parse({"-h"}).help);
}

TEST_CASE("slide_train: the help's example command lines parse", "[llama][slide_train]") {
  const std::string help = SlideTrainHelpText();
  const std::size_t examples = help.find("\nexamples:\n");
  REQUIRE(examples != std::string::npos);
  std::vector<std::string> commands;
  bool continued = false;
  for (std::string line : Lines(help.substr(examples + 11))) {
    line = line.substr(0, line.find('#'));
    const bool continues = line.find('\\') != std::string::npos;
    if (continues) line = line.substr(0, line.find('\\'));
    if (continued) {
      commands.back() += " " + line;
    } else {
      const std::size_t at = line.find("slide_train ");
      REQUIRE(at != std::string::npos);
      commands.push_back(line.substr(at + 12));
    }
    continued = continues;
  }
  CHECK(commands.size() == 5);
  for (const std::string& command : commands) {
    const Args args = absl::StrSplit(command, ' ', absl::SkipWhitespace());
    Parse(args);
  }
}

TEST_CASE("slide_train: bad command lines are InvalidArgument naming the flag",
          "[llama][slide_train]") {
  const std::vector<std::pair<Args, std::vector<std::string_view>>> cases = {
      {{"--bogus"}, {"unknown flag --bogus"}},
      {{"--bogus=1"}, {"unknown flag --bogus"}},
      {{"steps"}, {"unexpected argument 'steps'"}},
      {{"--steps"}, {"--steps needs a value"}},
      {{"--seq", "32", "--lr"}, {"--lr needs a value"}},
      {{"--dry-run=yes"}, {"--dry-run takes no value"}},
      {{"--steps", "x"}, {"--steps expects an integer", "'x'"}},
      {{"--steps", "2.5"}, {"--steps", "'2.5'"}},
      {{"--steps", "0"}, {"--steps", "'0'"}},
      {{"--steps", "99999999999"}, {"--steps", "'99999999999'"}},
      {{"--seq", "0"}, {"--seq", "'0'"}},
      {{"--batch", "-1"}, {"--batch", "'-1'"}},
      {{"--microbatches", "0"}, {"--microbatches", "'0'"}},
      {{"--slots", "0"}, {"--slots", "'0'"}},
      {{"--cpu-threads", "0"}, {"--cpu-threads", "'0'"}},
      {{"--landing-buffers", "0"}, {"--landing-buffers", "'0'"}},
      {{"--grad-chunk", "10"}, {"--grad-chunk", "'10'"}},
      {{"--ce-chunk", "0"}, {"--ce-chunk", "'0'"}},
      {{"--init-seed", "-3"}, {"--init-seed", "'-3'"}},
      {{"--lr", "-1"}, {"--lr expects a number", "'-1'"}},
      {{"--lr", "nan"}, {"--lr", "'nan'"}},
      {{"--lr", "1e-3x"}, {"--lr", "'1e-3x'"}},
      {{"--beta1", "1"}, {"--beta1", "'1'"}},
      {{"--beta2", "1.5"}, {"--beta2", "'1.5'"}},
      {{"--eps", "-1e-8"}, {"--eps", "'-1e-8'"}},
      {{"--weight-decay", "2"}, {"--weight-decay", "'2'"}},
      {{"--clip", "-1"}, {"--clip", "'-1'"}},
      {{"--assume-tflops", "0"}, {"--assume-tflops", "'0'"}},
      {{"--nvme-fraction", "1.5"}, {"--nvme-fraction", "'1.5'"}},
      {{"--nvme-fraction", "-0.1"}, {"--nvme-fraction", "'-0.1'"}},
      {{"--nvme-fraction", "0.5"}, {"--nvme-fraction needs --nvme-dir"}},
      {{"--nvme-dir", "/tmp"}, {"--nvme-dir needs --nvme-fraction", "or --nvme-checkpoints"}},
      {{"--nvme-checkpoints", "0.5"}, {"--nvme-checkpoints needs --nvme-dir"}},
      {{"--nvme-checkpoints", "1.5", "--nvme-dir", "/tmp"}, {"--nvme-checkpoints", "'1.5'"}},
      {{"--nvme-checkpoints", "-1", "--nvme-dir", "/tmp"}, {"--nvme-checkpoints", "'-1'"}},
      {{"--gpu-memory-budget", "0"}, {"--gpu-memory-budget", "'0'"}},
      {{"--gpu-memory-budget", "-5GiB"}, {"--gpu-memory-budget", "'-5Gi'"}},
      {{"--gpu-memory-budget", "lots"}, {"--gpu-memory-budget", "'lots'"}},
      {{"--gpu-memory-budget", "24XB"}, {"--gpu-memory-budget", "'24X'"}},
      {{"--backend", "tpu"}, {"--backend expects auto, cpu or cuda, got 'tpu'"}},
      {{"--update-timing", "x"}, {"--update-timing expects overlapped or after-backward, got 'x'"}},
      {{"--save-dtype", "int8"}, {"--save-dtype expects bf16, fp16 or fp32, got 'int8'"}},
      {{"--data-format", "u64"},
       {"--data-format expects auto, bytes, u16, u32 or llmc, got 'u64'"}},
      {{"--model", "gpt5"}, {"--model", "'gpt5'", "llama3-8b"}},
      {{"--model="}, {"--model expects a model name"}},
      {{"--resident", "0,x"}, {"--resident", "'0,x'"}},
      {{"--resident", "0,,1"}, {"--resident", "'0,,1'"}},
      {{"--resident", "-1"}, {"--resident", "'-1'"}},
      {{"--resident", "some"}, {"--resident", "'some'"}},
      {{"--resident="}, {"--resident", "''"}},
      {{"--save", ""}, {"--save expects a non-empty value"}},
      {{"--data="}, {"--data expects a non-empty value"}},
      {{"--min-lr", "0.1"}, {"--min-lr must not exceed --lr"}},
      {{"--lr", "0", "--min-lr", "1e-5"}, {"--min-lr must not exceed --lr"}},
      {{"--warmup-steps", "30"}, {"--warmup-steps must not exceed --steps"}},
      {{"--steps", "3", "--warmup-steps", "4"}, {"--warmup-steps must not exceed --steps"}},
      {{"--resident", "all", "--slots", "2"}, {"--slots", "--resident all"}},
  };
  for (const auto& [args, parts] : cases) {
    INFO("args: " << absl::StrJoin(args, " "));
    CheckError(ParseSlideTrainOptions(args).status(), absl::StatusCode::kInvalidArgument, parts);
  }
  // The valid neighbours of some of those.
  CHECK(Parse({"--lr", "0"}).min_lr == 0.0f);
  CHECK(Parse({"--steps", "3", "--warmup-steps", "3"}).warmup_steps == 3);
  CHECK(Parse({"--nvme-fraction", "0", "--lr", "1e-3", "--min-lr", "1e-3"}).min_lr == 1e-3f);
  // Checkpoints alone on the drive (m, v on the host) are a use of --nvme-dir.
  CHECK(Parse({"--nvme-dir", "/tmp", "--nvme-checkpoints", "1"}).nvme_fraction == 0.0);
  CHECK(Parse({"--gpu-memory-budget", "24Gi"}).gpu_memory_budget == std::int64_t{24} << 30);
  CHECK(Parse({"--gpu-memory-budget", "3M"}).gpu_memory_budget == 3'000'000);
  CHECK(Parse({"--gpu-memory-budget", "4096"}).gpu_memory_budget == 4096);
  for (const char* resident : {"auto", "none", "all", "0", "0,1,33"}) {
    CHECK(Parse({"--resident", resident}).resident == resident);
  }
}

// ---- the driver: training ----------------------------------------------------------------

TEST_CASE("slide_train: 3 CPU steps print a line each and a summary", "[llama][slide_train]") {
  TempDir dir;
  const Args args = Small({"--steps", "3", "--lr", "1e-3", "--json", dir.File("run.jsonl"),
                           "--trace", dir.File("trace.json")});
  const SlideTrainOptions options = Parse(args);
  std::string out;
  const SlideTrainSummary summary = Train(args, &out);
  INFO("output:\n" << out);

  REQUIRE(summary.losses.size() == 3);
  REQUIRE(summary.step_seconds.size() == 3);
  for (double loss : summary.losses) CHECK(std::isfinite(loss));
  // A fresh init predicts about uniformly over the 256 byte tokens: loss ~ ln 256.
  CHECK(std::fabs(summary.losses[0] - std::log(256.0)) < 0.2);
  CHECK(summary.median_step_seconds > 0.0);
  CHECK(summary.tokens_per_second > 0.0);
  CHECK(summary.tokens_per_second == Catch::Approx(32.0 / summary.median_step_seconds));
  CHECK(summary.model_tflops > 0.0);
  CHECK(summary.host_peak_bytes > 0);

  CHECK(Contains(out, "model tiny (llama): "));
  CHECK(Contains(out, "data synthetic: 65536 tokens; step = 1 microbatches x 1 x 32 = 32 tokens"));
  CHECK(Contains(out, "plan (budget "));
  CHECK(Contains(out, ", cpu backend):\n"));
  CHECK(LinesStartingWith(out, "setup: random init (seed 1234)").size() == 1);
  // "step i/3 | loss L | lr R | norm G[ (clip xC)] | S s | N tok/s | F TFLOP/s | host ..."
  const std::regex step_line(
      R"(^step (\d+)/3 \| loss (\S+) \| lr (\S+) \| norm [0-9.]+( \(clip x[0-9.]+\))? \| )"
      R"([0-9.]+ s \| [0-9]+ tok/s \| \S+ TFLOP/s \| host [0-9.]+ GiB \(peak [0-9.]+\) \| )"
      R"(cpu adam [0-9.]+ s, waits [0-9.]+ s$)");
  const std::vector<std::string> steps = LinesStartingWith(out, "step ");
  REQUIRE(steps.size() == 3);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    INFO(steps[i]);
    std::smatch m;
    REQUIRE(std::regex_match(steps[i], m, step_line));
    CHECK(m[1] == std::to_string(i + 1));
    CHECK(m[2] == absl::StrFormat("%.4f", summary.losses[i]));
    CHECK(m[3] ==
          absl::StrFormat("%.2e", ScheduledLearningRate(options, static_cast<std::int64_t>(i))));
    CHECK_FALSE(Contains(steps[i], "| GPU "));  // no device memory on the CPU backend
  }
  const std::vector<std::string> summaries = LinesStartingWith(out, "summary: median step ");
  REQUIRE(summaries.size() == 1);
  CHECK(Contains(summaries[0], absl::StrFormat("loss %.4f -> %.4f", summary.losses.front(),
                                               summary.losses.back())));
  CHECK(Contains(summaries[0], absl::StrFormat("%.0f tokens/s", summary.tokens_per_second)));

  const std::vector<std::string> json = Lines(testing::ReadBytes(dir.File("run.jsonl")));
  REQUIRE(json.size() == 1);
  CHECK(Contains(json[0], R"("model":"tiny","backend":"cpu","batch":1,"seq":32,"microbatches":1)"));
  CHECK(Contains(json[0], absl::StrFormat(R"("first_loss":%.6f,"last_loss":%.6f)",
                                          summary.losses.front(), summary.losses.back())));
  const std::string trace = testing::ReadBytes(dir.File("trace.json"));
  CHECK(trace.rfind("{\"traceEvents\": [", 0) == 0);
  CHECK(Contains(out, "trace: "));
  // --json appends.
  Train(args);
  CHECK(Lines(testing::ReadBytes(dir.File("run.jsonl"))).size() == 2);
}

TEST_CASE("slide_train: the schedule's learning rates", "[llama][slide_train]") {
  const SlideTrainOptions cosine = Parse({"--steps", "5", "--lr", "1e-3"});
  CHECK(ScheduledLearningRate(cosine, 0) == 1e-3f);
  CHECK(ScheduledLearningRate(cosine, 2) == Catch::Approx(0.55e-3));
  CHECK(ScheduledLearningRate(cosine, 4) == Catch::Approx(1e-4));
  const SlideTrainOptions warm = Parse({"--steps", "6", "--lr", "1e-3", "--warmup-steps", "2"});
  CHECK(ScheduledLearningRate(warm, 0) == Catch::Approx(0.5e-3));
  CHECK(ScheduledLearningRate(warm, 1) == Catch::Approx(1e-3));
  CHECK(ScheduledLearningRate(warm, 2) == Catch::Approx(1e-3));
  CHECK(ScheduledLearningRate(warm, 5) == Catch::Approx(1e-4));
  const SlideTrainOptions constant = Parse({"--steps", "4", "--lr", "1e-3", "--min-lr", "1e-3"});
  for (int step = 0; step < 4; ++step) CHECK(ScheduledLearningRate(constant, step) == 1e-3f);
}

TEST_CASE("slide_train: the loss falls, and runs are deterministic", "[llama][slide_train]") {
  const Args args = Small({"--steps", "10", "--lr", "3e-3"});
  const SlideTrainSummary a = Train(args);
  REQUIRE(a.losses.size() == 10);
  INFO("losses " << absl::StrJoin(a.losses, ", "));
  CHECK(a.losses.back() < a.losses.front() - 0.5);
  // The CPU backend is deterministic, whatever the CPU Adam's thread count.
  Args two_threads = args;
  two_threads.insert(two_threads.end(), {"--cpu-threads", "2"});
  const SlideTrainSummary b = Train(two_threads);
  CHECK(b.losses == a.losses);
  // The update timing changes when the CPU updates, not what it computes.
  Args after = args;
  after.insert(after.end(), {"--update-timing", "after-backward"});
  CHECK(Train(after).losses == a.losses);
}

// ---- --dry-run ---------------------------------------------------------------------------

void CheckPlanPrinted(const std::string& out, const std::string& backend) {
  INFO("output:\n" << out);
  CHECK(Contains(out, "plan (budget "));
  CHECK(Contains(out, ", " + backend + " backend):\n"));
  CHECK(LinesStartingWith(out, "ring: ").size() == 1);
  CHECK(LinesStartingWith(out, "placement: ").size() == 1);
  CHECK(LinesStartingWith(out, "device: ").size() == 1);
  CHECK(LinesStartingWith(out, "host: ").size() == 1);
  CHECK(LinesStartingWith(out, "predicted step (lower bound").size() == 1);
}

TEST_CASE("slide_train: --dry-run prints the plan and trains nothing", "[llama][slide_train]") {
  TempDir dir;
  std::string out;
  const SlideTrainSummary tiny =
      Train(Small({"--dry-run", "--steps", "3", "--json", dir.File("j"), "--trace", dir.File("t")}),
            &out);
  CHECK(tiny.losses.empty());
  CheckPlanPrinted(out, "cpu");
  CheckTrainedNothing(out);
  CHECK_FALSE(Exists(dir.File("j")));
  CHECK_FALSE(Exists(dir.File("t")));

  // A named 8B shape plans without its 32 GB of fp32 parameters.
  const std::int64_t peak_before = HostPeakBytes();
  const SlideTrainSummary big = Train(
      {"--model", "llama3-8b", "--gpu-memory-budget", "24GiB", "--backend", "cpu", "--dry-run"},
      &out);
  CHECK(big.losses.empty());
  CheckPlanPrinted(out, "cpu");
  CheckTrainedNothing(out);
  CHECK(Contains(out, "model llama3-8b (llama): 8.03B parameters, 32 layers"));
  CHECK(Contains(out, "plan (budget 24.00 GiB, cpu backend)"));
  CHECK(HostPeakBytes() - peak_before < (std::int64_t{2} << 30));

  // --backend cuda plans the GPU's bf16 run where the build has CUDA, without a GPU.
  Run cuda = RunArgs(
      {"--model", "llama3-8b", "--gpu-memory-budget", "24GiB", "--backend", "cuda", "--dry-run"});
  if (CudaInBuild()) {
    INFO(cuda.summary.status().ToString());
    REQUIRE(cuda.summary.ok());
    CheckPlanPrinted(cuda.out, "cuda");
    CheckTrainedNothing(cuda.out);
  } else {
    CheckError(cuda.summary.status(), absl::StatusCode::kFailedPrecondition, {"no CUDA"});
  }
}

// ---- budgets ------------------------------------------------------------------------------

TEST_CASE("slide_train: a budget below one layer fails before training, naming the minimum",
          "[llama][slide_train]") {
  TempDir dir;
  const Run small = RunArgs(Small({"--gpu-memory-budget", "1KiB", "--steps", "3", "--save",
                                   dir.File("out"), "--json", dir.File("j")}));
  CheckError(small.summary.status(), absl::StatusCode::kResourceExhausted,
             {"budget of 1024 bytes", "the minimum, with one slot, is "});
  CheckTrainedNothing(small.out);
  CHECK(dir.Entries().empty());
  // The dry run refuses it too.
  CheckError(RunArgs(Small({"--gpu-memory-budget", "1KiB", "--dry-run"})).summary.status(),
             absl::StatusCode::kResourceExhausted, {"the minimum, with one slot, is "});

  // The minimum stated is exact: it trains with one slot, a byte less does not plan.
  const std::string message(small.summary.status().message());
  std::smatch m;
  REQUIRE(std::regex_search(message, m, std::regex("the minimum, with one slot, is (\\d+) bytes")));
  std::int64_t minimum = 0;
  REQUIRE(absl::SimpleAtoi(m[1].str(), &minimum));
  REQUIRE(minimum > 1024);
  const SlideTrainSummary at_minimum = Train(
      Small({"--gpu-memory-budget", std::to_string(minimum), "--slots", "1", "--steps", "1"}));
  CHECK(at_minimum.losses.size() == 1);
  CheckError(RunArgs(Small({"--gpu-memory-budget", std::to_string(minimum - 1), "--slots", "1",
                            "--dry-run"}))
                 .summary.status(),
             absl::StatusCode::kResourceExhausted, {"the minimum, with one slot, is "});
}

TEST_CASE("slide_train: --resident indices outside the model are refused before training",
          "[llama][slide_train]") {
  // The tiny model has 6 units: the embedding, 4 layers, the head.
  const Run run =
      RunArgs(Small({"--resident", "0,6", "--gpu-memory-budget", "64MiB", "--steps", "1"}));
  CheckError(run.summary.status(), absl::StatusCode::kInvalidArgument,
             {"--resident", "[0, 6)", "'0,6'"});
  CheckTrainedNothing(run.out);
  std::string out;
  CHECK(Train(Small({"--resident", "0,5", "--gpu-memory-budget", "64MiB", "--steps", "1"}), &out)
            .losses.size() == 1);
  CHECK(LinesStartingWith(out, "placement: 4 sliding, 2 resident").size() == 1);
}

// ---- --save and --load --------------------------------------------------------------------

TEST_CASE("slide_train: --load of a --save checkpoint continues from the trained weights",
          "[llama][slide_train]") {
  TempDir dir;
  // One window of data (seq + 1 tokens) makes every step's batch the same, and a constant
  // learning rate makes a 2-step run the first 2 steps of a 3-step one: the 3rd step's loss
  // is the loss of the weights after 2 steps, which a run loading them must reproduce.
  const std::vector<std::uint32_t> corpus = SyntheticTokens();
  WriteU16Tokens(dir.File("window.bin"),
                 std::vector<std::uint32_t>(corpus.begin() + 1000, corpus.begin() + 1033));
  const Args common = Small({"--data", dir.File("window.bin"), "--data-format", "u16", "--lr",
                             "1e-2", "--min-lr", "1e-2"});
  auto with = [&](Args more) {
    Args args = common;
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };

  const SlideTrainSummary three = Train(with({"--steps", "3"}));
  REQUIRE(three.losses.size() == 3);
  CHECK(three.losses[2] < three.losses[0]);  // the weights moved
  std::string out;
  const SlideTrainSummary two =
      Train(with({"--steps", "2", "--save", dir.File("fp32"), "--save-dtype", "fp32"}), &out);
  CHECK(two.losses == std::vector<double>(three.losses.begin(), three.losses.begin() + 2));
  CHECK(LinesStartingWith(out, "saved " + dir.File("fp32") + " (fp32)").size() == 1);
  CHECK(testing::TempDir::ListDir(dir.File("fp32")) ==
        std::vector<std::string>{"config.json", "model.safetensors"});

  // --load DIR alone takes DIR/config.json (the tiny shape) and the weights, bit for bit.
  auto load = [&](const std::string& checkpoint) -> Args {
    // clang-format off
    return {"--backend", "cpu", "--seq", "32", "--data", dir.File("window.bin"),
            "--data-format", "u16", "--load", checkpoint, "--steps", "1"};
    // clang-format on
  };
  const SlideTrainSummary loaded = Train(load(dir.File("fp32")), &out);
  REQUIRE(loaded.losses.size() == 1);
  CHECK(loaded.losses[0] == three.losses[2]);
  CHECK(Contains(out, "model config.json (llama): "));
  CHECK(LinesStartingWith(out, "setup: loaded " + dir.File("fp32")).size() == 1);
  CHECK(LinesStartingWith(out, "setup: random init").empty());

  // bf16 (the default) rounds the weights: close to, not necessarily at, the fp32 loss.
  Train(with({"--steps", "2", "--save", dir.File("bf16")}));
  const SlideTrainSummary rounded = Train(load(dir.File("bf16")));
  CHECK(rounded.losses[0] == Catch::Approx(three.losses[2]).epsilon(0.01));
}

TEST_CASE("slide_train: --load errors name the path or the tensor and write nothing",
          "[llama][slide_train]") {
  TempDir dir;
  Train(Small({"--steps", "1", "--save", dir.File("tiny")}));
  const std::string out_dir = dir.File("out");
  const std::string json = dir.File("j");

  const Run missing =
      RunArgs(Small({"--load", dir.File("missing"), "--save", out_dir, "--json", json}));
  CheckError(missing.summary.status(), absl::StatusCode::kNotFound, {dir.File("missing")});
  CHECK(missing.out.empty());

  // A checkpoint of another shape: the tiny one's embedding is [256, 64].
  const Run other = RunArgs({"--backend", "cpu", "--seq", "32", "--model", "llama3.2-1b", "--load",
                             dir.File("tiny"), "--save", out_dir, "--json", json});
  CheckError(other.summary.status(), absl::StatusCode::kInvalidArgument,
             {"tensor 'model.embed_tokens.weight'", dir.File("tiny") + "/model.safetensors",
              "[256, 64]", "llama3.2-1b"});
  CHECK(other.out.empty());

  // A directory without a checkpoint.
  std::filesystem::create_directory(dir.File("empty"));
  const Run empty = RunArgs(Small({"--load", dir.File("empty")}));
  CheckError(empty.summary.status(), absl::StatusCode::kNotFound,
             {dir.File("empty"), "model.safetensors"});

  CHECK(dir.Entries() == std::vector<std::string>{"empty", "tiny"});
}

TEST_CASE("slide_train: a --save destination that cannot be written fails before training",
          "[llama][slide_train]") {
  TempDir dir;
  WriteBytes(dir.File("file"), "not a directory");
  // Under a regular file, so no one (root included) can create it.
  const Run under_file = RunArgs(Small({"--steps", "2", "--save", dir.File("file/ckpt")}));
  CheckError(under_file.summary.status(), absl::StatusCode::kFailedPrecondition,
             {"--save", dir.File("file/ckpt")});
  CheckTrainedNothing(under_file.out);
  // The file itself, and a directory with something in it.
  CheckError(RunArgs(Small({"--steps", "2", "--save", dir.File("file")})).summary.status(),
             absl::StatusCode::kFailedPrecondition, {"--save", "not a directory"});
  std::filesystem::create_directory(dir.File("full"));
  WriteBytes(dir.File("full/keep"), "x");
  const Run full = RunArgs(Small({"--steps", "2", "--save", dir.File("full") + "/"}));
  CheckError(full.summary.status(), absl::StatusCode::kFailedPrecondition, {"--save", "not empty"});
  CheckTrainedNothing(full.out);
  CHECK(testing::TempDir::ListDir(dir.File("full")) == std::vector<std::string>{"keep"});
  CHECK(dir.Entries() == std::vector<std::string>{"file", "full"});
  // An empty directory is a valid destination.
  std::filesystem::create_directory(dir.File("empty"));
  Train(Small({"--steps", "1", "--save", dir.File("empty")}));
  CHECK(testing::TempDir::ListDir(dir.File("empty")) ==
        std::vector<std::string>{"config.json", "model.safetensors"});
}

// ---- --data -------------------------------------------------------------------------------

TEST_CASE("slide_train: --data reads a uint16 token file; bad data fails before training",
          "[llama][slide_train]") {
  TempDir dir;
  // The embedded corpus as a token file trains exactly as the embedded corpus.
  const std::vector<std::uint32_t> corpus = SyntheticTokens();
  REQUIRE(corpus.size() == 65536);
  WriteU16Tokens(dir.File("corpus.bin"), corpus);
  std::string out;
  const SlideTrainSummary from_file = Train(
      Small({"--steps", "2", "--data", dir.File("corpus.bin"), "--data-format", "u16"}), &out);
  CHECK(Contains(out, "data " + dir.File("corpus.bin") + ": 65536 tokens;"));
  CHECK(from_file.losses == Train(Small({"--steps", "2"})).losses);
  // Read as bytes it is other data (131072 tokens, every other one 0).
  const SlideTrainSummary as_bytes = Train(
      Small({"--steps", "2", "--data", dir.File("corpus.bin"), "--data-format", "bytes"}), &out);
  CHECK(Contains(out, ": 131072 tokens;"));
  CHECK(as_bytes.losses != from_file.losses);

  const Run missing = RunArgs(Small({"--data", dir.File("missing.bin")}));
  CheckError(missing.summary.status(), absl::StatusCode::kNotFound,
             {"data file", dir.File("missing.bin")});
  CHECK(missing.out.empty());

  std::vector<std::uint32_t> big_id(100, 7);
  big_id[5] = 300;
  WriteU16Tokens(dir.File("big_id.bin"), big_id);
  const Run too_big = RunArgs(Small({"--data", dir.File("big_id.bin"), "--data-format", "u16"}));
  CheckError(too_big.summary.status(), absl::StatusCode::kInvalidArgument,
             {dir.File("big_id.bin"), "token id 300 at position 5", "vocab_size 256"});
  CHECK(too_big.out.empty());

  WriteU16Tokens(dir.File("short.bin"), std::vector<std::uint32_t>(32, 7));
  const Run short_data = RunArgs(Small({"--data", dir.File("short.bin"), "--data-format", "u16"}));
  CheckError(short_data.summary.status(), absl::StatusCode::kInvalidArgument,
             {dir.File("short.bin"), "has 32 tokens", "needs at least 33"});

  WriteBytes(dir.File("odd.bin"), "abc");
  CheckError(
      RunArgs(Small({"--data", dir.File("odd.bin"), "--data-format", "u16"})).summary.status(),
      absl::StatusCode::kInvalidArgument, {dir.File("odd.bin"), "not a whole number"});
}

TEST_CASE("slide_train: --nvme-checkpoints trains the same losses with the checkpoints on the "
          "drive", "[llama][slide_train]") {
  // A directory under the build tree (not a tmpfs: O_DIRECT), as the NVMe tests use.
  const pipeoffload::testing::TestDir nvme;
  const Args host = Small({"--steps", "3", "--lr", "3e-3", "--microbatches", "2"});
  Args drive = host;
  drive.insert(drive.end(), {"--nvme-dir", nvme.path(), "--nvme-checkpoints", "1"});
  std::string out;
  const SlideTrainSummary on_host = Train(host);
  const SlideTrainSummary on_drive = Train(drive, &out);
  INFO("output:\n" << out);
  CHECK(on_drive.losses == on_host.losses);
  // The tiny model's 3 checkpointed layers, 2 microbatches each, of 1 x 32 x 64 fp32 (8 KiB):
  // 6 records written and read back each step.
  CHECK(LinesStartingWith(out, "nvme: ").size() == 1);
  CHECK(LinesStartingWith(out, "host: ").size() == 1);
  CHECK(Contains(LinesStartingWith(out, "host: ")[0],
                 "checkpoints of 3 units, staged through 4 pinned buffers"));
  const std::vector<std::string> steps = LinesStartingWith(out, "step ");
  REQUIRE(steps.size() == 3);
  for (const std::string& step : steps) CHECK(Contains(step, " | NVMe checkpoints 0.0938 MiB"));
  CHECK(Contains(out, "NVMe: checkpoints: "));
  CHECK(nvme.Entries().empty());  // the files were unlinked
  // The dry run counts the drive in its prediction.
  Args dry = drive;
  dry.push_back("--dry-run");
  Train(dry, &out);
  CHECK(Contains(out, "of state and checkpoints each way"));
  // A directory that is not there fails before training.
  Args missing = host;
  missing.insert(missing.end(), {"--nvme-dir", nvme.path() + "/absent", "--nvme-checkpoints", "1"});
  const Run failed = RunArgs(missing);
  CheckError(failed.summary.status(), absl::StatusCode::kNotFound, {nvme.path() + "/absent"});
  CheckTrainedNothing(failed.out);
}

TEST_CASE("slide_train: a missing --config file is an error naming it", "[llama][slide_train]") {
  TempDir dir;
  const Run config = RunArgs(Small({"--config", dir.File("config.json")}));
  CheckError(config.summary.status(), absl::StatusCode::kNotFound, {dir.File("config.json")});
  CHECK(config.out.empty());
}

}  // namespace
}  // namespace pipeoffload::llama
