// The retrieval term of the mass estimate (key_scorers.h) for long contexts,
// found by descending the KeyTable's head-key summaries instead of reading
// every token's key.
//
// The flat pass (MassScores) computes, for retrieval head i and page b,
//   lse_i(b) = log sum_{t in b} exp(s * q_i . k_{b,t}),
//   p_i(b)   = exp(lse_i(b)) / z_i,   z_i = sum_b exp(lse_i(b)),
// and adds w_i p_i(b) to page b's estimate where p_i(b) >= h (the
// calibration's head_min_mass). With h > 0 a head adds to at most floor(1/h)
// pages: the pages holding at least h of all its attention. MassTreeBumps
// finds them, per head:
//
//   1. The query is quantised to int8 (q^, scale s_q); every dot product
//      below is exact int8 x int8 (int8_dot.h), c = softmax_scale * s_q.
//   2. Chunks (KeyTable::ChunkSummary, pages_per_chunk pages):
//        lb_C  = max(log(n_C T) + c s (q^ . mean_C), c s (q^ . top_C))
//                a lower estimate of the chunk's attention (Jensen on its
//                mean key; its largest-norm key's own logit)
//        pot_C = max(log T + c s (q^+ . max_C + q^- . min_C), c s (q^ . top_C))
//                what its best page may hold (Quest's bound over its pages'
//                mean keys, or its strongest key)
//      z0 = sum_C exp(lb_C). Chunks with pot_C >= log(h z0) - margin are
//      candidates (at most 2 x max_read_fraction of the chunks, or
//      min_candidate_chunks, the best pot_C); they, the chunks of the pages always opened, and a
//      systematic sample of the chunks (every C/32-th, at least 4) are
//      expanded: their pages are screened.
//   3. Pages (KeyTable::PageSummary): m_b and u_b as above on the page's
//      own mean, per-channel max/min and top key; its screen
//        sigma_b = max(log T + m_b + alpha (u_b - m_b), c s (q^ . top_b))
//      Quest's u_b on rotary keys is far above the real largest logit
//      (~20 nats on the shared copy model), so it is a ranking signal mixed
//      into the mean (alpha = bound_mix), not a proof.
//   4. The first page and the last recent_blocks pages are opened (their T
//      logits computed exactly: lse(b)); then screened pages best-first
//      until min_open are open and the next screens below
//      log(h * max(z_open, z0)) - stop_margin_nats, or max_read_fraction of
//      the pages (at least min_open_cap beyond those always opened) are
//      open. Then every 4th page of the sampled chunks.
//   5. z = the exactly opened pages' exp(lse) + the sample's, scaled to
//      every page not opened before it (a sample page that could itself
//      hold h of the attention counts once). Opened pages with
//      exp(lse) / z >= the head's gate get w_i * that share (times the
//      gate's weight). With copy tracking (calibration.h) h is
//      the smaller of head_min_mass and copy_min_mass, and the head's gate
//      (key_scorers.h, ObserveCopy) comes from its strongest opened key;
//      a copying head's shares are moved copy_lead tokens forward (the
//      last tokens' share of an opened page goes to the page after it).
//
// Reuse from step to step (MassReuse): a head whose query is within
// reuse_min_cosine of the query of its last full descent (steps 2-5), at
// most reuse_steps steps ago and with at most recent_blocks pages
// appended since, skips steps 2-3: it opens the first and recent pages,
// the pages it kept (those whose share was >= h e^-reuse_keep_nats at its
// previous step, at most reuse_max_kept, the best) and the page after each
// (a copying head's target moves forward), then the sample of step 4, and
// estimates z as step 5. When the sample finds a page holding h of the
// attention that was not kept (the target moved where reuse does not
// look), the head runs the full descent in the same step. Either way it
// keeps its pages for the next step.
//
// What it gives up against the flat pass: a page never opened gets no
// retrieval term, and the shares of opened pages rest on an estimated z.
// The selection it leads to is measured against the flat pass's by the
// expected mass (the flat pass's own estimates) of the chosen blocks; the
// tolerance is 0.5% of it (bench/quality/mass_tree_test.cc checks it on the
// shared dumps and on long contexts built from their keys; docs/QUALITY.md
// has the figures).
//
// Thread safety: pure function of its arguments; the scratch is the
// caller's (one per calling thread; its work slots serve the pool's helpers).
#ifndef KVTIER_INDEX_SELECT_MASS_TREE_H_
#define KVTIER_INDEX_SELECT_MASS_TREE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "index/select/calibration.h"
#include "index/select/key_scorers.h"
#include "index/select/worker_pool.h"
#include "index/summary/key_table.h"

namespace kvtier::index {

// The fields with a daemon key carry its name (select.mass_tree_min_blocks,
// ..._max_read_fraction, ..._recent_blocks, ..._reuse_steps,
// ..._reuse_min_cosine); a page, the tree's leaf, is one stored block.
struct MassTreeOptions {
  // Contexts of fewer blocks are scored by the flat pass (the Selector's
  // choice; MassTreeBumps itself runs at any size).
  int64_t min_blocks = 512;
  int32_t recent_blocks = 32;       // always opened: the last pages
  int32_t min_open = 16;            // pages opened before stopping early
  double max_read_fraction = 0.10;  // at most this share of pages opened
  // Floors of the two caps, which bind on short contexts (at 16K tokens
  // 10% of the pages is fewer than the targets' neighbourhoods need):
  // pages opened beyond the always-opened ones may reach min_open_cap, and
  // candidate chunks min_candidate_chunks, whatever the fractions say.
  int32_t min_open_cap = 128;
  int32_t min_candidate_chunks = 32;
  float stop_margin_nats = 3.0f;  // see step 4
  float bound_mix = 0.25f;        // alpha of step 2, in [0, 1]
  // Reuse from step to step (see the file comment); reuse_steps 0
  // descends fully at every step.
  int32_t reuse_steps = 8;        // [0, 1024]
  float reuse_min_cosine = 0.8f;  // [-1, 1]
  float reuse_keep_nats = 3.0f;   // [0, 30]
  int32_t reuse_max_kept = 64;    // [1, 4096]
};

// InvalidArgument naming the field when out of range.
absl::Status ValidateMassTreeOptions(const MassTreeOptions& options);

// The retrieval term of one page: sum over heads of w_i p_i(b).
struct MassBump {
  int64_t page = 0;
  float mass = 0.0f;
};

struct MassTreeStats {
  int64_t pages_opened = 0;     // summed over heads: pages whose keys were read
  int64_t pages_screened = 0;   // page summaries scored
  int64_t chunks_screened = 0;  // chunk summaries scored
  int64_t heads_reused = 0;     // heads that reused their kept pages
  int64_t heads_descended = 0;  // heads that ran the full descent
};

// A context's state from step to step (see the file comment): per
// retrieval head, the query of its last full descent and the pages it
// kept. Like MassMemory, a step starts from the state the last earlier
// step left (Begin), so repeating a step repeats its choice. Bounded: per
// head dim floats and reuse_max_kept pages. Thread safety: as the
// context's (the caller serialises per context).
struct MassReuse {
  struct Head {
    bool valid = false;
    std::vector<float> query;   // the last full descent's (any norm)
    std::vector<int64_t> kept;  // pages to open again, ascending
    int64_t pages = 0;          // context pages when they were kept
    int32_t age = 0;            // reusing steps since the full descent
  };
  int64_t step = INT64_MIN;
  std::vector<Head> before, now;  // what this step starts from, and leaves
  void Begin(int64_t s, size_t heads) {
    if (s != step) {
      before.swap(now);
      step = s;
    }
    before.resize(heads);
    now.resize(heads);
  }
  size_t MemoryBytes() const;
};

// Reused buffers (grown, never shrunk).
struct MassTreeScratch {
  struct Unit {
    float screen;
    int32_t kind;  // 0 page, 1 chunk
    int64_t index;
  };
  // One thread's descent buffers (one per worker slot).
  struct Work {
    std::vector<Unit> heap;         // screened pages of expanded chunks
    std::vector<Unit> chunk_units;  // candidate chunks
    std::vector<int64_t> candidates;
    std::vector<int64_t> sample_chunks;
    std::vector<int32_t> dots, dots2, dots3;
    std::vector<float> logits;
    std::vector<float> chunk_lb;
    std::vector<float> chunk_pot;       // log T + the best page mean
    std::vector<uint32_t> open_stamp;   // == stamp: opened
    std::vector<uint32_t> chunk_stamp;  // == stamp: expanded
    uint32_t stamp = 0;
  };
  // One retrieval head's descent: what the pages it opened hold.
  struct HeadResult {
    bool ran = false;                // false: an all-zero query, no target
    std::vector<int8_t> q, q_bound;  // q^, then [q^+ | q^-]
    std::vector<int64_t> opened;     // pages opened
    std::vector<double> lse;         // per opened page, same order
    std::vector<double> tail;        // its last copy_lead tokens' lse, same order
    double lz = 0;                   // log z (step 5)
    int64_t strongest = -1;          // the strongest opened key's token
    MassTreeStats stats;
  };
  std::vector<Work> work;         // per worker slot
  std::vector<HeadResult> heads;  // per retrieval head
  struct PageShare {
    int64_t page;
    double share;
  };
  std::vector<PageShare> shares;  // a head's shares per opened page
  std::vector<MassBump> bumps;    // before merging
};

// One context's step: what the descent reads.
struct MassTreeInput {
  // A calibrated context whose KeyTable holds the calibration's head keys
  // (ContextIndex::keys(), calibration(), key_slots(): one slot per
  // retrieval head); both required.
  const KeyTable* table = nullptr;
  const SelectionCalibration* calibration = nullptr;
  absl::Span<const int32_t> slots;
  int32_t dim = 0;
  // R x dim finite values with no all-zero row (the Selector validates).
  absl::Span<const float> head_queries;
  // As MassScores' (key_scorers.h; the strongest key is the strongest of
  // the pages opened); may be null.
  MassMemory* memory = nullptr;
  // The context's reuse state, Begin(step) called; null: every head
  // descends fully.
  MassReuse* reuse = nullptr;
  // With max_slots > 1, the heads' descents (steps 2-5 up to z) run on up
  // to max_slots threads of the pool (the scratch's work has a slot each);
  // the gates and shares then follow in head order on the caller's thread,
  // so the result is the same whatever the threads.
  WorkerPool* pool = nullptr;
  int32_t max_slots = 1;
  uint64_t pool_lane = 0;  // the pool's fairness lane (worker_pool.h)
};

// Appends to *bumps (cleared first) the pages with a retrieval term, in
// ascending page order, one entry per page, and adds to *stats.
// InvalidArgument when the input is not as MassTreeInput says or
// MinHeadMass(calibration) is not > 0.
absl::Status MassTreeBumps(const MassTreeInput& in, const MassTreeOptions& options,
                           MassTreeScratch* scratch, std::vector<MassBump>* bumps,
                           MassTreeStats* stats);

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_SELECT_MASS_TREE_H_
