// The AVX-512 build of the fused CPU kernels (fused_cpu_kernels.h), chosen at run time by fused_cpu.cpp
// where ATen runs its own kernels as AVX-512 (at::native::get_cpu_capability(), which also honours the
// ATEN_CPU_CAPABILITY environment variable): 16 floats or 8 doubles per vector. On an AVX-512 CPU,
// ATen's 8-wide float64 silu beat a 4-wide AVX2 silu_and_mul (0.83-0.99x, measured on this machine), and
// silu_and_mul's elements equal ATen's only with its vectors (ATen's silu runs its AVX-512 build there).
//
// Built like fused_cpu_avx2.cpp (see there): the standard library, c10 and the capability-independent
// ATen headers before the target pragma (GCC bug 109753), ATen's vec headers and the kernels after it.
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

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
// GCC 12 warns inside its own avx512fintrin.h (the _mm512_undefined_* idiom of the masked intrinsics
// ATen's vec512 uses) that a vector "may be used uninitialized": a known false positive of that header.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// g++ does not define the ISA macros for a target pragma; headers (ATen's vec, sleef.h) test them.
#define __AVX__ 1
#define __AVX2__ 1
#define __FMA__ 1
#define __F16C__ 1
#define __AVX512F__ 1
#define __AVX512BW__ 1
#define __AVX512VL__ 1
#define __AVX512DQ__ 1
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#include "fused_cpu_kernels.h"

static_assert(at::vec::Vectorized<float>::size() == 16, "expected the AVX-512 Vectorized<float>");
static_assert(at::vec::Vectorized<double>::size() == 8, "expected the AVX-512 Vectorized<double>");
#endif
