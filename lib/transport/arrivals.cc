// DescribeArrivals (arrivals.h).
#include "lib/transport/arrivals.h"

#include <cstddef>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipeoffload::internal {
namespace {

constexpr std::size_t kListed = 16;

std::string Ranks(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  if (ranks.size() <= kListed) return text + absl::StrJoin(ranks, ", ");
  const std::vector<int> first(ranks.begin(), ranks.begin() + kListed);
  return absl::StrCat(text, absl::StrJoin(first, ", "), " and ", ranks.size() - kListed, " more");
}

}  // namespace

std::string DescribeArrivals(const std::vector<bool>& arrived) {
  std::vector<int> came, missing;
  for (std::size_t r = 0; r < arrived.size(); ++r) {
    (arrived[r] ? came : missing).push_back(static_cast<int>(r));
  }
  if (missing.empty()) return "every rank arrived";
  if (came.empty()) return "no rank arrived";
  return absl::StrCat(Ranks(came), " arrived, ", Ranks(missing), " did not");
}

}  // namespace pipeoffload::internal
