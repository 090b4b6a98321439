// CUTLASS 3.x SM90 grouped GEMM (grouped_launch.h), as CUTLASS example 57 builds it: a pointer-array TMA
// warp-specialized cooperative kernel on 128x128x64 tiles (swapped, D^T = B^T A^T on 128x32x128 tiles for
// groups of few rows), D = A @ B per group in float32, rounded once to D's dtype. The per-group problem sizes, pointers and strides are built on the device from offs
// (grouped_prepare_kernel, one warp), and the kernel is given no host copy of them: its persistent grid is
// the SM count, and no call reads offs on the host. Output the kernel does not write (rows past the last
// end; RaggedK groups of no K) is zero-filled by grouped_zero_kernel.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/kernel_hardware_info.h>

#include "cutlass_common.cuh"
#include "grouped_launch.h"

namespace ops::cutlass_gemm {

// The grouped kinds' pointer-array epilogue: the float32 accumulator rounded once to ElementD, stored by TMA in
// LayoutD; C is D with beta = 0 (never loaded), as torch's grouped kernel (GroupMM.cu) configures it.
template <typename ElementD, typename LayoutD, typename TileShape, typename ClusterShape>
using GroupedEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementD, LayoutD*, 16 / sizeof(ElementD),
    ElementD, LayoutD*, 16 / sizeof(ElementD), cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
    cutlass::epilogue::fusion::LinearCombination<ElementD, float>>::CollectiveOp;

// LayoutA, LayoutB: the kernel's operands (with kSwapAB, the user's B^T and A^T); D row-major, or with
// kSwapAB column-major (D^T written column-major is the user's row-major D).
template <typename Element_, typename LayoutA, typename LayoutB, bool kSwapAB_>
struct Sm90GroupedGemmConfig {
  using Element = Element_;
  using ElementAB = Element;  // GroupedArrays' pointer types
  using ElementD = Element;
  static constexpr bool kSwapAB = kSwapAB_;
  static constexpr int kAlignment = 16 / sizeof(Element);
  // Swapped: 128 rows of the weight by 32 tokens, K 128 deep (grouped_args.h kGroupedGemmSwapTile).
  using TileShape = std::conditional_t<kSwapAB, cute::Shape<cute::_128, cute::_32, cute::_128>,
                                       cute::Shape<cute::_128, cute::_128, cute::_64>>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
  using LayoutD = std::conditional_t<kSwapAB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using CollectiveEpilogue = GroupedEpilogue<Element, LayoutD, TileShape, ClusterShape>;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA*, kAlignment, Element, LayoutB*,
      kAlignment, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<OnlyOnSm90a<Kernel>>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using Shape = typename ProblemShape::UnderlyingProblemShape;
};

// A CUTLASS 3.x per-group stride with its one dynamic mode (rows or columns) set to `ld`.
template <typename Stride>
CUTLASS_HOST_DEVICE Stride grouped_stride(int64_t ld) {
  Stride stride{};
  if constexpr (cute::is_static<cute::remove_cvref_t<decltype(cute::get<0>(stride))>>::value) {
    cute::get<1>(stride) = ld;
  } else {
    cute::get<0>(stride) = ld;
  }
  return stride;
}

// Bytes rounded up to 128: each per-group array of a workspace starts 128-byte aligned.
constexpr size_t workspace_round(size_t bytes) { return (bytes + 127) / 128 * 128; }
// `array` = the next `count` elements at p, which moves past them (workspace_round).
template <typename T>
void carve(char*& p, T*& array, int count) {
  array = reinterpret_cast<T*>(p);
  p += workspace_round(static_cast<size_t>(count) * sizeof(T));
}

// The per-group arrays in the launch's workspace, each 128-byte aligned (CUTLASS builds its initial TMA
// descriptors from the pointer arrays' own addresses, which must be 16-byte aligned).
template <typename Config>
struct GroupedArrays {
  using ElementAB = typename Config::ElementAB;
  using ElementD = typename Config::ElementD;
  typename Config::Shape* shapes = nullptr;
  const ElementAB** a = nullptr;
  const ElementAB** b = nullptr;
  ElementD** d = nullptr;
  typename Config::StrideA* stride_a = nullptr;
  typename Config::StrideB* stride_b = nullptr;
  typename Config::StrideD* stride_d = nullptr;
  int32_t* ends = nullptr;  // the clamped running-maximum ends (grouped_args.h), for the zero fill

  static size_t bytes(int groups) {
    const size_t g = static_cast<size_t>(groups);
    return workspace_round(g * sizeof(typename Config::Shape)) + 3 * workspace_round(g * sizeof(void*)) +
           workspace_round(g * sizeof(typename Config::StrideA)) +
           workspace_round(g * sizeof(typename Config::StrideB)) +
           workspace_round(g * sizeof(typename Config::StrideD)) + workspace_round(g * sizeof(int32_t));
  }
  GroupedArrays(void* base, int groups) {
    char* p = static_cast<char*>(base);
    carve(p, shapes, groups);
    carve(p, a, groups);
    carve(p, b, groups);
    carve(p, d, groups);
    carve(p, stride_a, groups);
    carve(p, stride_b, groups);
    carve(p, stride_d, groups);
    carve(p, ends, groups);
  }
};

// One warp: fn(g, start, end) for every group, its end clamped and the running maximum of those (a warp-wide
// max scan per 32 groups, carried across), its start the previous group's end.
template <typename Fn>
__device__ void for_each_group(const GroupedGemmLaunchArgs& args, Fn&& fn) {
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = threadIdx.x;
  const int64_t extent = grouped_extent(args);
  int32_t carry = 0;  // the previous chunk's last end
  for (int base = 0; base < args.groups; base += 32) {
    const int g = base + lane;
    int32_t end = 0;
    if (args.offs != nullptr && g < args.groups) end = clamped_offset(args.offs[g], extent);
    for (int step = 1; step < 32; step *= 2) {
      const int32_t before = __shfl_up_sync(kAll, end, step);
      if (lane >= step) end = max(end, before);
    }
    end = max(end, carry);
    int32_t start = __shfl_up_sync(kAll, end, 1);
    if (lane == 0) start = carry;
    carry = __shfl_sync(kAll, end, 31);
    if (g < args.groups) fn(g, start, end);
  }
}

// Group g's shape, pointers and strides (swapped: the problem n x m x k, B's as the kernel's A) and its end;
// returns its shape (group_shape).
template <typename Config>
__device__ GroupShape fill_group(const GroupedGemmLaunchArgs& args, const GroupedArrays<Config>& arrays, int g,
                                 int32_t start, int32_t end) {
  using ElementAB = typename Config::ElementAB;
  const GroupShape shape = group_shape(args, g, start, end);
  const GroupedKernelGroup k = grouped_kernel_group(args, shape);
  arrays.shapes[g] = typename Config::Shape{k.m, k.n, k.k};
  arrays.a[g] = static_cast<const ElementAB*>(k.a) + k.a_offset;
  arrays.b[g] = static_cast<const ElementAB*>(k.b) + k.b_offset;
  arrays.d[g] = static_cast<typename Config::ElementD*>(args.d) + k.d_offset;
  arrays.stride_a[g] = grouped_stride<typename Config::StrideA>(k.lda);
  arrays.stride_b[g] = grouped_stride<typename Config::StrideB>(k.ldb);
  arrays.stride_d[g] = grouped_stride<typename Config::StrideD>(args.ldd);
  arrays.ends[g] = end;
  return shape;
}

template <typename Config>
__global__ void __launch_bounds__(32) grouped_prepare_kernel(GroupedGemmLaunchArgs args, GroupedArrays<Config> arrays) {
  for_each_group(args, [&](int g, int32_t start, int32_t end) { fill_group(args, arrays, g, start, end); });
}

// Zeros what the kernel leaves unwritten: RaggedM, D's rows from the last end (blockIdx.y = 0); RaggedK,
// the m x n output of each group of no K (blockIdx.y = the group). Grid-stride over those elements.
template <typename Element>
__global__ void __launch_bounds__(256) grouped_zero_kernel(GroupedGemmLaunchArgs args, const int32_t* ends) {
  static_assert(sizeof(Element) == 2 || sizeof(Element) == 4);
  using Bits = std::conditional_t<sizeof(Element) == 2, uint16_t, uint32_t>;  // zero bits are 0 in each dtype
  Bits* d = static_cast<Bits*>(args.d);
  int64_t first_row = 0, rows = 0;
  if (args.mode == GroupedKernelMode::RaggedM) {
    first_row = args.groups > 0 ? ends[args.groups - 1] : 0;
    rows = args.m - first_row;
  } else {
    const int g = blockIdx.y;
    const int64_t start = g > 0 ? ends[g - 1] : 0;
    if (!grouped_zeroed_group(args, start, ends[g])) return;
    first_row = g * args.m;
    rows = args.m;
  }
  const int64_t count = rows * args.n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    d[(first_row + i / args.n) * args.ldd + i % args.n] = 0;
  }
}

// grouped_zero_kernel for the modes that leave output unwritten (RaggedM, RaggedK), after the prepare kernel.
template <typename ElementD>
LaunchStatus launch_grouped_zero(const GroupedGemmLaunchArgs& args, const int32_t* ends, cudaStream_t stream) {
  const bool ragged_m = args.mode == GroupedKernelMode::RaggedM;
  if (!ragged_m && args.mode != GroupedKernelMode::RaggedK) return {true, ""};
  const int64_t blocks = std::min<int64_t>((args.m * args.n + 255) / 256, ragged_m ? 4 * args.sm_count : 16);
  const dim3 grid(static_cast<unsigned>(std::max<int64_t>(blocks, 1)), ragged_m ? 1u : static_cast<unsigned>(args.groups));
  grouped_zero_kernel<ElementD><<<grid, 256, 0, stream>>>(args, ends);
  if (cudaGetLastError() != cudaSuccess) return {false, "the grouped zero-fill kernel failed to launch"};
  return {true, ""};
}

template <typename Config>
typename Config::Gemm::Arguments grouped_arguments(const GroupedGemmLaunchArgs& args,
                                                   const GroupedArrays<Config>& arrays) {
  using Element = typename Config::Element;
  cutlass::KernelHardwareInfo hw_info;
  hw_info.device_id = args.device;
  hw_info.sm_count = args.sm_count;
  typename Config::Gemm::Arguments arguments{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {args.groups, arrays.shapes, nullptr},
      {arrays.a, arrays.stride_a, arrays.b, arrays.stride_b},
      {{}, const_cast<const Element**>(arrays.d), arrays.stride_d, arrays.d, arrays.stride_d},
      hw_info};
  arguments.epilogue.thread.alpha = 1.0f;
  arguments.epilogue.thread.beta = 0.0f;
  arguments.epilogue.thread.dAlpha = {cute::_0{}, cute::_0{}, 0};
  arguments.epilogue.thread.dBeta = {cute::_0{}, cute::_0{}, 0};
  return arguments;
}

template <typename Element, bool kARowMajor, bool kBRowMajor, bool kSwapAB>
struct GroupedRow {
  // The kernel's layouts (grouped_kernel_layouts): swapped, its A is B^T and its B is A^T, D column-major.
  using Row = cutlass::layout::RowMajor;
  using Column = cutlass::layout::ColumnMajor;
  static constexpr bool a_row = kSwapAB ? !kBRowMajor : kARowMajor;
  static constexpr bool b_row = kSwapAB ? !kARowMajor : kBRowMajor;
  using type = Sm90GroupedGemmConfig<Element, std::conditional_t<a_row, Row, Column>,
                                     std::conditional_t<b_row, Row, Column>, kSwapAB>;
};

// fn.template operator()<Config>() for the row of OPS_GROUPED_GEMM_KERNELS that serves `args`; `none()` for
// layouts no kernel is built for (grouped_gemm_launch.cpp never asks for them).
template <typename Element, typename Fn, typename None>
auto with_grouped_config(const GroupedGemmLaunchArgs& args, Fn&& fn, None&& none) {
#define OPS_GROUPED_ROW(a_row, b_row, swap)                                                      \
  if (args.a_row_major == a_row && args.b_row_major == b_row && args.swap_ab == swap) {         \
    return fn.template operator()<typename GroupedRow<Element, a_row, b_row, swap>::type>();    \
  }
  OPS_GROUPED_GEMM_KERNELS(OPS_GROUPED_ROW)
#undef OPS_GROUPED_ROW
  return none();
}

template <typename Config>
size_t grouped_workspace_size(const GroupedGemmLaunchArgs& args) {
  const GroupedArrays<Config> none(nullptr, args.groups);
  return GroupedArrays<Config>::bytes(args.groups) + Config::Gemm::get_workspace_size(grouped_arguments(args, none));
}

template <typename Config>
LaunchStatus grouped_run(const GroupedGemmLaunchArgs& args, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream) {
  if (workspace_bytes < grouped_workspace_size<Config>(args)) return {false, "workspace too small"};
  const GroupedArrays<Config> arrays(workspace, args.groups);
  grouped_prepare_kernel<Config><<<1, 32, 0, stream>>>(args, arrays);
  if (cudaGetLastError() != cudaSuccess) return {false, "the grouped arguments' kernel failed to launch"};
  const LaunchStatus zeroed = launch_grouped_zero<typename Config::ElementD>(args, arrays.ends, stream);
  if (!zeroed.ok) return zeroed;
  char* cutlass_workspace = static_cast<char*>(workspace) + GroupedArrays<Config>::bytes(args.groups);
  return run_adapter<typename Config::Gemm>(grouped_arguments(args, arrays), cutlass_workspace,
                                            workspace_bytes - GroupedArrays<Config>::bytes(args.groups), stream);
}

// A grouped kind (GroupedKind below; ScaledGroupedKind, sm90_scaled_grouped_gemm.cuh): its launch arguments, one
// configuration's workspace and launch, and with_config, which calls fn.template operator()<Config>() for the
// configuration that serves a launch, else none().
// with_config's callables: function objects with a template operator() (C++17, which a lambda with template
// parameters is not; torch 2.11's extension builder compiles with -std=c++17).
template <typename Kind>
struct KindWorkspaceSize {
  const typename Kind::Args& args;
  template <typename Config>
  size_t operator()() const { return Kind::template workspace_size<Config>(args); }
};

template <typename Kind>
struct KindRun {
  const typename Kind::Args& args;
  void* workspace;
  size_t workspace_bytes;
  cudaStream_t stream;
  template <typename Config>
  LaunchStatus operator()() const { return Kind::template run<Config>(args, workspace, workspace_bytes, stream); }
};

struct GroupedKind {
  using Args = GroupedGemmLaunchArgs;
  template <typename Config>
  static size_t workspace_size(const Args& args) { return grouped_workspace_size<Config>(args); }
  template <typename Config>
  static LaunchStatus run(const Args& args, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
    return grouped_run<Config>(args, workspace, workspace_bytes, stream);
  }
  template <typename Element, typename Fn, typename None>
  static auto with_config(const Args& args, Fn&& fn, None&& none) { return with_grouped_config<Element>(args, fn, none); }
};

}  // namespace ops::cutlass_gemm

// Defines <name>_{workspace_size,run} (the kernel interface, launcher.h's OPS_DECLARE_KERNEL) over Kind's
// configurations of `Element`; `refusal`: the launch's error where none serves the arguments.
#define OPS_DEFINE_KIND_ENTRY_POINTS(name, Kind, Element, refusal)                                         \
  namespace ops::cutlass_gemm {                                                                          \
  size_t name##_workspace_size(const Kind::Args& args) {                                                 \
    return Kind::with_config<Element>(args, KindWorkspaceSize<Kind>{args}, [] { return size_t{0}; });    \
  }                                                                                                      \
  LaunchStatus name##_run(const Kind::Args& args, void* workspace, size_t workspace_bytes, cudaStream_t stream) { \
    return Kind::with_config<Element>(args, KindRun<Kind>{args, workspace, workspace_bytes, stream},     \
                                      [] { return LaunchStatus{false, refusal}; });                      \
  }                                                                                                      \
  }

// Defines grouped_gemm_sm90_<dtype>_{workspace_size,run} (grouped_launch.h) for `Element`.
#define OPS_DEFINE_SM90_GROUPED_GEMM(dtype, Element) \
  OPS_DEFINE_KIND_ENTRY_POINTS(grouped_gemm_sm90_##dtype, GroupedKind, Element, \
                               "no grouped kernel is built for these operand layouts")
