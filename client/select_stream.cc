#include "client/select_stream.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/client.h"

namespace kvtier {

absl::Status CheckContextSelect(const v1::ContextSelect& entry, const ContextShape* shape,
                                int index) {
  const std::string where = absl::StrCat("contexts[", index, "]");
  if (entry.context_id() == 0) {
    return absl::InvalidArgumentError(where + ".context_id: missing (0)");
  }
  if (shape == nullptr || shape->head_dim == 0) return absl::OkStatus();
  const size_t dim = shape->head_dim;
  const size_t n = entry.anchor_size();
  if (n != 0 && n != dim && n != size_t{shape->num_layers} * dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ".anchor: ", n, " floats; the context's profile takes head_dim ", dim,
        " (pooled) or num_layers*head_dim ", size_t{shape->num_layers} * dim, " (per layer)"));
  }
  if (entry.head_queries_size() % dim != 0) {
    return absl::InvalidArgumentError(absl::StrCat(where,
                                                   ".head_queries: ", entry.head_queries_size(),
                                                   " floats, not a multiple of head_dim ", dim));
  }
  return absl::OkStatus();
}

SelectStream::SelectStream(Client* client, v1::KvTier::Stub* stub,
                           std::chrono::milliseconds deadline)
    : client_(client) {
  if (deadline.count() > 0) ctx_.set_deadline(std::chrono::system_clock::now() + deadline);
  stream_ = stub->Select(&ctx_);
}

SelectStream::~SelectStream() {
  if (!closed_) {
    // Finish would wait for answers nobody reads: cancel, then collect the
    // status so gRPC can release the call.
    ctx_.TryCancel();
    Finish().IgnoreError();
  }
}

absl::Status SelectStream::Finish() {
  if (finished_) return Broken();
  finished_ = true;
  v1::SelectResponse drop;
  while (stream_->Read(&drop)) {
  }
  return FromGrpcStatus(stream_->Finish());
}

absl::Status SelectStream::Break(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (broken_.ok()) broken_ = std::move(status);
  return broken_;
}

absl::Status SelectStream::Broken() const {
  absl::MutexLock lock(&mu_);
  return broken_;
}

size_t SelectStream::outstanding() const {
  absl::MutexLock lock(&mu_);
  return pending_.size();
}

absl::StatusOr<uint64_t> SelectStream::Send(absl::Span<const v1::ContextSelect> contexts) {
  if (contexts.empty()) {
    return absl::InvalidArgumentError("contexts: empty: give at least one context");
  }
  v1::SelectRequest request;
  for (size_t i = 0; i < contexts.size(); ++i) {
    ContextShape shape;
    const bool known = client_->ContextShapeOf(contexts[i].context_id(), &shape);
    if (absl::Status st =
            CheckContextSelect(contexts[i], known ? &shape : nullptr, static_cast<int>(i));
        !st.ok()) {
      return st;
    }
    *request.add_contexts() = contexts[i];
  }
  const uint64_t id = next_id_++;
  request.set_request_id(id);
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    // Recorded before the write: the answer may be read before Write returns.
    pending_.push_back({id, static_cast<int>(contexts.size())});
  }
  if (!stream_->Write(request)) {
    absl::MutexLock lock(&mu_);
    if (!pending_.empty() && pending_.back().request_id == id) pending_.pop_back();
    if (!broken_.ok()) return broken_;
    return absl::UnavailableError(
        "Select stream: the daemon closed the stream "
        "(Receive returns its status)");
  }
  return id;
}

absl::Status SelectStream::FinishAfterReadFailed() {
  finished_ = true;
  absl::Status st = FromGrpcStatus(stream_->Finish());
  if (st.ok()) st = absl::UnavailableError("Select stream: the daemon ended the stream");
  return Break(std::move(st));
}

absl::StatusOr<std::vector<Selection>> SelectStream::Receive() {
  Pending want;
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    if (pending_.empty()) {
      return absl::FailedPreconditionError("Select stream: Receive without an outstanding Send");
    }
    want = pending_.front();
  }
  v1::SelectResponse response;
  if (!stream_->Read(&response)) return FinishAfterReadFailed();
  if (response.request_id() != want.request_id || response.contexts_size() != want.contexts) {
    ctx_.TryCancel();
    return Break(absl::InternalError(absl::StrCat(
        "Select stream: response ", response.request_id(), " with ", response.contexts_size(),
        " contexts does not answer request ", want.request_id, " of ", want.contexts)));
  }
  {
    absl::MutexLock lock(&mu_);
    pending_.pop_front();
  }
  std::vector<Selection> out(response.contexts_size());
  for (int i = 0; i < response.contexts_size(); ++i) {
    v1::ContextSelection* c = response.mutable_contexts(i);
    out[i].context_id = c->context_id();
    out[i].status = FromItemStatus(c->status(), absl::StrCat("contexts[", i, "]"));
    out[i].blocks.Swap(c->mutable_blocks());
  }
  return out;
}

void SelectStream::Cancel() { ctx_.TryCancel(); }

absl::Status SelectStream::Close() {
  closed_ = true;
  if (absl::Status st = Broken(); !st.ok()) {
    Finish().IgnoreError();  // after a mismatched answer the cancelled call is still open
    return st;
  }
  stream_->WritesDone();
  absl::Status st = Finish();
  absl::MutexLock lock(&mu_);
  pending_.clear();
  if (broken_.ok() && !st.ok()) broken_ = st;
  return st;
}

}  // namespace kvtier
