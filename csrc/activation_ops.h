// The activations of csrc/activation.h as ATen computes them: parsing ops.linear's argument, the
// forward (the reference the CUTLASS epilogues are checked against) and the backward.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include "activation.h"

namespace ops {

// The activation `name` spells; a ValueError naming `op` and listing the names otherwise.
Activation parse_activation(const char* op, c10::string_view name);

// x = act(x), in place.
void apply_activation_(const at::Tensor& x, Activation act);

// g * act'(z), elementwise, by ATen's own backward ops (themselves differentiable, so double backward
// works).
at::Tensor activation_backward(const at::Tensor& g, const at::Tensor& z, Activation act);

}  // namespace ops
