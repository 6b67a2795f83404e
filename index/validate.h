// Input checks shared by the index's public entry points. Every failure is
// InvalidArgument naming the field.
//
// Thread safety: pure functions.
#ifndef KVTIER_INDEX_VALIDATE_H_
#define KVTIER_INDEX_VALIDATE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace kvtier::index {

// `v` must hold exactly `dim` finite values; with require_nonzero, a nonzero
// L2 norm too.
absl::Status CheckVector(const char* field, absl::Span<const float> v, int64_t dim,
                         bool require_nonzero);

// `n` values at `v`, all finite.
absl::Status CheckFinite(const char* field, const float* v, size_t n);

// 1 <= v <= max; the message names "<prefix>.<field>".
absl::Status CheckCount(const char* prefix, const char* field, int64_t v, int64_t max);

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_VALIDATE_H_
