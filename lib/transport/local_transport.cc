// Local transport: pipeline stages as threads of one process, exchanging messages through
// mailboxes keyed by (sender, receiver, tag).
//
// Invariants (guarded by Hub::mu):
//  - A Send copies its bytes into the back of its mailbox's queue and finishes at once (eager),
//    so a sender never waits for its receiver and its buffer is free on return.
//  - A receive takes the front message of its mailbox, so messages of one (sender, receiver,
//    tag) pair up in posting order, and the k-th Barrier on each side of a pair match.
//  - A receive that finds a message of the wrong size consumes it and fails for good, naming
//    both sizes: the two programs disagree and the run cannot continue.
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/backend/clock.h"
#include "lib/transport/transport_checks.h"
#include "pipeoffload/transport.h"

namespace pipeoffload {
namespace {

struct MailboxKey {
  int src;
  int dst;
  MessageKind kind;
  int mb;
  int chunk;
  friend bool operator<(const MailboxKey& a, const MailboxKey& b) {
    return std::tie(a.src, a.dst, a.kind, a.mb, a.chunk) <
           std::tie(b.src, b.dst, b.kind, b.mb, b.chunk);
  }
};

struct Hub {
  std::mutex mu;
  std::condition_variable cv;  // a message arrived
  std::map<MailboxKey, std::deque<std::vector<char>>> mailboxes;
};

class LocalSendRequest final : public TransferRequest {
 public:
  absl::StatusOr<bool> Test() override { return true; }
  absl::Status Wait(double) override { return absl::OkStatus(); }
};

class LocalRecvRequest final : public TransferRequest {
 public:
  LocalRecvRequest(std::shared_ptr<Hub> hub, const MailboxKey& key, const MessageTag& tag,
                   void* data, std::int64_t bytes)
      : hub_(std::move(hub)), key_(key), tag_(tag), data_(data), bytes_(bytes) {}

  absl::StatusOr<bool> Test() override {
    if (done_ || !error_.ok()) return Result();
    std::vector<char> message;
    {
      std::lock_guard<std::mutex> lock(hub_->mu);
      if (!TakeLocked(message)) return false;
    }
    Deliver(message);
    return Result();
  }

  absl::Status Wait(double timeout_seconds) override {
    if (done_ || !error_.ok()) return error_;
    std::vector<char> message;
    {
      std::unique_lock<std::mutex> lock(hub_->mu);
      const bool arrived =
          hub_->cv.wait_until(lock, internal::DeadlineAfter(timeout_seconds), [&] {
            auto it = hub_->mailboxes.find(key_);
            return it != hub_->mailboxes.end() && !it->second.empty();
          });
      if (!arrived) {
        return absl::DeadlineExceededError(absl::StrFormat(
            "local transport: rank %d received no %s from rank %d within %.3f s", key_.dst,
            MessageTagToString(tag_), key_.src, timeout_seconds));
      }
      TakeLocked(message);
    }
    Deliver(message);
    return error_;
  }

 private:
  absl::StatusOr<bool> Result() const {
    if (!error_.ok()) return error_;
    return done_;
  }

  bool TakeLocked(std::vector<char>& message) {
    auto it = hub_->mailboxes.find(key_);
    if (it == hub_->mailboxes.end() || it->second.empty()) return false;
    message = std::move(it->second.front());
    it->second.pop_front();
    return true;
  }

  void Deliver(const std::vector<char>& message) {
    const auto size = static_cast<std::int64_t>(message.size());
    if (size != bytes_) {
      error_ = absl::InvalidArgumentError(absl::StrCat(
          "local transport: rank ", key_.dst, " expected ", bytes_, " bytes of ",
          MessageTagToString(tag_), " from rank ", key_.src, " but the message has ", size));
      return;
    }
    if (size > 0) std::memcpy(data_, message.data(), message.size());
    done_ = true;
  }

  std::shared_ptr<Hub> hub_;
  const MailboxKey key_;
  const MessageTag tag_;
  void* const data_;
  const std::int64_t bytes_;
  bool done_ = false;
  absl::Status error_;
};

class LocalTransport final : public Transport {
 public:
  LocalTransport(std::shared_ptr<Hub> hub, int rank, int size)
      : hub_(std::move(hub)), rank_(rank), size_(size) {}

  std::string Name() const override { return "local"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::StatusOr<std::unique_ptr<TransferRequest>> Send(int peer, const MessageTag& tag,
                                                        const void* data,
                                                        std::int64_t bytes) override {
    if (absl::Status ok = internal::CheckTransfer("local", "Send", rank_, size_, peer, tag, data,
                                                  bytes);
        !ok.ok()) {
      return ok;
    }
    std::vector<char> message(static_cast<std::size_t>(bytes));
    if (bytes > 0) std::memcpy(message.data(), data, message.size());
    {
      std::lock_guard<std::mutex> lock(hub_->mu);
      hub_->mailboxes[MailboxKey{rank_, peer, tag.kind, tag.mb, tag.chunk}].push_back(
          std::move(message));
    }
    hub_->cv.notify_all();
    return std::unique_ptr<TransferRequest>(new LocalSendRequest());
  }

  absl::StatusOr<std::unique_ptr<TransferRequest>> Recv(int peer, const MessageTag& tag,
                                                        void* data,
                                                        std::int64_t bytes) override {
    if (absl::Status ok = internal::CheckTransfer("local", "Recv", rank_, size_, peer, tag, data,
                                                  bytes);
        !ok.ok()) {
      return ok;
    }
    return std::unique_ptr<TransferRequest>(new LocalRecvRequest(
        hub_, MailboxKey{peer, rank_, tag.kind, tag.mb, tag.chunk}, tag, data, bytes));
  }

  absl::Status Barrier(int peer, double timeout_seconds) override {
    const MessageTag tag{MessageKind::kBarrier, 0, 0};
    absl::StatusOr<std::unique_ptr<TransferRequest>> sent = Send(peer, tag, nullptr, 0);
    if (!sent.ok()) return sent.status();
    absl::StatusOr<std::unique_ptr<TransferRequest>> received = Recv(peer, tag, nullptr, 0);
    if (!received.ok()) return received.status();
    return (*received)->Wait(timeout_seconds);
  }

 private:
  std::shared_ptr<Hub> hub_;
  const int rank_;
  const int size_;
};

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Transport>>> CreateLocalTransports(int num_ranks) {
  if (num_ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("local transport: num_ranks must be at least 1, got ", num_ranks));
  }
  auto hub = std::make_shared<Hub>();
  std::vector<std::unique_ptr<Transport>> endpoints;
  for (int rank = 0; rank < num_ranks; ++rank) {
    endpoints.push_back(std::make_unique<LocalTransport>(hub, rank, num_ranks));
  }
  return endpoints;
}

}  // namespace pipeoffload
