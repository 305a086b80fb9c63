// LayerSlidingEngineImpl, part 1: creation (plan, program, every buffer and event once),
// parameter and optimizer-state access between steps. Invariants: engine_impl.h.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/check.h"
#include "lib/base/host_memory_info.h"
#include "lib/base/status_macros.h"
#include "lib/slide/engine_impl.h"

namespace pipeoffload {

absl::StatusOr<std::unique_ptr<LayerSlidingEngine>> LayerSlidingEngine::Create(
    Backend& backend, SlidingModel& model, const SlidingOptions& options) {
  return internal::LayerSlidingEngineImpl::Create(backend, model, options);
}

namespace internal {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Runs of equal weight decay covering [0, count).
std::vector<std::pair<ParamRange, bool>> DecayRuns(const SlidingUnitShape& unit) {
  std::vector<std::pair<ParamRange, bool>> runs;
  std::int64_t at = 0;
  for (const ParamRange& range : unit.decay) {
    if (range.offset > at) runs.push_back({{at, range.offset - at}, false});
    runs.push_back({range, true});
    at = range.offset + range.count;
  }
  if (at < unit.param_count) runs.push_back({{at, unit.param_count - at}, false});
  return runs;
}

// element(i) for i in [0, count) on a few threads (Set/GetUnitParams of an 8B model split or
// join 8e9 masters).
template <typename Element>
void ForEachElement(std::int64_t count, const Element& element) {
  const int threads = static_cast<int>(std::clamp<std::int64_t>(count >> 22, 1, 8));
  std::vector<std::thread> pool;
  const std::int64_t per = (count + threads - 1) / threads;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([=, &element] {
      const std::int64_t begin = t * per;
      const std::int64_t end = std::min(count, begin + per);
      for (std::int64_t i = begin; i < end; ++i) element(i);
    });
  }
  for (std::thread& thread : pool) thread.join();
}

// values -> split masters (hi, lo), and back.
void SplitMasters(std::span<const float> values, std::uint16_t* hi, std::uint16_t* lo) {
  ForEachElement(static_cast<std::int64_t>(values.size()), [&](std::int64_t i) {
    const SplitBf16 split = SplitMaster(values[static_cast<std::size_t>(i)]);
    hi[i] = split.hi;
    lo[i] = split.lo;
  });
}
void JoinMasters(const std::uint16_t* hi, const std::uint16_t* lo, std::span<float> values) {
  ForEachElement(static_cast<std::int64_t>(values.size()), [&](std::int64_t i) {
    values[static_cast<std::size_t>(i)] = JoinSplitMaster(hi[i], lo[i]);
  });
}

}  // namespace

LayerSlidingEngineImpl::LayerSlidingEngineImpl(Backend& backend, SlidingModel& model,
                                               const SlidingOptions& options,
                                               SlidingModelShape shape, SlidingPlan plan,
                                               SlideProgram program)
    : backend_(backend),
      model_(model),
      options_(options),
      shape_(std::move(shape)),
      plan_(std::move(plan)),
      program_(std::move(program)),
      num_units_(static_cast<int>(shape_.units.size())),
      M_(options.num_microbatches),
      dtype_bytes_(SlideDtypeBytes(shape_.param_dtype)),
      resident_updates_(shape_.units.size(), 0) {}

LayerSlidingEngineImpl::~LayerSlidingEngineImpl() {
  worker_.reset();  // joins the update thread before the state it reads goes away
  // Copies may still read buffers after an error; let them finish before freeing anything.
  backend_.Synchronize(options_.timeout_seconds).IgnoreError();
  for (const Event& event : events_) backend_.DestroyEvent(event);
}

absl::StatusOr<std::unique_ptr<LayerSlidingEngine>> LayerSlidingEngineImpl::Create(
    Backend& backend, SlidingModel& model, const SlidingOptions& options) {
  const double start = Now();
  const SlidingModelShape& shape = model.Shape();
  PO_ASSIGN_OR_RETURN(SlidingPlan plan, PlanSliding(shape, options));
  // The CPU backend runs compute on the caller's thread: an upload must be enqueued before the
  // compute it should overlap. On a device, enqueue it after the compute work ahead of it, so a
  // host wait for the previous step's update never holds back work the device could run.
  const bool synchronous = backend.DeviceMemoryIsHostAccessible();
  const int slots = static_cast<int>(plan.slot_elements.size());
  SlideProgramOptions program_options;
  program_options.num_microbatches = options.num_microbatches;
  program_options.upload_distance = std::max(0, synchronous ? slots - 1 : slots - 2);
  program_options.grads_out_distance = (synchronous || slots < 2) ? 1 : 2;
  program_options.defer_updates =
      options.max_grad_norm > 0.0 || options.update_timing == UpdateTiming::kAfterBackward;
  PO_ASSIGN_OR_RETURN(SlideProgram program, BuildSlideProgram(shape, plan, program_options));
  PO_RETURN_IF_ERROR(CheckSlideProgram(shape, plan, options.num_microbatches, program));

  std::unique_ptr<LayerSlidingEngineImpl> engine(new LayerSlidingEngineImpl(
      backend, model, options, shape, std::move(plan), std::move(program)));
  engine->compute_synchronous_ = synchronous;
  PO_ASSIGN_OR_RETURN(engine->device_ops_, CreateSlideDeviceOps(backend, shape.param_dtype));
  PO_RETURN_IF_ERROR(engine->AllocateDevice());
  PO_RETURN_IF_ERROR(engine->AllocateHost());
  PO_RETURN_IF_ERROR(engine->CreateEvents());
  PO_ASSIGN_OR_RETURN(engine->cpu_adam_, CpuAdam::Create(options.cpu));
  engine->recorder_ = std::make_unique<SlideRecorder>(backend, options.record_trace);
  if (std::count(engine->plan_.nvme.begin(), engine->plan_.nvme.end(), true) > 0) {
    std::vector<std::int64_t> counts(shape.units.size(), 0);
    for (std::size_t u = 0; u < shape.units.size(); ++u) {
      if (engine->plan_.nvme[u]) counts[u] = shape.units[u].param_count;
    }
    PO_ASSIGN_OR_RETURN(engine->nvme_,
                        NvmeTier::Create(backend, options.nvme_dir, counts,
                                         engine->program_.grads_out_order,
                                         /*with_master_lo=*/shape.param_dtype != SlideDtype::kFp32,
                                         options.timeout_seconds, *engine->recorder_));
    engine->setup_.nvme = engine->nvme_->Describe();
    engine->setup_.pinned_bytes += engine->nvme_->staging_bytes();
  }
  PO_RETURN_IF_ERROR(engine->CreateCheckpointTier());
  const int landing = static_cast<int>(engine->landing_.size());
  engine->worker_ = std::make_unique<UpdateWorker>(
      backend, *engine->cpu_adam_, shape.param_dtype, engine->host_, landing,
      options.timeout_seconds, engine->nvme_.get(), *engine->recorder_);
  engine->setup_.seconds = Now() - start;
  return std::unique_ptr<LayerSlidingEngine>(std::move(engine));
}

absl::Status LayerSlidingEngineImpl::AllocateDevice() {
  const std::int64_t arena_bytes = plan_.device_total_bytes - plan_.device_model_bytes;
  DeviceArenaOptions arena_options;
  arena_options.budget_bytes = arena_bytes;
  arena_options.poison_on_free = false;  // nothing is freed before teardown
  PO_ASSIGN_OR_RETURN(arena_, DeviceArena::Create(backend_, arena_options));
  setup_.device_bytes = arena_bytes;
  auto take = [&](std::int64_t bytes) -> absl::StatusOr<void*> {
    return arena_->Allocate(std::max<std::int64_t>(bytes, 4), MemoryCategory::kOther);
  };
  for (std::int64_t capacity : plan_.slot_elements) {
    Slot slot;
    slot.capacity = capacity;
    PO_ASSIGN_OR_RETURN(slot.params, take(capacity * dtype_bytes_));
    PO_ASSIGN_OR_RETURN(slot.grads, take(capacity * dtype_bytes_));
    slots_.push_back(slot);
  }
  for (int a = 0; a < 2; ++a) {
    for (int mb = 0; mb < M_; ++mb) {
      PO_ASSIGN_OR_RETURN(void* act, take(shape_.activation_bytes));
      PO_ASSIGN_OR_RETURN(void* grad, take(shape_.activation_bytes));
      act_[a].push_back(act);
      grad_[a].push_back(grad);
    }
  }
  std::int64_t largest_view = 0, largest_own = 0, largest_workspace = 0;
  for (int u = 0; u < num_units_; ++u) {
    const int owner = Borrowed(u);
    largest_view = std::max(largest_view, Own(u) + (owner >= 0 ? Own(owner) : 0));
    largest_own = std::max(largest_own, Own(u));
    largest_workspace = std::max(largest_workspace, shape_.units[static_cast<std::size_t>(u)].workspace_bytes);
  }
  PO_ASSIGN_OR_RETURN(void* accum, take(largest_view * 4));
  accum_ = static_cast<float*>(accum);
  PO_ASSIGN_OR_RETURN(workspace_, take(largest_workspace));
  PO_ASSIGN_OR_RETURN(void* sums, take(8 * static_cast<std::int64_t>(num_units_)));
  sums_ = static_cast<double*>(sums);
  PO_ASSIGN_OR_RETURN(void* partials, take(8 * SlideDeviceOps::PartialsFor(largest_own)));
  partials_ = static_cast<double*>(partials);

  resident_.resize(static_cast<std::size_t>(num_units_));
  // Owners first, so a borrower can take its block with the owner's parameters inside.
  for (int u = 0; u < num_units_; ++u) {
    if (IsSliding(u)) continue;
    Resident& r = resident_[static_cast<std::size_t>(u)];
    const std::int64_t n = Own(u);
    PO_ASSIGN_OR_RETURN(r.grads, take(n * dtype_bytes_));
    PO_ASSIGN_OR_RETURN(void* m, take(n * 4));
    PO_ASSIGN_OR_RETURN(void* v, take(n * 4));
    r.exp_avg = static_cast<float*>(m);
    r.exp_avg_sq = static_cast<float*>(v);
    if (shape_.param_dtype != SlideDtype::kFp32) {
      PO_ASSIGN_OR_RETURN(void* master_lo, take(n * 2));
      r.master_lo = static_cast<std::uint16_t*>(master_lo);
    }
  }
  // Parameter blocks: a resident borrower's holds its own parameters then its owner's.
  auto owned_by_borrower = [&](int u) {
    for (int b = 0; b < num_units_; ++b) {
      if (Borrowed(b) == u && !IsSliding(b)) return true;
    }
    return false;
  };
  for (int u = 0; u < num_units_; ++u) {
    if (IsSliding(u) || owned_by_borrower(u)) continue;
    const int owner = Borrowed(u);
    const std::int64_t n = Own(u) + (owner >= 0 ? Own(owner) : 0);
    PO_ASSIGN_OR_RETURN(void* block, take(n * dtype_bytes_));
    resident_[static_cast<std::size_t>(u)].params = block;
    if (owner >= 0) {
      resident_[static_cast<std::size_t>(owner)].params =
          static_cast<std::byte*>(block) + Own(u) * dtype_bytes_;
    }
  }
  // Device memory starts as garbage: zero what must start at zero (m, v, masters, parameters).
  const Queue compute = backend_.queue(QueueKind::kCompute);
  for (int u = 0; u < num_units_; ++u) {
    if (IsSliding(u)) continue;
    const Resident& r = resident_[static_cast<std::size_t>(u)];
    const std::int64_t n = Own(u);
    PO_RETURN_IF_ERROR(backend_.FillAsync(compute, r.exp_avg, 0, n * 4));
    PO_RETURN_IF_ERROR(backend_.FillAsync(compute, r.exp_avg_sq, 0, n * 4));
    // Whole 4-byte words (FillAsync's unit): the arena's blocks are 256-byte aligned.
    PO_RETURN_IF_ERROR(backend_.FillAsync(compute, r.params, 0, (n * dtype_bytes_ + 3) / 4 * 4));
    if (r.master_lo != nullptr) {
      PO_RETURN_IF_ERROR(backend_.FillAsync(compute, r.master_lo, 0, (n * 2 + 3) / 4 * 4));
    }
  }
  return backend_.Synchronize(options_.timeout_seconds);
}

absl::Status LayerSlidingEngineImpl::AllocateHost() {
  // Sizes first, so one block per purpose is allocated and the host check sees the total.
  const bool fp32 = shape_.param_dtype == SlideDtype::kFp32;
  const bool park = plan_.landing_buffers == 0;
  std::int64_t pageable = 0, upload = 0, grads = 0, largest_sliding = 0;
  for (int u = 0; u < num_units_; ++u) {
    if (!IsSliding(u)) continue;
    const std::int64_t n = Own(u);
    largest_sliding = std::max(largest_sliding, n);
    // m, v and (bf16) the masters' low halves, unless on NVMe; the high halves are the upload.
    if (!plan_.nvme[static_cast<std::size_t>(u)]) {
      pageable += 2 * CarvedBytes(4 * n) + (fp32 ? 0 : CarvedBytes(2 * n));
    }
    upload += CarvedBytes(fp32 ? 4 * n : dtype_bytes_ * n);
    if (park) grads += CarvedBytes(dtype_bytes_ * n);
  }
  if (!park) grads = plan_.landing_buffers * CarvedBytes(dtype_bytes_ * largest_sliding);
  std::int64_t checkpoint_bytes = 0;
  for (int u = 0; u < num_units_; ++u) {
    if (IsCheckpointed(u, num_units_) && !CheckpointOnNvme(u)) {
      checkpoint_bytes += M_ * CarvedBytes(shape_.activation_bytes);
    }
  }
  std::int64_t side_elements = 0;
  for (int u = 0; u < num_units_; ++u) {
    if (Borrowed(u) >= 0) side_elements = std::max(side_elements, Own(Borrowed(u)));
  }
  const std::int64_t side = side_elements > 0 ? CarvedBytes(4 * side_elements) : 0;
  const std::int64_t small = CarvedBytes(8 * static_cast<std::int64_t>(num_units_));
  const std::int64_t pinned = upload + grads + checkpoint_bytes + side + small;
  const std::int64_t available = AvailableHostMemoryBytes();
  if (available >= 0 && pageable + pinned > available) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "layer sliding: the plan needs %.2f GB of host memory (%.2f GB pageable master / m / v, "
        "%.2f GB pinned), but only %.2f GB are available (MemAvailable); use the NVMe tier "
        "(--nvme-dir, --nvme-fraction), resident units, or a smaller model",
        (pageable + pinned) / 1e9, pageable / 1e9, pinned / 1e9, available / 1e9));
  }
  PO_ASSIGN_OR_RETURN(HostBlock state, HostBlock::Pageable(pageable, "master, m, v"));
  PO_ASSIGN_OR_RETURN(HostBlock uploads, HostBlock::Pinned(backend_, upload, "upload copies"));
  PO_ASSIGN_OR_RETURN(HostBlock grad_block, HostBlock::Pinned(backend_, grads, "gradients"));
  PO_ASSIGN_OR_RETURN(HostBlock ckpt, HostBlock::Pinned(backend_, checkpoint_bytes, "checkpoints"));
  PO_ASSIGN_OR_RETURN(HostBlock misc, HostBlock::Pinned(backend_, side + small, "engine scalars"));

  host_.resize(static_cast<std::size_t>(num_units_));
  parked_.resize(static_cast<std::size_t>(num_units_));
  for (int u = 0; u < num_units_; ++u) {
    UnitHostState& h = host_[static_cast<std::size_t>(u)];
    h.name = shape_.units[static_cast<std::size_t>(u)].name;
    h.count = Own(u);
    h.runs = DecayRuns(shape_.units[static_cast<std::size_t>(u)]);
    if (!IsSliding(u)) continue;
    const std::int64_t n = Own(u);
    h.nvme = plan_.nvme[static_cast<std::size_t>(u)];
    if (fp32) {
      h.master = static_cast<float*>(uploads.Carve(4 * n, ArrayKind::kMaster));
      h.upload = h.master;
    } else {
      if (!h.nvme) h.master_lo = static_cast<std::uint16_t*>(state.Carve(2 * n, ArrayKind::kMaster));
      h.upload = uploads.Carve(dtype_bytes_ * n, ArrayKind::kUpload);
    }
    if (!h.nvme) {
      h.exp_avg = static_cast<float*>(state.Carve(4 * n, ArrayKind::kExpAvg));
      h.exp_avg_sq = static_cast<float*>(state.Carve(4 * n, ArrayKind::kExpAvgSq));
    }
    if (park) parked_[static_cast<std::size_t>(u)].data = grad_block.Carve(dtype_bytes_ * n, ArrayKind::kGrads);
  }
  for (int b = 0; b < plan_.landing_buffers; ++b) {
    GradsHome home;
    home.data = grad_block.Carve(dtype_bytes_ * largest_sliding, ArrayKind::kGrads);
    landing_.push_back(std::move(home));
  }
  checkpoints_.resize(static_cast<std::size_t>(num_units_));
  for (int u = 0; u < num_units_; ++u) {
    if (!IsCheckpointed(u, num_units_) || CheckpointOnNvme(u)) continue;
    for (int mb = 0; mb < M_; ++mb) {
      checkpoints_[static_cast<std::size_t>(u)].push_back(
          ckpt.Carve(shape_.activation_bytes, ArrayKind::kMaster));
    }
  }
  if (side_elements > 0) side_ = static_cast<float*>(misc.Carve(4 * side_elements, ArrayKind::kMaster));
  sums_host_ = static_cast<double*>(misc.Carve(8 * num_units_, ArrayKind::kMaster));
  for (HostBlock* block : {&uploads, &grad_block, &ckpt, &misc}) {
    setup_.pin_seconds += block->allocate_seconds();
    setup_.pinned_bytes += block->bytes();
  }
  setup_.pageable_seconds = state.allocate_seconds();
  setup_.pageable_bytes = state.bytes();
  for (HostBlock* block : {&state, &uploads, &grad_block, &ckpt, &misc}) {
    blocks_.push_back(std::move(*block));
  }
  return absl::OkStatus();
}

absl::Status LayerSlidingEngineImpl::CreateCheckpointTier() {
  CheckpointTierOptions tier;
  for (const SlideOp& op : program_.ops) {
    if (op.kind == SlideOpKind::kLoadCheckpoint && CheckpointOnNvme(op.unit)) {
      tier.load_order.emplace_back(op.unit, op.mb);
    }
  }
  if (tier.load_order.empty()) return absl::OkStatus();
  tier.dir = options_.nvme_dir;
  tier.checkpoint_bytes = shape_.activation_bytes;
  tier.staging_buffers = plan_.checkpoint_staging_buffers;
  tier.timeout_seconds = options_.timeout_seconds;
  for (const SlidingUnitShape& unit : shape_.units) tier.unit_names.push_back(unit.name);
  PO_ASSIGN_OR_RETURN(checkpoint_tier_, CheckpointTier::Create(backend_, tier, *recorder_));
  setup_.pinned_bytes += checkpoint_tier_->staging_bytes();
  const std::string line = absl::StrCat("checkpoints: ", checkpoint_tier_->Describe());
  setup_.nvme = setup_.nvme.empty() ? line : absl::StrCat(setup_.nvme, "; ", line);
  return absl::OkStatus();
}

absl::Status LayerSlidingEngineImpl::CreateEvents() {
  auto make = [&]() -> absl::StatusOr<Event> {
    PO_ASSIGN_OR_RETURN(const Event event, backend_.CreateEvent());
    events_.push_back(event);
    return event;
  };
  for (Slot& slot : slots_) {
    PO_ASSIGN_OR_RETURN(slot.uploaded, make());
    PO_ASSIGN_OR_RETURN(slot.compute_done, make());
    PO_ASSIGN_OR_RETURN(slot.grads_done, make());
  }
  for (int a = 0; a < 2; ++a) {
    for (int mb = 0; mb < M_; ++mb) {
      PO_ASSIGN_OR_RETURN(const Event fwd, make());
      PO_ASSIGN_OR_RETURN(const Event saved, make());
      PO_ASSIGN_OR_RETURN(const Event loaded, make());
      act_fwd_done_[a].push_back(fwd);
      act_saved_[a].push_back(saved);
      act_loaded_[a].push_back(loaded);
    }
    PO_ASSIGN_OR_RETURN(act_reader_done_[a], make());
  }
  PO_ASSIGN_OR_RETURN(accum_done_, make());
  PO_ASSIGN_OR_RETURN(side_saved_, make());
  PO_ASSIGN_OR_RETURN(side_loaded_, make());
  PO_ASSIGN_OR_RETURN(sums_ready_, make());
  PO_ASSIGN_OR_RETURN(sums_copied_, make());
  std::int64_t largest_sliding = 0;
  for (int u = 0; u < num_units_; ++u) {
    if (IsSliding(u)) largest_sliding = std::max(largest_sliding, Own(u));
  }
  const std::int64_t chunk = options_.grad_chunk_elements;
  for (GradsHome& home : landing_) {
    for (std::int64_t c = 0; c < (largest_sliding + chunk - 1) / chunk; ++c) {
      PO_ASSIGN_OR_RETURN(const Event event, make());
      home.chunk_events.push_back(event);
    }
  }
  for (int u = 0; u < num_units_; ++u) {
    GradsHome& home = parked_[static_cast<std::size_t>(u)];
    if (home.data == nullptr) continue;
    for (std::int64_t c = 0; c < (Own(u) + chunk - 1) / chunk; ++c) {
      PO_ASSIGN_OR_RETURN(const Event event, make());
      home.chunk_events.push_back(event);
    }
  }
  return absl::OkStatus();
}

absl::Status LayerSlidingEngineImpl::CheckUnit(int unit, std::size_t size,
                                               std::string_view what) const {
  if (unit < 0 || unit >= num_units_) {
    return absl::InvalidArgumentError(absl::StrCat("layer sliding: ", std::string(what),
                                                   ": no unit ", unit, " (the model has ",
                                                   num_units_, ")"));
  }
  if (static_cast<std::int64_t>(size) != Own(unit)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer sliding: ", std::string(what), ": unit ", unit, " (",
        shape_.units[static_cast<std::size_t>(unit)].name, ") has ", Own(unit),
        " parameters, the span ", size));
  }
  return error_;
}

absl::Status LayerSlidingEngineImpl::Flush() {
  PO_RETURN_IF_ERROR(error_);
  PO_RETURN_IF_ERROR(worker_->Drain());
  PO_RETURN_IF_ERROR(backend_.Synchronize(options_.timeout_seconds));
  if (nvme_ != nullptr) PO_RETURN_IF_ERROR(nvme_->Read(-1, nullptr, nullptr));
  return absl::OkStatus();
}

absl::Status LayerSlidingEngineImpl::SetUnitParams(int unit, std::span<const float> values) {
  PO_RETURN_IF_ERROR(CheckUnit(unit, values.size(), "SetUnitParams"));
  PO_RETURN_IF_ERROR(Flush());
  const std::int64_t n = Own(unit);
  const bool fp32 = shape_.param_dtype == SlideDtype::kFp32;
  if (IsSliding(unit)) {
    UnitHostState& h = host_[static_cast<std::size_t>(unit)];
    if (fp32) {
      std::memcpy(h.master, values.data(), static_cast<std::size_t>(n) * 4);
    } else if (!h.nvme) {
      SplitMasters(values, static_cast<std::uint16_t*>(h.upload), h.master_lo);
    } else {
      std::vector<std::uint16_t> lo(static_cast<std::size_t>(n));
      SplitMasters(values, static_cast<std::uint16_t*>(h.upload), lo.data());
      PO_RETURN_IF_ERROR(nvme_->WriteMasterLo(unit, lo.data()));
    }
    return absl::OkStatus();
  }
  const Resident& r = resident_[static_cast<std::size_t>(unit)];
  const Queue h2d = backend_.queue(QueueKind::kH2D);
  if (fp32) {
    PO_RETURN_IF_ERROR(backend_.CopyAsync(h2d, r.params, values.data(), n * 4));
    return backend_.Synchronize(options_.timeout_seconds);
  }
  std::vector<std::uint16_t> hi(static_cast<std::size_t>(n)), lo(static_cast<std::size_t>(n));
  SplitMasters(values, hi.data(), lo.data());
  PO_RETURN_IF_ERROR(backend_.CopyAsync(h2d, r.params, hi.data(), n * 2));
  PO_RETURN_IF_ERROR(backend_.CopyAsync(h2d, r.master_lo, lo.data(), n * 2));
  return backend_.Synchronize(options_.timeout_seconds);
}

absl::Status LayerSlidingEngineImpl::GetUnitParams(int unit, std::span<float> values) {
  PO_RETURN_IF_ERROR(CheckUnit(unit, values.size(), "GetUnitParams"));
  PO_RETURN_IF_ERROR(Flush());
  const std::int64_t n = Own(unit);
  const bool fp32 = shape_.param_dtype == SlideDtype::kFp32;
  if (IsSliding(unit)) {
    const UnitHostState& h = host_[static_cast<std::size_t>(unit)];
    if (fp32) {
      std::memcpy(values.data(), h.master, values.size() * sizeof(float));
    } else if (!h.nvme) {
      JoinMasters(static_cast<const std::uint16_t*>(h.upload), h.master_lo, values);
    } else {
      std::vector<std::uint16_t> lo(static_cast<std::size_t>(n));
      PO_RETURN_IF_ERROR(nvme_->Read(unit, nullptr, nullptr, lo.data()));
      JoinMasters(static_cast<const std::uint16_t*>(h.upload), lo.data(), values);
    }
    return absl::OkStatus();
  }
  const Resident& r = resident_[static_cast<std::size_t>(unit)];
  const Queue d2h = backend_.queue(QueueKind::kD2H);
  if (fp32) {
    PO_RETURN_IF_ERROR(backend_.CopyAsync(d2h, values.data(), r.params, n * 4));
    return backend_.Synchronize(options_.timeout_seconds);
  }
  std::vector<std::uint16_t> hi(static_cast<std::size_t>(n)), lo(static_cast<std::size_t>(n));
  PO_RETURN_IF_ERROR(backend_.CopyAsync(d2h, hi.data(), r.params, n * 2));
  PO_RETURN_IF_ERROR(backend_.CopyAsync(d2h, lo.data(), r.master_lo, n * 2));
  PO_RETURN_IF_ERROR(backend_.Synchronize(options_.timeout_seconds));
  JoinMasters(hi.data(), lo.data(), values);
  return absl::OkStatus();
}

absl::Status LayerSlidingEngineImpl::GetUnitOptimizerState(int unit, std::span<float> exp_avg,
                                                           std::span<float> exp_avg_sq) {
  PO_RETURN_IF_ERROR(CheckUnit(unit, exp_avg.size(), "GetUnitOptimizerState"));
  PO_RETURN_IF_ERROR(CheckUnit(unit, exp_avg_sq.size(), "GetUnitOptimizerState"));
  PO_RETURN_IF_ERROR(Flush());
  const std::size_t bytes = exp_avg.size() * sizeof(float);
  if (IsSliding(unit)) {
    const UnitHostState& h = host_[static_cast<std::size_t>(unit)];
    if (h.nvme) return nvme_->Read(unit, exp_avg.data(), exp_avg_sq.data());
    std::memcpy(exp_avg.data(), h.exp_avg, bytes);
    std::memcpy(exp_avg_sq.data(), h.exp_avg_sq, bytes);
    return absl::OkStatus();
  }
  const Resident& r = resident_[static_cast<std::size_t>(unit)];
  const Queue d2h = backend_.queue(QueueKind::kD2H);
  PO_RETURN_IF_ERROR(backend_.CopyAsync(d2h, exp_avg.data(), r.exp_avg, Own(unit) * 4));
  PO_RETURN_IF_ERROR(backend_.CopyAsync(d2h, exp_avg_sq.data(), r.exp_avg_sq, Own(unit) * 4));
  return backend_.Synchronize(options_.timeout_seconds);
}

std::vector<std::int64_t> LayerSlidingEngineImpl::unit_update_counts() const {
  std::vector<std::int64_t> counts = worker_->update_counts();
  for (int u = 0; u < num_units_; ++u) {
    if (!IsSliding(u)) counts[static_cast<std::size_t>(u)] = resident_updates_[static_cast<std::size_t>(u)];
  }
  return counts;
}

absl::StatusOr<StepScalars> LayerSlidingEngineImpl::Scalars(float learning_rate,
                                                            std::int64_t step,
                                                            float grad_scale) const {
  AdamOptions adam = options_.adam;
  adam.learning_rate = learning_rate;
  StepScalars scalars;
  PO_ASSIGN_OR_RETURN(scalars.decay, MakeAdamStepScalars(adam, step, grad_scale));
  adam.weight_decay = 0.0f;
  PO_ASSIGN_OR_RETURN(scalars.no_decay, MakeAdamStepScalars(adam, step, grad_scale));
  return scalars;
}

}  // namespace internal
}  // namespace pipeoffload
