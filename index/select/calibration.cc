#include "index/select/calibration.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace kvtier::index {
namespace {

constexpr int32_t kMaxQueryHeads = 4096;

absl::Status CheckPrior(const char* name, const std::vector<float>& p) {
  for (size_t i = 0; i < p.size(); ++i) {
    if (!std::isfinite(p[i]) || p[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("calibration.", name, "[", i, "] (", p[i], ") must be finite and >= 0"));
    }
  }
  return absl::OkStatus();
}

int32_t KvHeadOf(const SelectionCalibration& c, const HeadRef& h, int32_t num_kv_heads) {
  const int32_t group = c.num_q_heads / num_kv_heads;
  return h.layer * num_kv_heads + h.q_head / group;
}

// The fields of copy tracking (ValidateCalibration's last checks).
absl::Status ValidateCopyTracking(const SelectionCalibration& c) {
  for (auto [name, v, hi] : {std::tuple{"copy_run", c.copy_run, 4096},
                             std::tuple{"copy_min_blocks", c.copy_min_blocks, 4096},
                             std::tuple{"copy_lead", c.copy_lead, 4096},
                             std::tuple{"copy_hold", c.copy_hold, 1 << 20}}) {
    if (v < 0 || v > hi) {
      return absl::InvalidArgumentError(
          absl::StrCat("calibration.", name, " (", v, ") must be in [0, ", hi, "]"));
    }
  }
  if (c.copy_min_mass != -1.0f && !(c.copy_min_mass >= 0 && c.copy_min_mass < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration.copy_min_mass (", c.copy_min_mass, ") must be -1 or in [0, 1)"));
  }
  if (!(c.copy_weight >= 1 && c.copy_weight <= 64)) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration.copy_weight (", c.copy_weight, ") must be in [1, 64]"));
  }
  if (!(c.uncopied_weight >= 0 && c.uncopied_weight <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration.uncopied_weight (", c.uncopied_weight, ") must be in [0, 1]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateCalibration(const SelectionCalibration& c, const BlockLayout& layout) {
  if (c.num_q_heads == 0) {
    if (!(c == SelectionCalibration{})) {
      return absl::InvalidArgumentError(
          "calibration.num_q_heads is 0 (uncalibrated) but other calibration "
          "fields are set");
    }
    return absl::OkStatus();
  }
  if (c.num_q_heads < 0 || c.num_q_heads > kMaxQueryHeads ||
      c.num_q_heads % layout.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration.num_q_heads (", c.num_q_heads,
                     ") must be a multiple of the profile's num_kv_heads (", layout.num_kv_heads,
                     ") in [1, ", kMaxQueryHeads, "]"));
  }
  if (c.retrieval_heads.size() > static_cast<size_t>(kMaxRetrievalHeads)) {
    return absl::InvalidArgumentError(absl::StrCat("calibration.retrieval_heads has ",
                                                   c.retrieval_heads.size(), " heads, at most ",
                                                   kMaxRetrievalHeads));
  }
  for (size_t i = 0; i < c.retrieval_heads.size(); ++i) {
    const HeadRef& h = c.retrieval_heads[i];
    if (h.layer < 0 || h.layer >= layout.num_layers || h.q_head < 0 || h.q_head >= c.num_q_heads) {
      return absl::InvalidArgumentError(absl::StrCat(
          "calibration.retrieval_heads[", i, "] (layer ", h.layer, ", q_head ", h.q_head,
          ") is outside ", layout.num_layers, " layers x ", c.num_q_heads, " query heads"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (c.retrieval_heads[j] == h) {
        return absl::InvalidArgumentError(
            absl::StrCat("calibration.retrieval_heads[", i, "] repeats retrieval_heads[", j, "]"));
      }
    }
  }
  if (c.prior.empty() || c.prior.size() > static_cast<size_t>(kMaxPriorBlocks) ||
      c.prior_all.size() != c.prior.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "calibration.prior (", c.prior.size(), " entries) and prior_all (", c.prior_all.size(),
        ") must have the same length in [1, ", kMaxPriorBlocks, "]"));
  }
  if (absl::Status s = CheckPrior("prior", c.prior); !s.ok()) return s;
  if (absl::Status s = CheckPrior("prior_all", c.prior_all); !s.ok()) return s;
  if (!c.head_weights.empty() && c.head_weights.size() != c.retrieval_heads.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "calibration.head_weights has ", c.head_weights.size(),
        " entries; expected none or one per retrieval head (", c.retrieval_heads.size(), ")"));
  }
  for (size_t i = 0; i < c.head_weights.size(); ++i) {
    if (!(c.head_weights[i] > 0 && c.head_weights[i] <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat("calibration.head_weights[", i, "] (",
                                                     c.head_weights[i], ") must be in (0, 1]"));
    }
  }
  if (!(c.head_min_mass >= 0 && c.head_min_mass < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration.head_min_mass (", c.head_min_mass, ") must be in [0, 1)"));
  }
  if (!std::isfinite(c.softmax_scale) || c.softmax_scale < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration.softmax_scale (", c.softmax_scale,
                     ") must be finite and >= 0 (0 = 1/sqrt(head_dim))"));
  }
  for (auto [name, v] :
       {std::pair{"sink_blocks", c.sink_blocks}, std::pair{"local_blocks", c.local_blocks}}) {
    if (v < -1 || v > kMaxForcedBlocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("calibration.", name, " (", v, ") must be in [0, ", kMaxForcedBlocks, "]"));
    }
  }
  for (auto [name, v] :
       {std::pair{"sink_mass", c.sink_mass}, std::pair{"sink_mass_all", c.sink_mass_all}}) {
    if (!(v == -1.0f || (std::isfinite(v) && v >= 0))) {
      return absl::InvalidArgumentError(
          absl::StrCat("calibration.", name, " (", v, ") must be finite and >= 0 (or unset)"));
    }
  }
  if ((c.sink_mass == -1.0f) != (c.sink_mass_all == -1.0f)) {
    return absl::InvalidArgumentError(
        "calibration.sink_mass and sink_mass_all: set both or neither");
  }
  if (!(c.retrieval_share > 0 && c.retrieval_share <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration.retrieval_share (", c.retrieval_share, ") must be in (0, 1]"));
  }
  return ValidateCopyTracking(c);
}

std::vector<int32_t> KeyHeadsOf(const SelectionCalibration& c, int32_t num_kv_heads) {
  std::vector<int32_t> out;
  if (!c.calibrated()) return out;
  for (const HeadRef& h : c.retrieval_heads) {
    out.push_back(KvHeadOf(c, h, num_kv_heads));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<int32_t> KeyHeadSlots(const SelectionCalibration& c, int32_t num_kv_heads) {
  const std::vector<int32_t> heads = KeyHeadsOf(c, num_kv_heads);
  std::vector<int32_t> out;
  for (const HeadRef& h : c.retrieval_heads) {
    const int32_t lkv = KvHeadOf(c, h, num_kv_heads);
    out.push_back(
        static_cast<int32_t>(std::lower_bound(heads.begin(), heads.end(), lkv) - heads.begin()));
  }
  return out;
}

}  // namespace kvtier::index
