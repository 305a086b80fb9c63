// PlanSliding: the ring's slots, which units stay resident, where m and v live, and every byte
// of every tier, from the shape and the budget alone (so --dry-run needs no device).
//
// Policy (why, in short): the CPU update is what binds sliding (reference/offload-systems.md
// 2.6: SlideFormer's step is CPU-bound on an H200), so budget left after the ring goes to
// resident units, which the GPU updates in milliseconds. Units are made resident from the
// bottom up (embedding, layer 0, ...): their gradients are the last of the backward, so on the
// CPU their updates would sit on the critical path into the next step's first forwards. A unit
// that does not fit is skipped and the next one tried; the head may go first instead (see
// PlanSliding). The highest sliding unit is the exception to "the CPU's work is critical": its
// gradients land first and its next forward comes last, so the update worker defers it into the
// CPU's idle time during the next forward (update_worker.h); the plan therefore minimises the
// sliding parameters *below* the top sliding unit, which is why a sliding head with two more
// resident layers beats a resident head on Llama-3-8B in 24 GiB (docs/sliding.md).
#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/layer_sliding.h"

namespace pipeoffload {
namespace {

// Every buffer is an arena block aligned to this (DeviceArena's default).
constexpr std::int64_t kAlign = 256;
// NVMe arrays start and end on this (O_DIRECT).
constexpr std::int64_t kNvmeAlign = 4096;
// Elements summed into one partial of the deterministic sum of squares (lib/optim's block).
constexpr std::int64_t kSumBlock = 8192;

std::int64_t Round(std::int64_t bytes, std::int64_t align) {
  return (bytes + align - 1) / align * align;
}

std::int64_t ViewElements(const SlidingModelShape& shape, int unit) {
  const SlidingUnitShape& s = shape.units[static_cast<std::size_t>(unit)];
  std::int64_t n = s.param_count;
  if (s.borrowed_unit >= 0) n += shape.units[static_cast<std::size_t>(s.borrowed_unit)].param_count;
  return n;
}

// Bytes for people: B, KB, MB, GB (powers of 1000), three significant digits.
std::string Gb(std::int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b < 1e3) return absl::StrFormat("%d B", bytes);
  if (b < 1e6) return absl::StrFormat("%.3g KB", b / 1e3);
  if (b < 1e9) return absl::StrFormat("%.3g MB", b / 1e6);
  return absl::StrFormat("%.2f GB", b / 1e9);
}

absl::Status CheckOptions(const SlidingModelShape& shape, const SlidingOptions& o) {
  auto bad = [](std::string_view field, std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("sliding options: ", std::string(field), " ",
                                                   std::string(why)));
  };
  if (o.gpu_memory_budget_bytes <= 0) return bad("gpu_memory_budget_bytes", "must be positive");
  if (o.num_microbatches < 1) return bad("num_microbatches", "must be >= 1");
  if (o.num_slots < 0) return bad("num_slots", "must be >= 0 (0: planned)");
  if (!o.placement.empty() && o.placement.size() != shape.units.size()) {
    return bad("placement", absl::StrCat("has ", o.placement.size(), " entries for ",
                                         shape.units.size(), " units"));
  }
  if (o.grad_chunk_elements <= 0) return bad("grad_chunk_elements", "must be positive");
  if (o.landing_buffers < 0) return bad("landing_buffers", "must be >= 0 (0: planned)");
  if (!(o.nvme_fraction >= 0.0 && o.nvme_fraction <= 1.0)) {
    return bad("nvme_fraction", absl::StrCat("must be in [0, 1], is ", o.nvme_fraction));
  }
  if (o.nvme_fraction > 0.0 && o.nvme_dir.empty()) {
    return bad("nvme_fraction", "needs nvme_dir");
  }
  if (!(o.nvme_checkpoint_fraction >= 0.0 && o.nvme_checkpoint_fraction <= 1.0)) {
    return bad("nvme_checkpoint_fraction",
               absl::StrCat("must be in [0, 1], is ", o.nvme_checkpoint_fraction));
  }
  if (o.nvme_checkpoint_fraction > 0.0 && o.nvme_dir.empty()) {
    return bad("nvme_checkpoint_fraction", "needs nvme_dir");
  }
  if (!(o.timeout_seconds > 0.0)) return bad("timeout_seconds", "must be positive");
  if (!(o.max_grad_norm < 1e300)) return bad("max_grad_norm", "must be finite");
  // The Adam options must give a valid first step (each step's lr is checked again).
  PO_RETURN_IF_ERROR(MakeAdamStepScalars(o.adam, 1, 1.0f).status());
  return absl::OkStatus();
}

// Per unit: a sliding unit far larger than the typical sliding one (more than 1.5x the median
// of their views: an LM head or embedding, ~2.4x a Llama-3-8B layer).
std::vector<bool> OutsizedSliding(const SlidingModelShape& shape,
                                  const std::vector<UnitPlace>& placement) {
  std::vector<std::int64_t> sorted;
  for (std::size_t u = 0; u < shape.units.size(); ++u) {
    if (placement[u] == UnitPlace::kSliding) sorted.push_back(ViewElements(shape, static_cast<int>(u)));
  }
  std::vector<bool> outsized(shape.units.size(), false);
  if (sorted.empty()) return outsized;
  std::sort(sorted.begin(), sorted.end());
  const std::int64_t median = sorted[sorted.size() / 2];
  for (std::size_t u = 0; u < shape.units.size(); ++u) {
    outsized[u] = placement[u] == UnitPlace::kSliding &&
                  ViewElements(shape, static_cast<int>(u)) * 2 > median * 3;
  }
  return outsized;
}

// Capacities of the ring for the sliding units: SlideFormer sizes every slot for the largest
// unit; here an outsized unit gets one slot of its own size and the others are sized for the
// rest (such units are used at the two ends of a step, never at once).
std::vector<std::int64_t> RingSlots(const SlidingModelShape& shape,
                                    const std::vector<UnitPlace>& placement, int num_slots) {
  const std::vector<bool> outsized = OutsizedSliding(shape, placement);
  std::int64_t largest = 0, small = 0;
  int big_units = 0, small_units = 0;
  for (std::size_t u = 0; u < shape.units.size(); ++u) {
    if (placement[u] != UnitPlace::kSliding) continue;
    const std::int64_t s = ViewElements(shape, static_cast<int>(u));
    largest = std::max(largest, s);
    if (outsized[u]) {
      ++big_units;
    } else {
      ++small_units;
      small = std::max(small, s);
    }
  }
  if (big_units + small_units == 0) return {};
  if (num_slots == 1) return {largest};
  if (big_units == 0 || small_units == 0) {
    const int n = num_slots > 0 ? num_slots : std::min(3, big_units + small_units);
    return std::vector<std::int64_t>(static_cast<std::size_t>(n), largest);
  }
  const int n_small = num_slots > 0 ? num_slots - 1 : std::min(3, small_units);
  std::vector<std::int64_t> slots(static_cast<std::size_t>(n_small), small);
  slots.insert(slots.begin(), largest);
  return slots;
}

struct DeviceBytes {
  std::int64_t slots = 0, accumulator = 0, activations = 0, workspace = 0, resident = 0,
               engine = 0, model = 0;
  std::int64_t Total() const {
    return slots + accumulator + activations + workspace + resident + engine + model;
  }
};

DeviceBytes CountDevice(const SlidingModelShape& shape, const SlidingOptions& o,
                        const std::vector<UnitPlace>& placement,
                        const std::vector<std::int64_t>& slots) {
  const std::int64_t dtype = SlideDtypeBytes(shape.param_dtype);
  DeviceBytes d;
  for (std::int64_t elements : slots) d.slots += 2 * Round(elements * dtype, kAlign);
  std::int64_t largest_view = 0, largest_own = 0, largest_workspace = 0;
  for (std::size_t u = 0; u < shape.units.size(); ++u) {
    const SlidingUnitShape& unit = shape.units[u];
    largest_view = std::max(largest_view, ViewElements(shape, static_cast<int>(u)));
    largest_own = std::max(largest_own, unit.param_count);
    largest_workspace = std::max(largest_workspace, unit.workspace_bytes);
    if (placement[u] == UnitPlace::kResident) {
      // Parameters, wire gradients, m, v; for fp32 the master is the parameter array (16 B per
      // parameter), for bf16 the parameters are the split master's high halves and its low
      // halves take 2 B more (14 B per parameter).
      const std::int64_t n = unit.param_count;
      d.resident += Round(n * dtype, kAlign) + Round(n * dtype, kAlign) + 2 * Round(n * 4, kAlign);
      if (shape.param_dtype != SlideDtype::kFp32) d.resident += Round(n * 2, kAlign);
    }
  }
  d.accumulator = Round(largest_view * 4, kAlign);
  d.activations =
      4 * static_cast<std::int64_t>(o.num_microbatches) * Round(shape.activation_bytes, kAlign);
  d.workspace = Round(largest_workspace, kAlign);
  // Per-unit sums of squares and the partials of the deterministic reduction.
  d.engine = Round(8 * static_cast<std::int64_t>(shape.units.size()), kAlign) +
             Round(8 * (largest_own / kSumBlock + 2), kAlign) + 8 * kAlign;
  d.model = shape.model_device_bytes;
  return d;
}

// Describe()'s part on the checkpoints on NVMe, or nothing when there are none.
std::string CheckpointsOnNvme(const std::vector<bool>& nvme_checkpoints, int staging) {
  const auto units = std::count(nvme_checkpoints.begin(), nvme_checkpoints.end(), true);
  if (units == 0) return std::string();
  return absl::StrCat("; checkpoints of ", units, " units, staged through ", staging,
                      " pinned buffers");
}

}  // namespace

absl::StatusOr<SlidingPlan> PlanSliding(const SlidingModelShape& shape,
                                        const SlidingOptions& options) {
  PO_RETURN_IF_ERROR(ValidateSlidingModelShape(shape));
  PO_RETURN_IF_ERROR(CheckOptions(shape, options));
  const std::size_t num_units = shape.units.size();
  const std::int64_t budget = options.gpu_memory_budget_bytes;

  std::vector<UnitPlace> placement(num_units, UnitPlace::kSliding);
  if (options.all_resident) {
    placement.assign(num_units, UnitPlace::kResident);
  } else if (!options.placement.empty()) {
    placement = options.placement;
  }
  // A borrower lives where its owner does (it reads the owner's parameters in place).
  auto check_borrowers = [&](const std::vector<UnitPlace>& p) -> absl::Status {
    for (std::size_t u = 0; u < num_units; ++u) {
      const int owner = shape.units[u].borrowed_unit;
      if (owner >= 0 && p[u] != p[static_cast<std::size_t>(owner)]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sliding options: placement: unit ", u, " (", shape.units[u].name,
            ") reads the parameters of unit ", owner, " and must be placed as it is (",
            std::string(UnitPlaceName(p[static_cast<std::size_t>(owner)])), ")"));
      }
    }
    return absl::OkStatus();
  };
  PO_RETURN_IF_ERROR(check_borrowers(placement));

  auto fits = [&](const std::vector<UnitPlace>& p) {
    return CountDevice(shape, options, p, RingSlots(shape, p, options.num_slots)).Total() <=
           budget;
  };
  if (!fits(placement)) {
    // The least this placement can run with: one slot of the largest sliding unit.
    const DeviceBytes least = CountDevice(shape, options, placement, RingSlots(shape, placement, 1));
    const DeviceBytes wanted =
        CountDevice(shape, options, placement, RingSlots(shape, placement, options.num_slots));
    return absl::ResourceExhaustedError(absl::StrCat(
        "sliding plan: a GPU memory budget of ", budget, " bytes (", Gb(budget),
        ") cannot hold the ring: it needs ", wanted.Total(), " bytes (", Gb(wanted.Total()),
        ": slots ", Gb(wanted.slots), ", gradient accumulator ", Gb(wanted.accumulator),
        ", activations ", Gb(wanted.activations), ", workspace ", Gb(wanted.workspace),
        ", resident units ", Gb(wanted.resident), ", model ", Gb(wanted.model),
        "); the minimum, with one slot, is ", least.Total(), " bytes (", Gb(least.Total()),
        ")", least.Total() > budget ? "" : ": pass --slots 1 or raise the budget"));
  }
  if (!options.all_resident && options.placement.empty()) {
    // Greedy from the bottom; and the same after the head first, since a resident head also
    // frees the ring's big slot and shrinks the accumulator. The plan keeps whichever leaves
    // fewer sliding parameters on the critical path (all but the top sliding unit's, which is
    // updated in the next forward's CPU idle time), then whichever holds more on the GPU.
    // Llama-3-8B in 24 GiB: embedding + layers 0-1 resident with a sliding head leaves 30
    // layers critical; embedding + head resident leaves 31 (measured: 1.92 s vs 2.06 s).
    auto greedy = [&](std::vector<int> order) {
      std::vector<UnitPlace> p = placement;
      for (int u : order) {
        if (p[static_cast<std::size_t>(u)] == UnitPlace::kResident) continue;
        if (shape.units[static_cast<std::size_t>(u)].borrowed_unit >= 0) continue;  // follows its owner
        std::vector<UnitPlace> trial = p;
        trial[static_cast<std::size_t>(u)] = UnitPlace::kResident;
        for (std::size_t b = 0; b < num_units; ++b) {
          if (shape.units[b].borrowed_unit == u) trial[b] = UnitPlace::kResident;
        }
        if (fits(trial)) p = std::move(trial);
      }
      return p;
    };
    auto resident_params = [&](const std::vector<UnitPlace>& p) {
      std::int64_t n = 0;
      for (std::size_t u = 0; u < num_units; ++u) {
        if (p[u] == UnitPlace::kResident) n += shape.units[u].param_count;
      }
      return n;
    };
    std::vector<int> ascending(num_units);
    std::iota(ascending.begin(), ascending.end(), 0);
    std::vector<int> head_first = ascending;
    std::rotate(head_first.rbegin(), head_first.rbegin() + 1, head_first.rend());
    const std::vector<UnitPlace> bottom_up = greedy(ascending);
    const std::vector<UnitPlace> with_head = greedy(head_first);
    auto critical_params = [&](const std::vector<UnitPlace>& p) {
      std::int64_t n = 0;
      bool top = true;
      for (std::size_t u = num_units; u-- > 0;) {
        if (p[u] != UnitPlace::kSliding) continue;
        if (!top) n += shape.units[u].param_count;
        top = false;
      }
      return n;
    };
    const std::int64_t critical_head = critical_params(with_head);
    const std::int64_t critical_bottom = critical_params(bottom_up);
    placement = critical_head < critical_bottom ||
                        (critical_head == critical_bottom &&
                         resident_params(with_head) > resident_params(bottom_up))
                    ? with_head
                    : bottom_up;
  }

  SlidingPlan plan;
  plan.placement = placement;
  plan.slot_elements = RingSlots(shape, placement, options.num_slots);
  const DeviceBytes device = CountDevice(shape, options, placement, plan.slot_elements);
  plan.device_slot_bytes = device.slots;
  plan.device_accumulator_bytes = device.accumulator;
  plan.device_activation_bytes = device.activations;
  plan.device_workspace_bytes = device.workspace;
  plan.device_resident_bytes = device.resident;
  plan.device_engine_bytes = device.engine;
  plan.device_model_bytes = device.model;
  plan.device_total_bytes = device.Total();

  // NVMe: the sliding units whose updates come first in the backward (the top ones) have the
  // most slack for a read before and a write after their update. Outsized units go last: the
  // tier's two staging sets are sized for its largest unit (20 B per parameter for bf16), so a
  // Llama-3-8B head on NVMe would pin 6 GB more than a layer.
  plan.nvme.assign(num_units, false);
  std::vector<int> sliding_desc;
  for (int u = static_cast<int>(num_units) - 1; u >= 0; --u) {
    if (placement[static_cast<std::size_t>(u)] == UnitPlace::kSliding) sliding_desc.push_back(u);
  }
  const std::vector<bool> outsized = OutsizedSliding(shape, placement);
  std::stable_partition(sliding_desc.begin(), sliding_desc.end(),
                        [&](int u) { return !outsized[static_cast<std::size_t>(u)]; });
  const int nvme_units = static_cast<int>(
      std::lround(options.nvme_fraction * static_cast<double>(sliding_desc.size())));
  for (int i = 0; i < nvme_units; ++i) plan.nvme[static_cast<std::size_t>(sliding_desc[static_cast<std::size_t>(i)])] = true;

  // Host bytes.
  const bool park = options.max_grad_norm > 0.0 || options.update_timing == UpdateTiming::kAfterBackward;
  const std::int64_t dtype = SlideDtypeBytes(shape.param_dtype);
  std::int64_t sliding_own = 0, largest_sliding_own = 0, largest_nvme = 0, borrowed = 0;
  for (std::size_t u = 0; u < num_units; ++u) {
    const SlidingUnitShape& unit = shape.units[u];
    if (unit.borrowed_unit >= 0) {
      borrowed = std::max(borrowed, shape.units[static_cast<std::size_t>(unit.borrowed_unit)].param_count);
    }
    if (placement[u] != UnitPlace::kSliding) continue;
    const std::int64_t n = unit.param_count;
    sliding_own += n;
    largest_sliding_own = std::max(largest_sliding_own, n);
    // m and v (pageable unless on NVMe) and the fp32 master: fp32 models: the master is the
    // pinned upload source; bf16 models: it is split, its high halves the pinned upload copy
    // and its low halves pageable, or on NVMe with m and v (12 B per parameter in all without
    // NVMe, 2 B on the host with it).
    const bool fp32 = shape.param_dtype == SlideDtype::kFp32;
    if (!plan.nvme[u]) plan.host_pageable_bytes += (fp32 ? 8 : 10) * n;
    plan.host_pinned_bytes += (fp32 ? 4 : dtype) * n;
    if (plan.nvme[u]) {
      plan.nvme_bytes += 2 * Round(4 * n, kNvmeAlign) + (fp32 ? 0 : Round(2 * n, kNvmeAlign));
      largest_nvme = std::max(largest_nvme, n);
    }
  }
  plan.landing_buffers =
      park ? 0 : (options.landing_buffers > 0 ? options.landing_buffers : 3);
  if (sliding_own > 0) {
    plan.host_pinned_bytes += park ? dtype * sliding_own
                                   : plan.landing_buffers * dtype * largest_sliding_own;
  }
  // Checkpoints (units 1 .. U-3): the lowest go to the drive first (saved first in the
  // forward, loaded last in the backward: the most slack for a write and a read).
  plan.nvme_checkpoints.assign(num_units, false);
  const int checkpointed = std::max(0, static_cast<int>(num_units) - 3);
  const int drive_units = static_cast<int>(
      std::lround(options.nvme_checkpoint_fraction * static_cast<double>(checkpointed)));
  for (int i = 0; i < drive_units; ++i) plan.nvme_checkpoints[static_cast<std::size_t>(1 + i)] = true;
  const std::int64_t drive_checkpoints =
      static_cast<std::int64_t>(drive_units) * options.num_microbatches;
  plan.host_pinned_bytes += static_cast<std::int64_t>(checkpointed - drive_units) *
                            options.num_microbatches * shape.activation_bytes;
  // The staging ring: a drive checkpoint's load is consumed one per microbatch backward (the
  // H2D of (u, mb) follows B(u+1, mb), program.h), so with K buffers a read has about K - 1
  // microbatch backwards to land. 4 covers the GPU machine's drive: a Llama-3-8B checkpoint
  // (16.8 MB at 2048 tokens) reads in ~10 ms at its 1.7 GB/s, 3 microbatch backwards take
  // ~13 ms (docs/sliding.md); more buffers would not speed the forward's writes, which the
  // drive's bandwidth bounds whatever the ring. Never more buffers than checkpoints.
  constexpr std::int64_t kCheckpointStaging = 4;
  plan.checkpoint_staging_buffers =
      static_cast<int>(std::min<std::int64_t>(kCheckpointStaging, drive_checkpoints));
  const std::int64_t staged_checkpoint = Round(shape.activation_bytes, kNvmeAlign);
  plan.host_pinned_bytes += plan.checkpoint_staging_buffers * staged_checkpoint;
  plan.nvme_bytes += drive_checkpoints * staged_checkpoint;
  plan.host_pinned_bytes += 4 * borrowed;  // a borrower's gradients for its owner
  // Two staging sets of m, v (and the low halves).
  plan.host_pinned_bytes += 2 * (2 * Round(4 * largest_nvme, kNvmeAlign) +
                                 (shape.param_dtype == SlideDtype::kFp32
                                      ? 0
                                      : Round(2 * largest_nvme, kNvmeAlign)));
  plan.host_pinned_bytes += 8 * static_cast<std::int64_t>(num_units);
  return plan;
}

std::string SlidingPlan::Describe(const SlidingModelShape& shape) const {
  std::string out;
  int resident = 0;
  std::string resident_names;
  for (std::size_t u = 0; u < placement.size(); ++u) {
    if (placement[u] != UnitPlace::kResident) continue;
    ++resident;
    if (resident <= 6) absl::StrAppend(&resident_names, resident > 1 ? ", " : "", shape.units[u].name);
  }
  if (resident > 6) absl::StrAppend(&resident_names, ", ...");
  absl::StrAppend(&out, "ring: ", slot_elements.size(), " slots (");
  for (std::size_t s = 0; s < slot_elements.size(); ++s) {
    absl::StrAppend(&out, s ? ", " : "", slot_elements[s], " elements");
  }
  absl::StrAppend(&out, ")\n");
  absl::StrAppend(&out, "placement: ", placement.size() - resident, " sliding, ", resident,
                  " resident", resident ? absl::StrCat(" (", resident_names, ")") : "", "\n");
  absl::StrAppend(&out, "device: ", Gb(device_total_bytes), " = slots ", Gb(device_slot_bytes),
                  " + accumulator ", Gb(device_accumulator_bytes), " + activations ",
                  Gb(device_activation_bytes), " + workspace ", Gb(device_workspace_bytes),
                  " + resident ", Gb(device_resident_bytes), " + engine ",
                  Gb(device_engine_bytes), " + model ", Gb(device_model_bytes), "\n");
  const int nvme_units = static_cast<int>(std::count(nvme.begin(), nvme.end(), true));
  absl::StrAppend(&out, "host: pageable ", Gb(host_pageable_bytes), ", pinned ",
                  Gb(host_pinned_bytes),
                  resident == static_cast<int>(placement.size()) ? std::string()
                  : landing_buffers > 0
                      ? absl::StrCat(" (", landing_buffers, " gradient landing buffers)")
                      : std::string(" (every sliding unit's gradients parked)"),
                  "; NVMe ", Gb(nvme_bytes), " (m, v",
                  shape.param_dtype == SlideDtype::kFp32 ? "" : ", masters' low halves", " of ",
                  nvme_units, " units",
                  CheckpointsOnNvme(nvme_checkpoints, checkpoint_staging_buffers), ")\n");
  return out;
}

}  // namespace pipeoffload
