#include "client/anchor.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvtier {
namespace {

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, frac = h & 0x3ff;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(frac), -24);
  } else if (exp == 31) {
    v = frac == 0 ? INFINITY : NAN;
  } else {
    v = std::ldexp(static_cast<float>(frac | 0x400), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

float BfloatToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

uint32_t DtypeBytes(v1::DType d) {
  switch (d) {
    case v1::DTYPE_FP16:
    case v1::DTYPE_BF16:
      return 2;
    case v1::DTYPE_FP32:
      return 4;
    default:
      return 0;
  }
}

}  // namespace

AnchorBuilder::AnchorBuilder(const v1::ModelProfile& profile)
    : profile_(profile),
      sum_(static_cast<size_t>(profile.num_layers()) * profile.head_dim(), 0.0) {}

void AnchorBuilder::Reset() {
  tokens_ = 0;
  std::fill(sum_.begin(), sum_.end(), 0.0);
}

absl::Status AnchorBuilder::AddTokens(absl::string_view block, uint32_t first_token,
                                      uint32_t count) {
  const uint64_t L = profile_.num_layers(), H = profile_.num_kv_heads(), D = profile_.head_dim(),
                 T = profile_.block_size_tokens();
  const uint32_t es = DtypeBytes(profile_.dtype());
  if (L == 0 || H == 0 || D == 0 || T == 0 || es == 0) {
    return absl::InvalidArgumentError(
        "profile: needs num_layers, num_kv_heads, head_dim, block_size_tokens and an FP16, BF16 or "
        "FP32 dtype");
  }
  const uint64_t want = L * 2 * H * T * D * es;
  if (block.size() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("block: ", block.size(), " bytes; one block of the profile has ", want));
  }
  if (count == 0 || first_token >= T || count > T - first_token) {
    return absl::InvalidArgumentError(absl::StrCat("first_token (", first_token, ") and count (",
                                                   count, ") must name tokens within the block's ",
                                                   T));
  }
  for (uint64_t l = 0; l < L; ++l) {
    double* row = &sum_[l * D];
    for (uint64_t h = 0; h < H; ++h) {
      // Keys of (l, h): element ((l * 2 + 0) * H + h) * T * D.
      const uint64_t base = ((l * 2) * H + h) * T * D;
      for (uint64_t t = first_token; t < first_token + count; ++t) {
        const char* p = block.data() + (base + t * D) * es;
        for (uint64_t d = 0; d < D; ++d) {
          float v;
          if (es == 4) {
            std::memcpy(&v, p + d * 4, 4);
          } else {
            uint16_t bits;
            std::memcpy(&bits, p + d * 2, 2);
            v = profile_.dtype() == v1::DTYPE_FP16 ? HalfToFloat(bits) : BfloatToFloat(bits);
          }
          row[d] += v;
        }
      }
    }
  }
  tokens_ += count;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> AnchorBuilder::Finish(AnchorLayout layout) const {
  if (tokens_ == 0) return absl::FailedPreconditionError("no tokens were added (AddTokens)");
  const size_t L = profile_.num_layers(), D = profile_.head_dim();
  const double per_row = static_cast<double>(tokens_) * profile_.num_kv_heads();
  std::vector<float> out(layout == AnchorLayout::kPooled ? D : L * D, 0.0f);
  for (size_t l = 0; l < L; ++l) {
    for (size_t d = 0; d < D; ++d) {
      const double mean = sum_[l * D + d] / per_row;
      if (!std::isfinite(mean)) {
        return absl::InvalidArgumentError(
            absl::StrCat("the keys of layer ", l, " are not finite (dim ", d, ")"));
      }
      if (layout == AnchorLayout::kPooled) {
        out[d] += static_cast<float>(mean / L);
      } else {
        out[l * D + d] = static_cast<float>(mean);
      }
    }
  }
  return out;
}

absl::StatusOr<std::vector<float>> GatherHeadQueries(absl::Span<const float> queries,
                                                     uint32_t num_layers, uint32_t num_q_heads,
                                                     uint32_t head_dim,
                                                     const v1::SelectionCalibration& calibration) {
  const uint64_t want = uint64_t{num_layers} * num_q_heads * head_dim;
  if (queries.size() != want || want == 0) {
    return absl::InvalidArgumentError(absl::StrCat("queries: ", queries.size(),
                                                   " values; expected ", num_layers, " layers x ",
                                                   num_q_heads, " query heads x ", head_dim));
  }
  std::vector<float> out;
  out.reserve(calibration.retrieval_heads_size() * head_dim);
  for (int i = 0; i < calibration.retrieval_heads_size(); ++i) {
    const v1::HeadRef& h = calibration.retrieval_heads(i);
    if (h.layer() >= num_layers || h.q_head() >= num_q_heads) {
      return absl::InvalidArgumentError(
          absl::StrCat("calibration.retrieval_heads[", i, "] (layer ", h.layer(), ", q_head ",
                       h.q_head(), ") is outside the queries' ", num_layers, " x ", num_q_heads));
    }
    const float* q = queries.data() + (uint64_t{h.layer()} * num_q_heads + h.q_head()) * head_dim;
    out.insert(out.end(), q, q + head_dim);
  }
  return out;
}

}  // namespace kvtier
