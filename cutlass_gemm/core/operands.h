// The memory one planned launch reads and writes, as at::Tensors: the user's matrices where the plan
// takes them in place, else buffers laid out as the plan says (copies of the inputs with their padding
// zeroed, a temporary output copied back). Shared by every GEMM of the family.
#pragma once

#include <ATen/core/Tensor.h>

#include <initializer_list>
#include <string>

#include "plan.h"

namespace ops::cutlass_gemm {

// Sizes, strides and address of a 2-D tensor, for the planner.
MatrixView view_of(const at::Tensor& t);

bool aligned16(const at::Tensor& t);  // its data pointer is 16-byte aligned
// "" where every extent fits CUTLASS's int32 problem sizes and strides, else why not.
std::string int32_extents_refusal(std::initializer_list<int64_t> extents);
// t contiguous from a 16-byte aligned address (vector loads of scales and bias; torch's FP8 GEMM operands).
at::Tensor aligned_contiguous(const at::Tensor& t);

// Whether TMA loads `t` (a matrix, or a 3-D batch of them) in place in the layout asked for (row-major: unit
// stride along each row; else column-major): its leading dimension at least the rows' (columns') length,
// that, the batch stride and the address 16-byte multiples.
bool tma_in_place(const at::Tensor& t, bool row_major);
// `t` where tma_in_place, else a copy in that layout.
at::Tensor tma_operand(const at::Tensor& t, bool row_major);

// The launch arguments of `plan` for the kernel's operands a (M, K), b (K, N) and d (M, N) before padding
// (with swap-AB already applied), and bias (N,) or undefined. `poison` fills the buffers with NaN first
// (tests: an element the kernel should write but does not, or a pad that is not zeroed, shows as NaN).
class StagedOperands {
 public:
  StagedOperands(const GemmPlan& plan, const at::Tensor& a, const at::Tensor& b, const at::Tensor& d,
                 const at::Tensor& bias, bool poison);
  const GemmLaunchArgs& args() const { return args_; }
  // After the launch: copies a temporary output into d.
  void finish();

 private:
  GemmLaunchArgs args_;
  at::Tensor d_, a_buffer_, b_buffer_, d_buffer_, bias_buffer_;
};

// The kernels' element type of a tensor dtype (csrc/checks.h kGemmDtypes; FP8 outputs and grouped elements).
DType to_dtype(at::ScalarType type);

}  // namespace ops::cutlass_gemm
