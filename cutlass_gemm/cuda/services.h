// The CUDA services every GEMM kind shares: the device target, the kernel table, the launch (pending-error
// check, workspace from PyTorch's allocator, the kernel on the current stream) and the autotuner. No CUTLASS
// headers; the kernels' entry points come from kernels/launcher.h.
#pragma once

#include <ATen/core/Tensor.h>
#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <vector>

#include "../core/device_target.h"
#include "../core/gemm_kind.h"
#include "../core/gemm_launch.h"
#include "../kernels/launch_args.h"

namespace ops::cutlass_gemm {

// The current CUDA device's compute capability, the archs this binary carries, and torch's TF32
// setting (call under a device guard for the inputs' device).
DeviceTarget current_device_target();

// Why the candidate-only SM90 kernels of `family` (e.g. "FP8", "grouped") do not run on the current device:
// not built (OPS_CANDIDATE_KERNELS=0) or turned off (set_candidate_kernels), or not an sm_90a device of a binary
// built for 9.0a; "" where they run.
std::string sm90a_candidates_refusal(const char* family);

// One kernel entry point of any kind, over its kind's launch arguments (kernels/launch_args.h, scaled_args.h,
// grouped_args.h) passed as `const void*`. kernel_problem: the CUTLASS 2.x dense kernels' host-built problem
// (launch_args.h, KernelProblem), else null.
struct KernelEntry {
  GemmKind kind = GemmKind::Dense;
  size_t (*workspace_size)(const void* args) = nullptr;
  LaunchStatus (*run)(const void* args, void* workspace, size_t workspace_bytes, cudaStream_t stream) = nullptr;
  KernelProblem (*kernel_problem)(const void* args) = nullptr;
};

// The one kernel table: the entry of `kind` at `index` (Dense: a kernel_list.h id; Scaled and ScaledGrouped:
// the output DType, bf16/f16/f32; Grouped: the element DType, bf16/f16). One not in this build raises, naming it.
const KernelEntry& kernel_entry(GemmKind kind, int index);
// Whether that entry is in this build (the candidate-only kernels need OPS_CANDIDATE_KERNELS=1).
bool kernel_built(GemmKind kind, int index);

// Launches `launch` (its kernel table entry with its arguments) on the current stream, with a workspace from
// PyTorch's caching allocator (stream-ordered, CUDA-graph safe) on like's device. A CUDA error left by
// earlier work raises first, naming `op` (the launch checks cudaGetLastError, which would report it as the
// kernel's).
LaunchStatus run_kernel(const char* op, const GemmLaunch& launch, const at::Tensor& like);

// Times run(i) for every candidate (a launch on the current stream that writes the whole result; false:
// CUTLASS refused it), caches the fastest under `key` (choice.h, store_tuned) and returns its index; during
// CUDA graph capture `fallback`, nothing timed or cached (timing synchronizes, which capture forbids).
size_t autotune(const std::string& key, const std::vector<std::string>& names, size_t fallback,
                const std::function<bool(size_t)>& run);

}  // namespace ops::cutlass_gemm
