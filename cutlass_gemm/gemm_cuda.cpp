// The CUDA kernels of ops::cutlass_gemm: device guard, current stream, workspace from PyTorch's
// allocator, then the planned CUTLASS launch (gemm_host.h). No CUTLASS headers here.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../csrc/checks.h"
#include "gemm_cuda.h"
#include "gemm_host.h"
#include "launcher.h"

#ifndef OPS_CUDA_ARCH_LIST
#error "setup.py defines OPS_CUDA_ARCH_LIST (the archs the kernels were built for)"
#endif

namespace ops::cutlass_gemm {

const KernelEntry& kernel_entry(int kernel_id) {
  static const KernelEntry kEntries[] = {
#define OPS_KERNEL_ENTRY(name, ...) {&name##_workspace_size, &name##_run},
      OPS_CUTLASS_GEMM_KERNELS(OPS_KERNEL_ENTRY)
#undef OPS_KERNEL_ENTRY
  };
  TORCH_CHECK(kernel_id >= 0 && kernel_id < kNumKernels, "cutlass_gemm: bad kernel id ", kernel_id);
  return kEntries[kernel_id];
}

namespace {

const std::vector<BuiltArch>& built_archs() {
  static const std::vector<BuiltArch> built = parse_arch_list(OPS_CUDA_ARCH_LIST);
  return built;
}

}  // namespace

DeviceTarget current_device_target() {
  const cudaDeviceProp* props = at::cuda::getCurrentDeviceProperties();
  DeviceTarget target;
  target.cc_major = props->major;
  target.cc_minor = props->minor;
  target.built = built_archs();
  // Follow torch.mm: TF32 only where torch.backends.cuda.matmul / set_float32_matmul_precision allow.
  target.allow_tf32 = at::globalContext().allowTF32CuBLAS();
  return target;
}

void launch_cutlass(const GemmPlan& plan, const GemmLaunchArgs& launch_args,
                    const at::Tensor& like) {
  const int id = static_cast<int>(plan.kernel);
  const KernelEntry& entry = kernel_entry(id);
  GemmLaunchArgs args = launch_args;
  args.device = like.get_device();
  args.sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const size_t workspace_bytes = entry.workspace_size(args);
  // Workspace from PyTorch's caching allocator: stream-ordered and CUDA-graph safe.
  at::Tensor workspace;
  if (workspace_bytes > 0) {
    workspace = at::empty({static_cast<int64_t>(workspace_bytes)}, like.options().dtype(at::kByte));
  }
  const LaunchStatus status =
      entry.run(args, workspace_bytes ? workspace.data_ptr() : nullptr, workspace_bytes,
                at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(status.ok, "cutlass_gemm: CUTLASS kernel ", kKernels[id].name,
              " failed: ", status.message, " (M=", args.m, ", N=", args.n, ", K=", args.k, ")");
}

namespace {

at::Tensor cutlass_gemm_cuda(const at::Tensor& A, const at::Tensor& B);

void cutlass_gemm_out_cuda(const at::Tensor& A, const at::Tensor& B, at::Tensor& out) {
  check_gemm_inputs("cutlass_gemm", A, B);
  const bool may_alias = check_gemm_out("cutlass_gemm", A, B, out);
  const c10::cuda::CUDAGuard guard(A.device());
  if (may_alias) {  // out shares A's or B's buffer: compute into a fresh tensor, then copy
    out.copy_(cutlass_gemm_cuda(A, B));
    return;
  }
  gemm_into(A, B, out, current_device_target(),
            [&](const GemmPlan& plan, const GemmLaunchArgs& args) { launch_cutlass(plan, args, A); });
}

at::Tensor cutlass_gemm_cuda(const at::Tensor& A, const at::Tensor& B) {
  check_gemm_inputs("cutlass_gemm", A, B);
  at::Tensor out = at::empty({A.size(0), B.size(1)}, A.options());
  cutlass_gemm_out_cuda(A, B, out);
  return out;
}

}  // namespace
}  // namespace ops::cutlass_gemm

TORCH_LIBRARY_IMPL(ops, CUDA, m) {
  m.impl("cutlass_gemm", &ops::cutlass_gemm::cutlass_gemm_cuda);
  m.impl("cutlass_gemm.out", &ops::cutlass_gemm::cutlass_gemm_out_cuda);
}
