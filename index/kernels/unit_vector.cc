#include "index/kernels/unit_vector.h"

#include <algorithm>
#include <cmath>

namespace kvtier::index {
namespace {

float MaxAbs(const float* v, size_t n) {
  float m = 0.0f;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(v[i]));
  return m;
}

}  // namespace

double StableNorm(const float* v, size_t n) {
  const double scale = MaxAbs(v, n);
  if (!(scale > 0)) return 0.0;
  double s = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = v[i] / scale;
    s += x * x;
  }
  return std::sqrt(s) * scale;
}

bool UnitVector(const float* v, size_t n, float* out) {
  const double scale = MaxAbs(v, n);
  if (!(scale > 0)) {
    std::fill(out, out + n, 0.0f);
    return false;
  }
  double s = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = v[i] / scale;
    s += x * x;
  }
  const double inv = 1.0 / std::sqrt(s);
  for (size_t i = 0; i < n; ++i) {
    out[i] = static_cast<float>((v[i] / scale) * inv);
  }
  return true;
}

}  // namespace kvtier::index
