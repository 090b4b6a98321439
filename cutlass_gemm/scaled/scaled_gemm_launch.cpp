// The launch of an SM90 FP8 scaled GEMM kernel as the CUDA kernel of ops::scaled_gemm builds it
// (prepare_scaled_launch: operands in the kernel's layouts, scales and bias where its loads want them), and
// its CPU replay: what the kernel computes from those arguments, read from their raw pointers and leading
// dimensions. The test hook _scaled_gemm_emulate runs both on CPU tensors, so the host side of the CUDA
// path is checked without a GPU.
#include <algorithm>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/util/Float8_e4m3fn.h>
#include <torch/library.h>

#include "../../csrc/json.h"
#include "../core/operands.h"
#include "../core/replay.h"
#include "scaled_gemm.h"
#include "../core/choice.h"  // json_names

namespace ops::cutlass_gemm {

std::vector<std::string> scaled_candidates(at::ScalarType out, ScaleRecipe recipe, Activation act, bool fast_accum) {
  return {scaled_kernel_name(out, recipe, act, fast_accum, false), scaled_kernel_name(out, recipe, act, fast_accum, true)};
}

ScaledLaunch prepare_scaled_launch(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                   const at::Tensor& scale_b, const c10::optional<at::Tensor>& bias,
                                   ScaleRecipe recipe, Activation act, bool fast_accum, at::Tensor& out) {
  ScaledLaunch l;
  l.a = tma_operand(A, /*row_major=*/true);
  l.b = tma_operand(B, /*row_major=*/false);
  l.in_place = out.is_contiguous() && aligned16(out);
  l.d = l.in_place ? out : at::empty(out.sizes(), out.options());
  // Blockwise: scale_a (M, ceil(K/128)) stored M-major, as the kernel's scale layout reads it, in rows of
  // M rounded up to 4 (16-byte aligned for its TMA loads).
  const int64_t sa_ld = (A.size(0) + 3) / 4 * 4;
  if (scaled_block_recipe(recipe)) {
    l.scale_a = at::zeros({scale_a.size(1), sa_ld}, scale_a.options());
    l.scale_a.narrow(1, 0, A.size(0)).copy_(scale_a.t());
  } else {
    l.scale_a = aligned_contiguous(scale_a);
  }
  l.scale_b = aligned_contiguous(scale_b);
  if (bias.has_value() && bias->defined()) l.bias = aligned_contiguous(*bias);
  ScaledGemmLaunchArgs& args = l.args;
  args.a = l.a.const_data_ptr();
  args.b = l.b.const_data_ptr();
  args.d = l.d.data_ptr();
  args.m = l.a.size(0);
  args.n = l.b.size(1);
  args.k = l.a.size(1);
  args.lda = l.a.stride(0);
  args.ldb = l.b.stride(1);
  args.ldd = l.d.size(1);
  args.scale_a = l.scale_a.const_data_ptr<float>();
  args.scale_a_per_row = recipe == ScaleRecipe::Rowwise;
  args.scale_b = l.scale_b.const_data_ptr<float>();
  args.scale_b_per_column = recipe == ScaleRecipe::Rowwise;
  args.block_scaled = scaled_block_recipe(recipe);
  args.block_n = recipe == ScaleRecipe::Block1x128 ? 1 : 128;
  args.scale_a_ld = sa_ld;
  args.bias = l.bias.defined() ? l.bias.const_data_ptr() : nullptr;
  args.fast_accum = fast_accum;
  args.swap_ab = scaled_swap_ab(args.m);
  args.act = bias_epilogue(act);
  return l;
}

namespace {

// The CUDA path's launch on CPU tensors (e4m3 A and B): prepared as on CUDA, computed by the replay.
at::Tensor scaled_gemm_emulate(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                               const at::Tensor& scale_b, const c10::optional<at::Tensor>& bias,
                               c10::optional<at::ScalarType> out_dtype, c10::string_view activation,
                               bool use_fast_accum) {
  return scaled_gemm_with(A, B, scale_a, scale_b, bias, out_dtype, activation, use_fast_accum,
                          [](const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa, const at::Tensor& sb,
                             const c10::optional<at::Tensor>& bi, ScaleRecipe recipe, Activation act, bool fast,
                             at::Tensor& out) {
                            TORCH_CHECK(a.scalar_type() == at::kFloat8_e4m3fn && b.scalar_type() == at::kFloat8_e4m3fn,
                                        "_scaled_gemm_emulate: the FP8 kernels take float8_e4m3fn A and B");
                            const at::AutoDispatchBelowADInplaceOrView below_autograd;
                            ScaledLaunch l = prepare_scaled_launch(a, b, sa, sb, bi, recipe, act, fast, out);
                            // A forced tactic (ops.gemm.set_tactic) picks the variant, as on CUDA.
                            const std::vector<std::string> names =
                                scaled_candidates(out.scalar_type(), recipe, act, fast);
                            Candidates c;
                            c.names = [&]() -> const std::vector<std::string>& { return names; };
                            c.heuristic = l.args.swap_ab ? 1 : 0;
                            const Choice choice =
                                choose("_scaled_gemm_emulate", "call", [] { return std::string(); }, c);
                            l.args.swap_ab = choice.index == 1;
                            replay_launch({GemmKind::Scaled, &l.args, out.scalar_type()});
                            if (!l.in_place) out.copy_(l.d);
                          });
}

}  // namespace
}  // namespace ops::cutlass_gemm

TORCH_LIBRARY_IMPL(ops, CPU, m) { m.impl("_scaled_gemm_emulate", &ops::cutlass_gemm::scaled_gemm_emulate); }
