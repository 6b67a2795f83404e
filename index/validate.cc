#include "index/validate.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace kvtier::index {

absl::Status CheckFinite(const char* field, const float* v, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(v[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "] (", v[i], ") is not finite"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckVector(const char* field, absl::Span<const float> v, int64_t dim,
                         bool require_nonzero) {
  if (static_cast<int64_t>(v.size()) != dim) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " has ", v.size(), " elements, expected dim ", dim));
  }
  if (absl::Status s = CheckFinite(field, v.data(), v.size()); !s.ok()) {
    return s;
  }
  if (require_nonzero) {
    double n2 = 0;
    for (float x : v) n2 += double{x} * x;
    if (!(n2 > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(field, " has zero norm"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckCount(const char* prefix, const char* field, int64_t v, int64_t max) {
  if (v < 1 || v > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, ".", field, " (", v, ") must be in [1, ", max, "]"));
  }
  return absl::OkStatus();
}

}  // namespace kvtier::index
