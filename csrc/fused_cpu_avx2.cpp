// The AVX2 + FMA build of the fused CPU kernels (fused_cpu_kernels.h), chosen at run time by
// fused_cpu.cpp when the CPU supports it. The target pragma comes before every include so that ATen's
// Vectorized<float> is its 256-bit AVX2 implementation here (exp and friends from Sleef, which
// libtorch_cpu exports). As with ATen's own per-capability files, inline functions shared with the
// baseline build (c10, std) may be emitted here with AVX2 instructions; the baseline fallback is for
// x86-64 CPUs without AVX2 (pre-2013), which this accepts, like ATen.
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("avx2,fma,f16c")
// g++ does not define the ISA macros for a target pragma; headers (ATen's vec, sleef.h) test them.
#define __AVX__ 1
#define __AVX2__ 1
#define __FMA__ 1
#define __F16C__ 1
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#include "fused_cpu_kernels.h"

static_assert(at::vec::Vectorized<float>::size() == 8, "expected the AVX2 Vectorized<float>");
#endif
