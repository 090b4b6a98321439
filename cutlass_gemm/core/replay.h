// The CPU replay of a launch of any kind: what tests run in place of a CUTLASS kernel, so that the whole host
// path (plan, copies, padding, temporaries, copy-back; the FP8 and grouped launches' operands, scales and
// per-group problems) is checked without a GPU. Each replay reads and writes exactly the memory the kernel
// would, from the raw pointers, leading dimensions and layouts of its launch arguments.
#pragma once

#include <ATen/core/Tensor.h>

#include "../kernels/grouped_args.h"
#include "../kernels/scaled_args.h"
#include "../kernels/scaled_grouped_args.h"
#include "gemm_launch.h"

namespace ops::cutlass_gemm {

// Computes the launch on CPU memory. Dense: at::mm, half types accumulating in fp32 as the tensor-core
// kernels do, then the epilogue. Scaled: each K block's partial product scaled as the blockwise mainloop
// scales it, or the tensorwise/rowwise epilogue; the scales and bias along the kernel's own modes (swapped:
// D^T = B^T A^T). Grouped: group by group in float64, the ends clamped and unwritten output zeroed as the
// device code does; FP8 grouped, per group as the blockwise mainloop scales it. A scaled launch whose leading dimensions CUTLASS's can_implement would refuse raises.
void replay_launch(const GemmLaunch& launch);

// The dense replay alone (replay_launch's Dense case).
void emulate_launch(const GemmPlan& plan, const GemmLaunchArgs& args, at::ScalarType dtype);

}  // namespace ops::cutlass_gemm
