// Clear errors for tensors that are not dense and strided. Sparse (COO, CSR/CSC/BSR/BSC), nested,
// MKL-DNN and quantized tensors dispatch to backend keys of their own, where no kernel of this library
// is registered, and PyTorch's generic message ("Could not run 'ops::rms_norm' with arguments from the
// 'SparseCPU' backend...") names neither the argument nor what to do about it. One boxed kernel,
// registered for every public op on those keys, names both, like the ops' other input checks
// (csrc/checks.h): "rms_norm: expected weight to be a dense (strided) tensor, got a sparse COO tensor;
// convert it with .to_dense() first".
#include <string>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace ops {
namespace {

// The public ops (csrc/registration.cpp); the internal ones (_cutlass_gemm_plan, ...) keep PyTorch's
// message.
constexpr const char* kPublicOps[] = {"cutlass_gemm", "cutlass_gemm.out", "linear", "rms_norm",
                                      "fused_add_rms_norm", "silu_and_mul"};

// What is wrong with `t` and how to fix it, or "" when it is dense and strided.
std::string non_strided_kind(const at::Tensor& t) {
  if (!t.defined()) return "";
  if (t.is_nested()) return "a nested tensor; pass its components (.unbind()) or a padded tensor (.to_padded_tensor(0))";
  if (t.is_quantized()) return "a quantized tensor; convert it with .dequantize() first";
  if (t.is_mkldnn()) return "an MKL-DNN tensor; convert it with .to_dense() first";
  if (t.is_sparse()) return "a sparse COO tensor; convert it with .to_dense() first";
  if (t.layout() != at::kStrided) return "a tensor of layout " + c10::str(t.layout()) + "; convert it with .to_dense() first";
  return "";
}

void reject_non_strided(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  std::string name = schema.name().substr(schema.name().find("::") + 2);
  if (!schema.overload_name().empty()) name += "." + schema.overload_name();
  const auto& arguments = schema.arguments();
  const size_t first = stack->size() - arguments.size();  // the arguments are the top of the stack
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::IValue& value = (*stack)[first + i];
    if (!value.isTensor()) continue;
    const std::string kind = non_strided_kind(value.toTensor());
    TORCH_CHECK(kind.empty(), name, ": expected ", arguments[i].name(), " to be a dense (strided) tensor, got ",
                kind);
  }
  TORCH_CHECK(false, name, ": expected dense (strided) tensors; got a tensor for the ",
              c10::toString(keys.highestPriorityTypeId()), " backend");
}

void register_rejections(torch::Library& m) {
  for (const char* name : kPublicOps) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&reject_non_strided>());
  }
}

}  // namespace
}  // namespace ops

TORCH_LIBRARY_IMPL(ops, SparseCPU, m) { ops::register_rejections(m); }
TORCH_LIBRARY_IMPL(ops, SparseCUDA, m) { ops::register_rejections(m); }
TORCH_LIBRARY_IMPL(ops, SparseCsrCPU, m) { ops::register_rejections(m); }
TORCH_LIBRARY_IMPL(ops, SparseCsrCUDA, m) { ops::register_rejections(m); }
TORCH_LIBRARY_IMPL(ops, NestedTensorCPU, m) { ops::register_rejections(m); }
TORCH_LIBRARY_IMPL(ops, NestedTensorCUDA, m) { ops::register_rejections(m); }
TORCH_LIBRARY_IMPL(ops, MkldnnCPU, m) { ops::register_rejections(m); }
TORCH_LIBRARY_IMPL(ops, QuantizedCPU, m) { ops::register_rejections(m); }
TORCH_LIBRARY_IMPL(ops, QuantizedCUDA, m) { ops::register_rejections(m); }
