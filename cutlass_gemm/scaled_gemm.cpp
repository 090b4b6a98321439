// ops::scaled_gemm (FP8 A and B with float32 scales) on CPU, and on CUDA until its CUTLASS kernels land:
// the dequantized formula in ATen, out = act((A * scale_a) @ (B * scale_b) + bias), dequantization,
// product, bias and activation in float32, rounded once to out_dtype. That is what torch._scaled_mm
// computes on CPU (equal bit for bit: tests/test_scaled_gemm.py), for every recipe (checks.h).
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include "../csrc/activation_ops.h"
#include "../csrc/checks.h"

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

at::ScalarType out_dtype_or_default(const c10::optional<at::ScalarType>& out_dtype) {
  return out_dtype.value_or(at::kBFloat16);
}

void scaled_gemm_into(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a, const at::Tensor& scale_b,
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

at::Tensor scaled_gemm(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a, const at::Tensor& scale_b,
                       const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> out_dtype,
                       c10::string_view activation, bool /*use_fast_accum: no effect in float32*/) {
  const at::ScalarType dtype = out_dtype_or_default(out_dtype);
  const ScaleRecipe recipe = check_scaled_gemm_inputs(kOp, A, B, scale_a, scale_b, bias, dtype);
  const Activation act = parse_activation(kOp, activation);
  at::Tensor out = at::empty({A.size(0), B.size(1)}, A.options().dtype(dtype));
  scaled_gemm_into(A, B, scale_a, scale_b, bias, recipe, act, out);
  return out;
}

void scaled_gemm_out(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a, const at::Tensor& scale_b,
                     const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> out_dtype,
                     c10::string_view activation, bool /*use_fast_accum*/, at::Tensor& out) {
  TORCH_CHECK(out.defined(), kOp, ": out must be a defined tensor");
  // Without out_dtype, out's dtype decides.
  const at::ScalarType dtype = out_dtype.value_or(out.scalar_type());
  const ScaleRecipe recipe = check_scaled_gemm_inputs(kOp, A, B, scale_a, scale_b, bias, dtype);
  const Activation act = parse_activation(kOp, activation);
  check_gemm_out(kOp, A, B, out, dtype, "out_dtype");
  // The result is computed apart from out and copied in last: out never feeds its own computation.
  scaled_gemm_into(A, B, scale_a, scale_b, bias, recipe, act, out);
}

}  // namespace
}  // namespace ops::cutlass_gemm

TORCH_LIBRARY_IMPL(ops, CPU, m) {
  m.impl("scaled_gemm", &ops::cutlass_gemm::scaled_gemm);
  m.impl("scaled_gemm.out", &ops::cutlass_gemm::scaled_gemm_out);
}

TORCH_LIBRARY_IMPL(ops, CUDA, m) {
  m.impl("scaled_gemm", &ops::cutlass_gemm::scaled_gemm);
  m.impl("scaled_gemm.out", &ops::cutlass_gemm::scaled_gemm_out);
}
