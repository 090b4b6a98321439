// The CUDA kernel of ops::scaled_gemm: the SM90 FP8 CUTLASS kernels (sm90_scaled_gemm.cuh) where they take
// the call (built, an sm_90a device, e4m3 A and B), else torch._scaled_mm (tensorwise and rowwise, where torch
// takes the call), else the dequantized formula (scaled_gemm.cpp). Operands the kernels cannot read in place
// (A not row-major, B not column-major, misaligned) are copied first; plan() names the path and why.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <functional>
#include <string>
#include <vector>

#include "../../csrc/json.h"
#include "../core/plan_json.h"
#include "../core/choice.h"
#include "../cuda/services.h"
#include "../core/operands.h"
#include "scaled_gemm.h"

namespace ops::cutlass_gemm {
namespace {

constexpr const char* kOp = "scaled_gemm";

// Why the CUTLASS kernels do not take the call; "" where they do.
std::string why_not_cutlass(const at::Tensor& A, const at::Tensor& B, ScaleRecipe recipe) {
  const std::string refusal = sm90a_candidates_refusal("FP8");
  if (!refusal.empty()) return refusal;
  if (A.scalar_type() != at::kFloat8_e4m3fn || B.scalar_type() != at::kFloat8_e4m3fn) {
    return "the FP8 kernels take float8_e4m3fn A and B";
  }
  if (A.size(0) == 0 || B.size(1) == 0 || A.size(1) == 0) return "an empty problem";
  // The blockwise scale_a's leading dimension is M rounded up to 4 (scaled_gemm_launch.cpp).
  return int32_extents_refusal({A.size(0) + 3, B.size(1), A.size(1)});
}

// A call's tuning cache key: its kernels, recipe, bias and extents on the current device.
std::string scaled_key(const std::vector<std::string>& names, ScaleRecipe recipe, bool bias, int64_t m, int64_t n,
                       int64_t k) {
  return tuning_key(current_device_target(), std::string(kOp) + " " + names[0] + " " +
                                                       scale_recipe_name(recipe) + (bias ? " bias" : "") +
                                                       " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                                                       " k=" + std::to_string(k));
}
// The one it runs (index into names: unswapped, swapped): forced, tuned, or scaled_swap_ab's choice.
Choice scaled_choice(int64_t m, const std::vector<std::string>& names, const std::function<std::string()>& key) {
  Candidates c;
  c.names = [&]() -> const std::vector<std::string>& { return names; };
  c.heuristic = scaled_swap_ab(m) ? 1 : 0;
  return choose(kOp, "call", key, c);
}

void launch(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a, const at::Tensor& scale_b,
            const c10::optional<at::Tensor>& bias, ScaleRecipe recipe, Activation act, bool fast_accum,
            at::Tensor& out) {
  ScaledLaunch l = prepare_scaled_launch(A, B, scale_a, scale_b, bias, recipe, act, fast_accum, out);
  ScaledGemmLaunchArgs& args = l.args;
  const std::vector<std::string> names = scaled_candidates(out.scalar_type(), recipe, act, fast_accum);
  const auto key = [&] { return scaled_key(names, recipe, bias.has_value(), args.m, args.n, args.k); };
  const Choice choice = scaled_choice(args.m, names, key);
  args.device = A.device().index();
  args.sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const GemmLaunch launch{GemmKind::Scaled, &args, out.scalar_type(), static_cast<int>(to_dtype(out.scalar_type()))};
  const auto attempt = [&](size_t candidate) {  // names: unswapped, then swapped
    args.swap_ab = candidate == 1;
    return run_kernel(kOp, launch, A);
  };
  const size_t index =
      choice.autotune ? autotune(key(), names, choice.index, [&](size_t i) { return attempt(i).ok; }) : choice.index;
  const LaunchStatus status = attempt(index);
  TORCH_CHECK(status.ok, kOp, ": CUTLASS kernel ", names[index], " failed: ", status.message);
  if (!l.in_place) out.copy_(l.d);
}

void compute(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a, const at::Tensor& scale_b,
             const c10::optional<at::Tensor>& bias, ScaleRecipe recipe, Activation act, bool fast_accum,
             at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(A.device());
  if (why_not_cutlass(A, B, recipe).empty()) {
    launch(A, B, scale_a, scale_b, bias, recipe, act, fast_accum, out);
  } else if (!scaled_gemm_torch_into(A, B, scale_a, scale_b, bias, recipe, act, fast_accum, out)) {
    scaled_gemm_formula_into(A, B, scale_a, scale_b, bias, recipe, act, out);
  }
}

at::Tensor scaled_gemm_cuda(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                            const at::Tensor& scale_b, const c10::optional<at::Tensor>& bias,
                            c10::optional<at::ScalarType> out_dtype, c10::string_view activation, bool use_fast_accum) {
  return scaled_gemm_with(A, B, scale_a, scale_b, bias, out_dtype, activation, use_fast_accum, compute);
}

void scaled_gemm_out_cuda(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                          const at::Tensor& scale_b, const c10::optional<at::Tensor>& bias,
                          c10::optional<at::ScalarType> out_dtype, c10::string_view activation, bool use_fast_accum,
                          at::Tensor& out) {
  scaled_gemm_out_with(A, B, scale_a, scale_b, bias, out_dtype, activation, use_fast_accum, out, compute);
}

}  // namespace

std::string scaled_gemm_cuda_plan(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                  const at::Tensor& scale_b, const c10::optional<at::Tensor>& bias,
                                  c10::optional<at::ScalarType> out_dtype, c10::string_view activation,
                                  bool use_fast_accum) {
  const at::ScalarType dtype = scaled_gemm_out_dtype(out_dtype);
  const ScaleRecipe recipe = check_scaled_gemm_inputs(kOp, A, B, scale_a, scale_b, bias, dtype);
  const Activation act = parse_activation(kOp, activation);
  const c10::cuda::CUDAGuard guard(A.device());
  const std::string why = why_not_cutlass(A, B, recipe);
  const std::string torch_refusal =
      why.empty() ? "" : scaled_gemm_torch_refusal(A, B, bias, recipe, act, dtype, use_fast_accum);
  PlanHead head;
  head.kind = GemmKind::Scaled;
  head.path = why.empty() ? "cutlass" : torch_refusal.empty() ? "torch._scaled_mm" : "formula";
  if (why.empty()) {
    head.candidates = scaled_candidates(dtype, recipe, act, use_fast_accum);
    const auto key = [&] {
      return scaled_key(head.candidates, recipe, bias.has_value(), A.size(0), B.size(1), A.size(1));
    };
    const Choice choice = scaled_choice(A.size(0), head.candidates, key);
    head.kernel = head.candidates[choice.index];
    head.swap_ab = choice.index == 1;
    head.source = choice.source;
    head.tuning_key = key();
  }
  head.reason = why.empty()             ? std::string("an SM90 FP8 kernel takes the call")
                : torch_refusal.empty() ? why + "; torch._scaled_mm takes it (the formula if torch refuses it)"
                                        : why + "; " + torch_refusal;
  return plan_json(head, [&](JsonObject& o) { o.add("recipe", scale_recipe_name(recipe)); });
}

}  // namespace ops::cutlass_gemm

TORCH_LIBRARY_IMPL(ops, CUDA, m) {
  m.impl("scaled_gemm", &ops::cutlass_gemm::scaled_gemm_cuda);
  m.impl("scaled_gemm.out", &ops::cutlass_gemm::scaled_gemm_out_cuda);
}
