#include "index/select/stability.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace kvtier::index {

absl::Status ValidateStabilityOptions(const StabilityOptions& o) {
  if (o.window_steps < 1 || o.window_steps > kMaxStabilityWindow) {
    return absl::InvalidArgumentError(absl::StrCat("stability.window_steps (", o.window_steps,
                                                   ") must be in [1, ", kMaxStabilityWindow, "]"));
  }
  if (!std::isfinite(o.theta)) {
    return absl::InvalidArgumentError("stability.theta is not finite");
  }
  if (!(o.weight >= 0.0f && o.weight <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("stability.weight (", o.weight, ") must be in [0, 1]"));
  }
  if (!(o.hold_threshold > 0.0f) || !std::isfinite(o.hold_threshold)) {
    return absl::InvalidArgumentError(
        absl::StrCat("stability.hold_threshold (", o.hold_threshold, ") must be > 0"));
  }
  return absl::OkStatus();
}

namespace {

uint64_t WindowMask(int32_t window) {
  return window >= 64 ? ~uint64_t{0} : (uint64_t{1} << window) - 1;
}

}  // namespace

void StabilityTracker::Resize(int64_t num_pages) {
  if (num_pages > this->num_pages()) {
    Slot fresh;
    fresh.last_step = step_;
    slots_.resize(static_cast<size_t>(num_pages), fresh);
  }
}

absl::Status StabilityTracker::BeginStep(int64_t step) {
  if (call_ != 0 && step < step_) {
    return absl::InvalidArgumentError(
        absl::StrCat("step (", step, ") is before the context's last step (", step_, ")"));
  }
  if (call_ == 0) {
    for (Slot& s : slots_) s.last_step = step;
  }
  if (call_ == UINT32_MAX) {
    // The call counter wraps: fold the log into every slot and clear the
    // marks, so that no old call matches a new one.
    for (int64_t p = 0; p < num_pages(); ++p) {
      Slot e = Effective(p);
      e.observed_call = 0;
      slots_[p] = e;
    }
    log_.clear();
    call_ = 0;
  }
  step_ = step;
  ++call_;
  // Entries older than 64 steps only tell that their pages were observed.
  size_t drop = 0;
  while (drop < log_.size() && step_ - log_[drop].step >= kMaxStabilityWindow) {
    pruned_observed_below_ = std::max(pruned_observed_below_, log_[drop].n);
    ++drop;
  }
  log_.erase(log_.begin(), log_.begin() + static_cast<std::ptrdiff_t>(drop));
  if (listing_ && step_ - last_window_step_ >= kMaxStabilityWindow) {
    listing_ = false;
    for (int64_t p : recent_) slots_[p].listed = false;
    recent_.clear();
  }
  // The list is pruned once per 64 steps (a step of a scorer that observes
  // thousands of pages must not pay for scanning them all again).
  if (listing_ && step_ - recent_pruned_step_ >= kMaxStabilityWindow) {
    recent_pruned_step_ = step_;
    size_t kept = 0;
    for (int64_t p : recent_) {
      if (step_ - slots_[p].last_step < kMaxStabilityWindow) {
        recent_[kept++] = p;
      } else {
        slots_[p].listed = false;
      }
    }
    recent_.resize(kept);
  }
  return absl::OkStatus();
}

StabilityTracker::Slot StabilityTracker::Effective(int64_t page) const {
  Slot s = slots_[page];
  // Observed (by a range) before the oldest entry kept: at least 64 steps
  // ago, which is all a window of <= 64 steps can tell.
  if (s.first_step == kNever && page < pruned_observed_below_) {
    s.first_step = step_ - kMaxStabilityWindow;
  }
  size_t i = log_.size();
  while (i > 0 && log_[i - 1].call > s.observed_call) --i;
  for (; i < log_.size(); ++i) {
    const RangeEntry& e = log_[i];
    if (page < e.edge || page >= e.n) continue;
    if (s.first_step == kNever) s.first_step = e.step;
    const int64_t d = e.step - s.last_step;
    s.bits = ((d >= 64 ? 0 : s.bits << d) & ~uint64_t{1}) | 1u;
    s.last_step = e.step;
    s.observed_call = e.call;
  }
  return s;
}

uint64_t StabilityTracker::Aged(const Slot& s) const {
  const int64_t d = step_ - s.last_step;
  return d >= 64 ? 0 : (s.bits << d);
}

int32_t StabilityTracker::Span(const Slot& s, int32_t window) const {
  if (s.first_step == kNever) return 0;
  const int64_t age = step_ - s.first_step + 1;
  return static_cast<int32_t>(std::clamp<int64_t>(age, 1, window));
}

void StabilityTracker::Observe(int64_t page, bool relevant) {
  Slot& s = slots_[page];
  if (NeedsFold(s, page)) s = Effective(page);  // fold the ranges first
  if (s.first_step == kNever) s.first_step = step_;
  s.bits = (Aged(s) & ~uint64_t{1}) | (relevant ? 1u : 0u);
  s.last_step = step_;
  s.observed_call = call_;
  if (listing_ && !s.listed) {
    s.listed = true;
    recent_.push_back(page);
  }
}

bool StabilityTracker::NoteWindowStep(int32_t window) {
  if (!listing_) {
    listing_ = true;
    listing_since_ = step_;
    recent_pruned_step_ = step_;
  }
  last_window_step_ = step_;
  return step_ - listing_since_ >= std::clamp(window, 1, kMaxStabilityWindow);
}

void StabilityTracker::ObserveRange(int64_t edge, int64_t n) {
  // At most one entry per step for the last 64 steps: its whole capacity
  // at once, not seven doublings spread over the window's first steps.
  if (log_.capacity() == 0) log_.reserve(kMaxStabilityWindow + 1);
  log_.push_back(RangeEntry{call_, step_, edge, n});
}

float StabilityTracker::Stability(int64_t page, int32_t window) const {
  const Slot& raw = slots_[page];
  Slot folded;
  const Slot& s = NeedsFold(raw, page) ? (folded = Effective(page)) : raw;
  const int32_t span = Span(s, std::clamp(window, 1, kMaxStabilityWindow));
  if (span == 0) return 0.0f;
  return static_cast<float>(std::popcount(Aged(s) & WindowMask(span))) / static_cast<float>(span);
}

bool StabilityTracker::RisingBits(uint64_t aged, int32_t span) {
  if (span == 0) return false;
  const uint64_t b = aged & WindowMask(span);
  if ((b & 1u) == 0) return false;
  const int32_t newer = (span + 1) / 2;
  const uint64_t newer_mask = (uint64_t{1} << newer) - 1;
  return std::popcount(b & newer_mask) > std::popcount(b >> newer);
}

bool StabilityTracker::Rising(int64_t page, int32_t window) const {
  const Slot& raw = slots_[page];
  Slot folded;
  const Slot& s = NeedsFold(raw, page) ? (folded = Effective(page)) : raw;
  return RisingBits(Aged(s), Span(s, std::clamp(window, 1, kMaxStabilityWindow)));
}

StabilityTracker::UniformRange StabilityTracker::Uniform(int32_t window) const {
  const int32_t w = std::clamp(window, 1, kMaxStabilityWindow);
  UniformRange u;
  uint64_t bits = 0;
  bool any = false;
  int64_t lo = 0, hi = INT64_MAX;
  // Pages below old_n were observed at least w steps ago (span = w).
  int64_t old_n = pruned_observed_below_;
  for (const RangeEntry& e : log_) {
    const int64_t age = step_ - e.step;  // 0: this step
    if (age < w) {
      any = true;
      bits |= uint64_t{1} << age;
      lo = std::max(lo, e.edge);
      hi = std::min(hi, e.n);
    }
    if (age + 1 >= w) old_n = std::max(old_n, e.n);
  }
  if (!any) return u;
  u.lo = lo;
  u.hi = std::min(hi, old_n);
  u.stability = static_cast<float>(std::popcount(bits & WindowMask(w))) / static_cast<float>(w);
  u.rising = RisingBits(bits, w);
  return u;
}

void StabilityTracker::CollectHeld(float min_stability, int32_t window,
                                   std::vector<int64_t>* out) const {
  for (int64_t page : chosen_) {
    if (page >= num_pages() || ObservedThisStep(page)) continue;
    if (Stability(page, window) >= min_stability) out->push_back(page);
  }
}

size_t StabilityTracker::MemoryBytes() const {
  return sizeof(*this) + slots_.capacity() * sizeof(Slot) + chosen_.capacity() * sizeof(int64_t) +
         log_.capacity() * sizeof(RangeEntry) + recent_.capacity() * sizeof(int64_t);
}

}  // namespace kvtier::index
