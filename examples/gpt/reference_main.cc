// gpt_reference: trains the GPT example in one process, no pipeline (the oracle every pipelined
// run is compared against bitwise). Prints the per-step loss at full float precision and, at the
// end, the parameter checksum. `gpt_reference --help` lists the flags.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>

#include "examples/gpt/gpt_config.h"
#include "examples/gpt/gpt_data.h"
#include "examples/gpt/reference_trainer.h"

namespace {

using pipeoffload::gpt::GptConfig;
using pipeoffload::gpt::GptData;
using pipeoffload::gpt::ReferenceTrainer;

struct Flags {
  GptConfig config;
  std::int64_t steps = 200;
  std::string data_path;
};

void PrintHelp(const Flags& d) {
  std::printf(
      "usage: gpt_reference [flags]\n"
      "Trains the example GPT single-process on the CPU (fp32) and prints the loss per step and\n"
      "the final parameter checksum (equal, bit for bit, to any pipelined run of the same flags).\n"
      "\n"
      "  --steps N          training steps (default %" PRId64
      ")\n"
      "  --seed S           seed for parameter init and microbatch sampling (default %" PRIu64
      ")\n"
      "  --data FILE        train on FILE's bytes instead of the embedded synthetic corpus\n"
      "  --layers N         transformer blocks (default %d)\n"
      "  --embd C           channels (default %d)\n"
      "  --heads H          attention heads, divides C (default %d)\n"
      "  --seq-len T        tokens per sequence (default %d)\n"
      "  --batch B          sequences per microbatch (default %d)\n"
      "  --microbatches M   microbatches per step (default %d)\n"
      "  --vocab V          vocabulary size; byte data needs 256 (default %d)\n"
      "  --lr X             AdamW learning rate (default %g)\n"
      "  --weight-decay X   AdamW decoupled weight decay on matrices (default %g)\n"
      "  --tied             tie the LM head to the token embedding\n"
      "  --help             this text\n",
      d.steps, d.config.seed, d.config.n_layer, d.config.n_embd, d.config.n_head, d.config.seq_len,
      d.config.batch_size, d.config.num_microbatches, d.config.vocab_size,
      static_cast<double>(d.config.optimizer.learning_rate),
      static_cast<double>(d.config.optimizer.weight_decay));
}

[[noreturn]] void Fail(const std::string& message) {
  std::fprintf(stderr, "gpt_reference: %s (see --help)\n", message.c_str());
  std::exit(2);
}

std::int64_t ParseInt(std::string_view flag, const char* text, std::int64_t lo, std::int64_t hi) {
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value < lo || value > hi) {
    Fail(std::string(flag) + " expects an integer in [" + std::to_string(lo) + ", " +
         std::to_string(hi) + "], got '" + text + "'");
  }
  return value;
}

float ParseFloat(std::string_view flag, const char* text) {
  char* end = nullptr;
  errno = 0;
  const float value = std::strtof(text, &end);
  if (errno != 0 || end == text || *end != '\0') {
    Fail(std::string(flag) + " expects a number, got '" + text + "'");
  }
  return value;
}

Flags ParseFlags(int argc, char** argv) {
  Flags flags;
  GptConfig& c = flags.config;
  constexpr std::int64_t kIntMax = 1 << 30;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      PrintHelp(flags);
      std::exit(0);
    }
    if (flag == "--tied") {
      c.tied_embeddings = true;
      continue;
    }
    static constexpr std::string_view kValueFlags[] = {
        "--steps",   "--seed",  "--data",         "--layers", "--embd",         "--heads",
        "--seq-len", "--batch", "--microbatches", "--vocab",  "--weight-decay", "--lr"};
    if (std::find(std::begin(kValueFlags), std::end(kValueFlags), flag) == std::end(kValueFlags)) {
      Fail("unknown flag: " + std::string(flag));
    }
    if (i + 1 >= argc) Fail(std::string(flag) + " needs a value");
    const char* value = argv[++i];
    if (flag == "--steps") {
      flags.steps = ParseInt(flag, value, 0, kIntMax);
    } else if (flag == "--seed") {
      c.seed = static_cast<std::uint64_t>(ParseInt(flag, value, 0, INT64_MAX));
    } else if (flag == "--data") {
      flags.data_path = value;
    } else if (flag == "--layers") {
      c.n_layer = static_cast<int>(ParseInt(flag, value, 1, kIntMax));
    } else if (flag == "--embd") {
      c.n_embd = static_cast<int>(ParseInt(flag, value, 1, kIntMax));
    } else if (flag == "--heads") {
      c.n_head = static_cast<int>(ParseInt(flag, value, 1, kIntMax));
    } else if (flag == "--seq-len") {
      c.seq_len = static_cast<int>(ParseInt(flag, value, 1, kIntMax));
    } else if (flag == "--batch") {
      c.batch_size = static_cast<int>(ParseInt(flag, value, 1, kIntMax));
    } else if (flag == "--microbatches") {
      c.num_microbatches = static_cast<int>(ParseInt(flag, value, 1, kIntMax));
    } else if (flag == "--vocab") {
      c.vocab_size = static_cast<int>(ParseInt(flag, value, 2, kIntMax));
    } else if (flag == "--lr") {
      c.optimizer.learning_rate = ParseFloat(flag, value);
    } else if (flag == "--weight-decay") {
      c.optimizer.weight_decay = ParseFloat(flag, value);
    } else {
      Fail("unknown flag: " + std::string(flag));
    }
  }
  return flags;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  std::shared_ptr<const GptData> data;
  if (flags.data_path.empty()) {
    data = std::make_shared<const GptData>(GptData::Synthetic());
  } else {
    absl::StatusOr<GptData> loaded = GptData::FromFile(flags.data_path);
    if (!loaded.ok()) Fail(std::string(loaded.status().message()));
    data = std::make_shared<const GptData>(std::move(loaded).value());
  }
  absl::StatusOr<std::unique_ptr<ReferenceTrainer>> trainer =
      ReferenceTrainer::Create(flags.config, data);
  if (!trainer.ok()) Fail(std::string(trainer.status().message()));

  const GptConfig& c = flags.config;
  std::printf("data: %s, %" PRId64 " bytes, unigram entropy %.4f nats (%.4f bits) per token\n",
              data->name().c_str(), data->size(), data->UnigramEntropyNats(),
              data->UnigramEntropyBits());
  std::printf(
      "model: %d layers, C %d, %d heads, T %d, V %d, %s head; B %d x m %d per step, "
      "seed %" PRIu64 "\n",
      c.n_layer, c.n_embd, c.n_head, c.seq_len, c.vocab_size, c.tied_embeddings ? "tied" : "untied",
      c.batch_size, c.num_microbatches, c.seed);
  for (std::int64_t step = 0; step < flags.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<std::vector<double>> losses = (*trainer)->TrainStep();
    if (!losses.ok()) Fail(std::string(losses.status().message()));
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    double mean = 0.0;
    for (double loss : *losses) mean += loss;
    mean /= static_cast<double>(losses->size());
    std::printf("step %" PRId64 " loss %.9g time %.1f ms\n", step, mean, ms);
  }
  absl::StatusOr<std::uint64_t> checksum = (*trainer)->Checksum();
  if (!checksum.ok()) Fail(std::string(checksum.status().message()));
  std::printf("checksum %016" PRIx64 "\n", *checksum);
  return 0;
}
