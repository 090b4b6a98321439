#include "plan_json.h"

#include <vector>

#include "../../csrc/json.h"
#include "tactic.h"
#include "choice.h"

namespace ops::cutlass_gemm {
namespace {

JsonObject operand_json(const OperandPlan& p) {
  JsonObject o;
  o.add("source", p.source == Source::InPlace ? "in_place" : "copy")
      .add("layout", layout_name(p.layout))
      .add("rows", p.rows)
      .add("cols", p.cols)
      .add("ld", p.ld);
  return o;
}

// The tactics the candidate-only kernels (kernel_list.h) would add to plan's candidates in a build with
// them (OPS_CANDIDATE_KERNELS=1), when the target's binary lacks them.
std::vector<Tactic> unbuilt_candidate_tactics(const GemmPlan& plan, const DeviceTarget& target) {
  if (target.candidates_built || plan.family.empty()) return {};
  const KernelInfo& family = kernel_info(plan.family.front());
  GemmPlan unbuilt = plan;
  unbuilt.family.clear();
  for (int i = 0; i < kNumKernels; ++i) {
    const KernelInfo& info = kKernels[i];
    if (candidate_only(info.config) && info.sm == family.sm && info.dtype == family.dtype &&
        info.math == family.math && info.epilogue == family.epilogue && info.a == family.a &&
        info.b == family.b) {
      unbuilt.family.push_back(static_cast<KernelId>(i));
    }
  }
  return tactic_candidates(unbuilt, target.sm_count);
}

}  // namespace

std::string why_not_a_candidate(const std::string& name, const GemmPlan& plan, const DeviceTarget& target) {
  const std::string kernel = name.substr(0, name.find('/'));
  for (const Tactic& t : unbuilt_candidate_tactics(plan, target)) {
    for (const Tactic& variant : launch_variants(t)) {
      if (tactic_name(variant) == name) {
        return " (" + kernel_name(t.kernel) + " is a candidate-only kernel, " +
               (candidate_kernels_enabled() ? "which this build leaves out: rebuild with OPS_CANDIDATE_KERNELS=1 to run it)"
                                            : "turned off by ops.gemm.set_candidate_kernels(False))");
      }
    }
  }
  for (int i = 0; i < kNumKernels; ++i) {
    if (kernel == kKernels[i].id) {
      return " ('" + kernel + "' is the kernel's id in cutlass_gemm/kernels/kernel_list.h; tactic names use its name, " +
             kernel_name(static_cast<KernelId>(i)) + ")";
    }
  }
  return "";
}

std::string plan_json(const PlanHead& head, const std::function<void(JsonObject&)>& fields) {
  JsonObject o;
  o.add("kind", gemm_kind_name(head.kind)).add("path", head.path);
  if (head.kernel.empty()) {
    o.null("kernel");
  } else {
    o.add("kernel", head.kernel);
  }
  if (fields) fields(o);
  if (head.path == "cutlass") {
    o.raw("candidates", json_names(head.candidates))
        .add("tactic_source", tactic_source_name(head.source))
        .add("tuning_key", head.tuning_key)
        .add("swap_ab", head.swap_ab);
  }
  if (!head.reason.empty()) o.add("reason", head.reason);
  return o.str();
}

std::string aten_plan_json(const std::string& reason, int64_t m, int64_t n, int64_t k) {
  PlanHead head;
  head.path = "aten";
  head.kernel = "aten";
  head.reason = reason;
  return plan_json(head, [&](JsonObject& o) {
    JsonObject tactic;
    tactic.add("name", "aten");
    o.add("kernel_id", "aten")
        .add("tactic", tactic)
        .add("tactic_source", "fallback")
        .add("fallback", reason)
        .raw("candidates", "[]")
        .raw("candidates_not_built", "[]")
        .add("m", m)
        .add("n", n)
        .add("k", k);
  });
}

std::string plan_json(const GemmPlan& plan, const DeviceTarget& target) {
  if (!plan.aten_fallback.empty()) return aten_plan_json(plan.aten_fallback, plan.m, plan.n, plan.k);
  PlanHead head;
  if (plan.tactic.kernel == KernelId::kCount) return plan_json(head);  // nothing ran (an empty problem)
  const int sm_count = target.sm_count;
  const KernelInfo& info = kernel_info(plan.tactic.kernel);
  head.path = "cutlass";
  head.kernel = kernel_name(plan.tactic.kernel);
  for (const Tactic& t : candidates_of(plan, sm_count)) head.candidates.push_back(tactic_name(t));
  head.source = plan.tactic_source;
  head.tuning_key = tuning_key(target, tuning_problem(plan));
  head.swap_ab = plan.swap_ab;
  std::vector<std::string> not_built;
  for (const Tactic& t : unbuilt_candidate_tactics(plan, target)) not_built.push_back(tactic_name(t));
  return plan_json(head, [&](JsonObject& o) {
    JsonObject tactic;
    tactic.add("name", tactic_name(plan.tactic))
        .add("config", config_name(info.config))
        .add("decomposition", decomposition_name(plan.tactic.decomposition))
        .add("splits", plan.tactic.splits)
        .add("swizzle", plan.tactic.swizzle)
        .add("raster", raster_name(plan.tactic.raster));
    o.add("kernel_id", info.id)
        .add("tactic", tactic)
        .raw("candidates_not_built", json_names(not_built))
        .add("m", plan.m)
        .add("n", plan.n)
        .add("k", plan.k)
        .add("a", operand_json(plan.a))
        .add("b", operand_json(plan.b))
        .add("d", operand_json(plan.d))
        .add("copied_elements", plan.copied_elements);
  });
}

}  // namespace ops::cutlass_gemm
