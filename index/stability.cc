#include "index/stability.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace kvtier::index {

absl::Status ValidateStabilityOptions(const StabilityOptions& o) {
  if (o.window_steps < 1 || o.window_steps > kMaxStabilityWindow) {
    return absl::InvalidArgumentError(
        absl::StrCat("stability.window_steps (", o.window_steps,
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
    return absl::InvalidArgumentError(absl::StrCat(
        "stability.hold_threshold (", o.hold_threshold, ") must be > 0"));
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
    return absl::InvalidArgumentError(absl::StrCat(
        "step (", step, ") is before the context's last step (", step_, ")"));
  }
  if (call_ == 0) {
    for (Slot& s : slots_) s.last_step = step;
  }
  step_ = step;
  ++call_;
  if (call_ == 0) {  // wrapped: clear marks so none matches by accident
    for (Slot& s : slots_) s.observed_call = 0;
    call_ = 1;
  }
  return absl::OkStatus();
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
  if (s.first_step == kNever) s.first_step = step_;
  s.bits = (Aged(s) & ~uint64_t{1}) | (relevant ? 1u : 0u);
  s.last_step = step_;
  s.observed_call = call_;
}

float StabilityTracker::Stability(int64_t page, int32_t window) const {
  const Slot& s = slots_[page];
  const int32_t span = Span(s, std::clamp(window, 1, kMaxStabilityWindow));
  if (span == 0) return 0.0f;
  return static_cast<float>(std::popcount(Aged(s) & WindowMask(span))) /
         static_cast<float>(span);
}

bool StabilityTracker::Rising(int64_t page, int32_t window) const {
  window = Span(slots_[page], std::clamp(window, 1, kMaxStabilityWindow));
  if (window == 0) return false;
  const uint64_t b = Aged(slots_[page]) & WindowMask(window);
  if ((b & 1u) == 0) return false;
  const int32_t newer = (window + 1) / 2;
  const uint64_t newer_mask = (uint64_t{1} << newer) - 1;
  return std::popcount(b & newer_mask) > std::popcount(b >> newer);
}

void StabilityTracker::CollectHeld(float min_stability, int32_t window,
                                   std::vector<int64_t>* out) const {
  for (int64_t page : chosen_) {
    if (page >= num_pages() || ObservedThisStep(page)) continue;
    if (Stability(page, window) >= min_stability) out->push_back(page);
  }
}

size_t StabilityTracker::MemoryBytes() const {
  return sizeof(*this) + slots_.capacity() * sizeof(Slot) +
         chosen_.capacity() * sizeof(int64_t);
}

}  // namespace kvtier::index
