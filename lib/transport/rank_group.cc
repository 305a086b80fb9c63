// AllGatherChecked (see rank_group.h): every rank's status travels with its payload, so a
// failure anywhere is reported by every rank, in the same words.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/base/byte_wire.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/rank_group.h"

namespace pipeoffload {

absl::StatusOr<std::vector<std::string>> AllGatherChecked(RankGroup& group,
                                                          const absl::Status& mine,
                                                          const std::string& payload,
                                                          std::string_view phase,
                                                          bool* group_failed) {
  internal::ByteWriter writer;
  writer.PutStatus(mine);
  writer.PutString(payload);
  absl::StatusOr<std::vector<std::string>> all =
      mine.ok() ? group.AllGather(writer.Take())
                : group.AllGatherWithin(writer.Take(), std::min(group.timeout_seconds(),
                                                                kFailedRankWaitSeconds));
  if (!all.ok()) {
    if (group_failed != nullptr) *group_failed = true;
    absl::Status met =
        Annotate(all.status(), absl::StrCat(std::string(phase), ": the ranks could not meet"));
    if (mine.ok()) return met;
    // The reason this rank stopped is what a reader needs most: never drop it.
    return absl::Status(mine.code(), absl::StrCat(met.message(), "; this rank had failed: ",
                                                  mine.message()));
  }
  std::vector<std::string> payloads;
  // Failures grouped by message, in rank order: ranks that fail alike (a bad file, a wrong
  // stage count) are named together with one message.
  std::vector<std::pair<std::string, std::vector<int>>> failures;
  absl::StatusCode first_code = absl::StatusCode::kOk;
  int failed = 0;
  for (int r = 0; r < group.size(); ++r) {
    internal::ByteReader reader((*all)[static_cast<std::size_t>(r)]);
    absl::Status status;
    std::string theirs;
    reader.GetStatus(&status);
    reader.GetString(&theirs);
    if (absl::Status read = reader.Finish(phase); !read.ok()) status = read;
    if (!status.ok()) {
      if (failed++ == 0) first_code = status.code();
      const std::string message(status.message());
      auto same = std::find_if(failures.begin(), failures.end(),
                               [&](const auto& failure) { return failure.first == message; });
      if (same == failures.end()) {
        failures.push_back({message, {r}});
      } else {
        same->second.push_back(r);
      }
    }
    payloads.push_back(std::move(theirs));
  }
  if (failed == 0) return payloads;
  const auto ranks = [](const std::vector<int>& list) {
    return absl::StrCat(list.size() == 1 ? "rank " : "ranks ", absl::StrJoin(list, ", "));
  };
  // A group of one (a one-stage pipeline) has no other rank to tell apart.
  std::string text = absl::StrCat(
      std::string(phase), " failed",
      group.size() == 1        ? std::string()
      : failed == group.size() ? std::string(" on every rank")
                               : absl::StrCat(" on ", failed, " of ", group.size(), " ranks"));
  if (failures.size() == 1) {
    if (failed < group.size()) absl::StrAppend(&text, " (", ranks(failures[0].second), ")");
    absl::StrAppend(&text, ": ", failures[0].first);
  } else {
    text += ":";
    for (const auto& [message, list] : failures) {
      absl::StrAppend(&text, "\n  ", ranks(list), ": ", message);
    }
  }
  return absl::Status(first_code, text);
}

}  // namespace pipeoffload
