// What one launch of the SM90 grouped GEMM kernels is given (grouped_launch.h) and what each of its groups
// computes: plain C++, shared by the host code that builds a launch (grouped/grouped_gemm_launch.cpp), the device
// code that expands it into CUTLASS's per-group arrays (sm90_grouped_gemm.cuh) and its CPU replay (core/replay.cpp).
#pragma once

#include <cstdint>

#ifndef OPS_HOST_DEVICE
#if defined(__CUDACC__)
#define OPS_HOST_DEVICE __host__ __device__
#else
#define OPS_HOST_DEVICE
#endif
#endif

namespace ops::cutlass_gemm {

// The modes the kernels run (torch._grouped_mm's, checks.h GroupedMode; 3D x 2D is not among them: its
// groups start at any column of B and D, where TMA needs 16-byte aligned addresses).
enum class GroupedKernelMode : int8_t {
  RaggedM,  // 2D A (m x k, row-major) x 3D B: offs cuts A's and D's rows, one B per group
  RaggedK,  // 2D A (m x k, column-major) x 2D B (k x n, row-major): offs cuts K, one m x n D per group
  Batched,  // 3D x 3D: every group m x n x k
};

// D = A @ B per group, accumulated in float32, D row-major and of A's dtype (bfloat16 or float16). Every
// address and leading dimension 16-byte aligned.
struct GroupedGemmLaunchArgs {
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  const int32_t* offs = nullptr;  // RaggedM, RaggedK: the groups' cumulative ends, read on the device
  int groups = 0;
  GroupedKernelMode mode = GroupedKernelMode::RaggedM;
  int64_t m = 0, n = 0, k = 0;  // RaggedM: m is all of A's rows; RaggedK: k is all of A's columns
  bool a_row_major = true;      // A (m x k): row-major (K-major), else column-major (M-major)
  bool b_row_major = true;      // B (k x n): row-major (N-major), else column-major (K-major)
  int64_t lda = 0, ldb = 0, ldd = 0;
  int64_t group_stride_a = 0;  // Batched: elements between the groups' A
  int64_t group_stride_b = 0;  // RaggedM, Batched: elements between the groups' B
  // RaggedM, Batched: the kernels run each group transposed, D^T (n x m, column-major: the row-major D) =
  // B^T A^T, so that a group's few rows (decode: a few tokens per expert) fill the kernel's narrow N tile
  // and its weight the 128-row side (grouped_swap_ab decides).
  bool swap_ab = false;
  int device = 0;
  int sm_count = 0;
};

// The SM90 grouped kernels, one row per layout of the user's A and B and swap, declared once: the device
// code instantiates each row (with_grouped_config, sm90_grouped_gemm.cuh) and the host names and lists them
// (core/kernel_names.cpp). X(a_row_major, b_row_major, swap_ab), one kernel per row and element
// type (bf16, f16): row-major A with B either way (2D x 3D, 3D x 3D), those two swapped, and column-major A
// with row-major B (2D x 2D).
#define OPS_GROUPED_GEMM_KERNELS(X) \
  X(true, true, false)              \
  X(true, false, false)             \
  X(true, true, true)               \
  X(true, false, true)              \
  X(false, true, false)
#define OPS_COUNT_ROW(...) +1
inline constexpr int kNumGroupedGemmKernels = 0 OPS_GROUPED_GEMM_KERNELS(OPS_COUNT_ROW);
#undef OPS_COUNT_ROW
static_assert(kNumGroupedGemmKernels == 5, "every grouped row named and listed, per element type");

// The kernels' tiles and cluster, and their schedule (sm90_grouped_gemm.cuh), for their names in plan().
inline constexpr const char* kGroupedGemmTile = "128x128x64_1x1x1";
inline constexpr const char* kGroupedGemmSwapTile = "128x32x128_1x1x1";
inline constexpr const char* kGroupedGemmSchedule = "warpspecialized_cooperative_ptr_array";

// Whether a launch runs its groups transposed (swap_ab): RaggedM and Batched with at most 32 rows per group
// on average, where a 128-row tile would be mostly idle. A prior, to be fitted on an H200.
OPS_HOST_DEVICE inline bool grouped_swap_ab(GroupedKernelMode mode, int64_t rows, int64_t groups) {
  return mode != GroupedKernelMode::RaggedK && groups > 0 &&
         (mode == GroupedKernelMode::Batched ? rows : rows / groups) <= 32;
}

// One group's problem: its extents and the element offsets of its A, B and D from the launch's pointers.
struct GroupShape {
  int m = 0, n = 0, k = 0;
  int64_t a = 0, b = 0, d = 0;
};

// The extent offs cuts (RaggedM: rows, RaggedK: K); Batched has none.
OPS_HOST_DEVICE inline int64_t grouped_extent(const GroupedGemmLaunchArgs& args) {
  return args.mode == GroupedKernelMode::RaggedM ? args.m : args.mode == GroupedKernelMode::RaggedK ? args.k : 0;
}

// Group g's end as the kernels read offs: clamped into [0, extent], then the running maximum of those
// (end = max(end of g - 1, clamp(offs[g]))), so that a decreasing or out-of-range offset makes an empty or
// shortened group, never a read or write out of bounds. This is core/group_ends.h's device_group_ends.
OPS_HOST_DEVICE inline int32_t clamped_offset(int32_t offset, int64_t extent) {
  return offset < 0 ? 0 : offset > extent ? static_cast<int32_t>(extent) : offset;
}

// Group g of [start, end) (ends as clamped_offset and the running maximum give them). A RaggedK group of no
// K is given no rows: the kernels skip it (an empty K loop would store an accumulator never initialized),
// and grouped_zeroed_group says it is zero-filled instead.
OPS_HOST_DEVICE inline GroupShape group_shape(const GroupedGemmLaunchArgs& args, int g, int64_t start, int64_t end) {
  GroupShape s;
  s.n = static_cast<int>(args.n);
  switch (args.mode) {
    case GroupedKernelMode::RaggedM:
      s.m = static_cast<int>(end - start);
      s.k = static_cast<int>(args.k);
      s.a = start * args.lda;
      s.b = g * args.group_stride_b;
      s.d = start * args.ldd;
      break;
    case GroupedKernelMode::RaggedK:
      s.k = static_cast<int>(end - start);
      s.m = s.k > 0 ? static_cast<int>(args.m) : 0;
      s.a = start * args.lda;  // column-major A: K is its column index
      s.b = start * args.ldb;  // row-major B: K is its row index
      s.d = g * args.m * args.ldd;
      break;
    case GroupedKernelMode::Batched:
      s.m = static_cast<int>(args.m);
      s.k = static_cast<int>(args.k);
      s.a = g * args.group_stride_a;
      s.b = g * args.group_stride_b;
      s.d = g * args.m * args.ldd;
      break;
  }
  return s;
}

// The operand layouts of the kernel a launch runs (swap_ab applied: its A is B^T, B's layout flipped, and its
// B is A^T; its D is column-major), which with_grouped_config turns into a kernel configuration.
struct GroupedKernelLayouts {
  bool a_row_major = true, b_row_major = true, d_row_major = true;
};
OPS_HOST_DEVICE inline GroupedKernelLayouts grouped_kernel_layouts(const GroupedGemmLaunchArgs& args) {
  GroupedKernelLayouts l;
  l.a_row_major = args.swap_ab ? !args.b_row_major : args.a_row_major;
  l.b_row_major = args.swap_ab ? !args.a_row_major : args.b_row_major;
  l.d_row_major = !args.swap_ab;
  return l;
}

// Group g as its kernel runs it (swap_ab applied: n x m x k, B's memory as the kernel's A): the extents, the
// kernel's A and B as a base pointer of the launch (args.a or args.b) and an element offset, their leading
// dimensions, and D's element offset. For the device's per-group arguments and the CPU replay alike.
struct GroupedKernelGroup {
  int m = 0, n = 0, k = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  int64_t a_offset = 0, b_offset = 0, d_offset = 0;
  int64_t lda = 0, ldb = 0;
};
OPS_HOST_DEVICE inline GroupedKernelGroup grouped_kernel_group(const GroupedGemmLaunchArgs& args, const GroupShape& s) {
  if (!args.swap_ab) return {s.m, s.n, s.k, args.a, args.b, s.a, s.b, s.d, args.lda, args.ldb};
  return {s.n, s.m, s.k, args.b, args.a, s.b, s.a, s.d, args.ldb, args.lda};
}

// Whether group g's m x n output is zero-filled instead of computed: a RaggedK group of no K.
OPS_HOST_DEVICE inline bool grouped_zeroed_group(const GroupedGemmLaunchArgs& args, int64_t start, int64_t end) {
  return args.mode == GroupedKernelMode::RaggedK && end == start;
}

}  // namespace ops::cutlass_gemm
