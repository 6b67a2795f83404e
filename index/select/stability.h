// Per-(context, block) relevance history: for every page a bit window of the
// last W steps of "affinity > theta"; stability = set bits / min(W, age),
// where age is the number of steps since the page was first observed
// (counting the current one). A page is judged over its own life: a block
// appended a moment ago that was relevant at every step it existed has
// stability 1, like an old block relevant at every one of the last W steps,
// so new blocks are not ranked below old ones for lack of history. The
// tracker keeps the last 64 steps; W is chosen per query (selector option),
// so it can be tuned without rebuilding contexts.
//
// Pages are aged lazily (a page's window is shifted by the number of steps
// since it was last touched), so a step costs time in proportion to the
// pages observed plus the pages chosen at the previous step, never to the
// context's length.
//
// Range observations: ObserveRange(edge, n) records "every page in [edge,
// n) was relevant at this call" as one log entry instead of writing each
// page's slot (the sliding window of the uncalibrated mass scorer observes
// a fifth of the context relevant every step). A page's window is the
// slot's bits with the log entries after its last explicit Observe folded
// in; Observe folds them into the slot first. The log keeps the last 64
// steps. Pages that no entry of the last W steps missed and that nothing
// observed explicitly within them share one window (Uniform), so a caller
// can rank them without visiting each one.
//
// Holding: the pages chosen at the previous step (SetChosen) that were not
// observed this step but are still stable are "held" candidates: a block
// that stayed relevant is not displaced because one step's masks skipped it.
//
// Rising: a page is rising at the current step when it was relevant at this
// step and the newer half of its window holds more set bits than the older
// half; the Selector reports rising pages it did not choose as prefetch
// candidates.
//
// Thread safety: not synchronised; used by one Select of its context at a
// time (the caller serialises per context).
#ifndef KVTIER_INDEX_SELECT_STABILITY_H_
#define KVTIER_INDEX_SELECT_STABILITY_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace kvtier::index {

inline constexpr int32_t kMaxStabilityWindow = 64;

// The initialisers are the shipped daemon's (select.window_steps,
// select.theta, select.stability_weight, select.hold_threshold;
// ConfigTest.ShippedSelectorSettingsAreTheLibraryDefaults).
struct StabilityOptions {
  int32_t window_steps = 64;  // W, in [1, 64]
  float theta = 0.8f;         // relevance threshold on the [0,1] affinity
  // Final rank = (1 - weight) * score + weight * stability, weight in [0,1].
  float weight = 0.5f;
  // Pages chosen at the previous step and at least this stable stay
  // candidates even when the hierarchy dropped their chunk, so a one-step
  // change of the masks cannot evict a block that stayed relevant. > 0;
  // values above 1 disable holding.
  float hold_threshold = 0.5f;
};

// InvalidArgument naming the field when out of range.
absl::Status ValidateStabilityOptions(const StabilityOptions& options);

class StabilityTracker {
 public:
  StabilityTracker() = default;

  // Grows to num_pages (new pages start with an empty window).
  void Resize(int64_t num_pages);
  int64_t num_pages() const { return static_cast<int64_t>(slots_.size()); }

  // Starts a step; steps never go back (the same step again re-observes).
  // InvalidArgument when step < the last step begun.
  absl::Status BeginStep(int64_t step);
  int64_t step() const { return step_; }
  bool begun() const { return call_ != 0; }

  // Records this step's bit of `page` (overwrites an earlier call of the
  // same step). Requires page < num_pages().
  void Observe(int64_t page, bool relevant);
  // Records a relevant bit at this call for every page in [edge, n) without
  // visiting them. Requires 0 <= edge <= n <= num_pages(), every page below
  // `edge` observed at least once by the end of this call (a page below an
  // entry that has aged out counts as observed 64 or more steps ago), and
  // at most one range per call.
  void ObserveRange(int64_t edge, int64_t n);
  bool ObservedThisStep(int64_t page) const {
    return slots_[page].observed_call == call_ ||
           (!log_.empty() && log_.back().call == call_ && log_.back().edge <= page &&
            page < log_.back().n);
  }

  // Stability over the last min(window, age) steps (window in 1..64) in
  // [0, 1] at the current step (pages not observed this step count a 0 bit
  // for it); 0 for a page never observed.
  float Stability(int64_t page, int32_t window) const;
  bool Rising(int64_t page, int32_t window) const;

  // Every page below observed_below() has been observed at least once
  // (callers that observe a whole range of pages raise it; 0 by default).
  int64_t observed_below() const { return observed_below_; }
  void RaiseObservedBelow(int64_t page) { observed_below_ = std::max(observed_below_, page); }
  // Records the pages chosen at this step (replacing the previous list).
  void SetChosen(const std::vector<int64_t>& pages) { chosen_ = pages; }

  // Called at every window step (before ObserveRange): from then on, until
  // 64 steps pass without one, Observe lists the pages it observes (for
  // recently_observed()). Returns whether the list already covers the last
  // `window` steps, i.e. whether Uniform(window) may be used.
  bool NoteWindowStep(int32_t window);

  // The pages whose windows over the last `window` steps are identical: in
  // [lo, hi) and not ExplicitWithin(page, window). Their Stability and
  // Rising over `window` are `stability` and `rising`. lo >= hi when there
  // are none.
  struct UniformRange {
    int64_t lo = 0, hi = 0;
    float stability = 0.0f;
    bool rising = false;
  };
  UniformRange Uniform(int32_t window) const;
  // Whether `page` was observed by Observe within the last `window` steps.
  bool ExplicitWithin(int64_t page, int32_t window) const {
    const Slot& s = slots_[page];
    return s.first_step != kNever && step_ - s.last_step < window;
  }
  // While listing (NoteWindowStep): every page observed by Observe since
  // listing began and within the last 64 steps, each once, among others
  // observed earlier (pruned once per 64 steps).
  const std::vector<int64_t>& recently_observed() const { return recent_; }

  // Appends to *out every page of the last SetChosen list that was not
  // observed this step and whose stability over `window` is
  // >= min_stability.
  void CollectHeld(float min_stability, int32_t window, std::vector<int64_t>* out) const;
  size_t MemoryBytes() const;

  // Tests only: sets the call counter (to reach its wrap-around).
  void TEST_SetCalls(uint32_t calls) { call_ = calls; }

 private:
  static constexpr int64_t kNever = INT64_MIN;
  struct Slot {
    uint64_t bits = 0;  // bit i: relevant at step last_step - i
    int64_t last_step = 0;
    int64_t first_step = kNever;  // step of the first Observe
    uint32_t observed_call = 0;
    bool listed = false;  // in recent_
  };
  struct RangeEntry {  // ObserveRange: [edge, n) relevant at `call`
    uint32_t call;
    int64_t step, edge, n;
  };
  // The slot of `page` with the log entries after its last Observe folded
  // in: what the page's window is now.
  Slot Effective(int64_t page) const;
  // Whether Effective(page) differs from the stored slot (cheap; inline so
  // that scorers without window steps pay one comparison).
  bool NeedsFold(const Slot& s, int64_t page) const {
    return (!log_.empty() && log_.back().call > s.observed_call) ||
           (s.first_step == kNever && page < pruned_observed_below_);
  }
  // min(window, steps since the page's first observation + 1); 0 if never.
  int32_t Span(const Slot& s, int32_t window) const;
  uint64_t Aged(const Slot& s) const;
  static bool RisingBits(uint64_t aged, int32_t span);

  int64_t step_ = 0;
  uint32_t call_ = 0;
  std::vector<Slot> slots_;
  std::vector<int64_t> chosen_;
  int64_t observed_below_ = 0;
  std::vector<RangeEntry> log_;  // ascending call; the last 64 steps
  // Every page below it was observed at or before a pruned log entry (so
  // at least 64 steps ago).
  int64_t pruned_observed_below_ = 0;
  std::vector<int64_t> recent_;  // pages with `listed`
  int64_t recent_pruned_step_ = 0;
  bool listing_ = false;  // window steps lately: Observe lists pages
  int64_t listing_since_ = 0;
  int64_t last_window_step_ = 0;
};

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_SELECT_STABILITY_H_
