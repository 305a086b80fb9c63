// The NVMe store's request table (nvme_store.h): argument checks, cutting requests into
// pieces, queue depth, retries, errors, statistics; the backends (nvme_io.h) move the pieces.
//
// Invariants (all under mu_):
//   - A request is NEW -> RUNNING -> FINISHED -> released (Wait). It is in pending_ while it
//     has bytes not yet handed out as a first piece (next < bytes) and no error; FINISHED when
//     it has no piece in flight, none queued for retry and nothing left to hand out.
//   - in_flight_ = pieces taken by NextPiece and not yet completed <= queue_depth; retries go
//     first, then pending_ in submission order.
//   - A request's first error ends it: it leaves pending_, its queued retries are dropped, and
//     the pieces still in flight only finish it.
//   - Once shutdown_ is set NextPiece hands out nothing; the destructor waits for in_flight_ to
//     reach 0 before the backend (then the file) goes, so no system call outlives a buffer
//     reference the kernel might hold.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/status_macros.h"
#include "lib/slide/nvme_io.h"

namespace pipeoffload {

std::string_view NvmeBackendName(NvmeBackend backend) {
  switch (backend) {
    case NvmeBackend::kAuto: return "auto";
    case NvmeBackend::kIoUring: return "io_uring";
    case NvmeBackend::kThreads: return "threads";
  }
  return "?";
}

namespace internal {
namespace {

using Clock = std::chrono::steady_clock;
// io_uring refuses to register a buffer above 1 GiB (io_buffer_validate in io_uring/rsrc.c),
// and a piece's length is an unsigned int in an SQE.
constexpr std::int64_t kMaxFixedBufferBytes = std::int64_t{1} << 30;

bool Aligned(std::int64_t value) { return value % NvmeStore::kAlignment == 0; }

absl::Status ValidateOptions(const NvmeStoreOptions& o) {
  if (o.capacity_bytes <= 0 || !Aligned(o.capacity_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NvmeStoreOptions.capacity_bytes must be a positive multiple of 4096, got ",
        o.capacity_bytes));
  }
  if (o.queue_depth < 1 || o.queue_depth > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("NvmeStoreOptions.queue_depth must be in [1, 4096], got ", o.queue_depth));
  }
  if (o.request_bytes <= 0 || !Aligned(o.request_bytes) ||
      o.request_bytes > kMaxFixedBufferBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NvmeStoreOptions.request_bytes must be a positive multiple of 4096 of at most 1 GiB, "
        "got ", o.request_bytes));
  }
  if (!(o.timeout_seconds >= 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NvmeStoreOptions.timeout_seconds must be >= 0, got ", o.timeout_seconds));
  }
  return absl::OkStatus();
}

absl::StatusCode CodeForErrno(int error) {
  if (error == EIO) return absl::StatusCode::kDataLoss;
  if (error == ENOSPC || error == EDQUOT) return absl::StatusCode::kResourceExhausted;
  return absl::StatusCode::kInternal;
}

struct Request {
  std::int64_t ticket = 0;
  bool write = false;
  std::int64_t offset = 0;
  std::byte* buffer = nullptr;
  std::int64_t bytes = 0;
  std::int64_t next = 0;  // bytes handed out as first pieces
  std::int64_t done = 0;  // bytes transferred
  int in_flight = 0;
  int retries_queued = 0;
  bool finished = false;
  absl::Status status;
};

// Registered buffer [begin, end) with its io_uring index.
struct FixedBuffer {
  const std::byte* begin;
  const std::byte* end;
  int index;
};

class NvmeStoreImpl final : public NvmeStore, public IoQueue {
 public:
  NvmeStoreImpl(const NvmeStoreOptions& options, ScratchFile file)
      : options_(options), file_(std::move(file)) {}
  ~NvmeStoreImpl() override;

  // Second stage of creation, since the backend needs the queue (this): the backend `start`
  // returns, or (null) the one options.backend names.
  absl::Status Start(const IoBackendStarter* start);

  absl::Status RegisterBuffers(const std::vector<std::span<std::byte>>& buffers) override;
  absl::StatusOr<std::int64_t> SubmitRead(std::int64_t offset, void* dst,
                                          std::int64_t bytes) override {
    return Submit(/*write=*/false, offset, static_cast<std::byte*>(dst), bytes);
  }
  absl::StatusOr<std::int64_t> SubmitWrite(std::int64_t offset, const void* src,
                                           std::int64_t bytes) override {
    // The buffer is only read from: IoPiece carries one pointer type for both directions.
    return Submit(/*write=*/true, offset,
                  const_cast<std::byte*>(static_cast<const std::byte*>(src)), bytes);
  }
  absl::Status Wait(std::int64_t ticket) override;
  bool Poll(std::int64_t ticket) override;
  absl::Status Sync() override;
  NvmeStats Stats() const override;
  std::int64_t capacity_bytes() const override { return options_.capacity_bytes; }
  bool direct_io() const override { return file_.direct_io; }
  std::string_view backend_name() const override { return backend_->name(); }
  bool fixed_buffers() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return !fixed_.empty();
  }
  std::string Describe() const override;

  bool NextPiece(bool wait, IoPiece* piece) override;
  void CompletePiece(const IoPiece& piece, std::int64_t result) override;

 private:
  absl::StatusOr<std::int64_t> Submit(bool write, std::int64_t offset, std::byte* buffer,
                                      std::int64_t bytes);
  bool TakePieceLocked(IoPiece* piece);
  int FixedIndexLocked(const std::byte* buffer, std::int64_t bytes) const;
  void FailLocked(Request& request, absl::Status status);
  void MaybeFinishLocked(Request& request);
  bool AnyUnfinishedLocked(bool writes_only) const;
  std::string OpText(const Request& request) const;

  const NvmeStoreOptions options_;
  ScratchFile file_;
  std::unique_ptr<IoBackend> backend_;  // destroyed (threads joined) before file_ closes
  std::string backend_note_;            // why not io_uring, when it is not

  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // a piece may start, or shutdown_
  std::condition_variable done_cv_;  // a request finished, or in_flight_ changed at shutdown
  std::map<std::int64_t, std::unique_ptr<Request>> requests_;  // unreleased, by ticket
  std::deque<Request*> pending_;
  std::deque<IoPiece> retries_;
  std::vector<FixedBuffer> fixed_;  // sorted by begin
  std::string fixed_note_ = "no buffers registered";
  std::int64_t next_ticket_ = 1;
  int in_flight_ = 0;
  bool shutdown_ = false;
  NvmeStats stats_;
  int active_[2] = {0, 0};  // unfinished requests per direction (0 read, 1 write)
  Clock::time_point busy_since_[2];
};

NvmeStoreImpl::~NvmeStoreImpl() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    shutdown_ = true;
    pending_.clear();
    retries_.clear();
    work_cv_.notify_all();
    done_cv_.wait(lock, [&] { return in_flight_ == 0; });
  }
  backend_.reset();
}

absl::Status NvmeStoreImpl::Start(const IoBackendStarter* start) {
  const int fd = file_.fd.get();
  const int depth = options_.queue_depth;
  if (start != nullptr) {
    PO_ASSIGN_OR_RETURN(backend_, (*start)(fd, depth, *this));
    return absl::OkStatus();
  }
  if (options_.backend != NvmeBackend::kThreads) {
    absl::StatusOr<std::unique_ptr<IoBackend>> uring = StartUringBackend(fd, depth, *this);
    if (uring.ok()) {
      backend_ = *std::move(uring);
      return absl::OkStatus();
    }
    if (options_.backend == NvmeBackend::kIoUring) return uring.status();
    backend_note_ = absl::StrCat("io_uring unavailable (", uring.status().message(), ")");
  }
  PO_ASSIGN_OR_RETURN(backend_, StartThreadBackend(fd, depth, *this));
  return absl::OkStatus();
}

absl::Status NvmeStoreImpl::RegisterBuffers(const std::vector<std::span<std::byte>>& buffers) {
  std::vector<iovec> iovecs;
  std::vector<FixedBuffer> table;
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i].empty() || buffers[i].data() == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("RegisterBuffers: buffer ", i, " is empty"));
    }
    // Buffers above the kernel's limit are registered in 1 GiB parts; a piece straddling two
    // parts takes the plain path.
    for (std::int64_t at = 0; at < static_cast<std::int64_t>(buffers[i].size());
         at += kMaxFixedBufferBytes) {
      const std::int64_t length =
          std::min<std::int64_t>(kMaxFixedBufferBytes, buffers[i].size() - at);
      std::byte* begin = buffers[i].data() + at;
      table.push_back({begin, begin + length, static_cast<int>(iovecs.size())});
      iovecs.push_back({begin, static_cast<std::size_t>(length)});
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (AnyUnfinishedLocked(/*writes_only=*/false)) {
    return absl::FailedPreconditionError("RegisterBuffers while a request is unfinished");
  }
  fixed_.clear();
  const absl::Status registered = backend_->RegisterBuffers(iovecs);
  if (iovecs.empty()) {
    fixed_note_ = "no buffers registered";
  } else if (!registered.ok()) {
    fixed_note_ = absl::StrCat("fixed buffers refused (", registered.message(), ")");
  } else {
    std::sort(table.begin(), table.end(),
              [](const FixedBuffer& a, const FixedBuffer& b) { return a.begin < b.begin; });
    fixed_ = std::move(table);
    fixed_note_ = absl::StrCat(iovecs.size(), " fixed buffers");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::int64_t> NvmeStoreImpl::Submit(bool write, std::int64_t offset,
                                                    std::byte* buffer, std::int64_t bytes) {
  const char* op = write ? "SubmitWrite" : "SubmitRead";
  const auto address = reinterpret_cast<std::uintptr_t>(buffer);
  if (buffer == nullptr || bytes <= 0 || offset < 0 || !Aligned(offset) || !Aligned(bytes) ||
      address % NvmeStore::kAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: offset %d, bytes %d and buffer %p must be multiples of %d (bytes > 0, buffer not "
        "null)", op, offset, bytes, static_cast<const void*>(buffer), NvmeStore::kAlignment));
  }
  if (bytes > options_.capacity_bytes - offset) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": offset ", offset, " + bytes ", bytes,
                                                   " exceeds the capacity of ",
                                                   options_.capacity_bytes, " bytes"));
  }
  std::int64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [other_ticket, other] : requests_) {
      if (other->finished || !(write || other->write)) continue;
      if (offset < other->offset + other->bytes && other->offset < offset + bytes) {
        return absl::FailedPreconditionError(absl::StrCat(
            op, " of [", offset, ", ", offset + bytes, ") overlaps unfinished ",
            OpText(*other), " (ticket ", other_ticket, ")"));
      }
    }
    ticket = next_ticket_++;
    auto request = std::make_unique<Request>();
    *request = Request{.ticket = ticket, .write = write, .offset = offset, .buffer = buffer,
                       .bytes = bytes};
    pending_.push_back(request.get());
    requests_.emplace(ticket, std::move(request));
    if (active_[write]++ == 0) busy_since_[write] = Clock::now();
  }
  work_cv_.notify_all();
  backend_->Wake();
  return ticket;
}

bool NvmeStoreImpl::NextPiece(bool wait, IoPiece* piece) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (shutdown_) return false;
    if (TakePieceLocked(piece)) return true;
    if (!wait) return false;
    work_cv_.wait(lock);
  }
}

bool NvmeStoreImpl::TakePieceLocked(IoPiece* piece) {
  if (in_flight_ >= options_.queue_depth) return false;
  if (!retries_.empty()) {
    *piece = retries_.front();
    retries_.pop_front();
    --requests_.at(piece->ticket)->retries_queued;
  } else {
    if (pending_.empty()) return false;
    Request& request = *pending_.front();
    const std::int64_t bytes = std::min(options_.request_bytes, request.bytes - request.next);
    *piece = IoPiece{.ticket = request.ticket, .write = request.write,
                     .offset = request.offset + request.next,
                     .buffer = request.buffer + request.next, .bytes = bytes};
    request.next += bytes;
    if (request.next == request.bytes) pending_.pop_front();
  }
  piece->fixed_index = FixedIndexLocked(piece->buffer, piece->bytes);
  ++requests_.at(piece->ticket)->in_flight;
  ++in_flight_;
  ++stats_.pieces;
  if (piece->fixed_index >= 0) ++stats_.fixed_pieces;
  return true;
}

int NvmeStoreImpl::FixedIndexLocked(const std::byte* buffer, std::int64_t bytes) const {
  auto it = std::upper_bound(fixed_.begin(), fixed_.end(), buffer,
                             [](const std::byte* b, const FixedBuffer& f) { return b < f.begin; });
  if (it == fixed_.begin()) return -1;
  --it;
  return buffer + bytes <= it->end ? it->index : -1;
}

void NvmeStoreImpl::CompletePiece(const IoPiece& piece, std::int64_t result) {
  std::lock_guard<std::mutex> lock(mu_);
  --in_flight_;
  Request& request = *requests_.at(piece.ticket);
  --request.in_flight;
  const bool failed = !request.status.ok();
  if (result == piece.bytes) {
    request.done += result;
    (piece.write ? stats_.bytes_written : stats_.bytes_read) += result;
  } else if (failed) {
    // The request already failed: this piece only had to land.
  } else if (result > 0 || result == -EAGAIN || result == -EINTR) {
    // A short transfer continues where it stopped (O_DIRECT stops at block boundaries).
    const std::int64_t moved = std::max<std::int64_t>(result, 0);
    request.done += moved;
    (piece.write ? stats_.bytes_written : stats_.bytes_read) += moved;
    IoPiece rest = piece;
    rest.offset += moved;
    rest.buffer += moved;
    rest.bytes -= moved;
    retries_.push_back(rest);
    ++request.retries_queued;
    ++stats_.retried_pieces;
  } else if (result == 0) {
    FailLocked(request, absl::DataLossError(absl::StrCat(
        OpText(request), ": the piece of ", piece.bytes, " bytes at offset ", piece.offset,
        " transferred nothing (end of file)")));
  } else {
    const int error = static_cast<int>(-result);
    FailLocked(request, absl::Status(CodeForErrno(error),
                                     ErrnoText(absl::StrCat(OpText(request), ", piece of ",
                                                            piece.bytes, " bytes at offset ",
                                                            piece.offset), error)));
  }
  MaybeFinishLocked(request);
  // A slot of the queue depth is free (and maybe a retry is queued); at shutdown the
  // destructor waits for in_flight_ to drain.
  work_cv_.notify_all();
  if (shutdown_) done_cv_.notify_all();
}

void NvmeStoreImpl::FailLocked(Request& request, absl::Status status) {
  request.status = std::move(status);
  request.next = request.bytes;
  pending_.erase(std::remove(pending_.begin(), pending_.end(), &request), pending_.end());
  retries_.erase(std::remove_if(retries_.begin(), retries_.end(),
                                [&](const IoPiece& p) { return p.ticket == request.ticket; }),
                 retries_.end());
  request.retries_queued = 0;
}

void NvmeStoreImpl::MaybeFinishLocked(Request& request) {
  if (request.finished || request.in_flight > 0 || request.retries_queued > 0 ||
      request.next < request.bytes) {
    return;
  }
  request.finished = true;
  if (--active_[request.write] == 0) {
    const double seconds =
        std::chrono::duration<double>(Clock::now() - busy_since_[request.write]).count();
    (request.write ? stats_.write_busy_seconds : stats_.read_busy_seconds) += seconds;
  }
  done_cv_.notify_all();
}

bool NvmeStoreImpl::AnyUnfinishedLocked(bool writes_only) const {
  for (const auto& [ticket, request] : requests_) {
    if (!request->finished && (request->write || !writes_only)) return true;
  }
  return false;
}

std::string NvmeStoreImpl::OpText(const Request& request) const {
  return absl::StrCat("NVMe ", request.write ? "write" : "read", " of ", request.bytes,
                      " bytes at offset ", request.offset, " in ", options_.dir);
}

absl::Status NvmeStoreImpl::Wait(std::int64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = requests_.find(ticket);
  if (it == requests_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("NVMe Wait: unknown ticket ", ticket, " (never issued, or already waited)"));
  }
  Request& request = *it->second;
  // Clamped so that a huge timeout cannot overflow the clock's representation.
  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(std::min(options_.timeout_seconds, 1e7)));
  if (!done_cv_.wait_for(lock, timeout, [&] { return request.finished; })) {
    return absl::DeadlineExceededError(absl::StrFormat(
        "%s (ticket %d) did not finish within %.3f s: %d of %d bytes done, %d pieces in flight "
        "on %s", OpText(request), ticket, options_.timeout_seconds, request.done, request.bytes,
        request.in_flight, std::string(backend_->name())));
  }
  absl::Status status = std::move(request.status);
  requests_.erase(it);
  return status;
}

bool NvmeStoreImpl::Poll(std::int64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = requests_.find(ticket);
  return it == requests_.end() || it->second->finished;
}

absl::Status NvmeStoreImpl::Sync() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (AnyUnfinishedLocked(/*writes_only=*/true)) {
      return absl::FailedPreconditionError("NVMe Sync while a write is unfinished");
    }
  }
  if (::fdatasync(file_.fd.get()) != 0) {
    return absl::InternalError(ErrnoText(absl::StrCat("fdatasync in ", options_.dir), errno));
  }
  const int error = ::posix_fadvise(file_.fd.get(), 0, 0, POSIX_FADV_DONTNEED);
  if (error != 0) {
    return absl::InternalError(ErrnoText(absl::StrCat("posix_fadvise in ", options_.dir), error));
  }
  return absl::OkStatus();
}

NvmeStats NvmeStoreImpl::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  NvmeStats stats = stats_;
  const Clock::time_point now = Clock::now();
  if (active_[0] > 0) {
    stats.read_busy_seconds += std::chrono::duration<double>(now - busy_since_[0]).count();
  }
  if (active_[1] > 0) {
    stats.write_busy_seconds += std::chrono::duration<double>(now - busy_since_[1]).count();
  }
  return stats;
}

std::string NvmeStoreImpl::Describe() const {
  std::lock_guard<std::mutex> lock(mu_);
  const double mib = static_cast<double>(options_.capacity_bytes) / (1 << 20);
  std::string text = absl::StrFormat(
      "NVMe store in %s: %s, %s (queue depth %d, %d KiB pieces), %s, %s", options_.dir,
      mib >= 1024 ? absl::StrFormat("%.2f GiB", mib / 1024) : absl::StrFormat("%.1f MiB", mib),
      std::string(backend_->name()), options_.queue_depth, options_.request_bytes >> 10,
      file_.direct_io ? "O_DIRECT" : "buffered I/O", fixed_note_);
  if (!backend_note_.empty()) absl::StrAppend(&text, "; ", backend_note_);
  if (!file_.note.empty()) absl::StrAppend(&text, "; ", file_.note);
  return text;
}

absl::StatusOr<std::unique_ptr<NvmeStore>> CreateStore(const NvmeStoreOptions& options,
                                                       const IoBackendStarter* start) {
  PO_RETURN_IF_ERROR(ValidateOptions(options));
  PO_ASSIGN_OR_RETURN(ScratchFile file,
                      CreateScratchFile(options.dir, options.capacity_bytes, options.direct_io));
  auto store = std::make_unique<NvmeStoreImpl>(options, std::move(file));
  PO_RETURN_IF_ERROR(store->Start(start));
  return std::unique_ptr<NvmeStore>(std::move(store));
}

}  // namespace

absl::StatusOr<std::unique_ptr<NvmeStore>> CreateNvmeStoreWithBackend(
    const NvmeStoreOptions& options, const IoBackendStarter& start) {
  return CreateStore(options, &start);
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<NvmeStore>> NvmeStore::Create(const NvmeStoreOptions& options) {
  return internal::CreateStore(options, /*start=*/nullptr);
}

}  // namespace pipeoffload
