// The stash contract of GptStageModel: Forward writes every byte of SavedBytes(chunk, false) and
// nothing beyond; a split Backward writes every byte up to SavedBytes(chunk, true) and nothing
// beyond; Backward works from a copy at another address after the original is poisoned (the
// saved entry is the only state from F to B); misrouted entries and calls give clear errors;
// recompute's retained blocks have the stated sizes, are written whole, and rebuild Forward's
// entry byte for byte.
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "examples/gpt/gpt_stage_model.h"
#include "tests/gpt/grad_check.h"
#include "tests/gpt/test_models.h"
#include "tests/testing/catch.h"

namespace pipeoffload::gpt {
namespace {

constexpr std::size_t kGuardBytes = 256;

std::unique_ptr<GptStageModel> MakeStage(const GptConfig& config, int p, int v, int stage) {
  auto data = std::make_shared<const GptData>(GptData::Synthetic());
  auto model = GptStageModel::Create(config, p, v, stage, data);
  REQUIRE(model.ok());
  return std::move(model).value();
}

bool AllBytesAre(const std::vector<unsigned char>& buffer, std::size_t from, unsigned char value) {
  for (std::size_t i = from; i < buffer.size(); ++i) {
    if (buffer[i] != value) return false;
  }
  return true;
}

// Runs Forward of (mb 1, chunk) into a buffer pre-filled with `fill`. The buffer is a vector of
// bytes with room for the split region and a guard; returned whole.
std::vector<unsigned char> ForwardInto(GptStageModel& model, int chunk, unsigned char fill,
                                       const std::vector<float>& input,
                                       std::vector<float>& output) {
  std::vector<unsigned char> buffer(
      static_cast<std::size_t>(model.SavedBytes(chunk, true)) + kGuardBytes, fill);
  const GptChunk& c = model.chunk(chunk);
  REQUIRE(model
              .Forward(1, chunk, c.is_first() ? nullptr : input.data(),
                       c.is_last() ? nullptr : output.data(), buffer.data())
              .ok());
  return buffer;
}

TEST_CASE("Forward writes exactly SavedBytes(chunk, false) bytes", "[gpt][stash]") {
  const bool tied = GENERATE(false, true);
  const GptConfig config = testing::PipelineConfig(4, tied);
  for (int stage = 0; stage < 2; ++stage) {
    auto model = MakeStage(config, 2, 2, stage);
    model->StartIteration(5);
    const std::vector<float> input = testing::RandomVector(model->BoundaryBytes() / 4, 3, 1.0f);
    std::vector<float> output(static_cast<std::size_t>(model->BoundaryBytes() / 4));
    for (int chunk = 0; chunk < 2; ++chunk) {
      CAPTURE(stage, chunk, tied);
      const std::size_t saved = static_cast<std::size_t>(model->SavedBytes(chunk, false));
      REQUIRE(saved % 4 == 0);
      REQUIRE(model->SavedBytes(chunk, true) > model->SavedBytes(chunk, false));
      const auto zeros = ForwardInto(*model, chunk, 0x00, input, output);
      const auto ones = ForwardInto(*model, chunk, 0xFF, input, output);
      // Whatever the buffer held before, the saved bytes come out the same: all were written.
      CHECK(std::memcmp(zeros.data(), ones.data(), saved) == 0);
      // Nothing past SavedBytes(chunk, false) was touched.
      CHECK(AllBytesAre(zeros, saved, 0x00));
      CHECK(AllBytesAre(ones, saved, 0xFF));
    }
  }
}

TEST_CASE("split Backward fills exactly the weight-gradient region", "[gpt][stash]") {
  const GptConfig config = testing::PipelineConfig(4, false);
  for (int stage = 0; stage < 2; ++stage) {
    auto model = MakeStage(config, 2, 2, stage);
    model->StartIteration(0);
    const std::vector<float> input = testing::RandomVector(model->BoundaryBytes() / 4, 4, 1.0f);
    const std::vector<float> grad_out = testing::RandomVector(model->BoundaryBytes() / 4, 5, 1e-3f);
    std::vector<float> output(input.size()), grad_in_a(input.size()), grad_in_b(input.size());
    for (int chunk = 0; chunk < 2; ++chunk) {
      CAPTURE(stage, chunk);
      const GptChunk& c = model->chunk(chunk);
      const std::size_t forward_bytes = static_cast<std::size_t>(model->SavedBytes(chunk, false));
      const std::size_t split_bytes = static_cast<std::size_t>(model->SavedBytes(chunk, true));
      auto a = ForwardInto(*model, chunk, 0x00, input, output);
      auto b = a;
      std::fill(b.begin() + static_cast<std::ptrdiff_t>(forward_bytes), b.end(), 0xFF);
      const void* go = c.is_last() ? nullptr : grad_out.data();
      REQUIRE(
          model->Backward(1, chunk, go, c.is_first() ? nullptr : grad_in_a.data(), a.data(), false)
              .ok());
      REQUIRE(
          model->Backward(1, chunk, go, c.is_first() ? nullptr : grad_in_b.data(), b.data(), false)
              .ok());
      CHECK(std::memcmp(a.data(), b.data(), split_bytes) == 0);
      CHECK(AllBytesAre(a, split_bytes, 0x00));
      CHECK(AllBytesAre(b, split_bytes, 0xFF));
      CHECK(std::memcmp(grad_in_a.data(), grad_in_b.data(), sizeof(float) * input.size()) == 0);

      // The full backward stays inside SavedBytes(chunk, false).
      auto full = ForwardInto(*model, chunk, 0xAB, input, output);
      REQUIRE(
          model
              ->Backward(1, chunk, go, c.is_first() ? nullptr : grad_in_a.data(), full.data(), true)
              .ok());
      CHECK(AllBytesAre(full, forward_bytes, 0xAB));
    }
  }
}

TEST_CASE("Backward and BackwardWeight work from a moved copy after the original is poisoned",
          "[gpt][stash]") {
  const bool split = GENERATE(false, true);
  CAPTURE(split);
  const GptConfig config = testing::PipelineConfig(3, true);
  // Two identical single-stage models: one keeps its entry in place, one gets moved copies.
  auto in_place = MakeStage(config, 1, 1, 0);
  auto moved = MakeStage(config, 1, 1, 0);
  const std::size_t bytes = static_cast<std::size_t>(in_place->SavedBytes(0, split));
  std::vector<float> fixed(bytes / 4);
  for (auto* model : {in_place.get(), moved.get()}) model->StartIteration(2);
  for (int mb = 0; mb < config.num_microbatches; ++mb) {
    REQUIRE(in_place->Forward(mb, 0, nullptr, nullptr, fixed.data()).ok());
    REQUIRE(in_place->Backward(mb, 0, nullptr, nullptr, fixed.data(), !split).ok());
    if (split) REQUIRE(in_place->BackwardWeight(mb, 0, fixed.data()).ok());

    std::vector<float> original(bytes / 4 + 2);
    REQUIRE(moved->Forward(mb, 0, nullptr, nullptr, original.data()).ok());
    // "Offload": copy to an address shifted by one float, then poison the original with NaN.
    std::vector<float> copy(bytes / 4 + 2);
    std::memcpy(copy.data() + 1, original.data(), bytes);
    std::fill(original.begin(), original.end(), std::numeric_limits<float>::quiet_NaN());
    REQUIRE(moved->Backward(mb, 0, nullptr, nullptr, copy.data() + 1, !split).ok());
    if (split) {
      std::vector<float> copy2(bytes / 4);
      std::memcpy(copy2.data(), copy.data() + 1, bytes);
      std::fill(copy.begin(), copy.end(), std::numeric_limits<float>::quiet_NaN());
      REQUIRE(moved->BackwardWeight(mb, 0, copy2.data()).ok());
    }
  }
  const ParameterBlock& a = in_place->chunk(0).params();
  const ParameterBlock& b = moved->chunk(0).params();
  CHECK(std::memcmp(a.grad(0), b.grad(0), sizeof(float) * a.numel()) == 0);
  bool finite = true;
  for (std::int64_t i = 0; i < b.numel(); ++i) finite = finite && std::isfinite(b.grad(0)[i]);
  CHECK(finite);
}

bool MessageContains(const absl::Status& status, const std::string& text) {
  return std::string(status.message()).find(text) != std::string::npos;
}

TEST_CASE("retained blocks: stated sizes, written whole, rebuilt into Forward's bytes",
          "[gpt][stash][recompute]") {
  const GptConfig config = testing::PipelineConfig(4, false);  // p = 2, v = 2: a layer a chunk
  const std::int64_t n = std::int64_t{config.batch_size} * config.seq_len;
  const std::int64_t nc = n * config.n_embd;
  const std::int64_t att =
      std::int64_t{config.batch_size} * config.n_head * config.seq_len * config.seq_len;
  // One layer's floats: x, ln1 mean/rstd, qkv, att, atty, res2, ln2 mean/rstd, fch (lean keeps
  // all of these; full keeps x alone on a chunk that is not the first).
  const std::int64_t layer_lean = nc + 2 * n + 3 * nc + att + 2 * nc + 2 * n + 4 * nc;
  for (int stage = 0; stage < 2; ++stage) {
    auto model = MakeStage(config, 2, 2, stage);
    const std::vector<float> input = testing::RandomVector(model->BoundaryBytes() / 4, 9, 1.0f);
    for (int chunk = 0; chunk < 2; ++chunk) {
      const GptChunk& c = model->chunk(chunk);
      // Floats beyond the header: first = tokens, last = lnf_in, lnf mean/rstd, probs, targets.
      const std::int64_t want_lean = layer_lean + (c.is_first() ? n : 0) +
                                     (c.is_last() ? nc + 2 * n + n * config.vocab_size + n : 0);
      const std::int64_t want_full = c.is_first() ? n : nc + (c.is_last() ? n : 0);
      for (const Recompute mode : {Recompute::kLean, Recompute::kFull}) {
        CAPTURE(stage, chunk, RecomputeName(mode));
        const std::int64_t retained_bytes = model->RetainedBytes(chunk, mode, true);
        CHECK(retained_bytes == GptStageModel::kSavedHeaderBytes +
                                    4 * (mode == Recompute::kLean ? want_lean : want_full));
        CHECK(retained_bytes == model->RetainedBytes(chunk, mode, false));
        CHECK(retained_bytes < model->SavedBytes(chunk, false));

        model->StartIteration(4);
        std::vector<float> output(input.size());
        const auto want_saved = ForwardInto(*model, chunk, 0x00, input, output);
        const double want_loss = model->losses()[1];
        std::vector<float> retained_output(input.size());
        std::vector<unsigned char> blocks[2];
        const unsigned char fills[2] = {0x00, 0xFF};
        for (int k = 0; k < 2; ++k) {
          blocks[k].assign(static_cast<std::size_t>(retained_bytes) + kGuardBytes, fills[k]);
          model->StartIteration(4);  // losses back to NaN
          REQUIRE(model
                      ->ForwardRetaining(1, chunk, c.is_first() ? nullptr : input.data(),
                                         c.is_last() ? nullptr : retained_output.data(),
                                         blocks[k].data(), mode)
                      .ok());
        }
        // Every retained byte written, nothing past the block; the same output and loss.
        CHECK(std::memcmp(blocks[0].data(), blocks[1].data(), retained_bytes) == 0);
        CHECK(AllBytesAre(blocks[0], static_cast<std::size_t>(retained_bytes), 0x00));
        CHECK(AllBytesAre(blocks[1], static_cast<std::size_t>(retained_bytes), 0xFF));
        if (c.is_last()) {
          CHECK(std::memcmp(&model->losses()[1], &want_loss, sizeof(double)) == 0);
        } else {
          CHECK(std::memcmp(retained_output.data(), output.data(), 4 * output.size()) == 0);
        }

        // Rebuilt into a NaN-filled entry: Forward's bytes, header included; the loss is not
        // recorded again.
        model->StartIteration(4);
        const std::size_t saved_bytes = static_cast<std::size_t>(model->SavedBytes(chunk, false));
        std::vector<float> rebuilt(saved_bytes / 4, std::numeric_limits<float>::quiet_NaN());
        REQUIRE(model->RecomputeSaved(1, chunk, blocks[1].data(), rebuilt.data(), mode).ok());
        CHECK(std::memcmp(rebuilt.data(), want_saved.data(), saved_bytes) == 0);
        CHECK(std::isnan(model->losses()[1]));

        // The other mode, or another microbatch, does not match the block's header.
        const Recompute other = mode == Recompute::kLean ? Recompute::kFull : Recompute::kLean;
        absl::Status s = model->RecomputeSaved(1, chunk, blocks[1].data(), rebuilt.data(), other);
        CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
        CHECK(MessageContains(s, mode == Recompute::kLean ? "'retained lean', expected 'retained "
                                                            "full'"
                                                          : "'retained full', expected 'retained "
                                                            "lean'"));
        s = model->RecomputeSaved(0, chunk, blocks[1].data(), rebuilt.data(), mode);
        CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
        CHECK(MessageContains(s, "belongs to mb 1"));
        // A retained block is not a saved entry.
        s = model->Backward(1, chunk, c.is_last() ? nullptr : input.data(),
                            c.is_first() ? nullptr : output.data(), blocks[1].data(), true);
        CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
      }
    }
    CHECK(model->RetainedBytes(0, Recompute::kNone, false) == -1);
    CHECK(model->RetainedBytes(2, Recompute::kFull, false) == -1);
    std::vector<float> block(static_cast<std::size_t>(model->SavedBytes(0, false) / 4));
    const absl::Status s = model->ForwardRetaining(0, 0, stage == 0 ? nullptr : input.data(),
                                                   block.data(), block.data(), Recompute::kNone);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(MessageContains(s, "mode is none"));
  }
}

TEST_CASE("misrouted stash entries and bad calls give clear errors", "[gpt][stash]") {
  const GptConfig config = testing::PipelineConfig(4, true);
  auto model = MakeStage(config, 2, 2, 1);  // chunks = virtual stages 1 and 3 (the last)
  std::vector<float> saved(static_cast<std::size_t>(model->SavedBytes(1, true) / 4));
  std::vector<float> boundary(static_cast<std::size_t>(model->BoundaryBytes() / 4), 0.5f);
  std::vector<float> grad(boundary.size());

  absl::Status s = model->Forward(0, 1, boundary.data(), nullptr, saved.data());
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(MessageContains(s, "StartIteration"));
  model->StartIteration(0);

  s = model->Forward(0, 2, boundary.data(), nullptr, saved.data());
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(MessageContains(s, "chunk 2"));
  CHECK(model->SavedBytes(2, false) == 0);
  s = model->Forward(config.num_microbatches, 1, boundary.data(), nullptr, saved.data());
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(MessageContains(s, "mb 3"));
  s = model->Forward(0, 1, nullptr, nullptr, saved.data());
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(MessageContains(s, "input is null"));
  s = model->Forward(0, 0, boundary.data(), nullptr, saved.data());
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(MessageContains(s, "output is null"));
  s = model->Forward(0, 1, boundary.data(), nullptr,
                     reinterpret_cast<unsigned char*>(saved.data()) + 1);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(MessageContains(s, "aligned"));

  // Backward before any Forward wrote the entry.
  std::fill(saved.begin(), saved.end(), 0.0f);
  s = model->Backward(0, 1, nullptr, grad.data(), saved.data(), true);
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(MessageContains(s, "not written by Forward"));

  REQUIRE(model->Forward(0, 1, boundary.data(), nullptr, saved.data()).ok());
  // W before B; B of another microbatch; B on the wrong chunk.
  s = model->BackwardWeight(0, 1, saved.data());
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(MessageContains(s, "expected 'awaiting weight grad'"));
  s = model->Backward(1, 1, nullptr, grad.data(), saved.data(), true);
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(MessageContains(s, "belongs to mb 0"));
  s = model->Backward(0, 0, boundary.data(), grad.data(), saved.data(), true);
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  s = model->Backward(0, 1, nullptr, nullptr, saved.data(), true);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(MessageContains(s, "grad_input is null"));
  // B split, then W, then a second W or B is refused.
  REQUIRE(model->Backward(0, 1, nullptr, grad.data(), saved.data(), false).ok());
  s = model->Backward(0, 1, nullptr, grad.data(), saved.data(), false);
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(model->BackwardWeight(0, 1, saved.data()).ok());
  s = model->BackwardWeight(0, 1, saved.data());
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(MessageContains(s, "'consumed'"));
  // An entry from a previous iteration.
  REQUIRE(model->Forward(0, 1, boundary.data(), nullptr, saved.data()).ok());
  model->StartIteration(1);
  s = model->Backward(0, 1, nullptr, grad.data(), saved.data(), true);
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(MessageContains(s, "step 0"));

  // Tied embeddings on a split model: the step needs the peer's part first.
  REQUIRE(model->NeedsTiedGradExchange());
  s = model->OptimizerStep();
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(MessageContains(s, "SetPeerTiedGradPart"));
  s = model->SetPeerTiedGradPart(grad.data(), 3);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipeoffload::gpt
