// The device-generic driver of the CUTLASS GEMM: turns at::Tensors into a planned launch (plan.h),
// picks its tactic (core/choice.h), stages the copies and temporaries the plan asks for (operands.h),
// calls a launch function and copies a temporary output back. The CUDA wrapper passes a launch function
// that runs the CUTLASS kernel; tests pass one that replays the launch descriptor on CPU tensors
// (core/replay.h), so this whole path is checked without a GPU.
#pragma once

#include <functional>
#include <string>

#include <ATen/core/Tensor.h>

#include "../core/device_target.h"
#include "../core/plan.h"

namespace ops::cutlass_gemm {

using LaunchFn = std::function<void(const GemmPlan&, const GemmLaunchArgs&)>;

// Computes out = A @ B through `launch`. A (M, K), B (K, N), out (M, N) already checked
// (csrc/checks.h). M, N or K = 0 are handled here without a launch. `poison` fills temporaries with
// NaN first (operands.h). Returns the plan (kernel = kCount when nothing was launched).
//
// With a Bias<Act> epilogue (ops.linear): out = act(A @ B + bias), bias (N,) optional (undefined:
// none), fused into the kernel's epilogue.
GemmPlan gemm_into(const at::Tensor& A, const at::Tensor& B, const at::Tensor& out,
                   const DeviceTarget& target, const LaunchFn& launch, bool poison = false,
                   Epilogue epilogue = Epilogue::Plain, const at::Tensor& bias = at::Tensor());

// The plan (with the heuristic's tactic; no forced tactic, no autotuning) gemm_into would make for
// out = A @ B with M, N, K > 0 (out undefined: a new row-major output; nothing is allocated). Raises
// the planner's error when no kernel can run.
GemmPlan plan_for(const at::Tensor& A, const at::Tensor& B, const at::Tensor& out,
                  const DeviceTarget& target, Epilogue epilogue = Epilogue::Plain);

// plan.tactic is the heuristic's choice; replaces it with the forced tactic or the tuning cache's choice
// (choice.h) among candidates_of(plan), in that order, and sets plan.autotune_key when the launcher should
// autotune. `dtype`: for messages.
void select_tactic(GemmPlan& plan, const DeviceTarget& target, const char* op, const std::string& dtype);

// CUDA builds (dense/gemm_cuda.cpp): runs plan's tactic (autotuned first where plan.autotune_key is set) on
// the current stream through the family's kernel table; raises a clear error naming the kernel if CUTLASS
// refuses or the launch fails. `like`: a tensor on the device.
void launch_cutlass(const GemmPlan& plan, const GemmLaunchArgs& args, const at::Tensor& like);

}  // namespace ops::cutlass_gemm
