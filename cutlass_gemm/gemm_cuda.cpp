// The CUDA kernels of ops::cutlass_gemm: device guard, current stream, workspace from PyTorch's
// allocator, then the planned CUTLASS launch (gemm_host.h) with its tactic (tactic.h), autotuned when
// the user asked for it. No CUTLASS headers here.
#include <algorithm>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../csrc/checks.h"
#include "../csrc/json.h"
#include "gemm_cuda.h"
#include "gemm_host.h"
#include "launcher.h"
#include "tactic.h"

#ifndef OPS_CUDA_ARCH_LIST
#error "setup.py defines OPS_CUDA_ARCH_LIST (the archs the kernels were built for)"
#endif

namespace ops::cutlass_gemm {

namespace {

// One entry per kernel_list.h line. Candidate-only kernels without OPS_CANDIDATE_KERNELS=1: null (the
// planner leaves them out).
const KernelEntry* entries() {
  static const KernelEntry kEntries[] = {
#define OPS_KERNEL_ENTRY(name, ...) {&name##_workspace_size, &name##_run, &name##_kernel_problem},
#define OPS_NO_KERNEL_ENTRY(name, ...) {nullptr, nullptr, nullptr},
      OPS_CUTLASS_GEMM_DEFAULT_KERNELS(OPS_KERNEL_ENTRY)
#if OPS_WITH_CANDIDATE_KERNELS
      OPS_CUTLASS_GEMM_CANDIDATE_KERNELS(OPS_KERNEL_ENTRY)
#else
      OPS_CUTLASS_GEMM_CANDIDATE_KERNELS(OPS_NO_KERNEL_ENTRY)
#endif
#undef OPS_NO_KERNEL_ENTRY
#undef OPS_KERNEL_ENTRY
  };
  return kEntries;
}

}  // namespace

const KernelEntry& kernel_entry(int kernel_id) {
  TORCH_CHECK(kernel_id >= 0 && kernel_id < kNumKernels, "cutlass_gemm: bad kernel id ", kernel_id);
  TORCH_CHECK(entries()[kernel_id].run != nullptr, "cutlass_gemm: kernel ", kernel_name(static_cast<KernelId>(kernel_id)),
              " is candidate-only and not in this build (rebuild with OPS_CANDIDATE_KERNELS=1)");
  return entries()[kernel_id];
}

namespace {

const std::vector<BuiltArch>& built_archs() {
  static const std::vector<BuiltArch> built = parse_arch_list(OPS_CUDA_ARCH_LIST);
  return built;
}

}  // namespace

DeviceTarget current_device_target() {
  const cudaDeviceProp* props = at::cuda::getCurrentDeviceProperties();
  DeviceTarget target;
  target.cc_major = props->major;
  target.cc_minor = props->minor;
  target.built = built_archs();
  // Follow torch.mm: TF32 only where torch's float32 matmul precision allows it.
  target.allow_tf32 = matmul_allows_tf32();
  target.sm_count = props->multiProcessorCount;
  target.name = props->name;
  static const bool sm80_on_sm90 = sm80_on_sm90_from_env();  // read once: this runs on every GEMM
  target.sm80_on_sm90 = sm80_on_sm90;
  target.candidates_built = OPS_WITH_CANDIDATE_KERNELS != 0;
  return target;
}

namespace {

// Runs one tactic: workspace from PyTorch's caching allocator (stream-ordered, CUDA-graph safe), then
// the CUTLASS launch on `stream`.
LaunchStatus run_tactic(const Tactic& tactic, GemmLaunchArgs args, const at::Tensor& like,
                        cudaStream_t stream) {
  const KernelEntry& entry = kernel_entry(static_cast<int>(tactic.kernel));
  args.decomposition = tactic.decomposition;
  args.splits = tactic.splits;
  args.swizzle = tactic.swizzle;
  const size_t workspace_bytes = entry.workspace_size(args);
  at::Tensor workspace;
  if (workspace_bytes > 0) {
    workspace = at::empty({static_cast<int64_t>(workspace_bytes)}, like.options().dtype(at::kByte));
  }
  return entry.run(args, workspace_bytes ? workspace.data_ptr() : nullptr, workspace_bytes, stream);
}

// CUDA events for the autotuner, destroyed on every path out (C10_CUDA_CHECK throws).
class EventPool {
 public:
  explicit EventPool(int n) : events_(n, nullptr) {
    for (cudaEvent_t& event : events_) {
      const cudaError_t err = cudaEventCreate(&event);
      if (err != cudaSuccess) {
        destroy();  // the constructor is not finished: the destructor would not run
        C10_CUDA_CHECK(err);
      }
    }
  }
  ~EventPool() { destroy(); }
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  cudaEvent_t operator[](int i) const { return events_[i]; }

 private:
  void destroy() {
    for (cudaEvent_t& event : events_) {
      if (event != nullptr) (void)cudaEventDestroy(event);
      event = nullptr;
    }
  }
  std::vector<cudaEvent_t> events_;
};

// Median milliseconds of kRepeats runs of `tactic` after a warm-up run, each between CUDA events on
// `stream` (synchronizes it), or -1 when CUTLASS refuses the tactic or its workspace cannot be
// allocated (an out-of-memory error is caught and the candidate skipped, so tuning never fails a GEMM
// that the heuristic's tactic can run). The timed interval includes each run's host-side launch work.
double time_tactic(const Tactic& tactic, const GemmLaunchArgs& args, const at::Tensor& like,
                   cudaStream_t stream, const EventPool& events, int repeats) {
  try {
    if (!run_tactic(tactic, args, like, stream).ok) return -1;
    C10_CUDA_CHECK(cudaEventRecord(events[0], stream));
    bool ok = true;
    for (int i = 1; i <= repeats && ok; ++i) {
      ok = run_tactic(tactic, args, like, stream).ok;
      C10_CUDA_CHECK(cudaEventRecord(events[i], stream));
    }
    C10_CUDA_CHECK(cudaEventSynchronize(events[repeats]));
    if (!ok) return -1;
    std::vector<double> times;
    for (int i = 1; i <= repeats; ++i) {
      float t = 0;
      C10_CUDA_CHECK(cudaEventElapsedTime(&t, events[i - 1], events[i]));
      times.push_back(t);
    }
    std::nth_element(times.begin(), times.begin() + repeats / 2, times.end());
    return times[repeats / 2];
  } catch (const c10::OutOfMemoryError&) {
    return -1;
  }
}

// Times every candidate tactic of `plan` and caches the fastest under `key`. Every candidate writes
// the complete result into args.d, so the output is right whichever runs last.
Tactic autotune(const GemmPlan& plan, const std::vector<Tactic>& candidates, const GemmLaunchArgs& args,
                const std::string& key, const at::Tensor& like, cudaStream_t stream) {
  constexpr int kRepeats = 5;
  // Our own synchronizing calls must not invalidate a capture that another thread runs in the
  // default (global) mode.
  const c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
  TuningRecord record;
  record.tactic = plan.tactic;
  record.resolved = true;
  double best_ms = -1;
  const EventPool events(kRepeats + 1);
  for (const Tactic& candidate : candidates) {
    const double ms = time_tactic(candidate, args, like, stream, events, kRepeats);
    record.timings_ms.emplace_back(tactic_name(candidate), ms);
    if (ms >= 0 && (best_ms < 0 || ms < best_ms)) {
      best_ms = ms;
      record.tactic = candidate;
    }
  }
  record.best = tactic_name(record.tactic);
  const Tactic best = record.tactic;
  store_tuned({{key, std::move(record)}});
  return best;
}

}  // namespace

void launch_cutlass(const GemmPlan& plan, const GemmLaunchArgs& launch_args,
                    const at::Tensor& like) {
  GemmLaunchArgs args = launch_args;
  args.device = like.get_device();
  args.sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  Tactic tactic = plan.tactic;
  if (!plan.autotune_key.empty()) {  // autotuning on, and no cached or forced choice (gemm_into)
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    // Timing synchronizes, which a capturing stream forbids: keep the heuristic's choice there.
    if (capture == cudaStreamCaptureStatusNone) {
      tactic = autotune(plan, tactic_candidates(plan, args.sm_count), args, plan.autotune_key, like, stream);
    }
  }
  const LaunchStatus status = run_tactic(tactic, args, like, stream);
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
  if (out.has_value()) check_gemm_out("cutlass_gemm", A, B, *out);
  TORCH_CHECK(A.numel() > 0 && B.numel() > 0, "cutlass_gemm: no kernel runs for an empty problem (M=",
              A.size(0), ", N=", B.size(1), ", K=", A.size(1), ")");
  const c10::cuda::CUDAGuard guard(A.device());
  const DeviceTarget target = current_device_target();
  return plan_json(plan_for(A, B, out.has_value() ? *out : at::Tensor(), target), target);
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
    if (entries()[i].kernel_problem == nullptr) continue;  // not in this build
    args.lda = info.a == Layout::Row ? args.k : args.m;
    args.ldb = info.b == Layout::Row ? args.n : args.k;
    const KernelProblem p = kernel_entry(i).kernel_problem(args);
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
