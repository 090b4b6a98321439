// CUDA kernels of rms_norm, fused_add_rms_norm and silu_and_mul: checks, device guard, current
// stream, contiguous rows, then the plain-CUDA launchers of fused_kernels.cu.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "checks.h"
#include "fused_common.h"
#include "fused_kernels.h"

namespace ops {
namespace {

int dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return fused::kF16;
    case at::kBFloat16: return fused::kBF16;
    case at::kFloat: return fused::kF32;
    case at::kDouble: return fused::kF64;
    default: TORCH_CHECK(false, "unsupported dtype ", t);
  }
}

void check_launch(const char* op, cudaError_t err) {
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA kernel launch failed: ", cudaGetErrorString(err));
}

int64_t rows_of(const at::Tensor& t, int64_t row_length) { return row_length == 0 ? 0 : t.numel() / row_length; }

at::Tensor rms_norm_cuda(const at::Tensor& input, const at::Tensor& weight, double eps, bool round_before_weight) {
  check_norm_inputs("rms_norm", input, weight);
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor x = input.contiguous();
  const at::Tensor w = weight.contiguous();
  at::Tensor y = at::empty(input.sizes(), input.options());
  const int64_t hidden = input.size(-1);
  check_launch("rms_norm", fused::rms_norm(dtype_code(input.scalar_type()), x.const_data_ptr(), w.const_data_ptr(),
                                           y.data_ptr(), rows_of(x, hidden), hidden, eps, round_before_weight,
                                           at::cuda::getCurrentCUDAStream()));
  return y;
}

void fused_add_rms_norm_cuda(at::Tensor& input, at::Tensor& residual, const at::Tensor& weight, double eps,
                             bool round_before_weight) {
  check_fused_add_rms_norm_inputs(input, residual, weight);
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor w = weight.contiguous();
  const int64_t hidden = input.size(-1);
  run_in_place_on_contiguous(input, residual, [&](at::Tensor& x, at::Tensor& res) {
    check_launch("fused_add_rms_norm",
                 fused::fused_add_rms_norm(dtype_code(input.scalar_type()), x.data_ptr(), res.data_ptr(),
                                           w.const_data_ptr(), rows_of(x, hidden), hidden, eps,
                                           round_before_weight, at::cuda::getCurrentCUDAStream()));
  });
}

at::Tensor silu_and_mul_cuda(const at::Tensor& input) {
  check_silu_and_mul_input("silu_and_mul", input);
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor x = input.contiguous();
  const int64_t d = input.size(-1) / 2;
  at::Tensor out = silu_and_mul_output(input);
  check_launch("silu_and_mul", fused::silu_and_mul(dtype_code(input.scalar_type()), x.const_data_ptr(),
                                                   out.data_ptr(), rows_of(out, d), d,
                                                   at::cuda::getCurrentCUDAStream()));
  return out;
}

// fused::set_rms_norm_packs_per_thread (csrc/fused_kernels.h): which rms_norm kernel serves long rows,
// for measurements (benchmarks.ops --candidates) and tests. Returns the previous setting.
int64_t rms_norm_set_packs_per_thread(int64_t packs) {
  const int previous = packs >= 0 && packs <= 8 ? fused::set_rms_norm_packs_per_thread(static_cast<int>(packs)) : -1;
  TORCH_CHECK_VALUE(previous >= 0, "_rms_norm_set_packs_per_thread: expected packs to be 0, 1, 2, 4 or 8, got ",
                    packs);
  return previous;
}

}  // namespace
}  // namespace ops

TORCH_LIBRARY_IMPL(ops, CompositeImplicitAutograd, m) {
  m.impl("_rms_norm_set_packs_per_thread", &ops::rms_norm_set_packs_per_thread);
}

TORCH_LIBRARY_IMPL(ops, CUDA, m) {
  m.impl("rms_norm", &ops::rms_norm_cuda);
  m.impl("fused_add_rms_norm", &ops::fused_add_rms_norm_cuda);
  m.impl("silu_and_mul", &ops::silu_and_mul_cuda);
}
