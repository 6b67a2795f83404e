// SelectHandler: answers one SelectRequest of a Select stream (the reactor
// in select_reactor.h does the streaming).
//
// Per request:
//   1. Every ContextSelect entry is checked on its own; a bad entry gets an
//      ItemStatus naming its field (contexts[i].anchor, .max_blocks, ...)
//      and the others proceed:
//        INVALID_ARGUMENT  anchor of a length that fits no layout (head_dim
//                          pooled, or num_layers x head_dim per layer when
//                          index.summary_per_layer is on: the message names
//                          both sizes), query not head_dim, head_queries
//                          not R x head_dim (R = the profile's retrieval
//                          heads), NaN/Inf or a row all zero;
//                          recency_weight outside [0, 1]; no
//                          budget, budget 0, below select.sink_blocks +
//                          select.local_blocks or above
//                          limits.max_batch_blocks; step going back; a
//                          context named twice; an unknown scorer
//        NOT_FOUND         context_id not open (for this tenant)
//        FAILED_PRECONDITION  the scorer needs what the context was not
//                          built with (select.default_scorer,
//                          index.keep_summaries)
//   2. The valid entries' contexts are locked (in increasing id, so that
//      streams sharing contexts cannot deadlock) and selected in ONE
//      index::Selector::SelectBatch call; the chosen ids, scores and
//      stability are copied out and the locks are released.
//   3. Without any context lock, per context the chosen blocks are made
//      resident in the device arena and pinned under a new lease of the
//      context's TTL (BlockStore::AcquireHandles with mark_wanted: the
//      placement policy hears of every chosen block first, in the same
//      pass; with wait_ms, MarkWanted before waiting); then, under the
//      context's lock again, the new lease replaces the previous Select's,
//      which only then is released, so blocks kept from one step to the
//      next are never unpinned in between. If the context was closed
//      meanwhile the entry gets NOT_FOUND and its new lease is released.
//      Selects of one context from several streams replace each other's
//      pins in the order they finish.
//      The handler never touches disk: promotion host -> arena is a
//      memory copy done here (AcquireHandles with memory_only); a block
//      whose only copy is on NVMe is handed to the prefetcher (a
//      background thread reads it into host memory) and comes back
//      RESIDENCY_PENDING ("on its way"); with wait_ms > 0 the handler
//      first waits, until wait_ms (at most kMaxSelectWaitMs) after the
//      request arrived, for the chosen NVMe-only blocks to reach host
//      memory. Host -> arena copies made here are limited per request to
//      select.inline_promotion_bytes (entries in order); chosen blocks past
//      it come back RESIDENCY_PENDING and are promoted by the prefetcher's
//      thread (pinned for the copy, released at once), so a later step
//      finds them RESIDENT. An entry with wait_ms > 0 is not limited: it
//      asked to wait rather than get PENDING. Appends to the context and other Selects go on while
//      it waits. A block that could not get an arena slot (every slot pinned) is PENDING too; ask
//      again next step. A block deleted or quarantined since the context was opened comes back
//      RESIDENCY_UNSPECIFIED without a handle.
//   4. Rising blocks the selector did not choose go to the prefetcher.
//
// SelectedBlock.score is the affinity the selector ranked the block by, in
// [0, 1] (raw scores min-max normalised per step), 0 when it was not scored
// this step; stability is the share of the last select.window_steps steps
// (or of the block's life) above select.theta. The stability filter ranks
// only the scorers in select.stability_scorers.
//
// Thread safety: not thread-safe (it owns an index::Selector); one per
// stream, used by one callback at a time.
#ifndef KVTIER_DAEMON_SELECT_HANDLER_H_
#define KVTIER_DAEMON_SELECT_HANDLER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/runtime.h"
#include "index/select/selector.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier::daemon {

// The longest ContextSelect.wait_ms accepted (INVALID_ARGUMENT above it).
inline constexpr uint32_t kMaxSelectWaitMs = 10000;

class SelectHandler {
 public:
  static absl::StatusOr<std::unique_ptr<SelectHandler>> Create(Runtime* runtime,
                                                               std::string tenant);
  ~SelectHandler();

  // Fills *response (cleared first) with one ContextSelection per entry of
  // request, in order, and request_id copied.
  void Handle(const v1::SelectRequest& request, v1::SelectResponse* response);

  // What answering `request` costs in the Select pool's deficit round
  // robin (Runtime::select_pool): 64 per block its contexts hold (a
  // context it cannot find counts one block), so a context of 4,096 blocks
  // costs one turn's quantum. Lock-free reads of the contexts' sizes.
  uint64_t Cost(const v1::SelectRequest& request) const;

  // Where the last Handle spent its time, microseconds (steady clock).
  struct Timings {
    double check_us = 0;   // entry checks, context locks, Prepare
    double select_us = 0;  // index::Selector::SelectBatch
    double build_us = 0;   // response blocks (ids, scores, stability), under the locks
    double pin_us = 0;     // wait_ms, AcquireHandles, lease swap (no context lock)
  };
  const Timings& last_timings() const { return timings_; }

 private:
  struct Item;  // one valid entry being selected

  SelectHandler(Runtime* runtime, std::string tenant, std::unique_ptr<index::Selector> selector);
  // Step 1 for entry i; on success fills *item (context not yet locked).
  absl::Status Check(const v1::ContextSelect& entry, int i, Item* item);
  // Under the context's lock (item->ctx->mu, asserted): checks that need
  // it (closed, step, budget floor, scorer precondition) and builds
  // item->request.
  absl::Status Prepare(const v1::ContextSelect& entry, int i, Item* item);
  // Under the context's lock (asserted): the chosen keys into item->keys, the
  // response blocks without residency, rising blocks into *prefetch.
  void Collect(Item* item, v1::ContextSelection* out, std::vector<BlockKey>* prefetch);
  // Blocks a call leaves to the prefetcher once it has answered: NVMe-only
  // blocks to read into memory (prefetch), and host blocks past the
  // request's promotion budget to copy into the arena (deferred).
  struct LaterWork {
    std::vector<BlockKey> prefetch;
    std::vector<BlockKey> deferred;
  };
  // No context lock: waits for NVMe-only blocks until deadline (when
  // wait_ms), pins item->keys under a new lease (item->lease) and fills
  // residency and handles; NVMe-only blocks go to later->prefetch.
  // Host -> arena promotions share the request's budget (promotion_):
  // blocks past it are PENDING and go to later->deferred.
  void Pin(const v1::ContextSelect& entry, absl::Time deadline, Item* item,
           v1::ContextSelection* out, LaterWork* later);
  // Takes the context's lock: the new lease replaces the previous one, or
  // is released when the context was closed meanwhile.
  void Install(Item* item, v1::ContextSelection* out);

  Runtime* const runtime_;
  const std::string tenant_;
  std::unique_ptr<index::Selector> selector_;
  // Reused across requests.
  std::vector<Item> items_;
  std::vector<index::SelectRequest> requests_;
  std::vector<absl::Mutex*> context_mus_;  // the batch's context locks, in id order
  std::vector<index::SelectResult> results_;
  // Scratch reused by every Handle() call (no per-step allocation).
  std::vector<Item*> valid_;
  absl::flat_hash_map<uint64_t, int> first_use_;
  Timings timings_;
  uint64_t selected_blocks_ = 0;  // blocks this request returned (all contexts)
  uint64_t new_blocks_ = 0;       // of those, not in their context's previous set
  // The mass tree's work in this request (all contexts).
  struct MassWork {
    uint64_t reused = 0, descended = 0, opened = 0;  // heads; pages opened
  };
  MassWork mass_;
  PromotionBudget promotion_;  // this request's inline host -> arena promotions
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_SELECT_HANDLER_H_
