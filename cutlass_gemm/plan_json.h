// A plan as JSON (ops.gemm.plan(), the emulation hooks) and the explanation of a tactic name that is
// not among a plan's candidates.
#pragma once

#include <string>

#include "device_target.h"
#include "plan.h"

namespace ops::cutlass_gemm {

// Kernel, tactic and where it came from, candidates, the candidate-only kernels of the family this
// build leaves out, operands, tuning-cache key.
std::string plan_json(const GemmPlan& plan, const DeviceTarget& target);

// For an error about tactic `name` that is not a candidate of plan: why, when a build with the
// candidate-only kernels would take it (a candidate or one of its launch variants), or when it names a
// kernel by its kernel_list.h id; else "".
std::string why_not_a_candidate(const std::string& name, const GemmPlan& plan, const DeviceTarget& target);

}  // namespace ops::cutlass_gemm
