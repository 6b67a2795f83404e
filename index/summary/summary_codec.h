// Byte encoding of a BlockSummary (the catalog stores it as an opaque blob).
//
// All integers and floats little endian.
//
//   offset size  field
//   0      4     magic "KVSB"
//   4      1     format version: 1, or 2 when flag bit 4 or 5 is set
//   5      1     element encoding: 1 = fp32, 2 = fp16 (vector sections)
//   6      2     flags: bit 0 weighted_mean, bit 1 bounds (min, max, radius),
//                bit 2 layer_mean, bit 3 layer bounds, bit 4 layer_mean is
//                int8 (needs bit 2), bit 5 head keys; other bits must be 0
//   8      2     dim D (1 .. kMaxHeadDim)
//   10     2     num_layers L (1 .. kMaxLayers when bit 2 is set, else 0)
//   12     4     weights_version
//   16     4     radius (fp32; 0 unless bit 1)
//   20     4     checksum: FNV-1a 32 over bytes [0, 20) and [24, end)
//   24     ...   sections, each D or L*D elements, in this order and only
//                when flagged: mean[D], weighted_mean[D], min[D], max[D],
//                layer_mean[L*D], layer_min[L*D], layer_max[L*D]
//                With bit 4, layer_mean is instead L fp32 scales followed by
//                L*D int8 values (value = int8 * scale of its layer).
//                With bit 5, last: u32 R, u32 T, R u32 key heads (ascending),
//                R fp32 scales, R*T*D int8 keys.
//
// The blob has exactly the length these fields imply. fp16 sections halve
// the size at ~1e-3 relative precision (enough for ranking).
//
// Thread safety: pure functions.
#ifndef KVTIER_INDEX_SUMMARY_SUMMARY_CODEC_H_
#define KVTIER_INDEX_SUMMARY_SUMMARY_CODEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "index/summary/summary.h"

namespace kvtier::index {

inline constexpr uint8_t kSummaryFormatVersion = 2;  // newest written
inline constexpr size_t kSummaryHeaderBytes = 24;

enum class SummaryEncoding : uint8_t { kFp32 = 1, kFp16 = 2 };

struct SummaryCodecOptions {
  SummaryEncoding encoding = SummaryEncoding::kFp16;  // vector sections
  // layer_mean as int8 with one scale per layer: L * (D + 4) bytes instead
  // of L * D * 2 (fp16); ~0.4% relative error per component, enough for
  // ranking (docs/QUALITY.md measures it).
  bool layer_int8 = false;
};

// Encodes `summary`. InvalidArgument (naming the field) when a section has
// the wrong length, a value is not finite, or (fp16) a value overflows
// binary16.
absl::StatusOr<std::string> EncodeSummary(const BlockSummary& summary,
                                          const SummaryCodecOptions& options);
absl::StatusOr<std::string> EncodeSummary(const BlockSummary& summary, SummaryEncoding encoding);

// Decodes a blob written by EncodeSummary. Truncated, oversized or corrupt
// input (bad magic, version, flags, lengths, checksum, non-finite values) is
// InvalidArgument (DataLoss for a checksum mismatch), never a partial result.
absl::StatusOr<BlockSummary> DecodeSummary(absl::string_view bytes);

// The `mean` section of an encoded summary, read without decoding the other
// sections or verifying the checksum: for ranking under a lock, where a full
// decode of a 28-layer summary (~8 KiB) costs ~25 us. A blob of the newest
// format version on a little-endian host is read from its header (magic,
// element encoding, dim) and first section; any other takes the full
// DecodeSummary. nullopt when the blob is no summary or has no mean.
std::optional<std::vector<float>> PeekSummaryMean(absl::string_view bytes);

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_SUMMARY_SUMMARY_CODEC_H_
