// Fuzz target: the block summary codec (index/summary/summary_codec.h).
//
// Input: byte 0, bit 0 set: the checksum field (bytes 20..23 of the blob)
// is recomputed before decoding, so mutations reach the sections behind
// it; bytes 1.. are the blob.
//
// Checked (a violation abort()s):
//   - DecodeSummary returns a summary, INVALID_ARGUMENT or DATA_LOSS;
//   - a decoded summary has the shape its header implies (every section
//     D or L*D long, R heads x T tokens x D keys) and only finite values;
//   - it re-encodes in fp32 (lossless for anything the codec decodes) and
//     decodes back bit for bit; the re-encoding in the blob's own element
//     encoding and int8 choice succeeds.
//
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "index/summary/summary_codec.h"

namespace {

using kvtier::index::BlockSummary;

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "summary_codec_fuzz: %s\n", what);
  std::abort();
}

// FNV-1a 32 over [0, 20) and [24, end): the codec's checksum field.
void Seal(std::string* blob) {
  if (blob->size() < kvtier::index::kSummaryHeaderBytes) return;
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < blob->size(); ++i) {
    if (i >= 20 && i < 24) continue;
    h ^= static_cast<uint8_t>((*blob)[i]);
    h *= 16777619u;
  }
  std::memcpy(&(*blob)[20], &h, 4);
}

bool Finite(const std::vector<float>& v) {
  for (float f : v) {
    if (!std::isfinite(f)) return false;
  }
  return true;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

void CheckShape(const BlockSummary& s) {
  const size_t D = static_cast<size_t>(s.dim);
  const size_t LD = static_cast<size_t>(s.num_layers) * D;
  Check(s.dim >= 1 && s.mean.size() == D, "mean is not D long");
  Check(s.weighted_mean.empty() || s.weighted_mean.size() == D, "weighted_mean is not D long");
  Check(s.min.size() == s.max.size() && (s.min.empty() || s.min.size() == D), "bounds shape");
  Check(s.layer_mean.empty() || s.layer_mean.size() == LD, "layer_mean is not L*D long");
  Check(s.layer_min.size() == s.layer_max.size() &&
            (s.layer_min.empty() || (s.layer_min.size() == LD && !s.layer_mean.empty())),
        "layer bounds shape");
  const size_t R = s.key_heads.size();
  Check(s.key_scales.size() == R && s.head_keys.size() == R * static_cast<size_t>(s.key_tokens) * D,
        "head keys shape");
  Check(Finite(s.mean) && Finite(s.weighted_mean) && Finite(s.min) && Finite(s.max) &&
            Finite(s.layer_mean) && Finite(s.layer_min) && Finite(s.layer_max) &&
            Finite(s.key_scales) && std::isfinite(s.radius),
        "a decoded value is not finite");
}

// True when some layer's largest |layer_mean| is positive and below
// 127 / FLT_MAX.
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string blob(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) != 0) Seal(&blob);
  auto decoded = kvtier::index::DecodeSummary(blob);
  if (!decoded.ok()) {
    const absl::StatusCode code = decoded.status().code();
    Check(code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kDataLoss,
          "decode error is neither INVALID_ARGUMENT nor DATA_LOSS");
    return 0;
  }
  const BlockSummary& s = *decoded;
  Check(Finite(s.layer_mean), "a decoded layer_mean holds a non-finite value");
  CheckShape(s);

  kvtier::index::SummaryCodecOptions fp32;
  fp32.encoding = kvtier::index::SummaryEncoding::kFp32;
  auto encoded = kvtier::index::EncodeSummary(s, fp32);
  Check(encoded.ok(), "a decoded summary does not re-encode in fp32");
  auto again = kvtier::index::DecodeSummary(*encoded);
  Check(again.ok(), "the fp32 re-encoding does not decode");
  const BlockSummary& t = *again;
  Check(t.dim == s.dim && t.weights_version == s.weights_version &&
            (s.min.empty() || std::memcmp(&t.radius, &s.radius, 4) == 0) &&
            SameBits(t.mean, s.mean) && SameBits(t.weighted_mean, s.weighted_mean) &&
            SameBits(t.min, s.min) && SameBits(t.max, s.max) &&
            SameBits(t.layer_mean, s.layer_mean) && SameBits(t.layer_min, s.layer_min) &&
            SameBits(t.layer_max, s.layer_max) && t.key_heads == s.key_heads &&
            t.key_tokens == s.key_tokens && t.head_keys == s.head_keys &&
            SameBits(t.key_scales, s.key_scales) &&
            (s.layer_mean.empty() ? t.num_layers == 0 : t.num_layers == s.num_layers),
        "fp32 round trip changed the summary");

  kvtier::index::SummaryCodecOptions own;
  own.encoding = static_cast<kvtier::index::SummaryEncoding>(static_cast<uint8_t>(blob[5]));
  own.layer_int8 = (static_cast<uint8_t>(blob[6]) & (1u << 4)) != 0;
  Check(kvtier::index::EncodeSummary(s, own).ok(),
        "a decoded summary does not re-encode in its own encoding");
  return 0;
}
