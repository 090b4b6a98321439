// CUDA kernel of ops::grouped_gemm: the SM90 grouped CUTLASS kernels where they are built and take the call
// (sm90_grouped_gemm.cuh: offs read on the device); else torch._grouped_mm where it runs the problem (its
// CUTLASS kernel for bfloat16 on SM90/SM100 also reads offs on the device), on offs clamped on the device;
// else grouped_gemm_loop (host offsets). No host synchronization on the first two: a call captures in a
// CUDA graph.
//
// Offsets are not checked on CUDA (that would read them on the host): both device paths clamp them
// (grouped_args.h; grouped_gemm_torch), run on CPU by the tests (_grouped_gemm_emulate, _grouped_gemm_torch_path).
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <functional>
#include <string>
#include <vector>

#include "../../csrc/checks.h"
#include "../../csrc/json.h"
#include "../core/plan_json.h"
#include "../core/choice.h"
#include "../core/operands.h"  // to_dtype
#include "../cuda/services.h"
#include "grouped_gemm.h"

namespace ops::cutlass_gemm {
namespace {

constexpr const char* kOp = "grouped_gemm";

// Whether torch._grouped_mm reads offs on the device (its CUTLASS kernel: bfloat16 on SM90 and SM100).
bool torch_kernel_on_device(const at::Tensor& A) {
  const int major = at::cuda::getDeviceProperties(A.device().index())->major;
  return A.scalar_type() == at::kBFloat16 && (major == 9 || major == 10);
}

// Why the SM90 grouped kernels do not take the call; "" where they do.
std::string why_not_cutlass(const at::Tensor& A, const at::Tensor& B, const GroupedProblem& p, at::ScalarType dtype) {
  const std::string refusal = sm90a_candidates_refusal("grouped");
  return refusal.empty() ? grouped_kernel_refusal(A, B, p, dtype) : refusal;
}

// The kernels that can run a launch of these layouts (unswapped; swapped but for RaggedK).
std::vector<std::string> grouped_candidates(GroupedGemmLaunchArgs args, at::ScalarType dtype) {
  std::vector<std::string> names;
  for (const bool swap : {false, true}) {
    if (swap && args.mode == GroupedKernelMode::RaggedK) continue;
    args.swap_ab = swap;
    names.push_back(grouped_kernel_name(args, dtype));
  }
  return names;
}
// A call's tuning cache key: its kernels, the operands' sizes and the group count on the current device.
std::string grouped_key(const std::vector<std::string>& names, const at::Tensor& A, const at::Tensor& B,
                        const GroupedProblem& p) {
  return tuning_key(current_device_target(), std::string(kOp) + " " + names[0] + " A=" + c10::str(A.sizes()) +
                                                       " B=" + c10::str(B.sizes()) + " groups=" +
                                                       std::to_string(p.groups));
}
// The one it runs (index into names: unswapped, swapped): forced, tuned, or grouped_swap_ab's choice.
Choice grouped_choice(const GroupedGemmLaunchArgs& args, const std::vector<std::string>& names,
                      const std::function<std::string()>& key) {
  Candidates c;
  c.names = [&]() -> const std::vector<std::string>& { return names; };
  c.heuristic = args.swap_ab ? 1 : 0;
  return choose(kOp, "call", key, c);
}

at::Tensor launch(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                  const GroupedProblem& p, at::ScalarType dtype) {
  GroupedLaunch l = prepare_grouped_launch(A, B, offs, p, dtype);
  const std::vector<std::string> names = grouped_candidates(l.args, dtype);
  const auto key = [&] { return grouped_key(names, A, B, p); };
  const Choice choice = grouped_choice(l.args, names, key);
  l.args.device = A.device().index();
  l.args.sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const GemmLaunch launch{GemmKind::Grouped, &l.args, dtype, static_cast<int>(to_dtype(dtype))};
  const auto attempt = [&](size_t candidate) {  // names: unswapped, then swapped
    l.args.swap_ab = candidate == 1;
    return run_kernel(kOp, launch, A);
  };
  const size_t index =
      choice.autotune ? autotune(key(), names, choice.index, [&](size_t i) { return attempt(i).ok; }) : choice.index;
  const LaunchStatus status = attempt(index);
  TORCH_CHECK(status.ok, kOp, ": CUTLASS kernel ", names[index], " failed: ", status.message);
  return l.d;
}

at::Tensor run(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
               const GroupedProblem& p, at::ScalarType dtype) {
  const c10::cuda::CUDAGuard guard(A.device());
  if (why_not_cutlass(A, B, p, dtype).empty()) return launch(A, B, offs, p, dtype);
  at::Tensor out = grouped_gemm_torch(A, B, offs, p, dtype);
  return out.defined() ? out : grouped_gemm_loop(A, B, offs, p, dtype);
}

at::Tensor grouped_gemm_cuda(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                             c10::optional<at::ScalarType> out_dtype) {
  return grouped_gemm_with(A, B, offs, out_dtype, run);
}

void grouped_gemm_out_cuda(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                           c10::optional<at::ScalarType> out_dtype, at::Tensor& out) {
  grouped_gemm_out_with(A, B, offs, out_dtype, out, run);
}

}  // namespace

std::string grouped_gemm_cuda_path(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                                   at::ScalarType dtype) {
  const GroupedProblem p = check_grouped_gemm_inputs(kOp, A, B, offs, dtype);
  const c10::cuda::CUDAGuard guard(A.device());
  const std::string why = why_not_cutlass(A, B, p, dtype);
  PlanHead head;
  head.kind = GemmKind::Grouped;
  bool sync = false;
  std::string offsets = "clamped on the device";
  if (why.empty()) {
    const GroupedGemmLaunchArgs args = grouped_kernel_layouts(p, A, B);
    head.path = "cutlass";
    head.candidates = grouped_candidates(args, dtype);
    const auto key = [&] { return grouped_key(head.candidates, A, B, p); };
    const Choice choice = grouped_choice(args, head.candidates, key);
    head.kernel = head.candidates[choice.index];
    head.swap_ab = choice.index == 1;
    head.source = choice.source;
    head.tuning_key = key();
  } else {
    const bool torch_path = grouped_gemm_torch_takes(A, B, p, dtype);
    // 3D x 3D reads no offsets; the others read them on the host unless torch's kernel takes them on the device.
    sync = p.mode != GroupedMode::Batched && !(torch_path && torch_kernel_on_device(A));
    head.path = torch_path ? "torch._grouped_mm" : "loop";
    if (!torch_path) offsets = "checked on the host";
    head.reason = why;
  }
  return plan_json(head, [&](JsonObject& o) {
    o.add("mode", grouped_mode_name(p.mode)).add("host_sync", sync).add("offsets", offsets);
  });
}

}  // namespace ops::cutlass_gemm

TORCH_LIBRARY_IMPL(ops, CUDA, m) {
  m.impl("grouped_gemm", &ops::cutlass_gemm::grouped_gemm_cuda);
  m.impl("grouped_gemm.out", &ops::cutlass_gemm::grouped_gemm_out_cuda);
}
