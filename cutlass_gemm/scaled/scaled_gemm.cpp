// ops::scaled_gemm (FP8 A and B with float32 scales) on CPU, and on CUDA where no CUTLASS kernel takes the
// call (scaled_gemm_cuda.cpp): the dequantized formula in ATen (core/scaled_formula.h), out = act((A * scale_a)
// @ (B * scale_b) + bias), dequantization, product, bias and activation in float32, rounded once to out_dtype.
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include <exception>
#include <map>
#include <mutex>
#include <new>

#include "../../csrc/json.h"
#include "../core/plan_json.h"
#include "../core/operands.h"  // aligned_contiguous
#include "scaled_gemm.h"

namespace ops::cutlass_gemm {
namespace {

constexpr const char* kOp = "scaled_gemm";

// The calls torch._scaled_mm refused (its checks raise before any launch), by what decides that: device,
// recipe, operand dtypes, the dtype asked of torch, whether torch adds the bias and use_fast_accum; torch's message.
struct TorchRefusals {
  std::mutex mutex;
  std::map<std::string, std::string> by_kind;
};
TorchRefusals& torch_refusals() {
  static TorchRefusals* instance = new TorchRefusals();  // never destroyed: usable at exit
  return *instance;
}

// torch computes act = none itself (its bias too); with an activation it returns the float32 product, the
// bias and the activation are added here and the result rounded once, as the formula.
at::ScalarType torch_out(Activation act, at::ScalarType dtype) { return act == Activation::None ? dtype : at::kFloat; }

std::string torch_kind(const at::Tensor& A, const at::Tensor& B, ScaleRecipe recipe, at::ScalarType out, bool bias,
                       bool fast_accum) {
  return c10::str(A.device(), " ", scale_recipe_name(recipe), " ", A.scalar_type(), " x ", B.scalar_type(), " -> ",
                  out, bias ? " with bias" : "", fast_accum ? " fast accumulation" : "");
}

bool has_bias(const c10::optional<at::Tensor>& bias) { return bias.has_value() && bias->defined(); }

// Why the path does not take a call of `kind` ("" where it asks torch).
std::string refusal_of(ScaleRecipe recipe, const std::string& kind) {
  if (scaled_block_recipe(recipe)) {
    return "blockwise scales are not given to torch._scaled_mm (its block-scale layouts differ between torch versions)";
  }
  std::lock_guard<std::mutex> lock(torch_refusals().mutex);
  const auto it = torch_refusals().by_kind.find(kind);
  return it == torch_refusals().by_kind.end() ? std::string() : "torch._scaled_mm refused " + kind + ": " + it->second;
}

}  // namespace

std::string scaled_gemm_torch_refusal(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& bias,
                                      ScaleRecipe recipe, Activation act, at::ScalarType dtype, bool fast_accum) {
  return refusal_of(recipe, torch_kind(A, B, recipe, torch_out(act, dtype), has_bias(bias) && act == Activation::None,
                                       fast_accum));
}

bool scaled_gemm_torch_into(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                            const at::Tensor& scale_b, const c10::optional<at::Tensor>& bias, ScaleRecipe recipe,
                            Activation act, bool use_fast_accum, at::Tensor& out) {
  const at::ScalarType dtype = torch_out(act, out.scalar_type());
  const bool direct = act == Activation::None;
  const std::string kind = torch_kind(A, B, recipe, dtype, has_bias(bias) && direct, use_fast_accum);
  if (!refusal_of(recipe, kind).empty()) return false;
  try {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    // torch takes A row-major, B column-major, float32 scales of one element (tensorwise) or (M, 1) and (1, N);
    // each contiguous from a 16-byte aligned address here, so that no refusal comes of an address or layout.
    const at::Tensor a = aligned_contiguous(A);
    const at::Tensor b = aligned_contiguous(B.t()).t();
    const bool tensorwise = recipe == ScaleRecipe::Tensorwise;
    const at::Tensor sa = tensorwise ? scale_a.reshape({}) : aligned_contiguous(scale_a);
    const at::Tensor sb = tensorwise ? scale_b.reshape({}) : aligned_contiguous(scale_b);
    const c10::optional<at::Tensor> torch_bias =
        direct && has_bias(bias) ? c10::optional<at::Tensor>(aligned_contiguous(*bias)) : c10::optional<at::Tensor>();
    at::Tensor z = at::_scaled_mm(a, b, sa, sb, torch_bias, c10::nullopt, dtype, use_fast_accum);
    if (!direct) {
      if (has_bias(bias)) z.add_(bias->to(at::kFloat));
      apply_activation_(z, act);
    }
    out.copy_(z);
    return true;
  } catch (const c10::AcceleratorError&) {
    throw;  // a device error, not a refusal
  } catch (const c10::OutOfMemoryError&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {  // torch's checks (c10::Error), or a Python kernel registered in its place
    const auto* error = dynamic_cast<const c10::Error*>(&e);
    std::lock_guard<std::mutex> lock(torch_refusals().mutex);
    torch_refusals().by_kind[kind] = error != nullptr ? error->what_without_backtrace() : e.what();
    return false;
  }
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
  PlanHead head;
  head.kind = GemmKind::Scaled;
  head.path = "formula";
  head.reason = "the CPU runs the dequantized formula in ATen";
  return plan_json(head, [&](JsonObject& o) { o.add("recipe", scale_recipe_name(recipe)); });
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

// The CUDA path's torch._scaled_mm step on CPU tensors; raises where it does not take the call.
at::Tensor scaled_gemm_torch_path(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                  const at::Tensor& scale_b, const c10::optional<at::Tensor>& bias,
                                  c10::optional<at::ScalarType> out_dtype, c10::string_view activation,
                                  bool use_fast_accum) {
  return scaled_gemm_with(A, B, scale_a, scale_b, bias, out_dtype, activation, use_fast_accum,
                          [](const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa, const at::Tensor& sb,
                             const c10::optional<at::Tensor>& bi, ScaleRecipe recipe, Activation act, bool fast,
                             at::Tensor& out) {
                            const bool taken = scaled_gemm_torch_into(a, b, sa, sb, bi, recipe, act, fast, out);
                            TORCH_CHECK(taken, "_scaled_gemm_torch_path: not taken: ",
                                        scaled_gemm_torch_refusal(a, b, bi, recipe, act, out.scalar_type(), fast));
                          });
}

}  // namespace
}  // namespace ops::cutlass_gemm

TORCH_LIBRARY_IMPL(ops, CPU, m) {
  m.impl("scaled_gemm", &ops::cutlass_gemm::scaled_gemm);
  m.impl("_scaled_gemm_torch_path", &ops::cutlass_gemm::scaled_gemm_torch_path);
  m.impl("scaled_gemm.out", &ops::cutlass_gemm::scaled_gemm_out);
}

TORCH_LIBRARY_IMPL(ops, CompositeImplicitAutograd, m) {
  m.impl("_scaled_gemm_plan", &ops::cutlass_gemm::scaled_gemm_plan);
}
