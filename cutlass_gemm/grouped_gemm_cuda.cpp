// CUDA kernel of ops::grouped_gemm until its CUTLASS grouped kernel lands: torch._grouped_mm where it runs the
// problem (its CUTLASS kernel for bfloat16 on SM90/SM100 reads offs on the device: no synchronization, so a
// call captures in a CUDA graph), on offs clamped on the device; else grouped_gemm_loop (host offsets).
//
// Offsets are not checked on CUDA (that would read them on the host): they are clamped to [0, extent] and
// made non-decreasing (a cumulative max) on the device, so a bad offset never reads out of bounds; the
// groups are those of the clamped offsets. Rows or columns past the last end, and 2D x 2D groups of no K,
// are zeroed on the device (torch._grouped_mm leaves them unwritten).
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

// A view torch._grouped_mm takes (torch's check_valid_strides_and_return_transposed): one of the last two
// strides 1, the other a multiple of 16 bytes and at least the extent, 16-byte aligned data and batch stride.
bool torch_layout(const at::Tensor& t) {
  const int64_t align = 16 / t.element_size(), d = t.dim() - 1;
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  if (t.dim() == 3 && t.stride(0) % align != 0) return false;
  if (t.stride(d - 1) == 1 && t.stride(d) >= std::max<int64_t>(1, t.size(d - 1))) return t.stride(d) % align == 0;
  if (t.stride(d) == 1 && t.stride(d - 1) >= std::max<int64_t>(1, t.size(d))) return t.stride(d - 1) % align == 0;
  return false;
}

// `t`, or a contiguous copy where its layout is not one torch takes; undefined if neither is.
at::Tensor for_torch(const at::Tensor& t) {
  if (torch_layout(t)) return t;
  const at::Tensor c = t.contiguous();
  return torch_layout(c) ? c : at::Tensor();
}

// Whether torch._grouped_mm computes this problem: its dtypes with out_dtype = A's dtype, nothing empty.
bool torch_runs(const at::Tensor& A, const at::Tensor& B, at::ScalarType dtype) {
  const at::ScalarType t = A.scalar_type();
  return dtype == t && (t == at::kBFloat16 || t == at::kHalf || t == at::kFloat) && A.numel() > 0 && B.numel() > 0;
}

// Whether torch._grouped_mm reads offs on the device (its CUTLASS kernel: bfloat16 on SM90 and SM100).
bool torch_kernel_on_device(const at::Tensor& A) {
  const int major = at::cuda::getDeviceProperties(A.device().index())->major;
  return A.scalar_type() == at::kBFloat16 && (major == 9 || major == 10);
}

at::Tensor device_offsets(const at::Tensor& offs, const GroupedProblem& p) {
  return std::get<0>(at::cummax(offs.clamp(0, p.extent), 0));
}

void zero_outside_groups(at::Tensor& out, const at::Tensor& ends, const GroupedProblem& p) {
  if (p.mode == GroupedMode::Batched) return;
  if (p.mode == GroupedMode::RaggedK) {
    const at::Tensor sizes = at::diff(ends, 1, 0, at::zeros({1}, ends.options()));
    out.masked_fill_((sizes == 0).view({p.groups, 1, 1}), 0);
    return;
  }
  const at::Tensor last = p.groups ? ends.narrow(0, p.groups - 1, 1) : at::zeros({1}, ends.options());
  const at::Tensor outside = at::arange(p.extent, ends.options()) >= last;
  out.masked_fill_(p.mode == GroupedMode::RaggedM ? outside.unsqueeze(1) : outside.unsqueeze(0), 0);
}

at::Tensor run(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
               const GroupedProblem& p, at::ScalarType dtype) {
  const c10::cuda::CUDAGuard guard(A.device());
  const at::AutoDispatchBelowADInplaceOrView below_autograd;  // a backend kernel: ATen calls unseen by autograd
  if (torch_runs(A, B, dtype)) {
    const at::Tensor a = for_torch(A), b = for_torch(B);
    if (a.defined() && b.defined()) {
      const c10::optional<at::Tensor> ends =
          p.mode == GroupedMode::Batched ? c10::nullopt : c10::optional<at::Tensor>(device_offsets(*offs, p));
      at::Tensor out = at::_grouped_mm(a, b, ends, c10::nullopt, dtype);
      if (ends.has_value()) zero_outside_groups(out, *ends, p);
      // torch pads the last dimension's stride to 16 bytes; the op returns a contiguous tensor (its fake kernel's).
      return out.is_contiguous() ? out : out.contiguous();
    }
  }
  return grouped_gemm_loop(A, B, offs, p, dtype);
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
  const bool torch_path = torch_runs(A, B, dtype) && for_torch(A).defined() && for_torch(B).defined();
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
