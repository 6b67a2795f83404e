#include "index/kernels/cpu_features.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#define KVTIER_CPU_X86 1
#endif

namespace kvtier::index {
namespace {

CpuFeatureSet Detect() {
  CpuFeatureSet f;
#ifdef KVTIER_CPU_X86
  __builtin_cpu_init();
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  f.avx512 = f.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
  f.avx512vnni = f.avx512 && __builtin_cpu_supports("avx512vnni");
#endif
  return f;
}

}  // namespace

const CpuFeatureSet& CpuFeatures() {
  static const CpuFeatureSet features = Detect();
  return features;
}

}  // namespace kvtier::index
