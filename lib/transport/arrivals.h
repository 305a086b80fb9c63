// Who came to a collective: the words every rank group's timeout uses, so that a rank that
// gave up names the ranks it never heard from ("ranks 0, 2 arrived, rank 1 did not").
#ifndef PIPEOFFLOAD_LIB_TRANSPORT_ARRIVALS_H_
#define PIPEOFFLOAD_LIB_TRANSPORT_ARRIVALS_H_

#include <string>
#include <vector>

namespace pipeoffload::internal {

// "ranks 0, 2 arrived, rank 1 did not"; "rank 0 arrived, ranks 1, 2 did not"; long lists are
// cut after 16 ranks ("ranks 0, 1, ..., 15 and 48 more").
std::string DescribeArrivals(const std::vector<bool>& arrived);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_TRANSPORT_ARRIVALS_H_
