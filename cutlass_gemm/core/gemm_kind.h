// What every GEMM of the family shares on the host, whatever its kind: the kind itself, and where the
// choice of its kernel came from. Plain C++.
#pragma once

#include <cstdint>

namespace ops::cutlass_gemm {

// The kinds of the GEMM family (DESIGN.md, "The GEMM family"): dense (cutlass_gemm, and linear as dense with
// a bias-activation epilogue), FP8 scaled (scaled_gemm), grouped (grouped_gemm) and FP8 scaled grouped
// (scaled_grouped_gemm). Each kind has its launch arguments (kernels/launch_args.h, scaled_args.h,
// grouped_args.h, scaled_grouped_args.h) and shares the choice, the autotuner, the kernel table, the plan JSON
// and the CPU replay.
enum class GemmKind : int8_t { Dense, Scaled, Grouped, ScaledGrouped };
inline constexpr int kNumGemmKinds = 4;

constexpr const char* gemm_kind_name(GemmKind kind) {
  switch (kind) {
    case GemmKind::Dense: return "dense";
    case GemmKind::Scaled: return "scaled";
    case GemmKind::Grouped: return "grouped";
    case GemmKind::ScaledGrouped: return "scaled_grouped";
  }
  return "?";
}

// Where a GEMM's kernel choice came from (choice.h): the shape heuristic, the tactic forced by
// ops.gemm.set_tactic, or the tuning cache (autotuned here, or loaded from a file).
enum class TacticSource : int8_t { Heuristic, Forced, Tuned };

}  // namespace ops::cutlass_gemm
