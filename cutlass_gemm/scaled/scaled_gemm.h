// ops::scaled_gemm's paths, shared by its CPU kernel (scaled_gemm.cpp) and its CUDA kernel
// (scaled_gemm_cuda.cpp).
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "../../csrc/activation.h"
#include "../../csrc/activation_ops.h"
#include "../../csrc/checks.h"
#include "../core/kernel_names.h"
#include "../core/scaled_formula.h"
#include "../kernels/scaled_args.h"

namespace ops::cutlass_gemm {

// A path of scaled_gemm: compute(A, B, scale_a, scale_b, bias, recipe, act, use_fast_accum, out) writes the
// result into out (a fresh tensor, or the user's for .out: the result must be computed apart from it).
// scaled_gemm and scaled_gemm.out around it: the op's checks, the output.
template <typename Compute>
at::Tensor scaled_gemm_with(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                            const at::Tensor& scale_b, const c10::optional<at::Tensor>& bias,
                            c10::optional<at::ScalarType> out_dtype, c10::string_view activation, bool use_fast_accum,
                            Compute&& compute) {
  const at::ScalarType dtype = scaled_gemm_out_dtype(out_dtype);
  const ScaleRecipe recipe = check_scaled_gemm_inputs("scaled_gemm", A, B, scale_a, scale_b, bias, dtype);
  const Activation act = parse_activation("scaled_gemm", activation);
  at::Tensor out = at::empty({A.size(0), B.size(1)}, A.options().dtype(dtype));
  compute(A, B, scale_a, scale_b, bias, recipe, act, use_fast_accum, out);
  return out;
}

template <typename Compute>
void scaled_gemm_out_with(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                          const at::Tensor& scale_b, const c10::optional<at::Tensor>& bias,
                          c10::optional<at::ScalarType> out_dtype, c10::string_view activation, bool use_fast_accum,
                          at::Tensor& out, Compute&& compute) {
  TORCH_CHECK(out.defined(), "scaled_gemm: out must be a defined tensor");
  const at::ScalarType dtype = out_dtype.value_or(out.scalar_type());  // without out_dtype, out's decides
  const char* origin = out_dtype.has_value() ? "out_dtype" : "out's dtype";
  const ScaleRecipe recipe = check_scaled_gemm_inputs("scaled_gemm", A, B, scale_a, scale_b, bias, dtype, origin);
  const Activation act = parse_activation("scaled_gemm", activation);
  const at::Tensor no_bias;
  bool may_alias = check_gemm_out("scaled_gemm", A, B, out, dtype, origin);
  // The kernels' epilogue reads the scales and the bias while it writes out.
  may_alias |= check_out_memory("scaled_gemm", out, {{"scale_a", &scale_a}, {"scale_b", &scale_b},
                                                     {"bias", bias.has_value() ? &*bias : &no_bias}});
  if (!may_alias) {
    compute(A, B, scale_a, scale_b, bias, recipe, act, use_fast_accum, out);
    return;
  }
  at::Tensor result = at::empty(out.sizes(), out.options());  // out shares memory with an input undecidably
  compute(A, B, scale_a, scale_b, bias, recipe, act, use_fast_accum, result);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  out.copy_(result);
}


// torch._scaled_mm as a path (CUDA, where no CUTLASS kernel takes the call): tensorwise and rowwise, torch
// adding the bias where there is no activation, else a float32 product to which the bias and activation
// are applied here, one rounding into out. Returns false, out untouched, where torch refuses the call; such
// a refusal is kept for every call of its kind (device, recipe, dtypes, bias, use_fast_accum), which then takes the
// formula without asking torch again.
bool scaled_gemm_torch_into(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                            const at::Tensor& scale_b, const c10::optional<at::Tensor>& bias, ScaleRecipe recipe,
                            Activation act, bool use_fast_accum, at::Tensor& out);
// Why that path does not take such a call ("" where it will ask torch): blockwise, or torch's refusal.
std::string scaled_gemm_torch_refusal(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& bias,
                                      ScaleRecipe recipe, Activation act, at::ScalarType dtype, bool fast_accum);


// A launch of the SM90 FP8 kernels as scaled_gemm's CUDA kernel builds it (scaled_gemm_launch.cpp): the
// tensors its arguments point into (operands in the kernel's layouts, copied where needed; d: out itself
// where contiguous and aligned, else a temporary to copy into out), and the arguments (device and SM count
// left to the caller).
// The kernels that can run a call: unswapped and swapped (ScaledGemmLaunchArgs::swap_ab), in that order.
std::vector<std::string> scaled_candidates(at::ScalarType out, ScaleRecipe recipe, Activation act, bool fast_accum);

struct ScaledLaunch {
  ScaledGemmLaunchArgs args;
  at::Tensor a, b, d, scale_a, scale_b, bias;
  bool in_place = false;
};
ScaledLaunch prepare_scaled_launch(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                   const at::Tensor& scale_b, const c10::optional<at::Tensor>& bias,
                                   ScaleRecipe recipe, Activation act, bool fast_accum, at::Tensor& out);


// JSON of the path a call takes (recipe, path, kernel, reason): ops.fp8.plan.
std::string scaled_gemm_plan(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                             const at::Tensor& scale_b, const c10::optional<at::Tensor>& bias,
                             c10::optional<at::ScalarType> out_dtype, c10::string_view activation,
                             bool use_fast_accum);
#if OPS_WITH_CUDA
std::string scaled_gemm_cuda_plan(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                  const at::Tensor& scale_b, const c10::optional<at::Tensor>& bias,
                                  c10::optional<at::ScalarType> out_dtype, c10::string_view activation,
                                  bool use_fast_accum);  // scaled_gemm_cuda.cpp
#endif

}  // namespace ops::cutlass_gemm
