// The device-generic half of the CUTLASS GEMM wrapper: turns at::Tensors into a planned launch
// (plan.h), materialises the copies and temporaries the plan asks for, calls a launch function, and
// copies a temporary output back. The CUDA wrapper passes a launch function that runs the CUTLASS
// kernel; tests pass one that replays the launch descriptor on CPU tensors (see emulate_launch), so
// this whole path is checked without a GPU.
#pragma once

#include <functional>
#include <string>

#include <ATen/core/Tensor.h>

#include "plan.h"

namespace ops::cutlass_gemm {

struct DeviceTarget {
  int cc_major = 0, cc_minor = 0;
  std::vector<BuiltArch> built;
  bool allow_tf32 = false;
};

using LaunchFn = std::function<void(const GemmPlan&, const GemmLaunchArgs&)>;

// Computes out = A @ B through `launch`. A (M, K), B (K, N), out (M, N) already checked
// (csrc/checks.h). M, N or K = 0 are handled here without a launch. `poison` fills temporaries with
// NaN first (tests: an element the kernel should write but does not, or a pad that is not zeroed,
// shows up as NaN). Returns the plan (kernel = kCount when nothing was launched).
//
// With a Bias<Act> epilogue (ops.linear): out = act(A @ B + bias), bias (N,) optional (undefined:
// none), fused into the kernel's epilogue.
GemmPlan gemm_into(const at::Tensor& A, const at::Tensor& B, const at::Tensor& out,
                   const DeviceTarget& target, const LaunchFn& launch, bool poison = false,
                   Epilogue epilogue = Epilogue::Plain, const at::Tensor& bias = at::Tensor());

// act(x) for a Bias<Act> epilogue, with ATen ops (in place); identity for Plain and BiasIdentity.
void apply_activation_(at::Tensor& x, Epilogue epilogue);

// A LaunchFn that computes the described GEMM with at::mm on CPU memory, reading and writing exactly
// the memory a CUTLASS kernel would (from the raw pointers, leading dimensions and layouts).
void emulate_launch(const GemmPlan& plan, const GemmLaunchArgs& args, at::ScalarType dtype);

// Parses ops.linear's activation argument ("none", "relu", "gelu", "gelu_tanh", "silu"); throws a
// clear error naming `op` otherwise.
Epilogue epilogue_for_activation(const char* op, c10::string_view activation);

DType to_dtype(at::ScalarType type);

}  // namespace ops::cutlass_gemm
