#include "index/summary_codec.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "index/simd.h"

namespace kvtier::index {
namespace {

constexpr char kMagic[4] = {'K', 'V', 'S', 'B'};
constexpr uint16_t kFlagWeighted = 1u << 0;
constexpr uint16_t kFlagBounds = 1u << 1;
constexpr uint16_t kFlagLayerMean = 1u << 2;
constexpr uint16_t kFlagLayerBounds = 1u << 3;
constexpr uint16_t kKnownFlags =
    kFlagWeighted | kFlagBounds | kFlagLayerMean | kFlagLayerBounds;

uint32_t Fnv1a(uint32_t h, const char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<uint8_t>(p[i]);
    h *= 16777619u;
  }
  return h;
}

uint32_t Checksum(absl::string_view blob) {
  uint32_t h = Fnv1a(2166136261u, blob.data(), 20);
  return Fnv1a(h, blob.data() + kSummaryHeaderBytes,
               blob.size() - kSummaryHeaderBytes);
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

absl::Status PutSection(std::string* out, const char* name,
                        const std::vector<float>& v, size_t expected,
                        SummaryEncoding enc) {
  if (v.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "summary.", name, " has ", v.size(), " elements, expected ", expected));
  }
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("summary.", name, "[", i, "] is not finite"));
    }
    if (enc == SummaryEncoding::kFp32) {
      PutLe<float>(out, v[i]);
    } else {
      const uint16_t h = simd::FloatToHalf(v[i]);
      if ((h & 0x7c00u) == 0x7c00u) {
        return absl::InvalidArgumentError(absl::StrCat(
            "summary.", name, "[", i, "] (", v[i], ") overflows fp16"));
      }
      PutLe<uint16_t>(out, h);
    }
  }
  return absl::OkStatus();
}

absl::Status GetSection(const char** p, const char* name, size_t n,
                        SummaryEncoding enc, std::vector<float>* v) {
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

}  // namespace

absl::StatusOr<std::string> EncodeSummary(const BlockSummary& s,
                                          SummaryEncoding encoding) {
  if (encoding != SummaryEncoding::kFp32 &&
      encoding != SummaryEncoding::kFp16) {
    return absl::InvalidArgumentError("encoding is not fp32 or fp16");
  }
  if (s.dim < 1 || s.dim > kMaxHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "summary.dim (", s.dim, ") must be in [1, ", kMaxHeadDim, "]"));
  }
  uint16_t flags = 0;
  if (!s.weighted_mean.empty()) flags |= kFlagWeighted;
  if (!s.min.empty() || !s.max.empty()) flags |= kFlagBounds;
  if (!s.layer_mean.empty()) flags |= kFlagLayerMean;
  if (!s.layer_min.empty() || !s.layer_max.empty()) flags |= kFlagLayerBounds;
  const bool layered = (flags & (kFlagLayerMean | kFlagLayerBounds)) != 0;
  if (layered && (s.num_layers < 1 || s.num_layers > kMaxLayers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("summary.num_layers (", s.num_layers, ") must be in [1, ",
                     kMaxLayers, "] when per-layer sections are present"));
  }
  if ((flags & kFlagLayerBounds) && !(flags & kFlagLayerMean)) {
    return absl::InvalidArgumentError(
        "summary.layer_min/layer_max require summary.layer_mean");
  }
  if (!std::isfinite(s.radius) || s.radius < 0) {
    return absl::InvalidArgumentError("summary.radius must be finite and >= 0");
  }
  const size_t D = static_cast<size_t>(s.dim);
  const size_t LD = layered ? static_cast<size_t>(s.num_layers) * D : 0;
  std::string out;
  out.append(kMagic, 4);
  PutLe<uint8_t>(&out, kSummaryFormatVersion);
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
    st = PutSection(&out, "layer_mean", s.layer_mean, LD, encoding);
  }
  if (st.ok() && (flags & kFlagLayerBounds)) {
    st = PutSection(&out, "layer_min", s.layer_min, LD, encoding);
    if (st.ok()) st = PutSection(&out, "layer_max", s.layer_max, LD, encoding);
  }
  if (!st.ok()) return st;
  const uint32_t sum = Checksum(out);
  std::memcpy(&out[20], &sum, sizeof(sum));
  return out;
}

absl::StatusOr<BlockSummary> DecodeSummary(absl::string_view b) {
  if (b.size() < kSummaryHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("summary blob is truncated (", b.size(),
                     " bytes, header needs ", kSummaryHeaderBytes, ")"));
  }
  if (std::memcmp(b.data(), kMagic, 4) != 0) {
    return absl::InvalidArgumentError("summary blob: bad magic");
  }
  const uint8_t version = GetLe<uint8_t>(b.data() + 4);
  if (version != kSummaryFormatVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("summary blob: unsupported format version ", version));
  }
  const uint8_t enc_raw = GetLe<uint8_t>(b.data() + 5);
  if (enc_raw != 1 && enc_raw != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("summary blob: unknown element encoding ", enc_raw));
  }
  const auto enc = static_cast<SummaryEncoding>(enc_raw);
  const uint16_t flags = GetLe<uint16_t>(b.data() + 6);
  if ((flags & ~kKnownFlags) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("summary blob: unknown flags 0x", absl::Hex(flags)));
  }
  const uint16_t dim = GetLe<uint16_t>(b.data() + 8);
  const uint16_t layers = GetLe<uint16_t>(b.data() + 10);
  if (dim < 1 || dim > kMaxHeadDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("summary blob: dim (", dim, ") out of range"));
  }
  const bool layered = (flags & (kFlagLayerMean | kFlagLayerBounds)) != 0;
  if ((flags & kFlagLayerBounds) && !(flags & kFlagLayerMean)) {
    return absl::InvalidArgumentError(
        "summary blob: layer bounds without layer_mean");
  }
  if (layered ? (layers < 1 || layers > kMaxLayers) : layers != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "summary blob: num_layers (", layers, ") inconsistent with flags"));
  }
  const size_t D = dim;
  const size_t LD = static_cast<size_t>(layers) * D;
  size_t elems = D;
  if (flags & kFlagWeighted) elems += D;
  if (flags & kFlagBounds) elems += 2 * D;
  if (flags & kFlagLayerMean) elems += LD;
  if (flags & kFlagLayerBounds) elems += 2 * LD;
  const size_t elem_bytes = enc == SummaryEncoding::kFp32 ? 4 : 2;
  const size_t expected = kSummaryHeaderBytes + elems * elem_bytes;
  if (b.size() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("summary blob length (", b.size(),
                     ") does not match its header (", expected, ")"));
  }
  if (GetLe<uint32_t>(b.data() + 20) != Checksum(b)) {
    return absl::DataLossError("summary blob: checksum mismatch");
  }
  BlockSummary s;
  s.dim = dim;
  s.num_layers = layers;
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
    st = GetSection(&p, "layer_mean", LD, enc, &s.layer_mean);
  }
  if (st.ok() && (flags & kFlagLayerBounds)) {
    st = GetSection(&p, "layer_min", LD, enc, &s.layer_min);
    if (st.ok()) st = GetSection(&p, "layer_max", LD, enc, &s.layer_max);
  }
  if (!st.ok()) return st;
  return s;
}

}  // namespace kvtier::index
