// The activations ops.linear fuses into its GEMM: one table, read by the checks, autograd, the CUTLASS
// epilogues (cutlass_gemm/kernels/kernel_list.h) and Python (ops._library.ACTIVATIONS, from the _tables op).
// Plain C++ (no torch): kernel translation units include it.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace ops {

enum class Activation : int8_t { None, ReLU, GELU, GELUTanh, SiLU };

// Indexed by Activation. "gelu" is erf's GELU (F.gelu), "gelu_tanh" its tanh approximation.
inline constexpr std::string_view kActivationNames[] = {"none", "relu", "gelu", "gelu_tanh", "silu"};
inline constexpr int kNumActivations = static_cast<int>(sizeof(kActivationNames) / sizeof(kActivationNames[0]));
static_assert(kNumActivations == static_cast<int>(Activation::SiLU) + 1);

constexpr std::string_view activation_name(Activation a) { return kActivationNames[static_cast<int>(a)]; }

constexpr std::optional<Activation> activation_named(std::string_view name) {
  for (int i = 0; i < kNumActivations; ++i) {
    if (kActivationNames[i] == name) return static_cast<Activation>(i);
  }
  return std::nullopt;
}

}  // namespace ops
