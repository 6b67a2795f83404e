#include "daemon/streams.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "daemon/grpc_status.h"

namespace kvtier::daemon {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Outside the table's lock: `ready` may run the stream's next step inline
// (an I/O pool without threads), which calls the table again.
void RunReady(std::vector<absl::AnyInvocable<void() &&>>& ready) {
  for (auto& r : ready) std::move(r)();
}

}  // namespace

absl::StatusOr<std::unique_ptr<StreamTable::Ticket>> StreamTable::Open(absl::string_view rpc,
                                                                       const std::string& tenant,
                                                                       CallCredentials credentials,
                                                                       Stream* stream) {
  absl::MutexLock lock(&mu_);
  PerTenant& per = tenants_[tenant];
  if (per.streams >= limits_.max_streams_per_tenant) {
    ++refused_;
    return absl::ResourceExhaustedError(absl::StrCat(
        rpc, ": tenant \"", tenant, "\" already has ", per.streams,
        " open streams (server.max_streams_per_tenant = ", limits_.max_streams_per_tenant,
        "); close one first"));
  }
  if (open_.size() >= limits_.max_streams) {
    ++refused_;
    return absl::ResourceExhaustedError(
        absl::StrCat(rpc, ": the daemon already has ", open_.size(),
                     " open streams (server.max_streams = ", limits_.max_streams, ")"));
  }
  std::unique_ptr<Ticket> t(new Ticket(this, tenant, std::move(credentials), stream));
  ++per.streams;
  open_.insert(t.get());
  return t;
}

void StreamTable::Close(Ticket* t) {
  std::vector<absl::AnyInvocable<void() &&>> ready;
  absl::ReleasableMutexLock lock(&mu_);
  DropWaitLocked(t);
  auto it = tenants_.find(t->tenant_);
  if (it != tenants_.end()) {
    it->second.queued_bytes -= t->held_bytes_;
    if (--it->second.streams == 0 && it->second.queued_bytes == 0) tenants_.erase(it);
  }
  queued_bytes_ -= t->held_bytes_;
  t->held_bytes_ = 0;
  open_.erase(t);
  GrantWaitersLocked(&ready);
  lock.Release();
  RunReady(ready);
}

StreamTable::Ticket::~Ticket() { table_->Close(this); }

void StreamTable::Ticket::WriteStarted() {
  write_since_ns_.store(NowNs(), std::memory_order_relaxed);
}

void StreamTable::Ticket::WriteDone() { write_since_ns_.store(0, std::memory_order_relaxed); }

bool StreamTable::FitsLocked(const Ticket& t, uint64_t bytes) const {
  mu_.AssertHeld();
  auto it = tenants_.find(t.tenant_);
  const uint64_t mine = it == tenants_.end() ? 0 : it->second.queued_bytes;
  const bool tenant_ok = mine == 0 || mine + bytes <= limits_.max_queued_bytes_per_tenant;
  const bool daemon_ok = queued_bytes_ == 0 || queued_bytes_ + bytes <= limits_.max_queued_bytes;
  return tenant_ok && daemon_ok;
}

bool StreamTable::Ticket::AcquireBytes(uint64_t bytes, absl::AnyInvocable<void() &&> ready) {
  StreamTable* table = table_;
  std::vector<absl::AnyInvocable<void() &&>> granted;
  bool now = false;
  {
    absl::MutexLock lock(&table->mu_);
    // A stream does not pass its own tenant's waiting requests; other
    // tenants' do not hold it up.
    table->GrantWaitersLocked(&granted);
    PerTenant& mine = table->tenants_[tenant_];
    if (mine.waiters.empty() && table->FitsLocked(*this, bytes)) {
      held_bytes_ += bytes;
      table->tenants_[tenant_].queued_bytes += bytes;
      table->queued_bytes_ += bytes;
      now = true;
    } else {
      // Something is held (else it would fit): its release grants this.
      wanted_bytes_ = std::max<uint64_t>(bytes, 1);
      ready_ = std::move(ready);
      if (mine.waiters.empty()) table->turns_.push_back(tenant_);
      mine.waiters.push_back(this);
      ++table->waiting_;
    }
  }
  RunReady(granted);
  return now;
}

void StreamTable::Ticket::ReleaseBytes(uint64_t bytes) {
  StreamTable* table = table_;
  std::vector<absl::AnyInvocable<void() &&>> granted;
  {
    absl::MutexLock lock(&table->mu_);
    bytes = std::min(bytes, held_bytes_);
    held_bytes_ -= bytes;
    table->tenants_[tenant_].queued_bytes -= bytes;
    table->queued_bytes_ -= bytes;
    table->GrantWaitersLocked(&granted);
  }
  RunReady(granted);
}

void StreamTable::GrantWaitersLocked(std::vector<absl::AnyInvocable<void() &&>>* ready) {
  mu_.AssertHeld();
  // Tenants in turn, each its oldest request; a tenant whose request does
  // not fit (its own cap, or the daemon's) goes to the back. Stops after a
  // whole round grants nothing.
  size_t idle = 0;
  while (!turns_.empty() && idle < turns_.size()) {
    std::string tenant = std::move(turns_.front());
    turns_.pop_front();
    PerTenant& per = tenants_[tenant];
    Ticket* t = per.waiters.front();
    if (FitsLocked(*t, t->wanted_bytes_)) {
      idle = 0;
      t->held_bytes_ += t->wanted_bytes_;
      per.queued_bytes += t->wanted_bytes_;
      queued_bytes_ += t->wanted_bytes_;
      t->wanted_bytes_ = 0;
      per.waiters.pop_front();
      --waiting_;
      ready->push_back(std::move(t->ready_));
      t->ready_ = nullptr;
    } else {
      ++idle;
    }
    if (!per.waiters.empty()) turns_.push_back(std::move(tenant));
  }
}

void StreamTable::DropWaitLocked(Ticket* t) {
  mu_.AssertHeld();
  if (t->wanted_bytes_ == 0) return;
  PerTenant& per = tenants_[t->tenant_];
  per.waiters.erase(std::remove(per.waiters.begin(), per.waiters.end(), t), per.waiters.end());
  if (per.waiters.empty())
    turns_.erase(std::remove(turns_.begin(), turns_.end(), t->tenant_), turns_.end());
  --waiting_;
  t->wanted_bytes_ = 0;
  t->ready_ = nullptr;
}

size_t StreamTable::CancelRevoked(const TenantRegistry& registry) {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (Ticket* t : open_) {
    if (t->revoked_ || t->stalled_) continue;
    absl::StatusOr<TenantPtr> now = Resolve(registry, t->credentials_);
    if (now.ok() && (*now)->name == t->tenant_) continue;
    t->revoked_ = true;
    const bool waiting = t->wanted_bytes_ > 0;
    DropWaitLocked(t);
    t->stream_->Abort(ToGrpcStatus(absl::UnauthenticatedError(
                          "the credentials of this stream were revoked by a reload "
                          "of auth.tenants_file")),
                      waiting);
    ++n;
  }
  revoked_ += n;
  return n;
}

size_t StreamTable::AbortStalled(std::chrono::steady_clock::time_point now) {
  const int64_t cutoff =
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count() -
      static_cast<int64_t>(limits_.write_timeout_ms) * 1000000;
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (Ticket* t : open_) {
    const int64_t since = t->write_since_ns_.load(std::memory_order_relaxed);
    if (t->stalled_ || since == 0 || since > cutoff) continue;
    t->stalled_ = true;
    t->stream_->Abort(
        ToGrpcStatus(absl::DeadlineExceededError(absl::StrCat("the client read nothing for "
                                                              "server.stream_write_timeout_ms = ",
                                                              limits_.write_timeout_ms, " ms"))),
        false);
    ++n;
  }
  stalled_ += n;
  return n;
}

StreamStats StreamTable::stats() const {
  absl::MutexLock lock(&mu_);
  StreamStats s;
  s.open = open_.size();
  s.refused = refused_;
  s.revoked = revoked_;
  s.stalled = stalled_;
  s.queued_bytes = queued_bytes_;
  s.waiting = waiting_;
  return s;
}

uint64_t StreamTable::OpenOf(const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = tenants_.find(tenant);
  return it == tenants_.end() ? 0 : it->second.streams;
}

}  // namespace kvtier::daemon
