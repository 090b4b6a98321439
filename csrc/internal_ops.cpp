// Private introspection ops (leading underscore): build facts, the CUTLASS instantiation list, and a
// test hook for the CUTLASS GEMM host path. They return JSON strings so that the op library needs no
// Python (it is also loaded by C++ programs, tests/cpp/); ops/_library.py decodes them.
#include <cstdio>
#include <stdexcept>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/library.h>

#include "../cutlass_gemm/gemm_host.h"
#include "../cutlass_gemm/plan.h"
#include "../cutlass_gemm/tactic.h"
#include "checks.h"
#include "json.h"

namespace ops {
namespace {

namespace cg = cutlass_gemm;

// The device an emulation or a plan query stands for: compute capability, the archs of a binary
// (TORCH_CUDA_ARCH_LIST syntax), torch's TF32 setting, the multiprocessor count and whether the binary
// has the candidate-only kernels (default: as this binary). Raises ValueError naming what is out of range.
cg::DeviceTarget emulated_target(int64_t cc_major, int64_t cc_minor, c10::string_view arch_list,
                                 bool allow_tf32, int64_t sm_count,
                                 c10::optional<bool> candidate_kernels) {
  TORCH_CHECK_VALUE(sm_count > 0 && sm_count <= 1'000'000, "cutlass_gemm: sm_count must be in [1, 1e6], got ",
                    sm_count);
  TORCH_CHECK_VALUE(cc_major >= 0 && cc_major < 100 && cc_minor >= 0 && cc_minor < 100,
                    "cutlass_gemm: compute capability out of range: ", cc_major, ".", cc_minor);
  cg::DeviceTarget target;
  target.cc_major = static_cast<int>(cc_major);
  target.cc_minor = static_cast<int>(cc_minor);
  try {
    target.built = cg::parse_arch_list(std::string(arch_list));
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, "cutlass_gemm: ", e.what());
  }
  target.allow_tf32 = allow_tf32;
  target.sm_count = static_cast<int>(sm_count);
  target.sm80_on_sm90 = cg::sm80_on_sm90_from_env();  // read per call: tests set it in os.environ
  target.candidates_built = candidate_kernels.value_or(OPS_WITH_CANDIDATE_KERNELS != 0);
  return target;
}

// The real host path of the CUDA wrapper (checks, plan, copies, zero padding, output temporary,
// copy-back) on CPU tensors, with the CUTLASS launch replaced by an exact replay of its descriptor.
// epilogue: "plain" (cutlass_gemm) or an ops.linear activation (Bias<Act> kernels, with `bias`).
std::string gemm_emulate(const at::Tensor& A, const at::Tensor& B, const at::Tensor& out,
                         int64_t cc_major, int64_t cc_minor, c10::string_view arch_list,
                         bool allow_tf32, bool poison, const c10::optional<at::Tensor>& bias,
                         c10::string_view epilogue, int64_t sm_count,
                         c10::optional<bool> candidate_kernels) {
  check_gemm_inputs("cutlass_gemm", A, B);
  TORCH_CHECK(!check_gemm_out("cutlass_gemm", A, B, out),
              "cutlass_gemm emulation: out shares A's or B's buffer (the real op computes into a temporary)");
  TORCH_CHECK(A.device().is_cpu(), "cutlass_gemm emulation runs on CPU tensors, got ", A.device());
  const cg::DeviceTarget target =
      emulated_target(cc_major, cc_minor, arch_list, allow_tf32, sm_count, candidate_kernels);
  const auto dtype = A.scalar_type();
  const cg::GemmPlan plan = cg::gemm_into(
      A, B, out, target,
      [&](const cg::GemmPlan& p, const cg::GemmLaunchArgs& args) { cg::emulate_launch(p, args, dtype); },
      poison,
      epilogue == "plain" ? cg::Epilogue::Plain : cg::epilogue_for_activation("linear", epilogue),
      bias.has_value() ? *bias : at::Tensor());
  return cg::plan_json(plan, target);
}

// The plan (heuristic tactic and candidates) for an emulated target, without running anything.
std::string gemm_plan_for_target(const at::Tensor& A, const at::Tensor& B, int64_t cc_major,
                                 int64_t cc_minor, c10::string_view arch_list, bool allow_tf32,
                                 int64_t sm_count, c10::string_view epilogue,
                                 const c10::optional<at::Tensor>& out,
                                 c10::optional<bool> candidate_kernels) {
  check_gemm_inputs("cutlass_gemm", A, B);
  if (out.has_value()) check_gemm_out("cutlass_gemm", A, B, *out);
  TORCH_CHECK(A.numel() > 0 && B.numel() > 0, "cutlass_gemm: no kernel runs for an empty problem");
  const cg::DeviceTarget target =
      emulated_target(cc_major, cc_minor, arch_list, allow_tf32, sm_count, candidate_kernels);
  const cg::Epilogue ep =
      epilogue == "plain" ? cg::Epilogue::Plain : cg::epilogue_for_activation("linear", epilogue);
  return cg::plan_json(cg::plan_for(A, B, out.has_value() ? *out : at::Tensor(), target, ep), target);
}

std::string kernels_json() {
  std::string out = "[";
  for (int i = 0; i < cg::kNumKernels; ++i) {
    const cg::KernelInfo& info = cg::kKernels[i];
    const cg::ConfigShape shape = cg::config_shape(info);
    const char* schedule = shape.schedule == cg::Schedule::Multistage    ? "multistage"
                           : shape.schedule == cg::Schedule::Cooperative ? "cooperative"
                           : shape.schedule == cg::Schedule::Pingpong    ? "pingpong"
                                                                         : "simt";
    JsonObject tile, cluster;
    tile.add("m", shape.tile_m).add("n", shape.tile_n).add("k", shape.tile_k);
    cluster.add("m", shape.cluster_m).add("n", shape.cluster_n);
    JsonObject o;
    o.add("name", cg::kernel_name(static_cast<cg::KernelId>(i)))
        .add("id", info.id)
        .add("sm", info.sm)
        .add("dtype", cg::dtype_name(info.dtype))
        .add("math", cg::math_name(info.math))
        .add("layout_a", cg::layout_name(info.a))
        .add("layout_b", cg::layout_name(info.b))
        .add("alignment", info.alignment)
        .add("on_sm90", info.on_sm90)
        .add("epilogue", cg::epilogue_name(info.epilogue))
        .add("config", cg::config_name(info.config))
        .add("tile", tile)
        .add("cluster", cluster)
        .add("stages", shape.stages)
        .add("schedule", schedule)
        .add("stream_k", shape.stream_k)
        .add("swap_ab", shape.swap_ab)
        .add("candidate_only", cg::candidate_only(info.config));
    out += (i ? "," : "") + o.str();
  }
  return out + "]";
}

std::string build_info_json() {
  JsonObject o;
  o.add("with_cuda", static_cast<bool>(OPS_WITH_CUDA))
      .add("cuda_arch_list", OPS_CUDA_ARCH_LIST)
      .add("candidate_kernels", static_cast<bool>(OPS_WITH_CANDIDATE_KERNELS))
      .add("cutlass_version", OPS_CUTLASS_VERSION)
      .add("torch_version", OPS_TORCH_VERSION)
      .add("cuda_version", OPS_CUDA_VERSION);
  return o.str();
}

void set_tactic(const c10::optional<c10::string_view>& name) {
  cg::set_forced_tactic(name.has_value() ? std::string(*name) : std::string());
}

std::string get_tactic() { return cg::forced_tactic(); }

void set_autotune(bool enabled) { cg::set_autotune(enabled); }

bool autotune_enabled() { return cg::autotune_enabled(); }

std::string tuning_cache() { return cg::tuning_cache_json(); }

void clear_tuning_cache() { cg::clear_tuning_cache(); }

// The entries of a saved tuning cache (ops.gemm.load_tuning_cache validated the file), all or none:
// entry i names the tactic bests[i] for the GEMM keys[i] (resolved against the GEMM's candidates when a
// GEMM of that key first runs) and has timing_counts[i] consecutive (name, ms) timings.
void add_tuning(const std::vector<std::string>& keys, const std::vector<std::string>& bests,
                c10::ArrayRef<int64_t> timing_counts, const std::vector<std::string>& timing_names,
                c10::ArrayRef<double> timing_ms) {
  constexpr const char* op = "ops.gemm.load_tuning_cache";
  TORCH_CHECK_VALUE(bests.size() == keys.size() && timing_counts.size() == keys.size(), op, ": ", keys.size(),
                    " keys, ", bests.size(), " tactics and ", timing_counts.size(), " timing counts");
  TORCH_CHECK_VALUE(timing_names.size() == timing_ms.size(), op, ": ", timing_names.size(), " timing names but ",
                    timing_ms.size(), " times");
  std::vector<std::pair<std::string, cg::TuningRecord>> records;
  size_t next = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    TORCH_CHECK_VALUE(!keys[i].empty() && !bests[i].empty(), op, ": entry ", i, " needs a key and a tactic name");
    TORCH_CHECK_VALUE(timing_counts[i] >= 0 && next + timing_counts[i] <= timing_names.size(), op,
                      ": timing counts do not add up to the timings given");
    cg::TuningRecord record;
    record.best = bests[i];
    for (int64_t t = 0; t < timing_counts[i]; ++t, ++next) {
      record.timings_ms.emplace_back(timing_names[next], timing_ms[next]);
    }
    records.emplace_back(keys[i], std::move(record));
  }
  TORCH_CHECK_VALUE(next == timing_names.size(), op, ": timing counts do not add up to the timings given");
  cg::store_tuned(std::move(records));
}

}  // namespace
}  // namespace ops

TORCH_LIBRARY_IMPL(ops, CompositeImplicitAutograd, m) {
  m.impl("_build_info", &ops::build_info_json);
  m.impl("_cutlass_gemm_kernels", &ops::kernels_json);
  m.impl("_allow_tf32", &ops::matmul_allows_tf32);
  m.impl("_cutlass_gemm_emulate", &ops::gemm_emulate);
  m.impl("_cutlass_gemm_plan_for_target", &ops::gemm_plan_for_target);
  m.impl("_cutlass_gemm_set_tactic", &ops::set_tactic);
  m.impl("_cutlass_gemm_get_tactic", &ops::get_tactic);
  m.impl("_cutlass_gemm_set_autotune", &ops::set_autotune);
  m.impl("_cutlass_gemm_autotune_enabled", &ops::autotune_enabled);
  m.impl("_cutlass_gemm_tuning_cache", &ops::tuning_cache);
  m.impl("_cutlass_gemm_clear_tuning_cache", &ops::clear_tuning_cache);
  m.impl("_cutlass_gemm_add_tuning", &ops::add_tuning);
}
