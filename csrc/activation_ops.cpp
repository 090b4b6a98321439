#include "activation_ops.h"

#include <string>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

namespace ops {

Activation parse_activation(const char* op, c10::string_view name) {
  const std::string_view view(name.data(), name.size());
  if (const auto act = activation_named(view)) return *act;
  std::string names;
  for (int i = 0; i < kNumActivations; ++i) {
    names += (i ? ", \"" : "\"") + std::string(kActivationNames[i]) + "\"";
  }
  TORCH_CHECK_VALUE(false, op, ": expected activation to be one of ", names, ", got \"", std::string(view), "\"");
}

void apply_activation_(const at::Tensor& x, Activation act) {
  at::Tensor self = x;  // the same tensor: at::gelu_ and at::silu_ take a non-const reference
  switch (act) {
    case Activation::None: return;
    case Activation::ReLU: self.relu_(); return;
    case Activation::GELU: at::gelu_(self, "none"); return;
    case Activation::GELUTanh: at::gelu_(self, "tanh"); return;
    case Activation::SiLU: at::silu_(self); return;
  }
}

at::Tensor activation_backward(const at::Tensor& g, const at::Tensor& z, Activation act) {
  switch (act) {
    case Activation::None: return g;
    case Activation::ReLU: return at::threshold_backward(g, z, 0);
    case Activation::GELU: return at::gelu_backward(g, z, "none");
    case Activation::GELUTanh: return at::gelu_backward(g, z, "tanh");
    case Activation::SiLU: {
      // aten::silu_backward has no derivative of its own; while a double-backward graph is being built,
      // use the composite form (as ATen's formula for silu does).
      if (!c10::GradMode::is_enabled()) return at::silu_backward(g, z);
      const at::Tensor s = at::sigmoid(z);
      return g * s * (1 + z * (1 - s));
    }
  }
  return g;
}

}  // namespace ops
