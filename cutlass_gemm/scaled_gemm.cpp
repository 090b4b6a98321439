// ops::scaled_gemm (FP8 A and B with float32 scales) on CPU, and on CUDA where no CUTLASS kernel takes the
// call (scaled_gemm_cuda.cpp): the dequantized formula in ATen, out = act((A * scale_a) @ (B * scale_b) +
// bias), dequantization, product, bias and activation in float32, rounded once to out_dtype. That is what
// torch._scaled_mm computes on CPU (equal bit for bit: tests/test_fp8.py), for every recipe (checks.h).
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include "../csrc/json.h"
#include "scaled_gemm.h"

namespace ops::cutlass_gemm {
namespace {

constexpr const char* kOp = "scaled_gemm";

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
  const at::Tensor a = A.to(at::kFloat).mul_(expand_scale_a(scale_a, recipe, K));
  const at::Tensor b = B.to(at::kFloat).mul_(expand_scale_b(scale_b, recipe, K, N));
  at::Tensor z = at::mm(a, b);
  if (bias.has_value() && bias->defined()) z.add_(bias->to(at::kFloat));
  apply_activation_(z, act);
  out.copy_(z);
}

std::string scaled_gemm_plan(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                             const at::Tensor& scale_b, const c10::optional<at::Tensor>& bias,
                             c10::optional<at::ScalarType> out_dtype, c10::string_view activation,
                             bool use_fast_accum) {
#if OPS_WITH_CUDA
  if (A.is_cuda()) return scaled_gemm_cuda_plan(A, B, scale_a, scale_b, bias, out_dtype, activation, use_fast_accum);
#endif
  const ScaleRecipe recipe = check_scaled_gemm_inputs(kOp, A, B, scale_a, scale_b, bias, scaled_gemm_out_dtype(out_dtype));
  parse_activation(kOp, activation);
  JsonObject plan;
  plan.add("recipe", scale_recipe_name(recipe));
  plan.add("path", "formula");
  plan.add("reason", "the CPU runs the dequantized formula in ATen");
  return plan.str();
}

namespace {

// The formula as a path: use_fast_accum has no effect in float32.
void formula(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a, const at::Tensor& scale_b,
             const c10::optional<at::Tensor>& bias, ScaleRecipe recipe, Activation act, bool /*use_fast_accum*/,
             at::Tensor& out) {
  scaled_gemm_formula_into(A, B, scale_a, scale_b, bias, recipe, act, out);
}

at::Tensor scaled_gemm(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a, const at::Tensor& scale_b,
                       const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> out_dtype,
                       c10::string_view activation, bool use_fast_accum) {
  return scaled_gemm_with(A, B, scale_a, scale_b, bias, out_dtype, activation, use_fast_accum, formula);
}

void scaled_gemm_out(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a, const at::Tensor& scale_b,
                     const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> out_dtype,
                     c10::string_view activation, bool use_fast_accum, at::Tensor& out) {
  scaled_gemm_out_with(A, B, scale_a, scale_b, bias, out_dtype, activation, use_fast_accum, out, formula);
}

}  // namespace
}  // namespace ops::cutlass_gemm

TORCH_LIBRARY_IMPL(ops, CPU, m) {
  m.impl("scaled_gemm", &ops::cutlass_gemm::scaled_gemm);
  m.impl("scaled_gemm.out", &ops::cutlass_gemm::scaled_gemm_out);
}

TORCH_LIBRARY_IMPL(ops, CompositeImplicitAutograd, m) {
  m.impl("_scaled_gemm_plan", &ops::cutlass_gemm::scaled_gemm_plan);
}
