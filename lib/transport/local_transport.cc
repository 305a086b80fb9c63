// Local transport: pipeline stages as threads of one process, exchanging messages through
// mailboxes keyed by (sender, receiver, tag).
//
// Invariants (guarded by Hub::mu):
//  - Without copiers, a Send copies its bytes into the back of its mailbox's queue and finishes
//    at once (eager), so a sender never waits for its receiver and its buffer is free on return.
//  - With copiers (device memory), a Send of > 0 bytes queues only its buffer's address and a
//    SendState; the receiver claims the message (kQueued -> kCopying) under the lock, copies
//    outside it with its copier, then marks it kDone (or failed). A destroyed unfinished send
//    withdraws a queued message, or waits for a running copy, so no copy ever reads a buffer
//    its sender has given up.
//  - A receive takes the front message of its mailbox, so messages of one (sender, receiver,
//    tag) pair up in posting order, and the k-th Barrier on each side of a pair match.
//  - A receive that finds a message of the wrong size consumes it and fails for good, naming
//    both sizes: the two programs disagree and the run cannot continue.
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/backend/clock.h"
#include "lib/transport/transport_checks.h"
#include "pipeoffload/backend.h"
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

// A rendezvous send's progress, shared by the sender's request and the queued message.
struct SendState {
  enum Phase { kQueued, kCopying, kDone, kWithdrawn };
  Phase phase = kQueued;
  absl::Status error;  // the receiver's copy error, when it failed
};

struct QueuedMessage {
  std::vector<char> bytes;            // eager: the message itself
  const void* source = nullptr;       // rendezvous: the sender's buffer ...
  std::int64_t source_bytes = 0;      // ... and its size
  std::shared_ptr<SendState> state;   // rendezvous only
  std::int64_t size() const {
    return state ? source_bytes : static_cast<std::int64_t>(bytes.size());
  }
};

struct Hub {
  std::mutex mu;
  std::condition_variable cv;  // a message arrived, or a rendezvous copy finished
  std::map<MailboxKey, std::deque<QueuedMessage>> mailboxes;
  std::vector<LocalCopyFunction> copiers;  // empty, or one per rank
};

class LocalSendRequest final : public TransferRequest {
 public:
  absl::StatusOr<bool> Test() override { return true; }
  absl::Status Wait(double) override { return absl::OkStatus(); }
};

class RendezvousSendRequest final : public TransferRequest {
 public:
  RendezvousSendRequest(std::shared_ptr<Hub> hub, const MailboxKey& key, const MessageTag& tag,
                        std::shared_ptr<SendState> state)
      : hub_(std::move(hub)), key_(key), tag_(tag), state_(std::move(state)) {}

  ~RendezvousSendRequest() override {
    std::unique_lock<std::mutex> lock(hub_->mu);
    if (state_->phase == SendState::kQueued) {
      std::deque<QueuedMessage>& queue = hub_->mailboxes[key_];
      for (auto it = queue.begin(); it != queue.end(); ++it) {
        if (it->state == state_) {
          queue.erase(it);
          break;
        }
      }
      state_->phase = SendState::kWithdrawn;
      return;
    }
    // A copy from our buffer is running on the receiver's thread: it must end before the
    // caller frees the buffer. Copies are bounded by their copier's own timeout.
    hub_->cv.wait(lock, [&] { return state_->phase != SendState::kCopying; });
  }

  absl::StatusOr<bool> Test() override {
    std::lock_guard<std::mutex> lock(hub_->mu);
    if (!state_->error.ok()) return state_->error;
    return state_->phase == SendState::kDone;
  }

  absl::Status Wait(double timeout_seconds) override {
    std::unique_lock<std::mutex> lock(hub_->mu);
    const bool done = hub_->cv.wait_until(lock, internal::DeadlineAfter(timeout_seconds), [&] {
      return state_->phase == SendState::kDone;
    });
    if (!done) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "local transport: rank %d's %s to rank %d was not received within %.3f s", key_.src,
          MessageTagToString(tag_), key_.dst, timeout_seconds));
    }
    return state_->error;
  }

 private:
  std::shared_ptr<Hub> hub_;
  const MailboxKey key_;
  const MessageTag tag_;
  std::shared_ptr<SendState> state_;
};

class LocalRecvRequest final : public TransferRequest {
 public:
  LocalRecvRequest(std::shared_ptr<Hub> hub, const MailboxKey& key, const MessageTag& tag,
                   void* data, std::int64_t bytes)
      : hub_(std::move(hub)), key_(key), tag_(tag), data_(data), bytes_(bytes) {}

  absl::StatusOr<bool> Test() override {
    if (done_ || !error_.ok()) return Result();
    QueuedMessage message;
    {
      std::lock_guard<std::mutex> lock(hub_->mu);
      if (!TakeLocked(message)) return false;
    }
    Deliver(message);
    return Result();
  }

  absl::Status Wait(double timeout_seconds) override {
    if (done_ || !error_.ok()) return error_;
    QueuedMessage message;
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

  // Pops the front message; a rendezvous message becomes kCopying (its sender now waits for
  // Deliver before giving its buffer up).
  bool TakeLocked(QueuedMessage& message) {
    auto it = hub_->mailboxes.find(key_);
    if (it == hub_->mailboxes.end() || it->second.empty()) return false;
    message = std::move(it->second.front());
    it->second.pop_front();
    if (message.state) message.state->phase = SendState::kCopying;
    return true;
  }

  void Deliver(const QueuedMessage& message) {
    const std::int64_t size = message.size();
    absl::Status copied;
    if (size != bytes_) {
      copied = absl::InvalidArgumentError(absl::StrCat(
          "local transport: rank ", key_.dst, " expected ", bytes_, " bytes of ",
          MessageTagToString(tag_), " from rank ", key_.src, " but the message has ", size));
    } else if (message.state) {
      const LocalCopyFunction& copy =
          hub_->copiers[hub_->copiers.size() == 1 ? 0 : static_cast<std::size_t>(key_.dst)];
      copied = copy(data_, message.source, size);
      if (!copied.ok()) {
        copied = absl::Status(copied.code(),
                              absl::StrCat("local transport: rank ", key_.dst, " copying ",
                                           MessageTagToString(tag_), " from rank ", key_.src,
                                           ": ", copied.message()));
      }
    } else if (size > 0) {
      std::memcpy(data_, message.bytes.data(), message.bytes.size());
    }
    if (message.state) {
      {
        std::lock_guard<std::mutex> lock(hub_->mu);
        message.state->phase = SendState::kDone;
        message.state->error = copied;
      }
      hub_->cv.notify_all();
    }
    if (!copied.ok()) {
      error_ = copied;
      return;
    }
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
  bool AcceptsDeviceMemory() const override { return !hub_->copiers.empty(); }
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
    const MailboxKey key{rank_, peer, tag.kind, tag.mb, tag.chunk};
    QueuedMessage message;
    std::unique_ptr<TransferRequest> request;
    if (!hub_->copiers.empty() && bytes > 0) {
      message.source = data;
      message.source_bytes = bytes;
      message.state = std::make_shared<SendState>();
      request = std::make_unique<RendezvousSendRequest>(hub_, key, tag, message.state);
    } else {
      message.bytes.resize(static_cast<std::size_t>(bytes));
      if (bytes > 0) std::memcpy(message.bytes.data(), data, message.bytes.size());
      request = std::make_unique<LocalSendRequest>();
    }
    {
      std::lock_guard<std::mutex> lock(hub_->mu);
      hub_->mailboxes[key].push_back(std::move(message));
    }
    hub_->cv.notify_all();
    return request;
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
  return CreateLocalTransports(num_ranks, LocalTransportOptions{});
}

absl::StatusOr<std::vector<std::unique_ptr<Transport>>> CreateLocalTransports(
    int num_ranks, const LocalTransportOptions& options) {
  if (num_ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("local transport: num_ranks must be at least 1, got ", num_ranks));
  }
  const auto copiers = static_cast<int>(options.receive_copiers.size());
  if (copiers != 0 && copiers != 1 && copiers != num_ranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "local transport: receive_copiers must hold 0, 1 or num_ranks (", num_ranks,
        ") functions, got ", copiers));
  }
  for (int i = 0; i < copiers; ++i) {
    if (!options.receive_copiers[static_cast<std::size_t>(i)]) {
      return absl::InvalidArgumentError(
          absl::StrCat("local transport: receive_copiers[", i, "] is an empty function"));
    }
  }
  auto hub = std::make_shared<Hub>();
  hub->copiers = options.receive_copiers;
  std::vector<std::unique_ptr<Transport>> endpoints;
  for (int rank = 0; rank < num_ranks; ++rank) {
    endpoints.push_back(std::make_unique<LocalTransport>(hub, rank, num_ranks));
  }
  return endpoints;
}

namespace {

// The copier's event, created on first use and destroyed with the last copy of the function.
struct ComputeCopierState {
  ComputeCopierState(Backend& b, double timeout) : backend(b), timeout_seconds(timeout) {}
  ~ComputeCopierState() {
    if (event.has_value()) backend.DestroyEvent(*event);
  }
  ComputeCopierState(const ComputeCopierState&) = delete;
  ComputeCopierState& operator=(const ComputeCopierState&) = delete;

  Backend& backend;
  const double timeout_seconds;
  std::mutex mu;  // one copy at a time, when several ranks share the function
  std::optional<Event> event;
};

}  // namespace

LocalCopyFunction BackendComputeCopier(Backend& backend, double timeout_seconds) {
  auto state = std::make_shared<ComputeCopierState>(backend, timeout_seconds);
  return [state](void* dst, const void* src, std::int64_t bytes) -> absl::Status {
    std::lock_guard<std::mutex> lock(state->mu);
    Backend& b = state->backend;
    if (!state->event.has_value()) {
      absl::StatusOr<Event> event = b.CreateEvent();
      if (!event.ok()) return event.status();
      state->event = *event;
    }
    const Queue compute = b.queue(QueueKind::kCompute);
    if (absl::Status s = b.CopyAsync(compute, dst, src, bytes); !s.ok()) return s;
    if (absl::Status s = b.RecordEvent(*state->event, compute); !s.ok()) return s;
    return b.WaitEvent(*state->event, state->timeout_seconds);
  };
}

absl::StatusOr<std::vector<std::unique_ptr<Transport>>> CreateLocalTransports(
    const std::vector<Backend*>& backends, double timeout_seconds) {
  if (backends.empty() || !(timeout_seconds > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("local transport: need at least one backend and a positive timeout, got ",
                     backends.size(), " and ", timeout_seconds));
  }
  LocalTransportOptions options;
  for (std::size_t r = 0; r < backends.size(); ++r) {
    if (backends[r] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("local transport: backends[", r, "] is null"));
    }
    options.receive_copiers.push_back(BackendComputeCopier(*backends[r], timeout_seconds));
  }
  return CreateLocalTransports(static_cast<int>(backends.size()), options);
}

}  // namespace pipeoffload
