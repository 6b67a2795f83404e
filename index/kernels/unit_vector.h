// Scale-safe norms and unit vectors. Every value is divided by the largest
// magnitude before it is squared, so any finite input (1e-38 .. 3e38 per
// component) gives a finite norm and exactly the direction of the input:
// an anchor of 1e30 in every component and one of 1 in every component
// normalise to the same unit vector.
//
// Thread safety: pure functions.
#ifndef KVTIER_INDEX_KERNELS_UNIT_VECTOR_H_
#define KVTIER_INDEX_KERNELS_UNIT_VECTOR_H_

#include <cstddef>

namespace kvtier::index {

// Euclidean norm of v[0, n), computed in double after scaling; finite for
// finite input (it may exceed FLT_MAX, hence double).
double StableNorm(const float* v, size_t n);

// out[i] = v[i] / |v|. Returns false (and writes zeros) when v is all zero.
// out may alias v.
bool UnitVector(const float* v, size_t n, float* out);

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_KERNELS_UNIT_VECTOR_H_
