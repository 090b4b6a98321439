// The AVX2 + FMA build of the fused CPU kernels (fused_cpu_kernels.h), chosen at run time by
// fused_cpu.cpp when the CPU supports it. A target pragma makes ATen's Vectorized<float> its 256-bit
// AVX2 implementation here (exp and friends from Sleef, which libtorch_cpu exports).
//
// Only ATen's vec headers and the kernels come after the pragma. The standard library, c10 and the
// ATen headers that do not depend on the CPU capability are included before it, for two reasons:
//  - GCC 13 and 14.1 reject the standard library under a target pragma ("inlining failed in call to
//    'always_inline' std::allocator<char>::~allocator(): target specific option mismatch"; GCC bug
//    109753, fixed in 14.2). It broke the build with the device machine's GCC 13.
//  - Inline functions shared with the baseline build are then compiled for the baseline ISA here too,
//    so the linker cannot pick an AVX2 copy of one for code that runs on a CPU without AVX2.
// The baseline fallback is for x86-64 CPUs without AVX2 (pre-2013), which this accepts, like ATen.
#if defined(__x86_64__) && defined(__GNUC__)
#include <algorithm>
#include <cfloat>
#include <cmath>

#include <ATen/ATen.h>
#include <ATen/AccumulateType.h>
#include <ATen/Dispatch.h>
#include <ATen/NumericUtils.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/native/Math.h>
#include <ATen/native/quantized/AffineQuantizerBase.h>
#include <c10/util/BFloat16-math.h>
#include <c10/util/MathConstants.h>
#include <c10/util/copysign.h>
#include <c10/util/qint32.h>
#include <c10/util/qint8.h>
#include <c10/util/quint8.h>

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
