// Host-side fp16 <-> fp32 conversions for test data and the CPU
// references, without CUDA headers. Widening is exact; narrowing rounds to
// nearest even (NaN stays NaN, overflow becomes Inf).
//
// Thread safety: pure functions.
#ifndef KVTIER_TESTS_GPU_HALF_H_
#define KVTIER_TESTS_GPU_HALF_H_

#include <cstdint>
#include <cstring>

namespace kvtier::gpu::testing {

inline float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint32_t FloatToBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  if (exponent == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return BitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return BitsToFloat(sign);
  // Subnormal: value = mantissa * 2^-24.
  const float magnitude = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
  return sign ? -magnitude : magnitude;
}

inline uint16_t FloatToHalf(float f) {
  const uint32_t bits = FloatToBits(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00;  // rounds to >= 65520: Inf
  if (abs < 0x38800000u) {                       // below 2^-14: subnormal or 0
    // Round abs * 2^24 to nearest even integer.
    const float scaled = BitsToFloat(abs) * 16777216.0f;
    uint32_t m = static_cast<uint32_t>(scaled);
    const float rest = scaled - static_cast<float>(m);
    if (rest > 0.5f || (rest == 0.5f && (m & 1))) ++m;
    return sign | static_cast<uint16_t>(m);
  }
  // Normal: rebias exponent, round the 13 dropped mantissa bits.
  uint32_t value = abs - 0x38000000u;  // exponent - 112
  const uint32_t dropped = value & 0x1fff;
  value >>= 13;
  if (dropped > 0x1000 || (dropped == 0x1000 && (value & 1))) ++value;
  return sign | static_cast<uint16_t>(value);
}

}  // namespace kvtier::gpu::testing

#endif  // KVTIER_TESTS_GPU_HALF_H_
