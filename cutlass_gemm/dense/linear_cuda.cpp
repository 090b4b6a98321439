// CUDA kernel of ops::linear: act(x @ W^T + bias). float16/bfloat16 run one CUTLASS GEMM with the bias
// and activation fused into its epilogue (kernel_list.h, sm{90,80}_*_rc_<act>); float32/float64 run
// the CUTLASS GEMM (cutlass_gemm's kernels) followed by the bias and activation in ATen (unfused).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../../csrc/activation_ops.h"
#include "../../csrc/checks.h"
#include "../cuda/services.h"
#include "gemm_host.h"

namespace ops::cutlass_gemm {
namespace {

at::Tensor linear_cuda(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                       c10::string_view activation) {
  check_linear_inputs("linear", input, weight, bias);
  const Activation act = parse_activation("linear", activation);
  const c10::cuda::CUDAGuard guard(input.device());
  const int64_t K = input.size(-1), N = weight.size(0);
  // Rows = product of the leading dimensions (not -1 in reshape: K or N may be 0).
  const int64_t M = c10::multiply_integers(input.sizes().slice(0, input.dim() - 1));
  auto out_sizes = input.sizes().vec();
  out_sizes.back() = N;
  at::Tensor out = at::empty(out_sizes, input.options());
  const at::Tensor out2d = out.view({M, N});
  const at::Tensor x2d = input.reshape({M, K});
  const at::Tensor b = bias.has_value() ? *bias : at::Tensor();
  const bool fused = input.scalar_type() == at::kHalf || input.scalar_type() == at::kBFloat16;
  const DeviceTarget target = current_device_target();
  const LaunchFn launch = [&](const GemmPlan& plan, const GemmLaunchArgs& args) {
    launch_cutlass(plan, args, input);
  };
  if (fused) {
    gemm_into(x2d, weight.t(), out2d, target, launch, /*poison=*/false, bias_epilogue(act), b);
  } else {
    gemm_into(x2d, weight.t(), out2d, target, launch);
    if (b.defined()) out2d.add_(b);
    apply_activation_(out2d, act);
  }
  return out;
}

}  // namespace
}  // namespace ops::cutlass_gemm

TORCH_LIBRARY_IMPL(ops, CUDA, m) { m.impl("linear", &ops::cutlass_gemm::linear_cuda); }
