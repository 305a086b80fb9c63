// PipelineStage::Open (pipeline.h): the set-up phases of one stage.
//
// Invariants:
//  - With a group, every rank makes the same sequence of group calls whatever fails: one
//    AllGather per measuring turn (kMeasured in turns), then one AllGatherChecked per phase
//    ("setup (stage models)": sizes and measured costs; "setup (schedule)": the plan, arena and
//    executor). A rank's failure travels in the next gather, so every rank stops with the same
//    message; only when the ranks cannot meet does each return its own error.
//  - Every rank plans from the same gathered inputs with deterministic functions (the compiler,
//    the simulators), so they compile the same schedule; the fingerprints prove it before any
//    step, as they must with files or specs given per rank.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/byte_wire.h"
#include "lib/base/status_macros.h"
#include "lib/runtime/pipeline_stage_impl.h"
#include "pipeoffload/compiler.h"

namespace pipeoffload {
namespace internal {
namespace {

int SourceCount(const StageOptions& options) {
  return static_cast<int>(options.spec.has_value()) +
         static_cast<int>(!options.schedule_file.empty()) +
         static_cast<int>(options.schedule.has_value());
}

void PutCosts(ByteWriter& writer, const std::optional<StageCosts>& costs) {
  writer.Put<std::uint8_t>(costs.has_value() ? 1 : 0);
  writer.PutVector(costs.has_value() ? costs->chunks : std::vector<ChunkTimes>{});
  writer.Put(costs.has_value() ? costs->link : LinkFigures{});
}

bool GetCosts(ByteReader& reader, std::optional<StageCosts>* costs) {
  std::uint8_t present = 0;
  StageCosts read;
  if (!reader.Get(&present) || !reader.GetVector(&read.chunks) || !reader.Get(&read.link)) {
    return false;
  }
  if (present != 0) *costs = std::move(read);
  return true;
}

}  // namespace

absl::Status PipelineStageImpl::ResolveSpec() {
  if (SourceCount(options_) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "give exactly one of spec, schedule_file and schedule; got ", SourceCount(options_)));
  }
  if (options_.spec.has_value()) {
    PO_ASSIGN_OR_RETURN(spec_, pipeoffload::ResolveSpec(*options_.spec));
    return absl::OkStatus();
  }
  if (!options_.schedule_file.empty()) {
    PO_ASSIGN_OR_RETURN(given_, LoadScheduleFile(options_.schedule_file));
  } else {
    given_ = options_.schedule;
  }
  spec_ = given_->spec;
  return absl::OkStatus();
}

absl::Status PipelineStageImpl::SetUpLocal() {
  const ExecutorOptions& executor = options_.executor;
  if (!(executor.wait_timeout_seconds > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wait_timeout_seconds must be positive, got ", executor.wait_timeout_seconds));
  }
  if (!executor.p2p_guarantee_points.empty()) {
    return absl::InvalidArgumentError(
        "executor.p2p_guarantee_points must be empty: the stage computes them from the schedule "
        "(set p2p_reserve and p2p_guarantee instead)");
  }
  PO_RETURN_IF_ERROR(ResolveSpec());
  const int p = num_stages();
  if (options_.transport == nullptr) {
    if (p != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a ", p, "-stage pipeline needs a transport (one endpoint per rank); only a one-stage "
          "pipeline runs without one"));
    }
    PO_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Transport>> one, CreateLocalTransports(1));
    owned_transport_ = std::move(one.front());
  }
  transport_ = options_.transport != nullptr ? options_.transport : owned_transport_.get();
  stage_ = transport_->rank();
  if (transport_->size() != p) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the schedule has ", p, " stages but the ", transport_->Name(), " transport connects ",
        transport_->size(), " ranks; run one rank per stage"));
  }
  if (RankGroup* group = options_.group; group != nullptr) {
    if (group->size() != p || group->rank() != stage_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the ", group->Name(), " group (rank ", group->rank(), " of ", group->size(),
          ") and the ", transport_->Name(), " transport (rank ", stage_, " of ",
          transport_->size(), ") must connect the same ranks"));
    }
  }
  if (options_.backend == nullptr) {
    CpuBackendOptions cpu;
    cpu.queue_wait_timeout_seconds = timeout();
    PO_ASSIGN_OR_RETURN(owned_backend_, CreateCpuBackend(cpu));
  }
  backend_ = options_.backend != nullptr ? options_.backend : owned_backend_.get();
  for (int c = 0; c < spec_.chunks_per_stage; ++c) {
    const std::int64_t bytes = model_.SavedBytes(c, spec_.split_backward);
    if (bytes <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("stage ", stage_, ": the model's SavedBytes(",
                                                     c, ") is ", bytes, "; it must be positive"));
    }
    own_saved_.push_back(bytes);
    own_retained_full_.push_back(model_.RetainedBytes(c, Recompute::kFull, spec_.split_backward));
    own_retained_lean_.push_back(model_.RetainedBytes(c, Recompute::kLean, spec_.split_backward));
    own_lean_rebuild_.push_back(
        model_.BackwardReadsRetained(c, Recompute::kLean, spec_.split_backward) ? 0 : -1);
  }
  return absl::OkStatus();
}

void PipelineStageImpl::MeasureCosts(absl::Status& status) {
  const StageCostOptions& costs = options_.costs;
  if (costs.source != CostSource::kMeasured) return;
  RankGroup* group = options_.group;
  if (status.ok() && group == nullptr && num_stages() > 1) {
    status = absl::FailedPreconditionError(
        "measured costs of a multi-stage pipeline need a RankGroup: every rank plans with every "
        "stage's measurements");
  }
  const bool in_turns = costs.measure_in_turns && group != nullptr;
  const int turns = in_turns ? group->size() : 1;
  for (int turn = 0; turn < turns; ++turn) {
    if (status.ok() && (!in_turns || turn == group->rank())) {
      absl::StatusOr<StageCosts> measured =
          MeasureStageCosts(*backend_, model_, spec_.stage_map(), stage_, spec_.split_backward,
                            costs.probe);
      if (measured.ok()) {
        own_costs_ = *std::move(measured);
      } else {
        status = measured.status();
      }
    }
    // The next stage measures only once this one is done; failures wait for the next gather.
    if (in_turns) {
      if (absl::StatusOr<std::vector<std::string>> synced = group->AllGather(""); !synced.ok()) {
        if (status.ok()) status = Annotate(synced.status(), "measuring costs in turns");
      }
    }
  }
}

absl::Status PipelineStageImpl::SizesFromGivenCosts() {
  // No group: the other stages' sizes can only come from the given costs; this stage's model
  // must agree with them, or the compiler would plan for entries of another size.
  const CostModel& given = options_.costs.given;
  const int p = num_stages();
  const int v = spec_.chunks_per_stage;
  sizes_.boundary_bytes = model_.BoundaryBytes();
  if (p == 1) {
    sizes_.saved_bytes = own_saved_;
    sizes_.retained_full_bytes = own_retained_full_;
    sizes_.retained_lean_bytes = own_retained_lean_;
    sizes_.lean_rebuild_bytes = own_lean_rebuild_;
    return absl::OkStatus();
  }
  const VirtualStageMap map = spec_.stage_map();
  sizes_.saved_bytes.clear();
  sizes_.retained_full_bytes.clear();
  sizes_.retained_lean_bytes.clear();
  sizes_.lean_rebuild_bytes.clear();
  for (int l = 0; l < p * v; ++l) {
    sizes_.saved_bytes.push_back(given.ActivationBytes(map.stage_of(l), map.chunk_of(l), map));
    // The other stages' retained bytes are the given cost model's (its 0 is the model's -1);
    // this stage's come from its own model.
    for (const Recompute mode : {Recompute::kFull, Recompute::kLean}) {
      const bool own = map.stage_of(l) == stage_;
      const std::int64_t given_bytes =
          given.RetainedBytes(map.stage_of(l), map.chunk_of(l), map, mode);
      const std::vector<std::int64_t>& own_bytes =
          mode == Recompute::kFull ? own_retained_full_ : own_retained_lean_;
      (mode == Recompute::kFull ? sizes_.retained_full_bytes : sizes_.retained_lean_bytes)
          .push_back(own ? own_bytes[static_cast<std::size_t>(map.chunk_of(l))]
                         : (given_bytes > 0 ? given_bytes : -1));
    }
    sizes_.lean_rebuild_bytes.push_back(
        map.stage_of(l) == stage_
            ? own_lean_rebuild_[static_cast<std::size_t>(map.chunk_of(l))]
            : given.RebuildBytes(map.stage_of(l), map.chunk_of(l), map, Recompute::kLean));
  }
  for (int c = 0; c < v; ++c) {
    const int l = map.virtual_stage(stage_, c);
    const std::int64_t listed = sizes_.saved_bytes[static_cast<std::size_t>(l)];
    if (listed != own_saved_[static_cast<std::size_t>(c)]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stash size mismatch: stage ", stage_, " chunk ", c, " (virtual stage ", l,
          ") saves ", own_saved_[static_cast<std::size_t>(c)],
          " bytes (StageModel::SavedBytes) but the given cost model says ", listed,
          "; give costs.given every stage's activation_bytes_per_virtual_stage, or open the "
          "stages with a RankGroup so they share their sizes"));
    }
  }
  if (given.boundary_bytes != sizes_.boundary_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "boundary size mismatch: stage ", stage_, "'s model passes ", sizes_.boundary_bytes,
        " bytes between stages (StageModel::BoundaryBytes) but the given cost model says ",
        given.boundary_bytes));
  }
  return absl::OkStatus();
}

absl::Status PipelineStageImpl::GatherStages(absl::Status status) {
  RankGroup* group = options_.group;
  if (group == nullptr) {
    PO_RETURN_IF_ERROR(status);
    if (own_costs_.has_value()) measured_ = {*own_costs_};
    return SizesFromGivenCosts();
  }
  ByteWriter mine;
  mine.PutVector(own_saved_);
  mine.PutVector(own_retained_full_);
  mine.PutVector(own_retained_lean_);
  mine.PutVector(own_lean_rebuild_);
  mine.Put<std::int64_t>(status.ok() ? model_.BoundaryBytes() : 0);
  PutCosts(mine, own_costs_);
  PO_ASSIGN_OR_RETURN(const std::vector<std::string> all,
                      AllGatherChecked(*group, status, mine.Take(), "setup (stage models)"));
  // Past a successful gather every rank has the same inputs, so every check below fails alike
  // on every rank.
  const int p = num_stages();
  const int v = spec_.chunks_per_stage;
  sizes_.saved_bytes.assign(static_cast<std::size_t>(p * v), 0);
  sizes_.retained_full_bytes.assign(static_cast<std::size_t>(p * v), -1);
  sizes_.retained_lean_bytes.assign(static_cast<std::size_t>(p * v), -1);
  sizes_.lean_rebuild_bytes.assign(static_cast<std::size_t>(p * v), -1);
  sizes_.boundary_bytes = 0;
  measured_.clear();
  for (int d = 0; d < p; ++d) {
    ByteReader reader(all[static_cast<std::size_t>(d)]);
    std::vector<std::int64_t> saved, retained_full, retained_lean, lean_rebuild;
    std::int64_t boundary = 0;
    std::optional<StageCosts> costs;
    reader.GetVector(&saved);
    reader.GetVector(&retained_full);
    reader.GetVector(&retained_lean);
    reader.GetVector(&lean_rebuild);
    reader.Get(&boundary);
    GetCosts(reader, &costs);
    PO_RETURN_IF_ERROR(reader.Finish("stage sizes and costs"));
    if (saved.size() != static_cast<std::size_t>(v) || retained_full.size() != saved.size() ||
        retained_lean.size() != saved.size() || lean_rebuild.size() != saved.size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "stage ", d, " has ", saved.size(), " chunks, the schedule ", v,
          " (the ranks were given different pipelines)"));
    }
    for (int c = 0; c < v; ++c) {
      const auto l = static_cast<std::size_t>(spec_.stage_map().virtual_stage(d, c));
      sizes_.saved_bytes[l] = saved[static_cast<std::size_t>(c)];
      sizes_.retained_full_bytes[l] = retained_full[static_cast<std::size_t>(c)];
      sizes_.retained_lean_bytes[l] = retained_lean[static_cast<std::size_t>(c)];
      sizes_.lean_rebuild_bytes[l] = lean_rebuild[static_cast<std::size_t>(c)];
    }
    if (d > 0 && boundary != sizes_.boundary_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the stage models disagree on BoundaryBytes: stage 0 passes ", sizes_.boundary_bytes,
          " bytes, stage ", d, " ", boundary));
    }
    sizes_.boundary_bytes = boundary;
    if (costs.has_value()) measured_.push_back(*std::move(costs));
  }
  return absl::OkStatus();
}

absl::StatusOr<CostModel> PipelineStageImpl::SoloCosts() const {
  const StageCostOptions& costs = options_.costs;
  switch (costs.source) {
    case CostSource::kNominal:
      if (!(costs.nominal_chunk_time > 0)) {
        return absl::InvalidArgumentError(absl::StrCat("nominal_chunk_time must be positive, got ",
                                                       costs.nominal_chunk_time));
      }
      return NominalCostModel(sizes_, costs.nominal_chunk_time);
    case CostSource::kGiven:
      return WithModelSizes(costs.given, sizes_);
    case CostSource::kMeasured:
      if (measured_.size() != static_cast<std::size_t>(num_stages())) {
        return absl::InternalError(absl::StrCat("measured costs of ", measured_.size(), " of ",
                                                num_stages(), " stages"));
      }
      return MeasuredCostModel(sizes_, measured_, costs.given);
  }
  return absl::InternalError("unknown cost source");
}

absl::Status PipelineStageImpl::SetUpRuntime() {
  PO_ASSIGN_OR_RETURN(const CostModel solo, SoloCosts());
  const PlanOptions& plan_options = options_.costs.plan;
  if (given_.has_value()) {
    PO_ASSIGN_OR_RETURN(plan_, ReplanSchedule(*std::move(given_), solo, plan_options));
    given_.reset();
  } else {
    PO_ASSIGN_OR_RETURN(plan_, PlanSchedule(spec_, solo, plan_options));
  }
  spec_ = plan_.schedule.spec;  // resolved (auto's choice, group size filled in)
  const Schedule& schedule = plan_.schedule;
  // P2P buffer lifetimes over all stages: the arena reserves their peak and the executor holds
  // to it (it waits for a send once its receiver is known to have posted, or consumed, it).
  std::vector<P2PLifetimes> p2p;
  ExecutorOptions executor_options = options_.executor;
  if (options_.p2p_reserve == P2PReserve::kPlanned) {
    const P2PGuarantee guarantee = options_.p2p_guarantee.value_or(
        transport_->Name() == "nccl" ? P2PGuarantee::kMessageConsumed
                                     : P2PGuarantee::kReceivePosted);
    absl::StatusOr<std::vector<P2PLifetimes>> analyzed = AnalyzeP2P(schedule, guarantee);
    if (!analyzed.ok()) return Annotate(analyzed.status(), "the schedule's P2P buffer lifetimes");
    p2p = *std::move(analyzed);
    executor_options.p2p_guarantee_points = p2p[static_cast<std::size_t>(stage_)].guarantee_point;
  }
  PO_ASSIGN_OR_RETURN(arena_need_,
                      StageArenaNeed(schedule, stage_, sizes_, options_.p2p_reserve,
                                     p2p.empty() ? nullptr : &p2p[static_cast<std::size_t>(stage_)],
                                     options_.arena));
  DeviceArenaOptions arena_options;
  arena_options.budget_bytes = arena_need_.budget_bytes;
  arena_options.alignment = options_.arena.alignment;
  arena_options.poison_on_free = options_.poison_on_free;
  arena_options.stash_high_below_bytes = arena_need_.smallest_entry_bytes;
  PO_ASSIGN_OR_RETURN(arena_, DeviceArena::Create(*backend_, arena_options));
  absl::StatusOr<std::unique_ptr<Executor>> executor =
      Executor::Create(spec_, schedule.stages[static_cast<std::size_t>(stage_)], model_,
                       *backend_, *arena_, *transport_, executor_options);
  if (!executor.ok()) {
    if (executor.status().code() == absl::StatusCode::kResourceExhausted) {
      return Annotate(executor.status(),
                      absl::StrCat("the arena budget of ", arena_options.budget_bytes,
                                   " bytes is too small for the plan"));
    }
    return executor.status();
  }
  executor_ = *std::move(executor);
  arena_budgets_.assign(static_cast<std::size_t>(num_stages()), 0);
  arena_budgets_[static_cast<std::size_t>(stage_)] = arena_need_.budget_bytes;
  return absl::OkStatus();
}

absl::Status PipelineStageImpl::Agree(absl::Status status) {
  RankGroup* group = options_.group;
  if (group == nullptr) return status;
  ByteWriter mine;
  mine.Put<std::uint64_t>(status.ok() ? ScheduleFingerprint(plan_.schedule) : 0);
  mine.Put<std::int64_t>(status.ok() ? arena_need_.budget_bytes : 0);
  PO_ASSIGN_OR_RETURN(const std::vector<std::string> all,
                      AllGatherChecked(*group, status, mine.Take(), "setup (schedule)"));
  std::vector<std::uint64_t> fingerprints(all.size());
  arena_budgets_.assign(all.size(), 0);
  for (std::size_t d = 0; d < all.size(); ++d) {
    ByteReader reader(all[d]);
    reader.Get(&fingerprints[d]);
    reader.Get(&arena_budgets_[d]);
    PO_RETURN_IF_ERROR(reader.Finish("schedule fingerprint"));
  }
  for (std::size_t d = 1; d < fingerprints.size(); ++d) {
    if (fingerprints[d] != fingerprints[0]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", d, " holds a different schedule than rank 0 (fingerprints ", fingerprints[d],
          " and ", fingerprints[0], "): give every rank the same spec or file and costs"));
    }
  }
  return absl::OkStatus();
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<PipelineStage>> PipelineStage::Open(const StageOptions& options,
                                                                   StageModel& model) {
  auto stage = std::make_unique<internal::PipelineStageImpl>(options, model);
  absl::Status status = stage->SetUpLocal();
  stage->MeasureCosts(status);
  PO_RETURN_IF_ERROR(stage->GatherStages(std::move(status)));
  PO_RETURN_IF_ERROR(stage->Agree(stage->SetUpRuntime()));
  return std::unique_ptr<PipelineStage>(std::move(stage));
}

}  // namespace pipeoffload
