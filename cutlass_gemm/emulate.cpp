#include "emulate.h"

#include <vector>

#include <ATen/ATen.h>

#include "../csrc/activation_ops.h"

namespace ops::cutlass_gemm {

void emulate_launch(const GemmPlan& plan, const GemmLaunchArgs& args, at::ScalarType dtype) {
  const auto options = at::TensorOptions().dtype(dtype).device(at::kCPU);
  auto strides = [](Layout layout, int64_t ld) {
    return layout == Layout::Row ? std::vector<int64_t>{ld, 1} : std::vector<int64_t>{1, ld};
  };
  // from_blob over exactly the memory the kernel would touch.
  const at::Tensor a = at::from_blob(const_cast<void*>(args.a), {args.m, args.k},
                                     strides(plan.a.layout, args.lda), options);
  const at::Tensor b = at::from_blob(const_cast<void*>(args.b), {args.k, args.n},
                                     strides(plan.b.layout, args.ldb), options);
  at::Tensor d = at::from_blob(args.d, {args.m, args.n}, {args.ldd, 1}, options);
  // fp32 accumulation (and epilogue) for half types, like the tensor-core kernels.
  const at::ScalarType compute = (dtype == at::kHalf || dtype == at::kBFloat16) ? at::kFloat : dtype;
  at::Tensor acc = at::mm(a.to(compute), b.to(compute));
  if (args.bias != nullptr) {
    acc.add_(at::from_blob(const_cast<void*>(args.bias), {args.n}, options).to(compute));
  }
  apply_activation_(acc, epilogue_activation(kernel_info(plan.tactic.kernel).epilogue));
  d.copy_(acc);
}

}  // namespace ops::cutlass_gemm
