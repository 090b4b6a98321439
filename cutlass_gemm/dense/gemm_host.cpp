#include "gemm_host.h"

#include <cstdlib>
#include <string>

#include <ATen/ATen.h>

#include "../../csrc/activation_ops.h"
#include "../../csrc/checks.h"
#include "../core/operands.h"
#include "../core/choice.h"
#include "../core/plan_json.h"  // why_not_a_candidate
#include "../core/tactic.h"

namespace ops::cutlass_gemm {


bool sm80_on_sm90_from_env() {
  const char* value = std::getenv("OPS_CUTLASS_SM80_ON_SM90");
  return value != nullptr && std::string(value) == "1";
}

GemmPlan plan_for(const at::Tensor& A, const at::Tensor& B, const at::Tensor& out,
                  const DeviceTarget& target, Epilogue epilogue) {
  GemmPlan plan;
  GemmRequest request;
  request.dtype = to_dtype(A.scalar_type());
  request.allow_tf32 = target.allow_tf32;
  request.cc_major = target.cc_major;
  request.cc_minor = target.cc_minor;
  request.built = target.built;
  request.m = A.size(0);
  request.n = B.size(1);
  request.k = A.size(1);
  request.a = view_of(A);
  request.b = view_of(B);
  // No out: a row-major (M, N) output at an aligned address (what the functional op allocates).
  request.c = out.defined() ? view_of(out) : MatrixView{request.m, request.n, request.n, 1, 0};
  request.epilogue = epilogue;
  request.allow_swap = epilogue == Epilogue::Plain;
  request.sm_count = target.sm_count;
  request.sm80_on_sm90 = target.sm80_on_sm90;
  request.candidates_built = target.candidates_built;
  const std::string error = plan_gemm(request, &plan);
  TORCH_CHECK(error.empty(), error);
  return plan;
}

void select_tactic(GemmPlan& plan, const DeviceTarget& target, const char* op, const std::string& dtype) {
  const int sm_count = target.sm_count;
  std::vector<std::string> names;
  std::vector<Tactic> chosen;  // a forced or cached tactic, which may be a candidate's launch variant
  Candidates c;
  c.names = [&]() -> const std::vector<std::string>& {
    if (names.empty()) {
      for (const Tactic& t : candidates_of(plan, sm_count)) names.push_back(tactic_name(t));
    }
    return names;
  };
  c.find = [&](const std::string& name) -> std::optional<size_t> {
    const std::optional<Tactic> tactic = tactic_named(candidates_of(plan, sm_count), name);
    if (!tactic.has_value()) return std::nullopt;
    chosen.push_back(*tactic);
    return chosen.size() - 1;
  };
  c.why_not = [&](const std::string& name) { return why_not_a_candidate(name, plan, target); };
  c.listing = [&] {
    std::string listing;
    for (const std::string& name : c.names()) listing += (listing.empty() ? "" : ", ") + name;
    return listing + " (an SM90 one also with /swz2, /swz4 or /swz8 and /raster_m or /raster_n)";
  };
  std::string key;
  const Choice choice = choose(op,
                               "GEMM (M=" + std::to_string(plan.m) + ", N=" + std::to_string(plan.n) + ", K=" +
                                   std::to_string(plan.k) + ", " + dtype + ")",
                               [&] { return key = tuning_key(target, tuning_problem(plan)); }, c);
  // The heuristic's choice is plan.tactic already (choose_tactic, one of the candidates).
  if (choice.source != TacticSource::Heuristic) plan.tactic = chosen.at(choice.index);
  plan.tactic_source = choice.source;
  if (choice.autotune) plan.autotune_key = key;
}

GemmPlan gemm_into(const at::Tensor& A, const at::Tensor& B, const at::Tensor& out,
                   const DeviceTarget& target, const LaunchFn& launch, bool poison,
                   Epilogue epilogue, const at::Tensor& bias) {
  const int64_t M = A.size(0), K = A.size(1), N = B.size(1);
  GemmPlan plan;
  if (M == 0 || N == 0) return plan;
  if (K == 0) {
    // act(0 + bias) for every row.
    if (bias.defined()) {
      out.copy_(bias.unsqueeze(0).expand({M, N}));
    } else {
      out.zero_();
    }
    apply_activation_(out, epilogue_activation(epilogue));
    return plan;
  }
  plan = plan_for(A, B, out, target, epilogue);
  if (!plan.aten_fallback.empty()) {  // no CUTLASS kernel may run here (plan.h): ATen, same semantics
    // Only plain GEMMs are withheld: the Bias<Act> kernels are half-precision ones, SM90 on Hopper.
    TORCH_INTERNAL_ASSERT(epilogue == Epilogue::Plain, "cutlass_gemm: a withheld kernel with a bias epilogue");
    at::Tensor result = out;
    at::mm_out(result, A, B);
    return plan;
  }
  select_tactic(plan, target, "cutlass_gemm", torch_dtype_name(A.scalar_type()));
  // The kernel's operands before padding: with swap, D^T = B^T A^T.
  StagedOperands staged(plan, plan.swap_ab ? B.t() : A, plan.swap_ab ? A.t() : B, plan.swap_ab ? out.t() : out,
                        bias, poison);
  launch(plan, staged.args());
  staged.finish();
  return plan;
}

}  // namespace ops::cutlass_gemm
