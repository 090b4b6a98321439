// Autocast (torch.autocast) kernels: inside an autocast region the GEMM ops (cutlass_gemm, linear,
// grouped_gemm) run in the region's lower precision dtype, as aten::mm and aten::linear do (both are on
// autocast's "lower precision" list): floating inputs on the region's device, except float64, are cast
// (through autocast's weight cache) to torch.get_autocast_dtype(device), float16 or bfloat16. The fused norm and activation ops keep
// autocast's default (fall through: they run in their inputs' dtype, like F.silu).
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace ops {
namespace {

using at::autocast::cached_cast;

template <c10::DeviceType kDevice>
at::Tensor cutlass_gemm_autocast(const at::Tensor& A, const at::Tensor& B) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(
      at::autocast::get_autocast_dispatch_key_from_device_type(kDevice));
  const at::ScalarType dtype = at::autocast::get_lower_precision_fp_from_device_type(kDevice);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::cutlass_gemm", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(cached_cast(dtype, A, kDevice), cached_cast(dtype, B, kDevice));
}

template <c10::DeviceType kDevice>
at::Tensor linear_autocast(const at::Tensor& input, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias, c10::string_view activation) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(
      at::autocast::get_autocast_dispatch_key_from_device_type(kDevice));
  const at::ScalarType dtype = at::autocast::get_lower_precision_fp_from_device_type(kDevice);
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("ops::linear", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            c10::string_view)>();
  return op.call(cached_cast(dtype, input, kDevice), cached_cast(dtype, weight, kDevice),
                 cached_cast(dtype, bias, kDevice), activation);
}

// grouped_gemm as well (torch._grouped_mm is not autocast-enabled, pytorch#174763): A and B cast, offs kept.
template <c10::DeviceType kDevice>
at::Tensor grouped_gemm_autocast(const at::Tensor& A, const at::Tensor& B, const std::optional<at::Tensor>& offs,
                                 std::optional<at::ScalarType> out_dtype) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(
      at::autocast::get_autocast_dispatch_key_from_device_type(kDevice));
  const at::ScalarType dtype = at::autocast::get_lower_precision_fp_from_device_type(kDevice);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::grouped_gemm", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                               std::optional<at::ScalarType>)>();
  return op.call(cached_cast(dtype, A, kDevice), cached_cast(dtype, B, kDevice), offs, out_dtype);
}

}  // namespace
}  // namespace ops

TORCH_LIBRARY_IMPL(ops, AutocastCUDA, m) {
  m.impl("cutlass_gemm", &ops::cutlass_gemm_autocast<c10::DeviceType::CUDA>);
  m.impl("linear", &ops::linear_autocast<c10::DeviceType::CUDA>);
  m.impl("grouped_gemm", &ops::grouped_gemm_autocast<c10::DeviceType::CUDA>);
}

TORCH_LIBRARY_IMPL(ops, AutocastCPU, m) {
  m.impl("cutlass_gemm", &ops::cutlass_gemm_autocast<c10::DeviceType::CPU>);
  m.impl("linear", &ops::linear_autocast<c10::DeviceType::CPU>);
  m.impl("grouped_gemm", &ops::grouped_gemm_autocast<c10::DeviceType::CPU>);
}
