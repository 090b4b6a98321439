// Clear errors for tensors that are not dense and strided. Sparse (COO, CSR/CSC/BSR/BSC), nested,
// MKL-DNN and quantized tensors dispatch to backend keys of their own, where no kernel of this library
// is registered, and PyTorch's generic message ("Could not run 'ops::rms_norm' with arguments from the
// 'SparseCPU' backend...") names neither the argument nor what to do about it. One boxed kernel,
// registered on those keys for every op the catalogue defines with ops::define, names both, like the
// ops' other input checks (csrc/checks.h): "rms_norm: expected weight to be a dense (strided) tensor,
// got a sparse COO tensor; convert it with .to_dense() first".
//
// Negative views (the lazily negated tensors of z.conj().imag or torch._neg_view) dispatch through the
// Negative key, whose PyTorch fallback (ATen/native/MathBitsFallback.h) runs an op on a resolved clone
// of each written argument and then expects the op to return the tensor it wrote: for the ops here that
// write an argument and return nothing (fused_add_rms_norm, cutlass_gemm.out), it read a stack slot that
// was not there, failed an internal assert and corrupted memory. So those ops get a
// kernel of their own on that key: a written negative view is refused with an error naming it, a read
// one is resolved (materialised) and the op runs on. They also get an ADInplaceOrView kernel
// (bump_versions), as ATen's in-place ops have.
#include "layout_errors.h"

#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/variable.h>

namespace ops {
namespace {

// The op's name as Python spells it: "cutlass_gemm.out".
std::string op_name(const c10::FunctionSchema& schema) {
  std::string name = schema.name().substr(schema.name().find("::") + 2);
  if (!schema.overload_name().empty()) name += "." + schema.overload_name();
  return name;
}

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
  const std::string name = op_name(schema);
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

void resolve_negative_views(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const auto& arguments = schema.arguments();
  const size_t first = stack->size() - arguments.size();
  for (size_t i = 0; i < arguments.size(); ++i) {
    c10::IValue& value = (*stack)[first + i];
    if (!value.isTensor() || !value.toTensor().is_neg()) continue;
    const bool written = arguments[i].alias_info() != nullptr && arguments[i].alias_info()->isWrite();
    TORCH_CHECK(!written, op_name(schema), ": ", arguments[i].name(), " is written in place but is a negative view "
                "(its negative bit is set, e.g. z.conj().imag), whose memory holds the negated values; pass a tensor "
                "of its own (t = ", arguments[i].name(), ".resolve_neg()) and copy the result back (", arguments[i].name(),
                ".copy_(t))");
    value = value.toTensor().resolve_neg();
  }
  op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::Negative), stack);
}

// The ADInplaceOrView kernel of an op that writes an argument, as ATen's in-place and out= ops have: the op
// runs below, then each tensor it wrote gets a new version, so that autograd refuses a backward through a
// saved tensor the op overwrote. Inference mode skips the Autograd kernels, not this one (tensors made
// outside it carry the key).
void bump_versions(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto& arguments = op.schema().arguments();
  const size_t first = stack->size() - arguments.size();
  std::vector<at::Tensor> written;
  for (size_t i = 0; i < arguments.size(); ++i) {
    const auto* alias = arguments[i].alias_info();
    const c10::IValue& value = (*stack)[first + i];
    if (alias != nullptr && alias->isWrite() && value.isTensor()) written.push_back(value.toTensor());
  }
  {
    const at::AutoDispatchBelowADInplaceOrView below;
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
  for (const at::Tensor& t : written) {
    torch::autograd::impl::bump_version(t);
  }
}

constexpr c10::DispatchKey kNonStridedKeys[] = {
    c10::DispatchKey::SparseCPU,       c10::DispatchKey::SparseCUDA,       c10::DispatchKey::SparseMeta,
    c10::DispatchKey::SparseCsrCPU,    c10::DispatchKey::SparseCsrCUDA,    c10::DispatchKey::SparseCsrMeta,
    c10::DispatchKey::NestedTensorCPU, c10::DispatchKey::NestedTensorCUDA, c10::DispatchKey::NestedTensorMeta,
    c10::DispatchKey::MkldnnCPU,       c10::DispatchKey::QuantizedCPU,     c10::DispatchKey::QuantizedCUDA};

}  // namespace

void define(torch::Library& m, const char* schema) {
  m.def(schema);
  const std::string declaration(schema);
  const std::string name = declaration.substr(0, declaration.find('('));  // "cutlass_gemm.out"
  for (const c10::DispatchKey key : kNonStridedKeys) {
    m.impl(name.c_str(), torch::dispatch(key, torch::CppFunction::makeFromBoxedFunction<&reject_non_strided>()));
  }
  if (declaration.find("!)") != std::string::npos) {  // writes an argument: "Tensor(a!) out"
    m.impl(name.c_str(), torch::dispatch(c10::DispatchKey::Negative,
                                         torch::CppFunction::makeFromBoxedFunction<&resolve_negative_views>()));
    m.impl(name.c_str(), torch::dispatch(c10::DispatchKey::ADInplaceOrView,
                                         torch::CppFunction::makeFromBoxedFunction<&bump_versions>()));
  }
}

}  // namespace ops
