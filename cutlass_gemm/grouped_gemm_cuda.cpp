// CUDA kernel of ops::grouped_gemm until its CUTLASS grouped kernel lands: torch._grouped_mm where it runs the
// problem (its CUTLASS kernel for bfloat16 on SM90/SM100 reads offs on the device: no synchronization, so a
// call captures in a CUDA graph), on offs clamped on the device; else grouped_gemm_loop (host offsets).
//
// Offsets are not checked on CUDA (that would read them on the host): grouped_gemm_torch (grouped_gemm.cpp,
// run on CPU by the tests) clamps them on the device.
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../csrc/checks.h"
#include "../csrc/json.h"
#include "grouped_gemm.h"

namespace ops::cutlass_gemm {
namespace {

constexpr const char* kOp = "grouped_gemm";

// Whether torch._grouped_mm reads offs on the device (its CUTLASS kernel: bfloat16 on SM90 and SM100).
bool torch_kernel_on_device(const at::Tensor& A) {
  const int major = at::cuda::getDeviceProperties(A.device().index())->major;
  return A.scalar_type() == at::kBFloat16 && (major == 9 || major == 10);
}

at::Tensor run(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
               const GroupedProblem& p, at::ScalarType dtype) {
  const c10::cuda::CUDAGuard guard(A.device());
  at::Tensor out = grouped_gemm_torch(A, B, offs, p, dtype);
  return out.defined() ? out : grouped_gemm_loop(A, B, offs, p, dtype);
}

at::Tensor grouped_gemm_cuda(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                             c10::optional<at::ScalarType> out_dtype) {
  return grouped_gemm_with(A, B, offs, out_dtype, run);
}

void grouped_gemm_out_cuda(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                           c10::optional<at::ScalarType> out_dtype, at::Tensor& out) {
  grouped_gemm_out_with(A, B, offs, out_dtype, out, run);
}

}  // namespace

std::string grouped_gemm_cuda_path(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                                   at::ScalarType dtype) {
  const GroupedProblem p = check_grouped_gemm_inputs(kOp, A, B, offs, dtype);
  const c10::cuda::CUDAGuard guard(A.device());
  const bool torch_path = grouped_gemm_torch_takes(A, B, dtype);
  // 3D x 3D reads no offsets; the others read them on the host unless torch's kernel takes them on the device.
  const bool sync = p.mode != GroupedMode::Batched && !(torch_path && torch_kernel_on_device(A));
  JsonObject plan;
  plan.add("mode", grouped_mode_name(p.mode));
  plan.add("path", torch_path ? "torch._grouped_mm" : "loop");
  plan.add("host_sync", sync);
  plan.add("offsets", torch_path ? "clamped on the device" : "checked on the host");
  return plan.str();
}

}  // namespace ops::cutlass_gemm

TORCH_LIBRARY_IMPL(ops, CUDA, m) {
  m.impl("grouped_gemm", &ops::cutlass_gemm::grouped_gemm_cuda);
  m.impl("grouped_gemm.out", &ops::cutlass_gemm::grouped_gemm_out_cuda);
}
