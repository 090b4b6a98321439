// The CPU replay of a launch descriptor: what tests run in place of a CUTLASS kernel, so that the whole
// host path (plan, copies, padding, temporaries, copy-back) is checked without a GPU.
#pragma once

#include <ATen/core/Tensor.h>

#include "plan.h"

namespace ops::cutlass_gemm {

// Computes the described GEMM with at::mm on CPU memory, reading and writing exactly the memory a
// CUTLASS kernel would (from the raw pointers, leading dimensions and layouts); half types accumulate
// in fp32, as the tensor-core kernels do, then the epilogue of plan.tactic's kernel.
void emulate_launch(const GemmPlan& plan, const GemmLaunchArgs& args, at::ScalarType dtype);

}  // namespace ops::cutlass_gemm
