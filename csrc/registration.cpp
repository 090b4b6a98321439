// The op catalogue: every schema of the `ops` library, public and private, in one place. Kernel files
// only register kernels (TORCH_LIBRARY_IMPL). Fake kernels and autograd of the public ops live in the
// Python package `ops`; set_python_module before each group names the module holding that group's
// fake kernels, so a missing fake kernel says what to import. ops::define is m.def plus clear errors
// for sparse, nested and quantized inputs (layout_errors.h). The private ops (a leading underscore)
// have a CompositeImplicitAutograd kernel each, registered beside their code (the _tensor_eps norms: a
// CompositeExplicitAutograd and an Autograd kernel each).
#include <torch/library.h>

#include "layout_errors.h"

TORCH_LIBRARY(ops, m) {
  m.set_python_module("ops.gemm");
  // C = A @ B. A (M, K), B (K, N), C (M, N); float16, bfloat16, float32, float64.
  ops::define(m, "cutlass_gemm(Tensor A, Tensor B) -> Tensor");
  // Out variant: writes A @ B into out (M, N). Returns nothing (an aliasing return would need
  // torch.Tag.out, whose name changed across torch releases: torch 2.10-2.12 call it out_variant).
  ops::define(m, "cutlass_gemm.out(Tensor A, Tensor B, *, Tensor(a!) out) -> ()");

  m.set_python_module("ops.linear");
  // act(input @ weight^T + bias); input (..., K), weight (N, K), bias (N,); activation one of
  // none, relu, gelu, gelu_tanh, silu (fused into the CUTLASS epilogue on CUDA for half types).
  ops::define(m, "linear(Tensor input, Tensor weight, Tensor? bias=None, str activation=\"none\") -> Tensor");

  m.set_python_module("ops.fp8");
  // act((A * scale_a) @ (B * scale_b) + bias); A (M, K), B (K, N) float8_e4m3fn / float8_e5m2, float32
  // scales of a recipe (checks.h ScaleRecipe), bias (N,) of out_dtype (None: bfloat16). Not differentiable.
  ops::define(m, "scaled_gemm(Tensor A, Tensor B, Tensor scale_a, Tensor scale_b, Tensor? bias=None, "
                 "ScalarType? out_dtype=None, str activation=\"none\", bool use_fast_accum=False) -> Tensor");
  // Out variant: out (M, N) of out_dtype (None: out's dtype).
  ops::define(m, "scaled_gemm.out(Tensor A, Tensor B, Tensor scale_a, Tensor scale_b, Tensor? bias=None, "
                 "ScalarType? out_dtype=None, str activation=\"none\", bool use_fast_accum=False, *, "
                 "Tensor(a!) out) -> ()");

  // (A * scale_a) @ (B * scale_b) + bias per group, in grouped_gemm's modes (offs int32 cumulative group
  // ends; checks.h GroupedMode), float8_e4m3fn A and B, float32 scales rowwise or blockwise 1x128 x 128x128
  // (checks.h ScaledGroupedProblem), bias (G, N) or (N,) of out_dtype (None: bfloat16). Not differentiable.
  ops::define(m, "scaled_grouped_gemm(Tensor A, Tensor B, Tensor scale_a, Tensor scale_b, Tensor? offs=None, "
                 "Tensor? bias=None, ScalarType? out_dtype=None) -> Tensor");
  // Out variant: out of the mode's shape and out_dtype (None: out's dtype).
  ops::define(m, "scaled_grouped_gemm.out(Tensor A, Tensor B, Tensor scale_a, Tensor scale_b, Tensor? offs=None, "
                 "Tensor? bias=None, ScalarType? out_dtype=None, *, Tensor(a!) out) -> ()");

  // (FP8 codes, float32 scales) of input per "tensor", "row", "group" (1x128 of a row) or "block"
  // (128x128 of a matrix); scale given: static. dtype None: float8_e4m3fn. quantize_fp8.cpp
  ops::define(m, "quantize_fp8(Tensor input, str granularity=\"row\", ScalarType? dtype=None, Tensor? scale=None, "
                 "bool pow2_scale=False) -> (Tensor, Tensor)");

  // quantize_fp8(op(...)) of rms_norm, fused_add_rms_norm (residual += input in place; input unchanged)
  // and silu_and_mul, in one op each; round_before_weight as rms_norm's. fp8_fused.cpp
  ops::define(m, "rms_norm_fp8(Tensor input, Tensor weight, float eps=1e-6, str granularity=\"row\", "
                 "ScalarType? dtype=None, Tensor? scale=None, bool pow2_scale=False, *, "
                 "bool round_before_weight=False) -> (Tensor, Tensor)");
  ops::define(m, "fused_add_rms_norm_fp8(Tensor input, Tensor(a!) residual, Tensor weight, float eps=1e-6, "
                 "str granularity=\"row\", ScalarType? dtype=None, Tensor? scale=None, bool pow2_scale=False, *, "
                 "bool round_before_weight=False) -> (Tensor, Tensor)");
  ops::define(m, "silu_and_mul_fp8(Tensor input, str granularity=\"row\", ScalarType? dtype=None, "
                 "Tensor? scale=None, bool pow2_scale=False) -> (Tensor, Tensor)");

  m.set_python_module("ops.grouped");
  // torch._grouped_mm's modes (checks.h GroupedMode): 2-D x 3-D (offs cuts M: the MoE forward), 2-D x 2-D
  // (offs cuts K: out (G, M, N)), 3-D x 3-D (batched, no offs), 3-D x 2-D (offs cuts N); offs int32
  // cumulative group ends; out_dtype A's dtype (None) or float32.
  ops::define(m, "grouped_gemm(Tensor A, Tensor B, Tensor? offs=None, ScalarType? out_dtype=None) -> Tensor");
  // Out variant: out of the mode's shape and out_dtype (None: out's dtype).
  ops::define(m, "grouped_gemm.out(Tensor A, Tensor B, Tensor? offs=None, ScalarType? out_dtype=None, *, "
                 "Tensor(a!) out) -> ()");

  m.set_python_module("ops.fused");
  // y = x / sqrt(mean(x^2, -1) + eps) * weight; x (..., hidden), weight (hidden,); stats in fp32.
  // round_before_weight: x / sqrt(...) rounded to x's dtype before the weight multiply (transformers'
  // LlamaRMSNorm, vLLM's RMSNorm.forward_native), else one rounding (F.rms_norm).
  ops::define(m, "rms_norm(Tensor input, Tensor weight, float eps=1e-6, *, bool round_before_weight=False) -> Tensor");
  // residual += input; input = rms_norm(residual, weight, eps); both mutated in place.
  ops::define(m, "fused_add_rms_norm(Tensor(a!) input, Tensor(b!) residual, Tensor weight, float eps=1e-6, *, "
                 "bool round_before_weight=False) -> ()");
  // x (..., 2d) -> silu(x[..., :d]) * x[..., d:].
  ops::define(m, "silu_and_mul(Tensor input) -> Tensor");
  // rms_norm with eps a 0-d CPU tensor: what ops.compile rewrites a norm into where the graph carries eps
  // as a tensor (torch.compile(dynamic=True) passes float arguments so). autograd.cpp
  ops::define(m, "_rms_norm_tensor_eps(Tensor input, Tensor weight, Tensor eps, *, bool round_before_weight=False) "
                 "-> Tensor");
  // fused_add_rms_norm with eps a 0-d CPU tensor, for the same graphs. autograd.cpp
  ops::define(m, "_fused_add_rms_norm_tensor_eps(Tensor(a!) input, Tensor(b!) residual, Tensor weight, Tensor eps, *, "
                 "bool round_before_weight=False) -> ()");

  // ---- Tactic and introspection controls (ops.gemm, ops.build_info, ops.kernels) ----------------
  m.set_python_module("ops.gemm");
  // JSON of the facts setup.py recorded (versions, arch list, source digest). internal_ops.cpp
  m.def("_build_info() -> str");
  // JSON of the activation names and the dtypes of the GEMMs and fused ops (activation.h, checks.h).
  // internal_ops.cpp
  m.def("_tables() -> str");
  // JSON list of the GEMM kernels in this build (CUTLASS and SIMT GEMV). cutlass_gemm/introspection_ops.cpp
  m.def("_cutlass_gemm_kernels() -> str");
  // Whether torch's matmul precision setting allows TF32 on CUDA (what cuBLAS reads). internal_ops.cpp
  m.def("_allow_tf32() -> bool");
  // Forces a tactic by name (None: the heuristic) for every CUDA GEMM. cutlass_gemm/introspection_ops.cpp
  m.def("_cutlass_gemm_set_tactic(str? name) -> ()");
  // The forced tactic, or "". cutlass_gemm/introspection_ops.cpp
  m.def("_cutlass_gemm_get_tactic() -> str");
  // Times every candidate on the first call of a shape and caches the fastest. cutlass_gemm/introspection_ops.cpp
  m.def("_cutlass_gemm_set_autotune(bool enabled) -> ()");
  m.def("_cutlass_gemm_autotune_enabled() -> bool");
  // Whether a candidate build's candidate-only kernels take calls (off: the default build's paths).
  // cutlass_gemm/introspection_ops.cpp
  m.def("_cutlass_gemm_set_candidate_kernels(bool enabled) -> ()");
  m.def("_cutlass_gemm_candidate_kernels_enabled() -> bool");
  // JSON of the tuning cache; clearing it; adding entries (load_tuning_cache). cutlass_gemm/introspection_ops.cpp
  m.def("_cutlass_gemm_tuning_cache() -> str");
  m.def("_cutlass_gemm_clear_tuning_cache() -> ()");
  // Test hook: how scaled_gemm's and grouped_gemm's SM90 kernels choose among `candidates` under `key`
  // (forced, tuned, heuristic; autotune due), as JSON. cutlass_gemm/introspection_ops.cpp
  m.def("_named_tactic_choice(str op, str key, str[] candidates, int heuristic) -> str");
  m.def("_cutlass_gemm_add_tuning(str[] keys, str[] bests, int[] timing_counts, str[] timing_names, "
        "float[] timing_ms) -> ()");
  // JSON plan (kernel, tactic, candidates) the CUDA kernel would run for A @ B on A's device. cutlass_gemm/dense/gemm_cuda.cpp
  m.def("_cutlass_gemm_plan(Tensor A, Tensor B, Tensor? out=None) -> str");
  // JSON of the path scaled_gemm takes for these arguments (recipe, path, kernel, reason). cutlass_gemm/scaled/scaled_gemm.cpp
  m.def("_scaled_gemm_plan(Tensor A, Tensor B, Tensor scale_a, Tensor scale_b, Tensor? bias=None, "
        "ScalarType? out_dtype=None, str activation=\"none\", bool use_fast_accum=False) -> str");
  // JSON of the path scaled_grouped_gemm takes (mode, recipe, path, host_sync).
  // cutlass_gemm/scaled_grouped/scaled_grouped_gemm.cpp
  m.def("_scaled_grouped_gemm_plan(Tensor A, Tensor B, Tensor scale_a, Tensor scale_b, Tensor? offs=None, "
        "Tensor? bias=None, ScalarType? out_dtype=None) -> str");
  // JSON of the path grouped_gemm takes for these arguments (mode, path, host_sync, offsets). cutlass_gemm/grouped/grouped_gemm.cpp
  m.def("_grouped_gemm_plan(Tensor A, Tensor B, Tensor? offs=None, ScalarType? out_dtype=None) -> str");
  // Which build of the fused CPU kernels runs: "default", "avx2" or "avx512". fused_cpu.cpp
  m.def("_fused_cpu_isa() -> str");
#if OPS_WITH_CUDA
  // Selects the CUDA rms_norm kernel: 0 the default, 1/2/4/8 packs per thread in registers; returns the
  // previous choice. fused_cuda.cpp
  m.def("_rms_norm_set_packs_per_thread(int packs) -> int");
  // Gives the allocator's C++ object PyTorch's record_stream hook; false if the allocator is not ours.
  // csrc/allocator/record_stream_hook.cpp
  m.def("_allocator_install_record_stream_hook() -> bool");
#endif

  // ---- Test hooks: the CUDA host path replayed on CPU (tests/test_gemm_plan.py) -----------------
  // Plans A @ B for a target GPU (compute capability, arch list, TF32, SM count, whether its binary has
  // the candidate-only kernels; default: as this one) and replays the launch descriptors on CPU into out (poisoned first);
  // returns the plan. cutlass_gemm/introspection_ops.cpp
  m.def("_cutlass_gemm_emulate(Tensor A, Tensor B, Tensor(a!) out, int cc_major, int cc_minor, "
        "str arch_list, bool allow_tf32, bool poison=True, Tensor? bias=None, str epilogue=\"plain\", "
        "int sm_count=132, bool? candidate_kernels=None) -> str");
  // The plan alone, for a target GPU. cutlass_gemm/introspection_ops.cpp
  m.def("_cutlass_gemm_plan_for_target(Tensor A, Tensor B, int cc_major, int cc_minor, str arch_list, "
        "bool allow_tf32, int sm_count=132, str epilogue=\"plain\", Tensor? out=None, "
        "bool? candidate_kernels=None) -> str");
  // scaled_gemm's SM90 kernel launch as its CUDA kernel prepares it, replayed on CPU tensors.
  // cutlass_gemm/scaled/scaled_gemm_launch.cpp
  m.def("_scaled_gemm_emulate(Tensor A, Tensor B, Tensor scale_a, Tensor scale_b, Tensor? bias=None, "
        "ScalarType? out_dtype=None, str activation=\"none\", bool use_fast_accum=False) -> Tensor");
  // scaled_gemm's CUDA path through torch._scaled_mm on CPU tensors (raises where it does not take the call).
  // cutlass_gemm/scaled/scaled_gemm.cpp
  m.def("_scaled_gemm_torch_path(Tensor A, Tensor B, Tensor scale_a, Tensor scale_b, Tensor? bias=None, "
        "ScalarType? out_dtype=None, str activation=\"none\", bool use_fast_accum=False) -> Tensor");
  // grouped_gemm's CUDA path (torch._grouped_mm on offsets clamped on the device) on CPU tensors.
  // cutlass_gemm/grouped/grouped_gemm.cpp
  m.def("_grouped_gemm_torch_path(Tensor A, Tensor B, Tensor? offs=None, ScalarType? out_dtype=None) -> Tensor");
  // grouped_gemm's SM90 grouped kernel launch as its CUDA kernel prepares it, replayed on CPU tensors (the
  // output poisoned with NaN first). cutlass_gemm/grouped/grouped_gemm_launch.cpp
  m.def("_grouped_gemm_emulate(Tensor A, Tensor B, Tensor? offs=None, ScalarType? out_dtype=None) -> Tensor");
  // scaled_grouped_gemm's SM90 FP8 grouped kernel launch as its CUDA kernel prepares it, replayed on CPU tensors
  // (the output poisoned with NaN first). cutlass_gemm/scaled_grouped/scaled_grouped_gemm_launch.cpp
  m.def("_scaled_grouped_gemm_emulate(Tensor A, Tensor B, Tensor scale_a, Tensor scale_b, Tensor? offs=None, "
        "Tensor? bias=None, ScalarType? out_dtype=None) -> Tensor");
  // What scaled_grouped_gemm's CUDA path gives torch._scaled_grouped_mm in 2D x 2D and 3D x 2D: A, B, scale_a,
  // scale_b, the group ends, and (3D x 2D) the output's columns in its result.
  // cutlass_gemm/scaled_grouped/scaled_grouped_gemm.cpp torch_ragged_operands
  m.def("_scaled_grouped_gemm_torch_operands(Tensor A, Tensor B, Tensor scale_a, Tensor scale_b, Tensor offs) "
        "-> Tensor[]");
#if OPS_WITH_CUDA
  // JSON of each CUTLASS 2.x kernel's host-built problem for a launch descriptor. cutlass_gemm/dense/gemm_cuda.cpp
  m.def("_cutlass_gemm_kernel_problems() -> str");
#endif
}
