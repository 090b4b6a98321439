// The CUDA kernels of ops::cutlass_gemm: device guard, then the planned CUTLASS launch (gemm_host.h) with
// its tactic (core/choice.h), autotuned when the user asked for it, through the family's CUDA services
// (cuda/services.h). No CUTLASS headers here.
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../../csrc/checks.h"
#include "../../csrc/json.h"
#include "../core/plan_json.h"
#include "../core/tactic.h"
#include "../cuda/services.h"
#include "gemm_host.h"

namespace ops::cutlass_gemm {

void launch_cutlass(const GemmPlan& plan, const GemmLaunchArgs& launch_args, const at::Tensor& like) {
  GemmLaunchArgs args = launch_args;
  args.device = like.get_device();
  args.sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const auto run = [&](const Tactic& tactic) {
    args.decomposition = tactic.decomposition;
    args.splits = tactic.splits;
    args.swizzle = tactic.swizzle;
    args.raster = tactic.raster;
    return run_kernel("cutlass_gemm", {GemmKind::Dense, &args, like.scalar_type(), static_cast<int>(tactic.kernel), &plan},
                      like);
  };
  Tactic tactic = plan.tactic;
  if (!plan.autotune_key.empty()) {  // autotuning on, and no cached or forced choice (select_tactic)
    const std::vector<Tactic>& candidates = candidates_of(plan, args.sm_count);
    std::vector<std::string> names;
    for (const Tactic& t : candidates) names.push_back(tactic_name(t));
    const size_t heuristic = static_cast<size_t>(
        std::find(candidates.begin(), candidates.end(), plan.tactic) - candidates.begin());
    const size_t best = autotune(plan.autotune_key, names, heuristic, [&](size_t i) { return run(candidates[i]).ok; });
    if (best < candidates.size()) tactic = candidates[best];
  }
  const LaunchStatus status = run(tactic);
  TORCH_CHECK(status.ok, "cutlass_gemm: CUTLASS kernel ", tactic_name(tactic), " failed: ",
              status.message, " (M=", args.m, ", N=", args.n, ", K=", args.k, ")");
}

namespace {

at::Tensor cutlass_gemm_cuda(const at::Tensor& A, const at::Tensor& B);

void cutlass_gemm_out_cuda(const at::Tensor& A, const at::Tensor& B, at::Tensor& out) {
  check_gemm_inputs("cutlass_gemm", A, B);
  const bool may_alias = check_gemm_out("cutlass_gemm", A, B, out);
  const c10::cuda::CUDAGuard guard(A.device());
  if (may_alias) {  // out shares A's or B's buffer: compute into a fresh tensor, then copy
    out.copy_(cutlass_gemm_cuda(A, B));
    return;
  }
  gemm_into(A, B, out, current_device_target(),
            [&](const GemmPlan& plan, const GemmLaunchArgs& args) { launch_cutlass(plan, args, A); });
}

at::Tensor cutlass_gemm_cuda(const at::Tensor& A, const at::Tensor& B) {
  check_gemm_inputs("cutlass_gemm", A, B);
  at::Tensor out = at::empty({A.size(0), B.size(1)}, A.options());
  cutlass_gemm_out_cuda(A, B, out);
  return out;
}

std::string cutlass_gemm_plan_cuda(const at::Tensor& A, const at::Tensor& B,
                                   const c10::optional<at::Tensor>& out) {
  check_gemm_inputs("cutlass_gemm", A, B);
  // An out that may share A's or B's buffer is computed into a fresh tensor (cutlass_gemm_out_cuda): its plan.
  const bool into_out = out.has_value() && !check_gemm_out("cutlass_gemm", A, B, *out);
  TORCH_CHECK(A.numel() > 0 && B.numel() > 0, "cutlass_gemm: no kernel runs for an empty problem (M=",
              A.size(0), ", N=", B.size(1), ", K=", A.size(1), ")");
  const c10::cuda::CUDAGuard guard(A.device());
  const DeviceTarget target = current_device_target();
  return plan_json(plan_for(A, B, into_out ? *out : at::Tensor(), target), target);
}

// For every instantiation in this build: the problem its kernel parameters hold for one synthetic launch descriptor
// (M, N, K = 136, 264, 72; A, B, D at fake addresses; leading dimensions by layout), computed on the
// host without a GPU (KernelProblem). JSON list of {name, known, m, n, k, a, b, d} plus the
// descriptor's values under "expected".
std::string kernel_problems_json() {
  GemmLaunchArgs args;
  args.m = 136;
  args.n = 264;
  args.k = 72;
  args.a = reinterpret_cast<const void*>(uintptr_t{0x100000});
  args.b = reinterpret_cast<const void*>(uintptr_t{0x200000});
  args.d = reinterpret_cast<void*>(uintptr_t{0x300000});
  args.ldd = args.n;
  // {m, n, k, a, b, d} of a problem as JSON (addresses as integers).
  const auto problem_json = [](int64_t m, int64_t n, int64_t k, const void* a, const void* b, const void* d) {
    const auto address = [](const void* p) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p)); };
    JsonObject o;
    o.add("m", m).add("n", n).add("k", k).add("a", address(a)).add("b", address(b)).add("d", address(d));
    return o;
  };
  std::string list = "[";
  for (int i = 0; i < kNumKernels; ++i) {
    const KernelInfo& info = kKernels[i];
    if (!kernel_built(GemmKind::Dense, i)) continue;
    args.lda = info.a == Layout::Row ? args.k : args.m;
    args.ldb = info.b == Layout::Row ? args.n : args.k;
    const KernelProblem p = kernel_entry(GemmKind::Dense, i).kernel_problem(&args);
    JsonObject o = problem_json(p.m, p.n, p.k, p.a, p.b, p.d);
    o.add("name", kernel_name(static_cast<KernelId>(i))).add("id", info.id).add("known", p.known);
    list += (list.size() > 1 ? "," : "") + o.str();
  }
  JsonObject result;
  result.add("expected", problem_json(args.m, args.n, args.k, args.a, args.b, args.d)).raw("kernels", list + "]");
  return result.str();
}

}  // namespace
}  // namespace ops::cutlass_gemm

TORCH_LIBRARY_IMPL(ops, CompositeImplicitAutograd, m) {
  m.impl("_cutlass_gemm_kernel_problems", &ops::cutlass_gemm::kernel_problems_json);
}

TORCH_LIBRARY_IMPL(ops, CUDA, m) {
  m.impl("_cutlass_gemm_plan", &ops::cutlass_gemm::cutlass_gemm_plan_cuda);
  m.impl("cutlass_gemm", &ops::cutlass_gemm::cutlass_gemm_cuda);
  m.impl("cutlass_gemm.out", &ops::cutlass_gemm::cutlass_gemm_out_cuda);
}
