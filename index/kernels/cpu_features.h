// The one CPU-feature detector of the index's kernels (simd.cc,
// simd_stats.cc, int8_dot.cc, ../selkv.cc): each picks its widest kernel
// from these flags once, at first use. Tiers, each including the one
// before:
//   avx2         AVX2, FMA and F16C (F16C from CPUID: clang before 15 does
//                not know __builtin_cpu_supports("f16c"))
//   avx512       AVX-512 F, BW and VL
//   avx512vnni   and AVX-512 VNNI
// On other architectures every flag is false (portable kernels only).
//
// Thread safety: CpuFeatures() detects once (a function-local static) and
// is safe from any thread.
#ifndef KVTIER_INDEX_KERNELS_CPU_FEATURES_H_
#define KVTIER_INDEX_KERNELS_CPU_FEATURES_H_

namespace kvtier::index {

struct CpuFeatureSet {
  bool avx2 = false;
  bool avx512 = false;
  bool avx512vnni = false;
};

const CpuFeatureSet& CpuFeatures();

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_KERNELS_CPU_FEATURES_H_
