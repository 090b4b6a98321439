// Shared by the CUDA wrappers of the CUTLASS-based ops (gemm_cuda.cpp, linear_cuda.cpp, scaled_gemm_cuda.cpp,
// grouped_gemm_cuda.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "gemm_host.h"

namespace ops::cutlass_gemm {

// The current CUDA device's compute capability, the archs this binary carries, and torch's TF32
// setting (call under a device guard for the inputs' device).
DeviceTarget current_device_target();

// Why the candidate-only SM90 kernels of `family` (e.g. "FP8", "grouped") do not run on the current device:
// not built (OPS_CANDIDATE_KERNELS=0), or not an sm_90a device of a binary built for 9.0a; "" where they run.
std::string sm90a_candidates_refusal(const char* family);

// Autotuning of a GEMM whose candidates are kernel names (choose_named's `autotune`, tactic_select.h): times
// run(i), a launch of candidate i on the current stream that writes the whole result (false: CUTLASS refused
// it), as cutlass_gemm's autotuner does, caches the fastest under `key` and returns its index; during CUDA
// graph capture `fallback`, nothing timed or cached.
size_t autotune_named(const std::string& key, const std::vector<std::string>& names, size_t fallback,
                      const std::function<bool(size_t)>& run);

// Runs plan.kernel on the current stream with a workspace from PyTorch's allocator; raises a clear
// error naming the kernel if CUTLASS refuses or the launch fails. `like`: a tensor on the device.
void launch_cutlass(const GemmPlan& plan, const GemmLaunchArgs& args, const at::Tensor& like);

}  // namespace ops::cutlass_gemm
