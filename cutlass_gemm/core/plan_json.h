// The one plan-JSON writer of the GEMM family (ops.gemm.plan, ops.fp8.plan, ops.grouped.plan, the emulation
// hooks), and the explanation of a dense tactic name that is not among a plan's candidates.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "../../csrc/json.h"

#include "device_target.h"
#include "plan.h"

namespace ops::cutlass_gemm {

// What every plan says, whatever its kind: {"kind", "path", "kernel", <the family's fields>, and on the
// "cutlass" path "candidates", "tactic_source", "tuning_key", "swap_ab"; then "reason" where one is given}.
// `kernel` "" writes null (nothing runs a kernel: an empty problem, or a path without one).
struct PlanHead {
  GemmKind kind = GemmKind::Dense;
  std::string path;    // "cutlass", or the family's fallback ("aten", "torch._scaled_mm", "formula", "loop", ...)
  std::string kernel;  // the kernel that runs
  std::vector<std::string> candidates;
  TacticSource source = TacticSource::Heuristic;
  std::string tuning_key;
  bool swap_ab = false;
  std::string reason;
};
std::string plan_json(const PlanHead& head, const std::function<void(JsonObject&)>& fields = {});

// A dense plan: kernel, tactic and where it came from, candidates, the candidate-only kernels of the family this
// build leaves out, operands, tuning-cache key.
std::string plan_json(const GemmPlan& plan, const DeviceTarget& target);

// A dense GEMM that ATen computes (no CUTLASS kernel may run: GemmPlan::aten_fallback, or a CPU tensor):
// kernel "aten" and `reason`.
std::string aten_plan_json(const std::string& reason, int64_t m, int64_t n, int64_t k);

// For an error about tactic `name` that is not a candidate of plan: why, when a build with the
// candidate-only kernels would take it (a candidate or one of its launch variants), or when it names a
// kernel by its kernel_list.h id; else "".
std::string why_not_a_candidate(const std::string& name, const GemmPlan& plan, const DeviceTarget& target);

}  // namespace ops::cutlass_gemm
