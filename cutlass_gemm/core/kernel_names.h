// Every kernel's public name and the one list of every kernel of every kind (kernel_names.cpp). The dense
// names (kernel_name, family_name) are declared in plan.h, which stays torch-free.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "../../csrc/activation.h"
#include "../../csrc/checks.h"  // ScaleRecipe
#include "../kernels/grouped_args.h"
#include "plan.h"

namespace ops::cutlass_gemm {

// An SM90 FP8 kernel: its row of OPS_SCALED_GEMM_CONFIGS (recipe class, accumulation, swap), output dtype and
// activation, e.g. sm90_e4m3_128x128x128_2x1x1_tn_align16_warpspecialized_cooperative_bf16_scaled_bias_none.
std::string scaled_kernel_name(at::ScalarType out, ScaleRecipe recipe, Activation act, bool fast_accum, bool swap_ab);

// An SM90 grouped kernel: its row of OPS_GROUPED_GEMM_KERNELS (the layouts and swap of args) and element type.
std::string grouped_kernel_name(const GroupedGemmLaunchArgs& args, at::ScalarType dtype);

// An SM90 FP8 grouped kernel: its row of OPS_SCALED_GROUPED_GEMM_KERNELS (block_n: 1 rowwise, 128 blockwise)
// and output dtype, e.g. sm90_e4m3_128x128x128_1x1x1_tnt_align16_warpspecialized_cooperative_ptr_array_fp8_blockwise_bf16_sfa1x128_sfb128x128.
std::string scaled_grouped_kernel_name(at::ScalarType out, int block_n);

// ops.kernels(): every kernel of every kind, built or candidate-only, as a JSON array of objects.
std::string kernels_json();

}  // namespace ops::cutlass_gemm
