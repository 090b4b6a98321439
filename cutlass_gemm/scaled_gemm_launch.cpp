// The launch of an SM90 FP8 scaled GEMM kernel as the CUDA kernel of ops::scaled_gemm builds it
// (prepare_scaled_launch: operands in the kernel's layouts, scales and bias where its loads want them), and
// its CPU replay: what the kernel computes from those arguments, read from their raw pointers and leading
// dimensions. The test hook _scaled_gemm_emulate runs both on CPU tensors, so the host side of the CUDA
// path is checked without a GPU.
#include <algorithm>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/util/Float8_e4m3fn.h>
#include <torch/library.h>

#include "../csrc/json.h"
#include "operands.h"
#include "scaled_gemm.h"
#include "tactic_select.h"  // json_names

namespace ops::cutlass_gemm {
bool scaled_block_recipe(ScaleRecipe recipe) {
  return recipe == ScaleRecipe::Block128 || recipe == ScaleRecipe::Block1x128;
}

namespace {
const char* out_name(at::ScalarType out) { return out == at::kBFloat16 ? "bf16" : out == at::kHalf ? "f16" : "f32"; }
}  // namespace

std::string scaled_kernel_name(at::ScalarType out, ScaleRecipe recipe, Activation act, bool fast_accum, bool swap_ab) {
  if (scaled_block_recipe(recipe)) {
    return std::string("sm90_e4m3_") + (swap_ab ? kSwappedBlockScaledGemmConfig : kBlockScaledGemmConfig) + "_" +
           out_name(out) +
           (recipe == ScaleRecipe::Block128 ? "_sfa1x128_sfb128x128" : "_sfa1x128_sfb1x128") + "_bias_" +
           std::string(activation_name(act));
  }
  return std::string("sm90_e4m3_") + (swap_ab ? kSwappedScaledGemmConfig : kScaledGemmConfig) +
         (fast_accum ? "_fp8_fastaccum" : "") + "_" + out_name(out) + "_scaled_bias_" +
         std::string(activation_name(act));
}

// One kernel serves tensorwise and rowwise (its epilogue broadcasts a scalar or a vector), fast or two-level
// accumulation; a blockwise kernel per block shape of B (its mainloop promotes per 128 of K); each swapped or not.
// As with_scaled_config (sm90_scaled_gemm.cuh) instantiates them.
std::vector<std::string> scaled_kernels_json() {
  std::vector<std::string> kernels;
  const auto add = [&](at::ScalarType out, std::initializer_list<ScaleRecipe> recipes, Activation act,
                       bool fast_accum, bool swap_ab) {
    std::vector<std::string> names;
    for (const ScaleRecipe r : recipes) names.emplace_back(scale_recipe_name(r));
    JsonObject o;
    o.add("name", scaled_kernel_name(out, *recipes.begin(), act, fast_accum, swap_ab))
        .add("op", "scaled_gemm")
        .add("sm", 90)
        .add("dtype", std::string(c10::getDtypeNames(at::kFloat8_e4m3fn).first))  // torch's names, as ops.kernels() spells all
        .add("out_dtype", std::string(c10::getDtypeNames(out).first))
        .raw("recipes", json_names(names))
        .add("activation", std::string(activation_name(act)))
        .add("accumulation", scaled_block_recipe(*recipes.begin()) ? "blockwise promotion"
                             : fast_accum                          ? "fast"
                                                                   : "two-level")
        .add("swap_ab", swap_ab)
        .add("candidate_only", true);
    kernels.push_back(o.str());
  };
  for (const at::ScalarType out : {at::kBFloat16, at::kHalf, at::kFloat}) {
    for (int a = 0; a < kNumActivations; ++a) {
      const Activation act = static_cast<Activation>(a);
      for (const bool swap_ab : {false, true}) {
        for (const bool fast : {false, true}) add(out, {ScaleRecipe::Tensorwise, ScaleRecipe::Rowwise}, act, fast, swap_ab);
      }
      for (const bool swap_ab : {false, true}) {
        add(out, {ScaleRecipe::Block128}, act, false, swap_ab);
        add(out, {ScaleRecipe::Block1x128}, act, false, swap_ab);
      }
    }
  }
  return kernels;
}

std::vector<std::string> scaled_candidates(at::ScalarType out, ScaleRecipe recipe, Activation act, bool fast_accum) {
  return {scaled_kernel_name(out, recipe, act, fast_accum, false), scaled_kernel_name(out, recipe, act, fast_accum, true)};
}

ScaledLaunch prepare_scaled_launch(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                   const at::Tensor& scale_b, const c10::optional<at::Tensor>& bias,
                                   ScaleRecipe recipe, Activation act, bool fast_accum, at::Tensor& out) {
  ScaledLaunch l;
  l.a = tma_operand(A, /*row_major=*/true);
  l.b = tma_operand(B, /*row_major=*/false);
  l.in_place = out.is_contiguous() && aligned16(out);
  l.d = l.in_place ? out : at::empty(out.sizes(), out.options());
  // Blockwise: scale_a (M, ceil(K/128)) stored M-major, as the kernel's scale layout reads it, in rows of
  // M rounded up to 4 (16-byte aligned for its TMA loads).
  const int64_t sa_ld = (A.size(0) + 3) / 4 * 4;
  if (scaled_block_recipe(recipe)) {
    l.scale_a = at::zeros({scale_a.size(1), sa_ld}, scale_a.options());
    l.scale_a.narrow(1, 0, A.size(0)).copy_(scale_a.t());
  } else {
    l.scale_a = aligned_contiguous(scale_a);
  }
  l.scale_b = aligned_contiguous(scale_b);
  if (bias.has_value() && bias->defined()) l.bias = aligned_contiguous(*bias);
  ScaledGemmLaunchArgs& args = l.args;
  args.a = l.a.const_data_ptr();
  args.b = l.b.const_data_ptr();
  args.d = l.d.data_ptr();
  args.m = l.a.size(0);
  args.n = l.b.size(1);
  args.k = l.a.size(1);
  args.lda = l.a.stride(0);
  args.ldb = l.b.stride(1);
  args.ldd = l.d.size(1);
  args.scale_a = l.scale_a.const_data_ptr<float>();
  args.scale_a_per_row = recipe == ScaleRecipe::Rowwise;
  args.scale_b = l.scale_b.const_data_ptr<float>();
  args.scale_b_per_column = recipe == ScaleRecipe::Rowwise;
  args.block_scaled = scaled_block_recipe(recipe);
  args.block_n = recipe == ScaleRecipe::Block1x128 ? 1 : 128;
  args.scale_a_ld = sa_ld;
  args.bias = l.bias.defined() ? l.bias.const_data_ptr() : nullptr;
  args.fast_accum = fast_accum;
  args.swap_ab = scaled_swap_ab(args.m);
  args.act = bias_epilogue(act);
  return l;
}

// The kernel's own problem (scaled_kernel_problem: swapped, D^T = B^T A^T with the scales and the bias
// along the other mode of D^T and the blockwise scales in each other's place), computed from the raw
// pointers, leading dimensions and scale layouts, each K block's partial product scaled as the blockwise
// mainloop scales it.
void replay_scaled_launch(const ScaledGemmLaunchArgs& args, at::ScalarType out_dtype) {
  const ScaledKernelProblem p = scaled_kernel_problem(args);
  // The kernel's can_implement: every dynamic stride a multiple of 16 bytes (CUTLASS detail::check_alignment),
  // whatever the extent along it.
  TORCH_CHECK(p.lda % 16 == 0 && p.ldb % 16 == 0 && args.ldd * c10::elementSize(out_dtype) % 16 == 0,
              "_scaled_gemm_emulate: CUTLASS's can_implement would refuse the leading dimensions lda = ", p.lda,
              ", ldb = ", p.ldb, " (FP8 elements), ldd = ", args.ldd, ": each must be 16 bytes");
  const bool swap = args.swap_ab;
  const auto* A = static_cast<const c10::Float8_e4m3fn*>(p.a);
  const auto* B = static_cast<const c10::Float8_e4m3fn*>(p.b);
  const int64_t k_blocks = (p.k + kScaleBlock - 1) / kScaleBlock;
  // CUTLASS's blockwise scale layouts: (ceil(extent / granularity), K blocks), the first mode fastest.
  const int ga = sfa_granularity(swap, args.block_n), gb = sfb_granularity(swap, args.block_n);
  const int64_t sfa_ld = (p.sfa_extent + ga - 1) / ga, sfb_ld = (p.sfb_extent + gb - 1) / gb;
  const auto scale = [](const float* s, bool vector, bool along_columns, int64_t i, int64_t j) {
    return s[vector ? (along_columns ? j : i) : 0];
  };
  at::Tensor z = at::empty({p.m, p.n}, at::kFloat);
  float* zp = z.data_ptr<float>();
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      float acc = 0;
      if (args.block_scaled) {
        for (int64_t kb = 0; kb < k_blocks; ++kb) {
          float part = 0;
          for (int64_t k = kb * kScaleBlock; k < std::min(p.k, (kb + 1) * kScaleBlock); ++k) {
            part += static_cast<float>(A[i * p.lda + k]) * static_cast<float>(B[j * p.ldb + k]);
          }
          acc += part * p.sfa[kb * sfa_ld + i / ga] * p.sfb[kb * sfb_ld + j / gb];
        }
      } else {
        for (int64_t k = 0; k < p.k; ++k) acc += static_cast<float>(A[i * p.lda + k]) * static_cast<float>(B[j * p.ldb + k]);
        acc = scale(args.scale_a, args.scale_a_per_row, scale_a_along_columns(swap), i, j) *
              (scale(args.scale_b, args.scale_b_per_column, scale_b_along_columns(swap), i, j) * acc);
      }
      zp[i * p.n + j] = acc;
    }
  }
  if (args.bias != nullptr) {
    const bool columns = bias_along_columns(swap);
    const at::Tensor bias = at::from_blob(const_cast<void*>(args.bias), {columns ? p.n : p.m},
                                          at::TensorOptions().dtype(out_dtype));
    z.add_(columns ? bias.to(at::kFloat).reshape({1, p.n}) : bias.to(at::kFloat).reshape({p.m, 1}));
  }
  apply_activation_(z, epilogue_activation(args.act));
  const std::vector<int64_t> strides = p.d_column_major ? std::vector<int64_t>{1, args.ldd}
                                                        : std::vector<int64_t>{args.ldd, 1};
  at::from_blob(args.d, {p.m, p.n}, strides, at::TensorOptions().dtype(out_dtype)).copy_(z);
}

namespace {

// The CUDA path's launch on CPU tensors (e4m3 A and B): prepared as on CUDA, computed by the replay.
at::Tensor scaled_gemm_emulate(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                               const at::Tensor& scale_b, const c10::optional<at::Tensor>& bias,
                               c10::optional<at::ScalarType> out_dtype, c10::string_view activation,
                               bool use_fast_accum) {
  return scaled_gemm_with(A, B, scale_a, scale_b, bias, out_dtype, activation, use_fast_accum,
                          [](const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa, const at::Tensor& sb,
                             const c10::optional<at::Tensor>& bi, ScaleRecipe recipe, Activation act, bool fast,
                             at::Tensor& out) {
                            TORCH_CHECK(a.scalar_type() == at::kFloat8_e4m3fn && b.scalar_type() == at::kFloat8_e4m3fn,
                                        "_scaled_gemm_emulate: the FP8 kernels take float8_e4m3fn A and B");
                            const at::AutoDispatchBelowADInplaceOrView below_autograd;
                            ScaledLaunch l = prepare_scaled_launch(a, b, sa, sb, bi, recipe, act, fast, out);
                            // A forced tactic (ops.gemm.set_tactic) picks the variant, as on CUDA.
                            const NamedChoice choice = choose_named(
                                "_scaled_gemm_emulate", [] { return std::string(); },
                                scaled_candidates(out.scalar_type(), recipe, act, fast), l.args.swap_ab ? 1 : 0);
                            l.args.swap_ab = choice.index == 1;
                            replay_scaled_launch(l.args, out.scalar_type());
                            if (!l.in_place) out.copy_(l.d);
                          });
}

}  // namespace
}  // namespace ops::cutlass_gemm

TORCH_LIBRARY_IMPL(ops, CPU, m) { m.impl("_scaled_gemm_emulate", &ops::cutlass_gemm::scaled_gemm_emulate); }
