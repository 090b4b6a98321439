// The GEMM planner: plain host C++ (no torch, no CUDA, no CUTLASS), so every decision that turns a
// user's tensors into a CUTLASS launch can be unit-tested on a machine without a GPU.
//
// Given the operands' sizes, strides and addresses, the device's compute capability and the archs the
// binary was built for, it decides:
//   * whether to compute D = A B directly or D^T = B^T A^T ("swap"), so that a column-major output is
//     written in place by a row-major-output kernel;
//   * for each operand, whether the kernel reads it in place (row- or column-major, with its leading
//     dimension) or from a copy (other strides, misaligned pointer / leading dimension / contiguous
//     extent), and for the output whether it is written in place or through a temporary;
//   * whether K or N must be zero-padded to the kernel's alignment (only for extents that are not a
//     multiple of 16 bytes, e.g. an fp16 GEMM with K = 7);
//   * which instantiation of kernel_list.h runs, and with which scheduler settings (the "tactic",
//     chosen by shape in tactic.h among the configs that serve the plan's layouts).
// Among valid plans it takes the one that copies the fewest bytes; ties prefer K-major operands (A
// row-major, B column-major: the layout tensor cores read best), then no swap.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../kernels/kernel_list.h"
#include "../kernels/launch_args.h"  // GemmLaunchArgs, LaunchStatus, Decomposition
#include "gemm_kind.h"  // TacticSource

namespace ops::cutlass_gemm {

// A 2-D operand as the user passed it: sizes, strides (elements) and the byte address of element 0.
struct MatrixView {
  int64_t rows = 0, cols = 0;
  int64_t stride0 = 0, stride1 = 0;
  uint64_t address = 0;

  MatrixView transposed() const { return {cols, rows, stride1, stride0, address}; }
};

// One arch the binary carries machine code for, e.g. {9, 0, true} for "9.0a".
struct BuiltArch {
  int major = 0, minor = 0;
  bool arch_specific = false;  // the "a" suffix
};

// Parses a TORCH_CUDA_ARCH_LIST-style string ("8.0;9.0a", "8.0 8.6+PTX"). PTX entries count as the
// arch they name. Throws std::invalid_argument on a malformed entry.
std::vector<BuiltArch> parse_arch_list(const std::string& arch_list);

// How a planned GEMM runs: the instantiation and its run-time scheduler settings.
struct Tactic {
  KernelId kernel = KernelId::kCount;
  Decomposition decomposition = Decomposition::DataParallel;
  int splits = 1;   // SplitK: number of K slices (>= 2); 1 otherwise
  int swizzle = 1;  // SM90 schedulers' max swizzle size (1, 2, 4 or 8): tile order for L2 reuse
  Raster raster = Raster::Heuristic;  // SM90 schedulers' raster order (launch_args.h)

  bool operator==(const Tactic& o) const {
    return kernel == o.kernel && decomposition == o.decomposition && splits == o.splits &&
           swizzle == o.swizzle && raster == o.raster;
  }
};


struct GemmRequest {
  DType dtype = DType::Float;
  bool allow_tf32 = false;           // float32 only: torch's matmul precision allows TF32
  int cc_major = 0, cc_minor = 0;    // the device's compute capability
  std::vector<BuiltArch> built;      // archs in the binary
  int64_t m = 0, n = 0, k = 0;
  MatrixView a, b, c;                // A (m x k), B (k x n), C (m x n): the output to write
  Epilogue epilogue = Epilogue::Plain;  // Bias<Act> (ops.linear): a per-column bias of C
  bool allow_swap = true;            // false for Bias<Act>: a swap would make the bias per-row
  int sm_count = 132;                // the device's multiprocessors (the tactic heuristic's wave size)
  // Run the SM80 (CUTLASS 2.x) kernels on Hopper too (OPS_CUTLASS_SM80_ON_SM90=1). Off by default: on an
  // H200 they gave wrong, partly unwritten results (benchmarks/results/2026-11-30-h200/SUMMARY.md), so
  // Hopper computes the GEMMs only they serve (fp32 without TF32, fp64) with ATen instead.
  bool sm80_on_sm90 = false;
  // Whether the binary holds the candidate-only kernels (kernel_list.h, candidate_only(); built with
  // OPS_CANDIDATE_KERNELS=1). Without them they are left out of every family.
  bool candidates_built = false;
};

enum class Source : int8_t {
  InPlace,  // the kernel reads/writes the user's memory
  Copy,     // inputs: copied (and zero-padded) into a fresh buffer; output: written to a temporary,
            // then copied into the user's tensor
};

// How one kernel operand is provided. rows x cols is the kernel's view (padded extents included).
struct OperandPlan {
  Source source = Source::InPlace;
  Layout layout = Layout::Row;
  int64_t rows = 0, cols = 0;
  int64_t ld = 0;  // leading dimension in elements (in the user's memory, or in the buffer)
};

// The launch descriptor. The kernel computes D (m x n, row-major) = A (m x k) @ B (k x n) where, with
// swap, A is the user's B^T, B is the user's A^T and D is the user's C^T. m, n, k include padding:
// n > user's n (or m, with swap) or k > user's k only when the extent had to be padded.
struct GemmPlan {
  Tactic tactic;                 // tactic.kernel: the instantiation that runs (kCount: none)
  std::vector<KernelId> family;  // every runnable instantiation for this plan (same dtype, math,
                                 // epilogue and layouts): the configs a tactic may choose among
  bool swap_ab = false;
  int64_t m = 0, n = 0, k = 0;
  OperandPlan a, b, d;
  int64_t copied_elements = 0;  // elements read + written by copies (the plan's cost)
  TacticSource tactic_source = TacticSource::Heuristic;
  // Set when the launcher should autotune this GEMM before running it (autotuning on, no forced
  // tactic, no cached choice, more than one candidate): the tuning-cache key to store the choice under.
  std::string autotune_key;
  // tactic_candidates(), computed once per GEMM on first use (candidates_of, tactic.h) and read by the
  // choice, the autotuner and plan().
  mutable std::vector<Tactic> candidates;
  mutable bool candidates_known = false;
  // Non-empty: no CUTLASS kernel serves this request on this device because its kernels are withheld
  // there (GemmRequest::sm80_on_sm90); ATen computes the GEMM instead. The reason, for plan().
  std::string aten_fallback;
};

// Returns "" and fills *plan, or returns an error message (naming the op) when no kernel can run.
// Requires m, n, k > 0 (empty problems never reach a kernel).
std::string plan_gemm(const GemmRequest& request, GemmPlan* plan);

// The dtype x math a request runs with: fp32 uses TF32 only when allowed, else 3xTF32.
Math math_for(DType dtype, bool allow_tf32);

// Whether an instantiation has machine code that runs on a device of this compute capability.
// SM80 kernels on a cc 9.0 device only with sm80_on_sm90 (GemmRequest).
bool kernel_runs_on(const KernelInfo& info, int cc_major, int cc_minor,
                    const std::vector<BuiltArch>& built, bool sm80_on_sm90 = false);

// A kernel's public name, spelled from its fields (config_shape() and the kernel_list.h columns) in the
// order of CUTLASS's generator (cutlass_library's procedural_name): arch, element type, tile, cluster
// (SM90), stages (SM80), layouts in BLAS letters (t row-major, n column-major; SM90: A, B and D, so a
// swap-AB kernel reads "..n"), alignment, tile scheduler, schedule, then the fused epilogue, e.g.
// sm90_bf16_128x128x64_2x1x1_tnt_align8_warpspecialized_cooperative or
// sm80_f16_128x128_32x4_tn_align8_bias_relu.
const std::string& kernel_name(KernelId id);

// The family a kernel belongs to (what its configs share: arch, element type, the layouts of the GEMM
// served, epilogue), spelled as kernel_name() spells them, e.g. sm90_bf16_tn or sm90_f16_tn_bias_silu.
std::string family_name(KernelId id);

const char* dtype_name(DType dtype);
const char* math_name(Math math);
const char* layout_name(Layout layout);
const char* epilogue_name(Epilogue epilogue);
const char* schedule_name(Schedule schedule);

}  // namespace ops::cutlass_gemm
