// Int8 x int8 dot products with exact int32 sums: the kernel of the mass
// scorer's tree (mass_tree.h), which scores the retrieval heads' int8 keys
// against an int8 query.
//
//   DotRowsS8(rows, count, stride, dim, q, out)
//     out[r] = sum_{d < dim} q[d] * rows[r * stride + d]
//
// rows and q hold values in [-127, 127] (-128 is not allowed: the AVX2
// kernel takes |x|; summary.h's QuantizeInt8 makes such values), dim is at
// most kMaxInt8Dim, so every sum fits int32
// exactly and every kernel returns the same integers.
//
// Kernels, chosen once at run time: AVX-512 VNNI (vpdpbusd on 64 bytes: the
// row is made unsigned by adding 128 and the query's sum times 128 is
// subtracted again), AVX2 (vpmaddubsw of |q| with the row signed by q: each
// 16-bit pair sum is at most 2 * 127 * 127 < 2^15, so it never saturates),
// and a portable loop. Int8DotIsa() names the one in use; tests force each
// with SetInt8DotIsaForTest.
//
// Thread safety: pure functions of their arguments.
#ifndef KVTIER_INDEX_KERNELS_INT8_DOT_H_
#define KVTIER_INDEX_KERNELS_INT8_DOT_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace kvtier::index {

inline constexpr int32_t kMaxInt8Dim = 65536;

void DotRowsS8(const int8_t* rows, int64_t count, size_t stride, int32_t dim, const int8_t* q,
               int32_t* out);

// "avx512vnni", "avx2" or "portable".
absl::string_view Int8DotIsa();

// Tests only: forces a kernel ("avx512vnni", "avx2", "portable"; "" = the
// detected one). Returns false (and changes nothing) when the CPU lacks it.
bool SetInt8DotIsaForTest(absl::string_view isa);

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_KERNELS_INT8_DOT_H_
