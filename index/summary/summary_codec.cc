#include "index/summary/summary_codec.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "index/kernels/simd.h"

namespace kvtier::index {
namespace {

constexpr char kMagic[4] = {'K', 'V', 'S', 'B'};
constexpr uint16_t kFlagWeighted = 1u << 0;
constexpr uint16_t kFlagBounds = 1u << 1;
constexpr uint16_t kFlagLayerMean = 1u << 2;
constexpr uint16_t kFlagLayerBounds = 1u << 3;
constexpr uint16_t kFlagLayerInt8 = 1u << 4;
constexpr uint16_t kFlagHeadKeys = 1u << 5;
constexpr uint16_t kKnownFlags = kFlagWeighted | kFlagBounds | kFlagLayerMean | kFlagLayerBounds |
                                 kFlagLayerInt8 | kFlagHeadKeys;
// Largest head-keys section accepted (bounds a decode of hostile input).
constexpr uint64_t kMaxHeadKeyBytes = uint64_t{64} << 20;

uint32_t Fnv1a(uint32_t h, const char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<uint8_t>(p[i]);
    h *= 16777619u;
  }
  return h;
}

uint32_t Checksum(absl::string_view blob) {
  uint32_t h = Fnv1a(2166136261u, blob.data(), 20);
  return Fnv1a(h, blob.data() + kSummaryHeaderBytes, blob.size() - kSummaryHeaderBytes);
}

template <typename T>
void PutLe(std::string* out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));  // x86-64 and aarch64 are little endian
  out->append(buf, sizeof(T));
}

template <typename T>
T GetLe(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

absl::Status PutSection(std::string* out, const char* name, const std::vector<float>& v,
                        size_t expected, SummaryEncoding enc) {
  if (v.size() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("summary.", name, " has ", v.size(), " elements, expected ", expected));
  }
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) {
      return absl::InvalidArgumentError(absl::StrCat("summary.", name, "[", i, "] is not finite"));
    }
    if (enc == SummaryEncoding::kFp32) {
      PutLe<float>(out, v[i]);
    } else {
      const uint16_t h = simd::FloatToHalf(v[i]);
      if ((h & 0x7c00u) == 0x7c00u) {
        return absl::InvalidArgumentError(
            absl::StrCat("summary.", name, "[", i, "] (", v[i], ") overflows fp16"));
      }
      PutLe<uint16_t>(out, h);
    }
  }
  return absl::OkStatus();
}

absl::Status GetSection(const char** p, const char* name, size_t n, SummaryEncoding enc,
                        std::vector<float>* v) {
  v->resize(n);
  for (size_t i = 0; i < n; ++i) {
    float f;
    if (enc == SummaryEncoding::kFp32) {
      f = GetLe<float>(*p);
      *p += 4;
    } else {
      f = simd::HalfToFloat(GetLe<uint16_t>(*p));
      *p += 2;
    }
    if (!std::isfinite(f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("summary blob: ", name, "[", i, "] is not finite"));
    }
    (*v)[i] = f;
  }
  return absl::OkStatus();
}

absl::Status PutLayerInt8(std::string* out, const BlockSummary& s) {
  const size_t D = static_cast<size_t>(s.dim);
  const size_t L = static_cast<size_t>(s.num_layers);
  if (s.layer_mean.size() != L * D) {
    return absl::InvalidArgumentError(absl::StrCat("summary.layer_mean has ", s.layer_mean.size(),
                                                   " elements, expected ", L * D));
  }
  for (size_t i = 0; i < s.layer_mean.size(); ++i) {
    if (!std::isfinite(s.layer_mean[i])) {
      return absl::InvalidArgumentError(absl::StrCat("summary.layer_mean[", i, "] is not finite"));
    }
  }
  std::vector<int8_t> q(L * D);
  for (size_t l = 0; l < L; ++l) {
    PutLe<float>(out, QuantizeInt8(&s.layer_mean[l * D], D, &q[l * D]));
  }
  out->append(reinterpret_cast<const char*>(q.data()), q.size());
  return absl::OkStatus();
}

absl::Status PutHeadKeys(std::string* out, const BlockSummary& s) {
  const size_t R = s.key_heads.size();
  const size_t per_head = static_cast<size_t>(s.key_tokens) * s.dim;
  if (s.key_tokens < 1 || s.key_tokens > kMaxBlockSizeTokens || s.key_scales.size() != R ||
      s.head_keys.size() != R * per_head) {
    return absl::InvalidArgumentError(absl::StrCat(
        "summary.head_keys has ", s.head_keys.size(), " values and ", s.key_scales.size(),
        " scales for ", R, " heads of ", s.key_tokens, " tokens x ", s.dim, " dims"));
  }
  for (size_t j = 0; j < R; ++j) {
    if (s.key_heads[j] < 0 || (j > 0 && s.key_heads[j] <= s.key_heads[j - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("summary.key_heads[", j, "] must be >= 0, ascending and distinct"));
    }
    if (!std::isfinite(s.key_scales[j]) || s.key_scales[j] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("summary.key_scales[", j, "] must be finite and >= 0"));
    }
  }
  PutLe<uint32_t>(out, static_cast<uint32_t>(R));
  PutLe<uint32_t>(out, static_cast<uint32_t>(s.key_tokens));
  for (int32_t h : s.key_heads) PutLe<uint32_t>(out, static_cast<uint32_t>(h));
  for (float f : s.key_scales) PutLe<float>(out, f);
  out->append(reinterpret_cast<const char*>(s.head_keys.data()), s.head_keys.size());
  return absl::OkStatus();
}

// A summary blob's header fields that shape its body, once checked.
struct DecodedHeader {
  SummaryEncoding enc = SummaryEncoding::kFp32;
  uint16_t flags = 0;
  uint16_t dim = 0;
  uint16_t layers = 0;
  size_t heads = 0, tokens = 0;  // of the head-keys section (0 when absent)
};

// Reads and checks the fixed header of blob b: size, magic, version,
// element encoding, flags and their consistency, dim and num_layers.
// Leaves heads and tokens 0 (CheckBlobLength reads them).
absl::StatusOr<DecodedHeader> ParseHeader(absl::string_view b) {
  if (b.size() < kSummaryHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("summary blob is truncated (", b.size(),
                                                   " bytes, header needs ", kSummaryHeaderBytes,
                                                   ")"));
  }
  if (std::memcmp(b.data(), kMagic, 4) != 0) {
    return absl::InvalidArgumentError("summary blob: bad magic");
  }
  const uint8_t version = GetLe<uint8_t>(b.data() + 4);
  if (version < 1 || version > kSummaryFormatVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("summary blob: unsupported format version ", version));
  }
  const uint8_t enc_raw = GetLe<uint8_t>(b.data() + 5);
  if (enc_raw != 1 && enc_raw != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("summary blob: unknown element encoding ", enc_raw));
  }
  DecodedHeader h;
  h.enc = static_cast<SummaryEncoding>(enc_raw);
  const uint16_t flags = h.flags = GetLe<uint16_t>(b.data() + 6);
  const uint16_t v2_flags = kFlagLayerInt8 | kFlagHeadKeys;
  if ((flags & ~kKnownFlags) != 0 || (version == 1 && (flags & v2_flags))) {
    return absl::InvalidArgumentError(
        absl::StrCat("summary blob: unknown flags 0x", absl::Hex(flags)));
  }
  const uint16_t dim = h.dim = GetLe<uint16_t>(b.data() + 8);
  const uint16_t layers = h.layers = GetLe<uint16_t>(b.data() + 10);
  if (dim < 1 || dim > kMaxHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat("summary blob: dim (", dim, ") out of range"));
  }
  const bool layered = (flags & (kFlagLayerMean | kFlagLayerBounds)) != 0;
  if ((flags & kFlagLayerBounds) && !(flags & kFlagLayerMean)) {
    return absl::InvalidArgumentError("summary blob: layer bounds without layer_mean");
  }
  if ((flags & kFlagLayerInt8) && !(flags & kFlagLayerMean)) {
    return absl::InvalidArgumentError("summary blob: int8 layer flag without layer_mean");
  }
  if (layered ? (layers < 1 || layers > kMaxLayers) : layers != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("summary blob: num_layers (", layers, ") inconsistent with flags"));
  }
  return h;
}

// Checks that blob b is exactly as long as its header says (reading the
// head-keys section's counts into h->heads and h->tokens, range-checked)
// and that its checksum matches.
absl::Status CheckBlobLength(absl::string_view b, DecodedHeader* h) {
  const uint16_t flags = h->flags;
  const size_t D = h->dim;
  const size_t LD = static_cast<size_t>(h->layers) * D;
  const size_t elem_bytes = h->enc == SummaryEncoding::kFp32 ? 4 : 2;
  size_t elems = D;
  if (flags & kFlagWeighted) elems += D;
  if (flags & kFlagBounds) elems += 2 * D;
  if (flags & kFlagLayerBounds) elems += 2 * LD;
  size_t expected = kSummaryHeaderBytes + elems * elem_bytes;
  if (flags & kFlagLayerMean) {
    expected += (flags & kFlagLayerInt8) ? h->layers * 4 + LD : LD * elem_bytes;
  }
  // The head-keys section sizes itself: read its counts first.
  if (flags & kFlagHeadKeys) {
    if (b.size() < expected + 8) {
      return absl::InvalidArgumentError("summary blob: head-keys section is truncated");
    }
    const size_t heads = h->heads = GetLe<uint32_t>(b.data() + expected);
    const size_t tokens = h->tokens = GetLe<uint32_t>(b.data() + expected + 4);
    if (heads < 1 || heads > kMaxLayers * static_cast<size_t>(kMaxKvHeads) || tokens < 1 ||
        tokens > static_cast<size_t>(kMaxBlockSizeTokens) ||
        uint64_t{heads} * tokens * D > kMaxHeadKeyBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "summary blob: head keys of ", heads, " heads x ", tokens, " tokens are out of range"));
    }
    expected += 8 + heads * 8 + heads * tokens * D;
  }
  if (b.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat("summary blob length (", b.size(),
                                                   ") does not match its header (", expected, ")"));
  }
  if (GetLe<uint32_t>(b.data() + 20) != Checksum(b)) {
    return absl::DataLossError("summary blob: checksum mismatch");
  }
  return absl::OkStatus();
}

// Reads the int8 layer_mean section at *p (layers scales, then layers x D
// int8 values) into *v and advances *p past it. InvalidArgument when a
// scale is not finite, negative, or so large int8 x scale could overflow.
absl::Status GetLayerInt8(const char** p, size_t layers, size_t D, std::vector<float>* v) {
  absl::Status st;
  const size_t LD = layers * D;
  v->resize(LD);
  const char* q = *p + layers * 4;
  for (size_t l = 0; l < layers && st.ok(); ++l) {
    const float scale = GetLe<float>(*p + l * 4);
    // int8 x scale must stay finite (|q| <= 127).
    if (!std::isfinite(scale) || scale < 0 || scale > std::numeric_limits<float>::max() / 128.0f) {
      st = absl::InvalidArgumentError(
          absl::StrCat("summary blob: layer_mean scale of layer ", l, " is invalid"));
    }
    for (size_t d = 0; d < D; ++d) {
      (*v)[l * D + d] = static_cast<float>(static_cast<int8_t>(q[l * D + d])) * scale;
    }
  }
  *p = q + LD;
  return st;
}

// Reads the head-keys section at p (its counts, already read into h, then
// the head indices, the scales and the int8 keys) into s. InvalidArgument
// when the heads are not ascending and distinct or a scale is invalid.
absl::Status GetHeadKeys(const char* p, const DecodedHeader& h, BlockSummary* s) {
  const size_t heads = h.heads;
  p += 8;
  s->key_tokens = static_cast<int32_t>(h.tokens);
  s->key_heads.resize(heads);
  s->key_scales.resize(heads);
  for (size_t j = 0; j < heads; ++j) {
    const uint32_t head = GetLe<uint32_t>(p + j * 4);
    if (head > static_cast<uint32_t>(INT32_MAX) ||
        (j > 0 && static_cast<int32_t>(head) <= s->key_heads[j - 1])) {
      return absl::InvalidArgumentError("summary blob: key heads are not ascending and distinct");
    }
    s->key_heads[j] = static_cast<int32_t>(head);
  }
  p += heads * 4;
  for (size_t j = 0; j < heads; ++j) {
    s->key_scales[j] = GetLe<float>(p + j * 4);
    if (!std::isfinite(s->key_scales[j]) || s->key_scales[j] < 0 ||
        s->key_scales[j] > std::numeric_limits<float>::max() / 128.0f) {
      return absl::InvalidArgumentError("summary blob: a head-key scale is invalid");
    }
  }
  p += heads * 4;
  s->head_keys.resize(heads * h.tokens * h.dim);
  std::memcpy(s->head_keys.data(), p, s->head_keys.size());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> EncodeSummary(const BlockSummary& s, SummaryEncoding encoding) {
  SummaryCodecOptions options;
  options.encoding = encoding;
  return EncodeSummary(s, options);
}

absl::StatusOr<std::string> EncodeSummary(const BlockSummary& s,
                                          const SummaryCodecOptions& options) {
  const SummaryEncoding encoding = options.encoding;
  if (encoding != SummaryEncoding::kFp32 && encoding != SummaryEncoding::kFp16) {
    return absl::InvalidArgumentError("encoding is not fp32 or fp16");
  }
  if (s.dim < 1 || s.dim > kMaxHeadDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("summary.dim (", s.dim, ") must be in [1, ", kMaxHeadDim, "]"));
  }
  uint16_t flags = 0;
  if (!s.weighted_mean.empty()) flags |= kFlagWeighted;
  if (!s.min.empty() || !s.max.empty()) flags |= kFlagBounds;
  if (!s.layer_mean.empty()) flags |= kFlagLayerMean;
  if (!s.layer_min.empty() || !s.layer_max.empty()) flags |= kFlagLayerBounds;
  if (options.layer_int8 && (flags & kFlagLayerMean)) flags |= kFlagLayerInt8;
  if (!s.key_heads.empty()) flags |= kFlagHeadKeys;
  const bool layered = (flags & (kFlagLayerMean | kFlagLayerBounds)) != 0;
  if (layered && (s.num_layers < 1 || s.num_layers > kMaxLayers)) {
    return absl::InvalidArgumentError(absl::StrCat("summary.num_layers (", s.num_layers,
                                                   ") must be in [1, ", kMaxLayers,
                                                   "] when per-layer sections are present"));
  }
  if ((flags & kFlagLayerBounds) && !(flags & kFlagLayerMean)) {
    return absl::InvalidArgumentError("summary.layer_min/layer_max require summary.layer_mean");
  }
  if (!std::isfinite(s.radius) || s.radius < 0) {
    return absl::InvalidArgumentError("summary.radius must be finite and >= 0");
  }
  const size_t D = static_cast<size_t>(s.dim);
  const size_t LD = layered ? static_cast<size_t>(s.num_layers) * D : 0;
  std::string out;
  out.append(kMagic, 4);
  // Version 1 readers can read blobs without the version-2 sections.
  PutLe<uint8_t>(
      &out, (flags & (kFlagLayerInt8 | kFlagHeadKeys)) != 0 ? kSummaryFormatVersion : uint8_t{1});
  PutLe<uint8_t>(&out, static_cast<uint8_t>(encoding));
  PutLe<uint16_t>(&out, flags);
  PutLe<uint16_t>(&out, static_cast<uint16_t>(s.dim));
  PutLe<uint16_t>(&out, static_cast<uint16_t>(layered ? s.num_layers : 0));
  PutLe<uint32_t>(&out, s.weights_version);
  PutLe<float>(&out, (flags & kFlagBounds) ? s.radius : 0.0f);
  PutLe<uint32_t>(&out, 0);  // checksum, filled below
  absl::Status st = PutSection(&out, "mean", s.mean, D, encoding);
  if (st.ok() && (flags & kFlagWeighted)) {
    st = PutSection(&out, "weighted_mean", s.weighted_mean, D, encoding);
  }
  if (st.ok() && (flags & kFlagBounds)) {
    st = PutSection(&out, "min", s.min, D, encoding);
    if (st.ok()) st = PutSection(&out, "max", s.max, D, encoding);
  }
  if (st.ok() && (flags & kFlagLayerMean)) {
    st = (flags & kFlagLayerInt8) ? PutLayerInt8(&out, s)
                                  : PutSection(&out, "layer_mean", s.layer_mean, LD, encoding);
  }
  if (st.ok() && (flags & kFlagLayerBounds)) {
    st = PutSection(&out, "layer_min", s.layer_min, LD, encoding);
    if (st.ok()) st = PutSection(&out, "layer_max", s.layer_max, LD, encoding);
  }
  if (st.ok() && (flags & kFlagHeadKeys)) st = PutHeadKeys(&out, s);
  if (!st.ok()) return st;
  const uint32_t sum = Checksum(out);
  std::memcpy(&out[20], &sum, sizeof(sum));
  return out;
}

absl::StatusOr<BlockSummary> DecodeSummary(absl::string_view b) {
  absl::StatusOr<DecodedHeader> header = ParseHeader(b);
  if (!header.ok()) return header.status();
  DecodedHeader& h = *header;
  if (absl::Status st = CheckBlobLength(b, &h); !st.ok()) return st;
  const uint16_t flags = h.flags;
  const SummaryEncoding enc = h.enc;
  const size_t D = h.dim;
  const size_t LD = static_cast<size_t>(h.layers) * D;
  BlockSummary s;
  s.dim = h.dim;
  s.num_layers = h.layers;
  s.weights_version = GetLe<uint32_t>(b.data() + 12);
  s.radius = GetLe<float>(b.data() + 16);
  if (!std::isfinite(s.radius) || s.radius < 0) {
    return absl::InvalidArgumentError("summary blob: radius is invalid");
  }
  const char* p = b.data() + kSummaryHeaderBytes;
  absl::Status st = GetSection(&p, "mean", D, enc, &s.mean);
  if (st.ok() && (flags & kFlagWeighted)) {
    st = GetSection(&p, "weighted_mean", D, enc, &s.weighted_mean);
  }
  if (st.ok() && (flags & kFlagBounds)) {
    st = GetSection(&p, "min", D, enc, &s.min);
    if (st.ok()) st = GetSection(&p, "max", D, enc, &s.max);
  }
  if (st.ok() && (flags & kFlagLayerMean)) {
    st = (flags & kFlagLayerInt8) ? GetLayerInt8(&p, h.layers, D, &s.layer_mean)
                                  : GetSection(&p, "layer_mean", LD, enc, &s.layer_mean);
  }
  if (st.ok() && (flags & kFlagLayerBounds)) {
    st = GetSection(&p, "layer_min", LD, enc, &s.layer_min);
    if (st.ok()) st = GetSection(&p, "layer_max", LD, enc, &s.layer_max);
  }
  if (st.ok() && (flags & kFlagHeadKeys)) st = GetHeadKeys(p, h, &s);
  if (!st.ok()) return st;
  return s;
}

std::optional<std::vector<float>> PeekSummaryMean(absl::string_view blob) {
  if (blob.size() < kSummaryHeaderBytes || blob.substr(0, 4) != "KVSB") return std::nullopt;
  if (static_cast<uint8_t>(blob[4]) != kSummaryFormatVersion ||
      std::endian::native != std::endian::little) {
    absl::StatusOr<BlockSummary> summary = DecodeSummary(blob);
    if (!summary.ok() || summary->mean.empty()) return std::nullopt;
    return std::move(summary->mean);
  }
  const auto encoding = static_cast<SummaryEncoding>(blob[5]);
  uint16_t dim = 0;
  std::memcpy(&dim, blob.data() + 8, sizeof(dim));
  const size_t elem = encoding == SummaryEncoding::kFp32   ? 4
                      : encoding == SummaryEncoding::kFp16 ? 2
                                                           : 0;
  if (elem == 0 || dim == 0 || blob.size() < kSummaryHeaderBytes + size_t{dim} * elem) {
    return std::nullopt;
  }
  std::vector<float> v(dim);
  if (elem == 4) {
    std::memcpy(v.data(), blob.data() + kSummaryHeaderBytes, size_t{dim} * 4);
  } else {
    simd::HalfToFloatN(blob.data() + kSummaryHeaderBytes, v.data(), dim);
  }
  return v;
}

}  // namespace kvtier::index
