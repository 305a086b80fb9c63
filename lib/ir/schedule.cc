// Names of the IR's enumerations and the short op strings used in text forms and errors.
#include "pipeoffload/schedule.h"

#include <array>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pipeoffload {
namespace {

constexpr std::array<std::string_view, kNumOpKinds> kOpKindNames = {
    "F", "B", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "OFFLOAD", "RELEASE", "RELOAD",
    "BARRIER", "RECOMPUTE", "RECOMPUTE_LEAN"};

constexpr std::array<std::pair<Family, std::string_view>, 5> kFamilyNames = {{
    {Family::k1F1B, "1f1b"},
    {Family::kInterleaved, "interleaved"},
    {Family::kGroupInterleaved, "group-interleaved"},
    {Family::kZbv, "zbv"},
    {Family::kDualPipeV, "dualpipev"},
}};

constexpr std::array<std::pair<Placement, std::string_view>, 2> kPlacementNames = {{
    {Placement::kLoop, "loop"},
    {Placement::kV, "v"},
}};

constexpr std::array<std::pair<OffloadPolicy, std::string_view>, 5> kPolicyNames = {{
    {OffloadPolicy::kNone, "none"},
    {OffloadPolicy::kHalf, "po-h"},
    {OffloadPolicy::kFull, "po-f"},
    {OffloadPolicy::kSelective, "selective"},
    {OffloadPolicy::kAuto, "auto"},
}};

template <typename Enum, std::size_t N>
std::string_view NameOf(const std::array<std::pair<Enum, std::string_view>, N>& table,
                        Enum value) {
  for (const auto& [candidate, name] : table) {
    if (candidate == value) return name;
  }
  return "?";
}

template <typename Enum, std::size_t N>
std::optional<Enum> ValueOf(const std::array<std::pair<Enum, std::string_view>, N>& table,
                            std::string_view name) {
  for (const auto& [candidate, candidate_name] : table) {
    if (candidate_name == name) return candidate;
  }
  return std::nullopt;
}

}  // namespace

std::string_view OpKindName(OpKind kind) {
  return kOpKindNames[static_cast<std::size_t>(kind)];
}

std::optional<OpKind> OpKindFromName(std::string_view name) {
  for (std::size_t i = 0; i < kOpKindNames.size(); ++i) {
    if (kOpKindNames[i] == name) return static_cast<OpKind>(i);
  }
  return std::nullopt;
}

std::string OpToString(const Op& op) {
  // StrCat rather than operator+ chains: GCC 12 at -O3 reports a false -Wrestrict on those.
  const std::string_view kind = OpKindName(op.kind);
  if (op.kind == OpKind::kBarrier) {
    if (op.mb < 0) return absl::StrCat(std::string(kind), "~", op.peer);
    return absl::StrCat(std::string(kind), op.mb, ".", op.chunk, "~", op.peer);
  }
  std::string out = absl::StrCat(std::string(kind), op.mb, ".", op.chunk);
  if (IsSend(op.kind)) absl::StrAppend(&out, "->", op.peer);
  if (IsP2P(op.kind) && !IsSend(op.kind)) absl::StrAppend(&out, "<-", op.peer);
  return out;
}

std::string_view FamilyName(Family family) { return NameOf(kFamilyNames, family); }

std::optional<Family> FamilyFromName(std::string_view name) {
  return ValueOf(kFamilyNames, name);
}

std::string_view PlacementName(Placement placement) { return NameOf(kPlacementNames, placement); }

std::optional<Placement> PlacementFromName(std::string_view name) {
  return ValueOf(kPlacementNames, name);
}

std::string_view OffloadPolicyName(OffloadPolicy policy) {
  return NameOf(kPolicyNames, policy);
}

std::optional<OffloadPolicy> OffloadPolicyFromName(std::string_view name) {
  return ValueOf(kPolicyNames, name);
}

}  // namespace pipeoffload
