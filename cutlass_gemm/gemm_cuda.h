// Shared by the CUDA wrappers of the CUTLASS-based ops (gemm_cuda.cpp, linear_cuda.cpp, scaled_gemm_cuda.cpp,
// grouped_gemm_cuda.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "gemm_host.h"

namespace ops::cutlass_gemm {

// The current CUDA device's compute capability, the archs this binary carries, and torch's TF32
// setting (call under a device guard for the inputs' device).
DeviceTarget current_device_target();

// Why the candidate-only SM90 kernels of `family` (e.g. "FP8", "grouped") do not run on the current device:
// not built (OPS_CANDIDATE_KERNELS=0), or not an sm_90a device of a binary built for 9.0a; "" where they run.
std::string sm90a_candidates_refusal(const char* family);

// Runs plan.kernel on the current stream with a workspace from PyTorch's allocator; raises a clear
// error naming the kernel if CUTLASS refuses or the launch fails. `like`: a tensor on the device.
void launch_cutlass(const GemmPlan& plan, const GemmLaunchArgs& args, const at::Tensor& like);

}  // namespace ops::cutlass_gemm
