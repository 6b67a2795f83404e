// BlockStore::View: a block's bytes lent for sending without a copy (the
// rest of BlockStoreImpl is in block_store_impl.cc).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "storage/common/status_macros.h"
#include "storage/store/block_store_impl.h"
#include "storage/store/store_internal.h"

namespace kvtier {
namespace {

// A verified private copy (a block not in host memory, or any store
// without views).
class OwnedView final : public BlockView {
 public:
  explicit OwnedView(std::string bytes) : bytes_(std::move(bytes)) {}
  absl::Span<const uint8_t> bytes() const override {
    return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes_.data()), bytes_.size());
  }

 private:
  std::string bytes_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BlockView>> BlockStore::View(const BlockKey& key, TierId* from) {
  std::string bytes;
  KVTIER_RETURN_IF_ERROR(Get(key, &bytes, from));
  return std::make_unique<OwnedView>(std::move(bytes));
}

std::vector<absl::StatusOr<std::unique_ptr<BlockView>>> BlockStore::ViewMany(
    absl::Span<const BlockKey> keys, std::vector<TierId>* from) {
  std::vector<absl::StatusOr<std::unique_ptr<BlockView>>> views;
  views.reserve(keys.size());
  from->assign(keys.size(), TierId::kHost);
  for (size_t i = 0; i < keys.size(); ++i) views.push_back(View(keys[i], &(*from)[i]));
  return views;
}

// The host-tier copy of a busy entry: it stays where it is until the view
// is destroyed.
class BlockStoreImpl::HostView final : public BlockView {
 public:
  // Takes over the entry's busy count and the lent bytes View counted.
  HostView(BlockStoreImpl* store, Entry* e, absl::Span<const uint8_t> bytes)
      : store_(store), e_(e), bytes_(bytes) {}
  ~HostView() override {
    absl::MutexLock lock(&store_->mu_);
    --e_->busy;
    store_->view_bytes_ -= bytes_.size();
    store_->idle_cv_.SignalAll();
  }
  absl::Span<const uint8_t> bytes() const override { return bytes_; }

 private:
  BlockStoreImpl* const store_;
  Entry* const e_;
  const absl::Span<const uint8_t> bytes_;
};

absl::StatusOr<std::unique_ptr<BlockView>> BlockStoreImpl::View(const BlockKey& key, TierId* from) {
  KVTIER_RETURN_IF_ERROR(ValidateBlockKey(key));
  Entry* e = nullptr;
  absl::Span<const uint8_t> bytes;
  std::string place;
  uint64_t checksum = 0;
  {
    absl::MutexLock lock(&mu_);
    e = FindReadyLocked(key);
    const uint64_t cap =
        options_.max_view_bytes != 0 ? options_.max_view_bytes : options_.host_capacity_bytes / 4;
    if (e != nullptr && !e->quarantined && e->host && view_bytes_ + e->size_bytes > cap) {
      ++views_copied_over_cap_;  // lending it would pass the cap: a copy
      e = nullptr;
    }
    if (e != nullptr && !e->quarantined && e->host) {
      CountReadLocked(e);
      e->last_access_micros = env_->NowMicros();
      policy_->Touch(*e->Fastest(), e);
      *from = *e->Fastest();
      ++e->busy;  // the host copy stays in place while the view lives
      auto data = host_->Data(*e->host);
      if (!data.ok()) {
        --e->busy;
        idle_cv_.SignalAll();
        return data.status();
      }
      bytes = absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(data->data()), data->size());
      place = store_internal::HostPlace("host slot", *e->host);
      checksum = e->checksum;
      view_bytes_ += bytes.size();
    } else {
      e = nullptr;  // not in host memory (or missing): read as Get does
    }
  }
  if (e == nullptr) return BlockStore::View(key, from);
  // What leaves the store is what was put: verified in place, as Get
  // verifies its copy (the slot cannot change while the entry is busy).
  if (store_internal::Checksum(bytes) == checksum) {
    return std::unique_ptr<BlockView>(new HostView(this, e, bytes));
  }
  absl::MutexLock lock(&mu_);
  --e->busy;
  view_bytes_ -= bytes.size();
  idle_cv_.SignalAll();
  absl::Status st = CheckCopyLocked(e, TierId::kHost, std::move(place), bytes);
  if (st.ok()) st = absl::InternalError("host copy changed while it was read");
  return st;
}

}  // namespace kvtier
