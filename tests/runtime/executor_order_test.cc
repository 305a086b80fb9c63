// The executor's ordering of P2P posts after compute (Transport::OrderAfter). With a transport
// that can order on the device, every SEND, and every RECV on a backend whose memory the host
// cannot touch, calls OrderAfter for the stage's compute queue right before it posts, and the
// compute queue is never host-waited for them; with one that cannot (local, and MPI in its own
// test), the executor host-waits as before. Gradients equal the reference bitwise either way.
// The NCCL transport's own ordering is tested on a GPU (tests/gpu/nccl_transport_test.cc).
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pipeoffload/runtime.h"
#include "pipeoffload/transport.h"
#include "tests/backend/opaque_backend.h"
#include "tests/runtime/hand_schedules.h"
#include "tests/runtime/toy_model.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

using testing::OpaqueBackend;

// Forwards transfers to `inner` and claims it can order after `backend`'s compute queue (and
// nothing else). The CPU backend's compute queue is the calling thread, so its work is done by
// the time OrderAfter is called and there is nothing to wait for: what matters here is the log
// of calls, "order compute" / "send activation(mb 0, chunk 0)" / "recv ...", in order.
class OrderingTransport final : public Transport {
 public:
  OrderingTransport(Transport& inner, const Backend& backend)
      : inner_(inner), compute_(backend.queue(QueueKind::kCompute)) {}

  std::string Name() const override { return "ordering-" + inner_.Name(); }
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  bool AcceptsDeviceMemory() const override { return inner_.AcceptsDeviceMemory(); }
  bool CanOrderAfter(const Queue& queue) const override { return queue == compute_; }
  absl::Status OrderAfter(const Queue& queue) override {
    if (!CanOrderAfter(queue)) return Transport::OrderAfter(queue);
    calls_.push_back("order " + QueueName(queue));
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<TransferRequest>> Send(int peer, const MessageTag& tag,
                                                        const void* data,
                                                        std::int64_t bytes) override {
    calls_.push_back("send " + MessageTagToString(tag));
    return inner_.Send(peer, tag, data, bytes);
  }
  absl::StatusOr<std::unique_ptr<TransferRequest>> Recv(int peer, const MessageTag& tag,
                                                        void* data, std::int64_t bytes) override {
    calls_.push_back("recv " + MessageTagToString(tag));
    return inner_.Recv(peer, tag, data, bytes);
  }
  absl::Status Barrier(int peer, double timeout_seconds) override {
    return inner_.Barrier(peer, timeout_seconds);
  }

  const std::vector<std::string>& calls() const { return calls_; }

 private:
  Transport& inner_;
  const Queue compute_;
  std::vector<std::string> calls_;
};

int CountOps(const StageProgram& program, std::initializer_list<OpKind> kinds) {
  int count = 0;
  for (const Op& op : program.ops) {
    for (OpKind kind : kinds) count += op.kind == kind ? 1 : 0;
  }
  return count;
}

// The log's first call that is a post not right after an "order compute", or "" when every post
// is; and the number of orders.
std::string UnorderedPost(const std::vector<std::string>& calls, int* orders) {
  *orders = 0;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    if (calls[i] == "order compute") {
      ++*orders;
    } else if (i == 0 || calls[i - 1] != "order compute") {
      return absl::StrCat("call ", i, ": ", calls[i]);
    }
  }
  return "";
}

struct Run {
  std::vector<testing::StageOutcome> outcomes;
  std::vector<int> compute_records;          // [stage]
  std::vector<std::vector<std::string>> logs;  // [stage], with the ordering transport
};

// Runs `schedule` (p = 4) on opaque CPU backends over local transports with compute-queue
// copiers, wrapped in OrderingTransports when `ordering`.
Run RunOpaque(const Schedule& schedule, bool ordering) {
  const int p = schedule.spec.num_stages;
  CpuBackendOptions cpu;
  cpu.max_copy_delay_seconds = 200e-6;  // jitter the copy engines
  std::vector<std::unique_ptr<OpaqueBackend>> backends;
  LocalTransportOptions options;
  for (int d = 0; d < p; ++d) {
    cpu.fault_seed = static_cast<std::uint64_t>(d + 1);
    absl::StatusOr<std::unique_ptr<Backend>> inner = CreateCpuBackend(cpu);
    REQUIRE(inner.ok());
    backends.push_back(std::make_unique<OpaqueBackend>(std::move(*inner)));
    options.receive_copiers.push_back(BackendComputeCopier(*backends.back(), 10.0));
  }
  absl::StatusOr<std::vector<std::unique_ptr<Transport>>> local = CreateLocalTransports(p, options);
  REQUIRE(local.ok());
  std::vector<std::unique_ptr<OrderingTransport>> wrapped;
  std::vector<Backend*> backend_pointers;
  std::vector<Transport*> transports;
  for (int d = 0; d < p; ++d) {
    const auto s = static_cast<std::size_t>(d);
    backend_pointers.push_back(backends[s].get());
    transports.push_back((*local)[s].get());
    if (ordering) {
      wrapped.push_back(std::make_unique<OrderingTransport>(*(*local)[s], *backends[s]));
      transports.back() = wrapped.back().get();
    }
  }
  testing::HarnessOptions harness;
  Run run;
  run.outcomes = testing::RunToyStages(schedule, backend_pointers, transports, harness);
  for (int d = 0; d < p; ++d) {
    const auto s = static_cast<std::size_t>(d);
    run.compute_records.push_back(backends[s]->compute_records());
    if (ordering) run.logs.push_back(wrapped[s]->calls());
  }
  return run;
}

TEST_CASE("a transport that orders on the device replaces the executor's host waits",
          "[runtime][executor][order]") {
  const auto [family, v, policy] =
      GENERATE(std::make_tuple(Family::k1F1B, 1, OffloadPolicy::kNone),
               std::make_tuple(Family::kInterleaved, 2, OffloadPolicy::kNone),
               std::make_tuple(Family::k1F1B, 1, OffloadPolicy::kFull),
               std::make_tuple(Family::kInterleaved, 2, OffloadPolicy::kFull));
  const testing::ToyConfig config{/*num_stages=*/4, /*chunks_per_stage=*/v,
                                  /*num_microbatches=*/8};
  absl::StatusOr<Schedule> schedule = testing::CompileToy(config, family, policy);
  REQUIRE(schedule.ok());
  CAPTURE(FamilyName(family), v, OffloadPolicyName(policy));

  const Run waited = RunOpaque(*schedule, /*ordering=*/false);
  const Run ordered = RunOpaque(*schedule, /*ordering=*/true);
  const std::vector<testing::ToyGrads> reference = testing::ToyReference(config);
  bool offloads = false;
  for (const Run* run : {&waited, &ordered}) {
    for (std::size_t d = 0; d < 4; ++d) {
      INFO("stage " << d << ": " << run->outcomes[d].status.ToString());
      REQUIRE(run->outcomes[d].status.ok());
    }
    CHECK(testing::GradsByVirtualStage(run->outcomes, 4, v) == reference);
  }
  for (int d = 0; d < 4; ++d) {
    CAPTURE(d);
    const auto s = static_cast<std::size_t>(d);
    const StageProgram& program = schedule->stages[s];
    // The backend's memory is opaque, so RECVs are ordered as well as SENDs.
    const int posts = CountOps(program, {OpKind::kSendActivation, OpKind::kSendGrad,
                                         OpKind::kRecvActivation, OpKind::kRecvGrad});
    REQUIRE(posts > 0);
    offloads = offloads || CountOps(program, {OpKind::kOffload}) > 0;
    const IterationStats& host = waited.outcomes[s].iterations[0];
    const IterationStats& device = ordered.outcomes[s].iterations[0];
    CHECK(host.p2p_compute_waits == posts);
    CHECK(host.p2p_device_orders == 0);
    CHECK(device.p2p_compute_waits == 0);
    CHECK(device.p2p_device_orders == posts);
    // The backend's view: each host wait recorded an event on the compute queue; nothing else
    // differs between the runs (stash copies and receive copiers record the same in both).
    CHECK(waited.compute_records[s] - ordered.compute_records[s] == posts);
    // The transport's view: every post came right after an ordering, one ordering per post.
    int orders = 0;
    CHECK(UnorderedPost(ordered.logs[s], &orders) == "");
    CHECK(orders == posts);
    CHECK(static_cast<int>(ordered.logs[s].size()) == 2 * posts);
  }
  CHECK(offloads == (policy != OffloadPolicy::kNone));
}

TEST_CASE("on a host-accessible backend only SENDs are ordered, by host waits over local",
          "[runtime][executor][order]") {
  const Schedule schedule = testing::Hand1F1B(4, 4, false);
  const auto outcomes = testing::RunToyPipeline(schedule, testing::HarnessOptions{});
  for (std::size_t d = 0; d < 4; ++d) {
    CAPTURE(d);
    REQUIRE(outcomes[d].status.ok());
    const IterationStats& stats = outcomes[d].iterations[0];
    CHECK(stats.p2p_compute_waits ==
          CountOps(schedule.stages[d], {OpKind::kSendActivation, OpKind::kSendGrad}));
    CHECK(stats.p2p_device_orders == 0);
  }
}

TEST_CASE("the local transport cannot order after a queue and says so",
          "[runtime][transport][order]") {
  absl::StatusOr<std::unique_ptr<Backend>> cpu = CreateCpuBackend();
  REQUIRE(cpu.ok());
  absl::StatusOr<std::vector<std::unique_ptr<Transport>>> plain = CreateLocalTransports(2);
  REQUIRE(plain.ok());
  LocalTransportOptions options;
  options.receive_copiers = {BackendComputeCopier(**cpu, 1.0)};
  absl::StatusOr<std::vector<std::unique_ptr<Transport>>> copying =
      CreateLocalTransports(2, options);
  REQUIRE(copying.ok());
  for (Transport* transport : {(*plain)[1].get(), (*copying)[1].get()}) {
    for (QueueKind kind : {QueueKind::kCompute, QueueKind::kD2H}) {
      const Queue queue = (*cpu)->queue(kind);
      CHECK_FALSE(transport->CanOrderAfter(queue));
      const absl::Status refused = transport->OrderAfter(queue);
      INFO(refused.ToString());
      CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
      CHECK(refused.message() ==
            absl::StrCat("local transport: rank 1 cannot order its transfers after the ",
                         QueueName(queue), " queue of cpu on the device (Transport::"
                         "CanOrderAfter is false there): host-wait that queue instead"));
    }
  }
}

}  // namespace
}  // namespace pipeoffload
