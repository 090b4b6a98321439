// Shared by the CUDA wrappers of the CUTLASS-based ops (gemm_cuda.cpp, linear_cuda.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include "gemm_host.h"

namespace ops::cutlass_gemm {

// The current CUDA device's compute capability, the archs this binary carries, and torch's TF32
// setting (call under a device guard for the inputs' device).
DeviceTarget current_device_target();

// Runs plan.kernel on the current stream with a workspace from PyTorch's allocator; raises a clear
// error naming the kernel if CUTLASS refuses or the launch fails. `like`: a tensor on the device.
void launch_cutlass(const GemmPlan& plan, const GemmLaunchArgs& args, const at::Tensor& like);

}  // namespace ops::cutlass_gemm
