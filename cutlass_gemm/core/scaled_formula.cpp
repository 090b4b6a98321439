// The dequantized FP8 formula: what torch._scaled_mm computes on CPU (equal bit for bit:
// tests/test_fp8_numerics.py), for every recipe (checks.h).
#include "scaled_formula.h"

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>

#include "../../csrc/activation_ops.h"

namespace ops::cutlass_gemm {
namespace {

// scale_a as a float32 (1 or M, 1 or K) factor of A's elements, scale_b as a (1 or K, 1 or N) one of B's.
at::Tensor expand_scale_a(const at::Tensor& s, ScaleRecipe recipe, int64_t K) {
  switch (recipe) {
    case ScaleRecipe::Tensorwise: return s.reshape({1, 1});
    case ScaleRecipe::Rowwise: return s;
    case ScaleRecipe::Block128:
    case ScaleRecipe::Block1x128: return expand_block_scale(s, 1, K);
  }
  return s;
}

at::Tensor expand_scale_b(const at::Tensor& s, ScaleRecipe recipe, int64_t K, int64_t N) {
  switch (recipe) {
    case ScaleRecipe::Tensorwise: return s.reshape({1, 1});
    case ScaleRecipe::Rowwise: return s;
    case ScaleRecipe::Block128:
      return expand_block_scale(expand_block_scale(s, 0, K), 1, N);
    case ScaleRecipe::Block1x128: return expand_block_scale(s, 0, K);
  }
  return s;
}

}  // namespace

at::ScalarType scaled_gemm_out_dtype(const c10::optional<at::ScalarType>& out_dtype) {
  return out_dtype.value_or(at::kBFloat16);
}

void scaled_gemm_formula_into(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a, const at::Tensor& scale_b,
                      const c10::optional<at::Tensor>& bias, ScaleRecipe recipe, Activation act, at::Tensor& out) {
  const at::AutoDispatchBelowADInplaceOrView below_autograd;  // a backend kernel: ATen calls unseen by autograd
  const int64_t K = A.size(1), N = B.size(1);
  // Row-major float32 copies, as torch._scaled_mm's CPU path makes them: mm of a column-major B at M <= 3
  // sums in another order (a few ulps).
  const auto contiguous = [](const at::Tensor& t) {
    return t.to(at::kFloat, /*non_blocking=*/false, /*copy=*/false, at::MemoryFormat::Contiguous);
  };
  const at::Tensor a = contiguous(A).mul_(expand_scale_a(scale_a, recipe, K));
  const at::Tensor b = contiguous(B).mul_(expand_scale_b(scale_b, recipe, K, N));
  at::Tensor z = at::mm(a, b);
  if (bias.has_value() && bias->defined()) z.add_(bias->to(at::kFloat));
  apply_activation_(z, act);
  out.copy_(z);
}

}  // namespace ops::cutlass_gemm
