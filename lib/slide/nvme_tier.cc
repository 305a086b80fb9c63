// NvmeTier: Adam m, v (and the masters' low halves) of the NVMe units in one NvmeStore file,
// two pinned staging sets taking turns (invariants in nvme_tier.h). A unit's record: m, v, lo,
// each 4 KiB-aligned.
#include "lib/slide/nvme_tier.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/slide/nvme_store.h"

namespace pipeoffload::internal {
namespace {

constexpr std::int64_t kAlign = NvmeStore::kAlignment;

std::int64_t Round(std::int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

}  // namespace

struct NvmeTier::Impl {
  struct Set {
    std::byte* m = nullptr;
    std::byte* v = nullptr;
    std::byte* lo = nullptr;  // with_master_lo only
    int unit = -1;          // whose state the set holds (or is reading / writing)
    bool reading = false;   // read tickets pending
    bool writing = false;   // write tickets pending
    std::int64_t tickets[3] = {0, 0, 0};
  };

  Backend* backend = nullptr;
  std::unique_ptr<NvmeStore> store;
  void* staging = nullptr;
  std::int64_t staging_bytes = 0;
  std::vector<std::int64_t> counts;   // elements per unit (0: not on NVMe)
  std::vector<std::int64_t> offsets;  // file offset of the unit's m (v, lo follow, aligned)
  std::vector<int> order;             // prefetch order
  bool with_master_lo = false;
  Set sets[2];

  std::int64_t Bytes(int unit) const { return Round(4 * counts[static_cast<std::size_t>(unit)]); }
  std::int64_t LoBytes(int unit) const {
    return with_master_lo ? Round(2 * counts[static_cast<std::size_t>(unit)]) : 0;
  }
  std::int64_t LoOffset(int unit) const {
    return offsets[static_cast<std::size_t>(unit)] + 2 * Bytes(unit);
  }

  absl::Status Finish(Set& set) {
    if (!set.reading && !set.writing) return absl::OkStatus();
    for (std::int64_t& ticket : set.tickets) {
      if (ticket > 0) PO_RETURN_IF_ERROR(store->Wait(ticket));
      ticket = 0;
    }
    set.reading = set.writing = false;
    return absl::OkStatus();
  }

  absl::Status StartRead(Set& set, int unit) {
    PO_RETURN_IF_ERROR(Finish(set));
    const std::int64_t bytes = Bytes(unit);
    const std::int64_t offset = offsets[static_cast<std::size_t>(unit)];
    PO_ASSIGN_OR_RETURN(set.tickets[0], store->SubmitRead(offset, set.m, bytes));
    PO_ASSIGN_OR_RETURN(set.tickets[1], store->SubmitRead(offset + bytes, set.v, bytes));
    if (with_master_lo) {
      PO_ASSIGN_OR_RETURN(set.tickets[2], store->SubmitRead(LoOffset(unit), set.lo, LoBytes(unit)));
    }
    set.unit = unit;
    set.reading = true;
    return absl::OkStatus();
  }

  int Next(int unit) const {
    const auto it = std::find(order.begin(), order.end(), unit);
    if (it == order.end()) return -1;
    for (auto next = it + 1; next != order.end(); ++next) {
      if (counts[static_cast<std::size_t>(*next)] > 0) return *next;
    }
    return -1;
  }
};

NvmeTier::~NvmeTier() {
  if (impl_ == nullptr) return;
  for (Impl::Set& set : impl_->sets) impl_->Finish(set).IgnoreError();
  impl_->store.reset();
  if (impl_->staging != nullptr) impl_->backend->FreeHost(impl_->staging);
}

absl::StatusOr<std::unique_ptr<NvmeTier>> NvmeTier::Create(
    Backend& backend, const std::string& dir, const std::vector<std::int64_t>& counts,
    std::vector<int> order, bool with_master_lo, double timeout_seconds,
    SlideRecorder& /*recorder*/) {
  std::unique_ptr<NvmeTier> tier(new NvmeTier());
  tier->impl_ = std::make_unique<Impl>();
  Impl& impl = *tier->impl_;
  impl.backend = &backend;
  impl.counts = counts;
  impl.order = std::move(order);
  impl.with_master_lo = with_master_lo;
  impl.offsets.assign(counts.size(), 0);
  std::int64_t file = 0, largest = 0, largest_lo = 0;
  for (std::size_t u = 0; u < counts.size(); ++u) {
    if (counts[u] <= 0) continue;
    impl.offsets[u] = file;
    file += 2 * impl.Bytes(static_cast<int>(u)) + impl.LoBytes(static_cast<int>(u));
    largest = std::max(largest, impl.Bytes(static_cast<int>(u)));
    largest_lo = std::max(largest_lo, impl.LoBytes(static_cast<int>(u)));
  }
  NvmeStoreOptions options;
  options.dir = dir;
  options.capacity_bytes = file;
  options.timeout_seconds = timeout_seconds;
  absl::StatusOr<std::unique_ptr<NvmeStore>> store = NvmeStore::Create(options);
  if (!store.ok()) return Annotate(store.status(), "layer sliding: the NVMe tier (--nvme-dir)");
  impl.store = std::move(*store);
  // Two sets of m, v (and lo), 4 KiB-aligned for O_DIRECT (one allocation, one spare page to
  // align).
  const std::int64_t set_bytes = 2 * largest + largest_lo;
  impl.staging_bytes = 2 * set_bytes + kAlign;
  PO_ASSIGN_OR_RETURN(impl.staging, backend.AllocateHost(impl.staging_bytes));
  auto* base = reinterpret_cast<std::byte*>(
      (reinterpret_cast<std::uintptr_t>(impl.staging) + kAlign - 1) / kAlign * kAlign);
  for (int s = 0; s < 2; ++s) {
    impl.sets[s].m = base + s * set_bytes;
    impl.sets[s].v = impl.sets[s].m + largest;
    if (with_master_lo) impl.sets[s].lo = impl.sets[s].v + largest;
  }
  PO_RETURN_IF_ERROR(impl.store->RegisterBuffers(
      {std::span<std::byte>(base, static_cast<std::size_t>(2 * set_bytes))}));
  return tier;
}

absl::StatusOr<NvmeTier::State> NvmeTier::Acquire(int unit) {
  Impl& impl = *impl_;
  Impl::Set* set = nullptr;
  for (Impl::Set& s : impl.sets) {
    // Prefetched, or still staged from its last update (its write back may be running: the
    // staged bytes are the newest state either way).
    if (s.unit == unit) set = &s;
  }
  if (set == nullptr) {
    // Not prefetched: take the set that is not holding the next unit's prefetch.
    set = &impl.sets[impl.sets[0].unit == impl.Next(unit) ? 1 : 0];
    PO_RETURN_IF_ERROR(impl.StartRead(*set, unit));
  }
  PO_RETURN_IF_ERROR(impl.Finish(*set));
  return State{reinterpret_cast<float*>(set->m), reinterpret_cast<float*>(set->v),
               reinterpret_cast<std::uint16_t*>(set->lo)};
}

absl::Status NvmeTier::Release(int unit) {
  Impl& impl = *impl_;
  Impl::Set* set = nullptr;
  for (Impl::Set& s : impl.sets) {
    if (s.unit == unit && !s.reading && !s.writing) set = &s;
  }
  if (set == nullptr) {
    return absl::InternalError(absl::StrCat("NVMe tier: Release of unit ", unit, " not acquired"));
  }
  const std::int64_t bytes = impl.Bytes(unit);
  const std::int64_t offset = impl.offsets[static_cast<std::size_t>(unit)];
  PO_ASSIGN_OR_RETURN(set->tickets[0], impl.store->SubmitWrite(offset, set->m, bytes));
  PO_ASSIGN_OR_RETURN(set->tickets[1], impl.store->SubmitWrite(offset + bytes, set->v, bytes));
  if (impl.with_master_lo) {
    PO_ASSIGN_OR_RETURN(set->tickets[2], impl.store->SubmitWrite(impl.LoOffset(unit), set->lo,
                                                                 impl.LoBytes(unit)));
  }
  set->writing = true;
  // Prefetch the next unit into the other set (after its own write back, if any, finished).
  const int next = impl.Next(unit);
  Impl::Set& other = impl.sets[set == &impl.sets[0] ? 1 : 0];
  if (next >= 0 && other.unit != next) PO_RETURN_IF_ERROR(impl.StartRead(other, next));
  return absl::OkStatus();
}

absl::Status NvmeTier::Read(int unit, float* exp_avg, float* exp_avg_sq,
                            std::uint16_t* master_lo) {
  Impl& impl = *impl_;
  for (Impl::Set& set : impl.sets) PO_RETURN_IF_ERROR(impl.Finish(set));
  if (unit < 0) return absl::OkStatus();
  Impl::Set& set = impl.sets[0];
  PO_RETURN_IF_ERROR(impl.StartRead(set, unit));
  PO_RETURN_IF_ERROR(impl.Finish(set));
  const auto count = static_cast<std::size_t>(impl.counts[static_cast<std::size_t>(unit)]);
  if (exp_avg != nullptr) std::memcpy(exp_avg, set.m, count * 4);
  if (exp_avg_sq != nullptr) std::memcpy(exp_avg_sq, set.v, count * 4);
  if (master_lo != nullptr && impl.with_master_lo) std::memcpy(master_lo, set.lo, count * 2);
  return absl::OkStatus();
}

absl::Status NvmeTier::WriteMasterLo(int unit, const std::uint16_t* master_lo) {
  Impl& impl = *impl_;
  if (!impl.with_master_lo) {
    return absl::InternalError("NVMe tier: WriteMasterLo without masters' low halves");
  }
  for (Impl::Set& set : impl.sets) {
    PO_RETURN_IF_ERROR(impl.Finish(set));
    if (set.unit == unit) set.unit = -1;  // staged state would shadow the new halves
  }
  Impl::Set& set = impl.sets[0];
  set.unit = -1;
  const auto count = static_cast<std::size_t>(impl.counts[static_cast<std::size_t>(unit)]);
  std::memcpy(set.lo, master_lo, count * 2);
  PO_ASSIGN_OR_RETURN(set.tickets[2], impl.store->SubmitWrite(impl.LoOffset(unit), set.lo,
                                                              impl.LoBytes(unit)));
  set.writing = true;
  return impl.Finish(set);
}

std::int64_t NvmeTier::file_bytes() const { return impl_->store->capacity_bytes(); }
std::int64_t NvmeTier::staging_bytes() const { return impl_->staging_bytes; }
std::string NvmeTier::Describe() const { return impl_->store->Describe(); }

}  // namespace pipeoffload::internal
