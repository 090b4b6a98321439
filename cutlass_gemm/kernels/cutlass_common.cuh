// Shared by the CUTLASS kernel translation units (never by TUs that include torch headers).
#pragma once

#include <atomic>
#include <cstdint>
#include <type_traits>
#include <utility>

#include <cutlass/array.h>
#include <cutlass/cutlass.h>
#include <cutlass/device_kernel.h>
#include <cutlass/epilogue/thread/activation.h>
#include <cutlass/fast_math.h>
#include <cutlass/gemm/gemm.h>
#include <cutlass/layout/matrix.h>
#include <cutlass/numeric_types.h>

#include "launcher.h"

namespace ops::cutlass_gemm {

// The CUTLASS element and layout types of a kernel-list entry (kernel_list.h is the one source of
// truth for dtype, layouts, alignment and the archs a kernel is built for).
template <DType> struct CutlassElement;
template <> struct CutlassElement<DType::Half> { using type = cutlass::half_t; };
template <> struct CutlassElement<DType::BFloat16> { using type = cutlass::bfloat16_t; };
template <> struct CutlassElement<DType::Float> { using type = float; };
template <> struct CutlassElement<DType::Double> { using type = double; };

template <Layout L>
using CutlassLayout = std::conditional_t<L == Layout::Row, cutlass::layout::RowMajor,
                                         cutlass::layout::ColumnMajor>;

// x / (1 + e^t), the logistic form of the activations below, without dividing by an infinity that a
// finite t produced: for a finite t above 80 the quotient is below |x| * 1.8e-35 and this returns
// x * 0 (a signed zero, what PyTorch's float formula gives once e^t overflows, t > 88.7), dividing by the
// finite 1 + e^80 instead. An infinite divisor sends the IEEE division down its slow path, and large
// negative pre-activations make one often: on unnormalised random inputs (a GEMM output of std ~64) up
// to half the elements of gelu_tanh, whose epilogue the H200 run of 2026-11-30 measured (with silu's)
// at 4-5x erf-GELU's cost; this is the suspected cause. Infinite and NaN t pass through unchanged.
CUTLASS_HOST_DEVICE float logistic_quotient(float x, float t) {
  const bool vanishes = t > 80.0f && t <= 3.4028235e38f;
  const float q = x / (1.0f + cutlass::fast_exp(vanishes ? 80.0f : t));
  return vanishes ? x * 0.0f : q;
}

// GELU with the tanh approximation (PyTorch's gelu(approximate="tanh")) as z * sigmoid(2u) =
// z / (1 + exp(-2u)), u = sqrt(2/pi) (z + 0.044715 z^3): equal to 0.5 z (1 + tanh(u)) without its
// cancellation for negative z. CUTLASS's GELU_taylor evaluates 1 + tanh(u) with tanh.approx.f32, whose
// absolute error (~2^-11 near tanh = -1) is a large relative error of 1 + tanh(u): ~20% at z = -3,
// where the result is -0.0036, far more than the output's rounding. This form's error is that of expf
// (relative ~1e-5 at most, for z near -10). Large finite negative z gives -0; +inf gives +inf; -inf
// and NaN give NaN, as PyTorch's formula does.
template <typename T>
struct GeluTanh {
  static const bool kIsHeavy = true;

  CUTLASS_HOST_DEVICE T operator()(T const& z) const {
    const float x = static_cast<float>(z);
    const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return static_cast<T>(logistic_quotient(x, -2.0f * u));
  }
};

// SiLU, x * sigmoid(x) = x / (1 + exp(-x)) (PyTorch's F.silu), through logistic_quotient: CUTLASS's SiLu
// divides 1 by 1 + inf for x < -88.7. +inf gives +inf; -inf and NaN give NaN, as PyTorch's formula does.
template <typename T>
struct Silu {
  static const bool kIsHeavy = true;

  CUTLASS_HOST_DEVICE T operator()(T const& z) const {
    const float x = static_cast<float>(z);
    return static_cast<T>(logistic_quotient(x, -x));
  }
};

// Element-wise application of a scalar functor above to a CUTLASS Array (the epilogue's fragments).
template <template <typename> class Fn, typename T, int N>
struct ArrayOf {
  static const bool kIsHeavy = true;

  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& z) const {
    Fn<T> op;
    cutlass::Array<T, N> y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = op(z[i]);
    return y;
  }
};
template <typename T, int N>
struct GeluTanh<cutlass::Array<T, N>> : ArrayOf<GeluTanh, T, N> {};
template <typename T, int N>
struct Silu<cutlass::Array<T, N>> : ArrayOf<Silu, T, N> {};

// The activation functor of a Bias<Act> epilogue (kernel_list.h); Identity for Plain.
template <Epilogue E, typename T> struct ActivationFor { using type = cutlass::epilogue::thread::Identity<T>; };
template <typename T> struct ActivationFor<Epilogue::BiasReLU, T> { using type = cutlass::epilogue::thread::ReLu<T>; };
template <typename T> struct ActivationFor<Epilogue::BiasGELU, T> { using type = cutlass::epilogue::thread::GELU<T>; };
template <typename T> struct ActivationFor<Epilogue::BiasGELUTanh, T> { using type = GeluTanh<T>; };
template <typename T> struct ActivationFor<Epilogue::BiasSiLU, T> { using type = Silu<T>; };

template <Epilogue E>
struct ActivationTemplate {
  template <typename T>
  using type = typename ActivationFor<E, T>::type;
};

template <KernelId kId>
struct KernelTraits {
  static constexpr KernelInfo info = kernel_info(kId);
  using Element = typename CutlassElement<info.dtype>::type;
  using LayoutA = CutlassLayout<info.a>;
  using LayoutB = CutlassLayout<info.b>;
  static constexpr int kAlignment = info.alignment;
  static constexpr bool kBias = info.epilogue != Epilogue::Plain;
  static_assert(kAlignment * sizeof(Element) <= 16);
};

// A fat binary (e.g. sm_80 + sm_90a) compiles every kernel TU for every arch. These wrappers make
// the device body of a kernel empty on the archs it cannot run on: the SM90 kernels need wgmma/TMA
// (sm_90a only), and the Ampere-only SM80 kernels are never dispatched on Hopper. This also keeps the
// build fast, since the empty copies cost almost nothing to compile.

// CUTLASS 3.x kernels: `device_kernel<K>` calls `K{}(params, smem)`.
template <typename Kernel>
struct OnlyOnSm90a : Kernel {
  template <typename... Args>
  CUTLASS_DEVICE void operator()(Args&&... args) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    Kernel::operator()(std::forward<Args>(args)...);
#elif defined(__CUDA_ARCH__)
    __trap();  // dispatched where it has no body: an error, never an unwritten output
#endif
  }
};

// CUTLASS 2.x kernels: `Kernel2<K>` calls `K::invoke(params, smem)`.
// kAlsoSm90: keep the body in the sm_90 pass too (the kernels Hopper dispatches to: 3xTF32, fp64).
template <typename Kernel, bool kAlsoSm90>
struct OnlyOnSm80Family : Kernel {
  template <typename... Args>
  CUTLASS_DEVICE static void invoke(Args&&... args) {
#if defined(__CUDA_ARCH__)
#if __CUDA_ARCH__ >= 800 && __CUDA_ARCH__ < 900
    Kernel::invoke(std::forward<Args>(args)...);
#elif __CUDA_ARCH__ == 900
    if constexpr (kAlsoSm90) {
      Kernel::invoke(std::forward<Args>(args)...);
    } else {
      __trap();
    }
#else
    __trap();
#endif
#endif
  }
};

inline LaunchStatus status_from(cutlass::Status status, const char* stage) {
  if (status == cutlass::Status::kSuccess) {
    return {};
  }
  // cutlassGetStatusString returns static strings; `stage` is a literal.
  (void)stage;
  return {false, cutlassGetStatusString(status)};
}

// Raises a CUTLASS 3.x kernel's dynamic shared memory limit on the current device, once per process
// and device unless `force`. GemmUniversalAdapter::initialize calls cudaFuncSetAttribute on every
// call; the attribute belongs to the kernel function in the device's context and stays set, so one
// call per device is enough (the 2.x adapter caches it the same way, per thread and current device, in
// GemmUniversalBase::init_device_props). A context reset (cudaDeviceReset) drops it: run_adapter then
// sees the launch fail and calls this again with force = true.
template <typename Kernel>
bool ensure_max_dynamic_smem(bool force = false) {
  constexpr int kSmemBytes = Kernel::SharedStorageSize;
  if constexpr (kSmemBytes < (48 << 10)) {
    return true;
  } else {
    static std::atomic<uint64_t> done{0};  // bit d: set on device d (devices >= 64: every call)
    int device = -1;
    if (cudaGetDevice(&device) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    const uint64_t bit = device >= 0 && device < 64 ? uint64_t{1} << device : 0;
    if (!force && bit != 0 && (done.load(std::memory_order_acquire) & bit) != 0) {
      return true;
    }
    if (cudaFuncSetAttribute(cutlass::device_kernel<Kernel>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kSmemBytes) != cudaSuccess) {
      (void)cudaGetLastError();  // clear the (non-sticky) error; the op reports its own
      return false;
    }
    done.fetch_or(bit, std::memory_order_release);
    return true;
  }
}

// Runs a GemmUniversalAdapter: can_implement, workspace initialization, params, launch.
// CUTLASS 3.x (SM90): the adapter's steps (initialize_workspace, to_underlying_arguments, static run)
// without its per-call cudaFuncSetAttribute (ensure_max_dynamic_smem). CUTLASS 2.x: initialize + run.
template <typename Gemm>
LaunchStatus run_adapter(const typename Gemm::Arguments& arguments, void* workspace,
                         size_t workspace_bytes, cudaStream_t stream) {
  if (Gemm::get_workspace_size(arguments) > workspace_bytes) {
    return {false, "workspace too small"};
  }
  cutlass::Status status = Gemm::can_implement(arguments);
  if (status != cutlass::Status::kSuccess) {
    return {false, "CUTLASS can_implement rejected the problem (alignment or shape)"};
  }
  using Kernel = typename Gemm::GemmKernel;
  if constexpr (cutlass::gemm::detail::IsCutlass3GemmKernel<Kernel>::value) {
    status = Kernel::initialize_workspace(arguments, workspace, stream, nullptr);
    if (status != cutlass::Status::kSuccess) {
      return status_from(status, "initialize_workspace");
    }
    typename Kernel::Params params = Kernel::to_underlying_arguments(arguments, workspace);
    if (!ensure_max_dynamic_smem<Kernel>()) {
      return {false, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize) failed"};
    }
    status = Gemm::run(params, stream);
    if (status != cutlass::Status::kSuccess && ensure_max_dynamic_smem<Kernel>(/*force=*/true)) {
      // A launch refused for its shared memory (the cached attribute lost with a context reset) is
      // not enqueued: clear the error and launch once more with the attribute set again. (run() takes
      // any pending error for its launch's: run_tactic clears none and refuses to launch over one.)
      (void)cudaGetLastError();
      status = Gemm::run(params, stream);
    }
  } else {
    Gemm gemm;
    status = gemm.initialize(arguments, workspace, stream);
    if (status != cutlass::Status::kSuccess) {
      return status_from(status, "initialize");
    }
    status = gemm.run(stream);
  }
  if (status != cutlass::Status::kSuccess) {
    return status_from(status, "run");
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return {false, cudaGetErrorString(err)};
  }
  return {};
}

// Gemm::to_underlying_arguments, where the device-level type has one (adapters that rewrite the
// arguments before building the kernel's Params), else the arguments as they are.
template <typename Gemm, typename = void>
struct HasUnderlyingArguments : std::false_type {};
template <typename Gemm>
struct HasUnderlyingArguments<Gemm, std::void_t<decltype(Gemm::to_underlying_arguments(
                                        std::declval<const typename Gemm::Arguments&>()))>>
    : std::true_type {};

// KernelProblem (launch_args.h) of a CUTLASS 2.x launch: the kernel Params built from `arguments` as
// GemmUniversalBase::initialize builds them (host code only: device_sms and occupancy do not change
// the problem or the pointers of a kGemm-mode GemmUniversal).
template <typename Gemm>
KernelProblem kernel_problem(const typename Gemm::Arguments& arguments) {
  using Kernel = typename Gemm::GemmKernel;
  if constexpr (cutlass::gemm::detail::IsCutlass3GemmKernel<Kernel>::value) {
    return {};
  } else {
    typename Gemm::Arguments kernel_arguments = arguments;
    if constexpr (HasUnderlyingArguments<Gemm>::value) {
      kernel_arguments = Gemm::to_underlying_arguments(arguments);
    }
    const typename Kernel::Params params(kernel_arguments, /*device_sms=*/1, /*sm_occupancy=*/1);
    return {true, params.problem_size.m(), params.problem_size.n(), params.problem_size.k(),
            params.ptr_A, params.ptr_B, params.ptr_D};
  }
}

}  // namespace ops::cutlass_gemm

// Defines <name>_workspace_size, <name>_run and <name>_kernel_problem for one configuration type `Config`
// (with a nested `Gemm` and a static `arguments(const GemmLaunchArgs&)`).
#define OPS_DEFINE_CUTLASS_GEMM(name, ...)                                                     \
  OPS_DEFINE_CUTLASS_GEMM_IMPL(name, __VA_ARGS__)
#define OPS_DEFINE_CUTLASS_GEMM_IMPL(name, Config)                                                  \
  namespace ops::cutlass_gemm {                                                                 \
  size_t name##_workspace_size(const GemmLaunchArgs& args) {                                    \
    return Config::Gemm::get_workspace_size(Config::arguments(args));                           \
  }                                                                                             \
  LaunchStatus name##_run(const GemmLaunchArgs& args, void* workspace, size_t workspace_bytes,  \
                          cudaStream_t stream) {                                                \
    return run_adapter<Config::Gemm>(Config::arguments(args), workspace, workspace_bytes, stream); \
  }                                                                                             \
  KernelProblem name##_kernel_problem(const GemmLaunchArgs& args) {                             \
    return kernel_problem<Config::Gemm>(Config::arguments(args));                               \
  }                                                                                             \
  }
