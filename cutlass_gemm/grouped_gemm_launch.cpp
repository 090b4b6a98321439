// The launch of an SM90 grouped GEMM kernel as the CUDA kernel of ops::grouped_gemm builds it
// (prepare_grouped_launch: operands in the layouts the kernels read, a fresh output), and its CPU replay:
// what the kernels compute from those arguments, group by group from the raw pointers, leading dimensions
// and offs, with the ends clamped and the unwritten output zeroed as the device code does (grouped_args.h).
// The test hook _grouped_gemm_emulate runs both on CPU tensors, so the host side of the CUDA path and the
// per-group arithmetic of its device code are checked without a GPU.
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include <limits>

#include "../csrc/json.h"
#include "grouped_gemm.h"
#include "operands.h"
#include "tactic_select.h"  // json_names

namespace ops::cutlass_gemm {
namespace {

GroupedKernelMode kernel_mode(GroupedMode mode) {
  switch (mode) {
    case GroupedMode::RaggedM: return GroupedKernelMode::RaggedM;
    case GroupedMode::RaggedK: return GroupedKernelMode::RaggedK;
    default: return GroupedKernelMode::Batched;
  }
}

bool multiple_of_16_bytes(int64_t extent, const at::Tensor& t) { return extent * t.element_size() % 16 == 0; }

}  // namespace

std::string grouped_kernel_refusal(const at::Tensor& A, const at::Tensor& B, const GroupedProblem& p,
                                   at::ScalarType dtype) {
  const at::ScalarType t = A.scalar_type();
  if ((t != at::kBFloat16 && t != at::kHalf) || dtype != t) {
    return "the grouped kernels take bfloat16 or float16 A and B with out_dtype = their dtype";
  }
  if (p.mode == GroupedMode::RaggedN) {
    return "3D x 2D is not among the grouped kernels' modes: its groups start at any column of B and the "
           "output, where TMA needs 16-byte aligned addresses";
  }
  if (p.groups == 0 || A.numel() == 0 || B.numel() == 0) return "an empty problem";
  const int64_t m = A.size(-2), k = A.size(-1), n = B.size(-1);
  const std::string extents = int32_extents_refusal({m, n, k});
  if (!extents.empty()) return extents;
  // The rows of each operand the kernel reads: K for a row-major A and a column-major B, N for a row-major
  // B and D, M for RaggedK's column-major A.
  const bool aligned = multiple_of_16_bytes(n, A) &&
                       (p.mode == GroupedMode::RaggedK ? multiple_of_16_bytes(m, A) : multiple_of_16_bytes(k, A));
  if (!aligned) {
    return p.mode == GroupedMode::RaggedK ? "M and N must be multiples of 16 bytes (TMA rows)"
                                          : "K and N must be multiples of 16 bytes (TMA rows)";
  }
  if (p.mode == GroupedMode::RaggedK && p.groups > 65535) return "more than 65535 groups of K";
  return "";
}

GroupedGemmLaunchArgs grouped_kernel_layouts(const GroupedProblem& p, const at::Tensor& A, const at::Tensor& B) {
  GroupedGemmLaunchArgs args;
  args.mode = kernel_mode(p.mode);
  // RaggedK reads A column-major (its K, cut by offs, is the column index); the others row-major. B: in place
  // in either layout, else a row-major copy; RaggedK's B is cut along K, its rows: row-major.
  args.a_row_major = args.mode != GroupedKernelMode::RaggedK;
  args.b_row_major = args.mode == GroupedKernelMode::RaggedK || !tma_in_place(B, /*row_major=*/false);
  args.swap_ab = grouped_swap_ab(args.mode, A.size(-2), p.groups);
  return args;
}

GroupedLaunch prepare_grouped_launch(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                                     const GroupedProblem& p, at::ScalarType dtype) {
  GroupedLaunch l;
  GroupedGemmLaunchArgs& args = l.args;
  args = grouped_kernel_layouts(p, A, B);
  args.groups = static_cast<int>(p.groups);
  args.m = A.size(-2);
  args.k = A.size(-1);
  args.n = B.size(-1);
  l.a = tma_operand(A, args.a_row_major);
  l.b = tma_operand(B, args.b_row_major);
  l.d = at::empty(p.out_sizes, A.options().dtype(dtype));
  if (args.mode != GroupedKernelMode::Batched) l.offs = offs->contiguous();
  const int64_t last = l.a.dim() - 1;
  args.a = l.a.const_data_ptr();
  args.b = l.b.const_data_ptr();
  args.d = l.d.data_ptr();
  args.offs = l.offs.defined() ? l.offs.const_data_ptr<int32_t>() : nullptr;
  args.lda = args.a_row_major ? l.a.stride(last - 1) : l.a.stride(last);
  args.ldb = args.b_row_major ? l.b.stride(l.b.dim() - 2) : l.b.stride(l.b.dim() - 1);
  args.ldd = args.n;
  args.group_stride_a = l.a.dim() == 3 ? l.a.stride(0) : 0;
  args.group_stride_b = l.b.dim() == 3 ? l.b.stride(0) : 0;
  return l;
}

std::string grouped_kernel_name(const GroupedGemmLaunchArgs& args, at::ScalarType dtype) {
  // The kernel's own A, B and D in BLAS letters (t row-major, n column-major), as kernel_name() spells them:
  // swapped, A is B^T (B's layout flipped), B is A^T and D column-major.
  const std::string layouts = args.swap_ab ? std::string(args.b_row_major ? "n" : "t") + "nn"
                                           : std::string(args.a_row_major ? "t" : "n") + (args.b_row_major ? "t" : "n") + "t";
  return std::string("sm90_") + (dtype == at::kBFloat16 ? "bf16" : "f16") + "_" +
         (args.swap_ab ? kGroupedGemmSwapTile : kGroupedGemmTile) + "_" + layouts + "_align8_" + kGroupedGemmSchedule;
}

// As with_grouped_config (sm90_grouped_gemm.cuh) instantiates them: per dtype, row-major A with B either way
// (2D x 3D and 3D x 3D), those two swapped, and column-major A with row-major B (2D x 2D).
std::vector<std::string> grouped_kernels_json() {
  struct Variant {
    bool a_row_major, b_row_major, swap_ab;
  };
  constexpr Variant kVariants[] = {
      {true, true, false}, {true, false, false}, {true, true, true}, {true, false, true}, {false, true, false}};
  const std::string row_a_modes =
      json_names({grouped_mode_name(GroupedMode::RaggedM), grouped_mode_name(GroupedMode::Batched)});
  const std::string column_a_modes = json_names({grouped_mode_name(GroupedMode::RaggedK)});
  std::vector<std::string> kernels;
  for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    for (const Variant& v : kVariants) {
      GroupedGemmLaunchArgs args;
      args.a_row_major = v.a_row_major;
      args.b_row_major = v.b_row_major;
      args.swap_ab = v.swap_ab;
      JsonObject o;
      o.add("name", grouped_kernel_name(args, dtype))
          .add("op", "grouped_gemm")
          .add("sm", 90)
          .add("dtype", std::string(c10::getDtypeNames(dtype).first))  // torch's names, as ops.kernels() spells all
          .raw("modes", v.a_row_major ? row_a_modes : column_a_modes)
          .add("layout_a", v.a_row_major ? "row" : "col")
          .add("layout_b", v.b_row_major ? "row" : "col")
          .add("swap_ab", v.swap_ab)
          .add("candidate_only", true);
      kernels.push_back(o.str());
    }
  }
  return kernels;
}

void replay_grouped_launch(const GroupedGemmLaunchArgs& args, at::ScalarType dtype) {
  const at::TensorOptions options = at::TensorOptions().dtype(dtype);
  const int64_t bytes = c10::elementSize(dtype), extent = grouped_extent(args);
  auto* d = static_cast<char*>(args.d);
  const auto matrix = [&](const void* base, int64_t rows, int64_t cols, int64_t ld, bool row_major) {
    return at::from_blob(const_cast<void*>(base), {rows, cols}, row_major ? at::IntArrayRef{ld, 1} : at::IntArrayRef{1, ld},
                         options);
  };
  // The kernel's problem per group (grouped_kernel_group and grouped_kernel_layouts, as the device code
  // and with_grouped_config read them; swapped: D^T = B^T A^T, D^T column-major).
  const GroupedKernelLayouts l = grouped_kernel_layouts(args);
  int32_t end = 0;
  for (int g = 0; g < args.groups; ++g) {
    const int32_t start = end;
    if (args.offs != nullptr) end = std::max(end, clamped_offset(args.offs[g], extent));
    const GroupShape s = group_shape(args, g, start, end);
    if (grouped_zeroed_group(args, start, end)) {
      matrix(d + s.d * bytes, args.m, args.n, args.ldd, true).zero_();
      continue;
    }
    const GroupedKernelGroup k = grouped_kernel_group(args, s);
    if (k.m == 0 || k.n == 0) continue;
    const at::Tensor product =
        at::mm(matrix(static_cast<const char*>(k.a) + k.a_offset * bytes, k.m, k.k, k.lda, l.a_row_major).to(at::kDouble),
               matrix(static_cast<const char*>(k.b) + k.b_offset * bytes, k.k, k.n, k.ldb, l.b_row_major).to(at::kDouble));
    matrix(d + k.d_offset * bytes, k.m, k.n, args.ldd, l.d_row_major).copy_(product);
  }
  if (args.mode == GroupedKernelMode::RaggedM && end < args.m) {
    matrix(d + end * args.ldd * bytes, args.m - end, args.n, args.ldd, true).zero_();
  }
}

namespace {

// The CUDA path's SM90 launch on CPU tensors: prepared as on CUDA, computed by the replay.
at::Tensor grouped_gemm_emulate(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                                c10::optional<at::ScalarType> out_dtype) {
  return grouped_gemm_with(A, B, offs, out_dtype, [](const at::Tensor& a, const at::Tensor& b,
                                                      const c10::optional<at::Tensor>& o, const GroupedProblem& p,
                                                      at::ScalarType dtype) {
    const std::string refusal = grouped_kernel_refusal(a, b, p, dtype);
    TORCH_CHECK(refusal.empty(), "_grouped_gemm_emulate: the SM90 grouped kernels do not take this problem: ", refusal);
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    GroupedLaunch l = prepare_grouped_launch(a, b, o, p, dtype);
    l.d.fill_(std::numeric_limits<double>::quiet_NaN());  // an element the kernels would leave unwritten shows
    replay_grouped_launch(l.args, dtype);
    return l.d;
  });
}

}  // namespace
}  // namespace ops::cutlass_gemm

TORCH_LIBRARY_IMPL(ops, CPU, m) { m.impl("_grouped_gemm_emulate", &ops::cutlass_gemm::grouped_gemm_emulate); }
