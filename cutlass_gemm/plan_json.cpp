#include "plan_json.h"

#include <vector>

#include "../csrc/json.h"
#include "tactic.h"
#include "tactic_select.h"

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
        return " (" + kernel_name(t.kernel) + " is a candidate-only kernel, which this build leaves out: "
               "rebuild with OPS_CANDIDATE_KERNELS=1 to run it)";
      }
    }
  }
  for (int i = 0; i < kNumKernels; ++i) {
    if (kernel == kKernels[i].id) {
      return " ('" + kernel + "' is the kernel's id in cutlass_gemm/kernel_list.h; tactic names use its name, " +
             kernel_name(static_cast<KernelId>(i)) + ")";
    }
  }
  return "";
}

std::string plan_json(const GemmPlan& plan, const DeviceTarget& target) {
  const int sm_count = target.sm_count;
  JsonObject o;
  if (!plan.aten_fallback.empty()) {
    JsonObject tactic;
    tactic.add("name", "aten");
    o.add("kernel", "aten")
        .add("kernel_id", "aten")
        .add("tactic", tactic)
        .add("tactic_source", "fallback")
        .add("fallback", plan.aten_fallback)
        .raw("candidates", "[]")
        .raw("candidates_not_built", "[]")
        .add("m", plan.m)
        .add("n", plan.n)
        .add("k", plan.k);
    return o.str();
  }
  if (plan.tactic.kernel == KernelId::kCount) {
    o.null("kernel");
    return o.str();
  }
  const KernelInfo& info = kernel_info(plan.tactic.kernel);
  std::string candidates = "[";
  for (const Tactic& t : tactic_candidates(plan, sm_count)) {
    candidates += (candidates.size() > 1 ? "," : "") + JsonObject::quote(tactic_name(t));
  }
  candidates += "]";
  std::string not_built = "[";
  for (const Tactic& t : unbuilt_candidate_tactics(plan, target)) {
    not_built += (not_built.size() > 1 ? "," : "") + JsonObject::quote(tactic_name(t));
  }
  not_built += "]";
  JsonObject tactic;
  tactic.add("name", tactic_name(plan.tactic))
      .add("config", config_name(info.config))
      .add("decomposition", decomposition_name(plan.tactic.decomposition))
      .add("splits", plan.tactic.splits)
      .add("swizzle", plan.tactic.swizzle)
      .add("raster", raster_name(plan.tactic.raster));
  const char* source = tactic_source_name(plan.tactic_source);
  o.add("kernel", kernel_name(plan.tactic.kernel))
      .add("kernel_id", info.id)
      .add("tactic", tactic)
      .add("tactic_source", source)
      .add("tuning_key", tuning_key(plan, target))
      .raw("candidates", candidates)
      .raw("candidates_not_built", not_built)
      .add("swap_ab", plan.swap_ab)
      .add("m", plan.m)
      .add("n", plan.n)
      .add("k", plan.k)
      .add("a", operand_json(plan.a))
      .add("b", operand_json(plan.b))
      .add("d", operand_json(plan.d))
      .add("copied_elements", plan.copied_elements);
  return o.str();
}

}  // namespace ops::cutlass_gemm
