#include "gemm_host.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>

#include <ATen/ATen.h>

#include "../csrc/checks.h"
#include "../csrc/json.h"
#include "tactic.h"

namespace ops::cutlass_gemm {
namespace {

MatrixView view_of(const at::Tensor& t) {
  return {t.size(0), t.size(1), t.stride(0), t.stride(1),
          reinterpret_cast<uint64_t>(t.const_data_ptr())};
}

at::Tensor new_buffer(const at::Tensor& like, int64_t outer, int64_t ld, bool poison) {
  if (poison) {
    return at::full({outer, ld}, std::numeric_limits<double>::quiet_NaN(), like.options());
  }
  return at::empty({outer, ld}, like.options());
}

// The user's matrix `x` (the kernel's view before padding) copied into a buffer laid out as
// `plan` says, zero-filling the padded extents the kernel reads. Returns the buffer.
at::Tensor copy_operand(const at::Tensor& x, const OperandPlan& plan, bool poison) {
  const bool row = plan.layout == Layout::Row;
  // A column-major (rows x cols) matrix is a row-major (cols x rows) one.
  const at::Tensor src = row ? x : x.t();
  const int64_t outer = row ? plan.rows : plan.cols;
  const int64_t inner = row ? plan.cols : plan.rows;
  at::Tensor buffer = new_buffer(x, outer, plan.ld, poison);
  buffer.narrow(0, 0, src.size(0)).narrow(1, 0, src.size(1)).copy_(src);
  if (inner > src.size(1)) buffer.narrow(1, src.size(1), inner - src.size(1)).zero_();
  if (outer > src.size(0)) buffer.narrow(0, src.size(0), outer - src.size(0)).narrow(1, 0, inner).zero_();
  return buffer;
}

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

// For an error about tactic `name` that is not a candidate of plan: why, when a build with the
// candidate-only kernels would take it (a candidate or one of its launch variants), or when it names a
// kernel by its kernel_list.h id; else "".
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

}  // namespace

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
  const char* source = plan.tactic_source == TacticSource::Forced  ? "forced"
                       : plan.tactic_source == TacticSource::Tuned ? "tuned"
                                                                   : "heuristic";
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

DType to_dtype(at::ScalarType type) {
  switch (type) {
    case at::kHalf: return DType::Half;
    case at::kBFloat16: return DType::BFloat16;
    case at::kFloat: return DType::Float;
    case at::kDouble: return DType::Double;
    default: TORCH_CHECK(false, "cutlass_gemm: unsupported dtype ", type);
  }
}

Epilogue epilogue_for_activation(const char* op, c10::string_view activation) {
  if (activation == "none") return Epilogue::BiasIdentity;
  if (activation == "relu") return Epilogue::BiasReLU;
  if (activation == "gelu") return Epilogue::BiasGELU;
  if (activation == "gelu_tanh") return Epilogue::BiasGELUTanh;
  if (activation == "silu") return Epilogue::BiasSiLU;
  TORCH_CHECK_VALUE(false, op, ": expected activation to be one of \"none\", \"relu\", \"gelu\", "
                    "\"gelu_tanh\", \"silu\", got \"", std::string(activation), "\"");
}

void apply_activation_(const at::Tensor& x, Epilogue epilogue) {
  at::Tensor self = x;  // the same tensor: at::gelu_ and at::silu_ take a non-const reference
  switch (epilogue) {
    case Epilogue::Plain:
    case Epilogue::BiasIdentity: return;
    case Epilogue::BiasReLU: self.relu_(); return;
    case Epilogue::BiasGELU: at::gelu_(self, "none"); return;
    case Epilogue::BiasGELUTanh: at::gelu_(self, "tanh"); return;
    case Epilogue::BiasSiLU: at::silu_(self); return;
  }
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

bool sm80_on_sm90_from_env() {
  const char* value = std::getenv("OPS_CUTLASS_SM80_ON_SM90");
  return value != nullptr && std::string(value) == "1";
}

namespace {

std::atomic<bool> autotune_flag{false};
std::atomic<bool> forced_flag{false};       // forced non-empty: lets every GEMM skip the mutex
std::atomic<bool> tuning_cache_used{false};  // the tuning cache is not empty: worth a look-up

// Sets *tactic to the candidate of `plan` named `name` (tactic_name) and returns true, or returns false.
// `names`, if given, receives every candidate's name, comma-separated (for error messages).
// A candidate's launch_variants() (another swizzle or raster order) are accepted too.
bool candidate_named(const GemmPlan& plan, int sm_count, const std::string& name, Tactic* tactic,
                     std::string* names = nullptr) {
  bool found = false;
  for (const Tactic& candidate : tactic_candidates(plan, sm_count)) {
    const std::string candidate_name = tactic_name(candidate);
    for (const Tactic& variant : launch_variants(candidate)) {
      if (!found && tactic_name(variant) == name) {
        *tactic = variant;
        found = true;
      }
    }
    if (names != nullptr) *names += (names->empty() ? "" : ", ") + candidate_name;
  }
  if (names != nullptr) *names += " (an SM90 one also with /swz2, /swz4 or /swz8 and /raster_m or /raster_n)";
  return found;
}

// plan.tactic is the heuristic's choice; replace it with the forced tactic (which must be a candidate)
// or the tuning cache's choice, in that order, and say whether the launcher should autotune.
void select_tactic(GemmPlan& plan, const DeviceTarget& target, at::ScalarType dtype) {
  const std::string forced = forced_tactic();
  if (!forced.empty()) {
    std::string names;
    const bool found = candidate_named(plan, target.sm_count, forced, &plan.tactic, &names);
    TORCH_CHECK(found, "cutlass_gemm: the forced tactic '", forced, "' cannot run this GEMM (M=", plan.m,
                ", N=", plan.n, ", K=", plan.k, ", ", torch_dtype_name(dtype), ")", why_not_a_candidate(forced, plan, target),
                "; its candidates are: ", names, ". Clear it with ops.gemm.set_tactic(None).");
    plan.tactic_source = TacticSource::Forced;
    return;
  }
  const bool autotune = autotune_flag.load(std::memory_order_relaxed);
  if (!autotune && !tuning_cache_used.load(std::memory_order_relaxed)) return;
  const std::string key = tuning_key(plan, target);
  if (find_tuned(key, plan, target, &plan.tactic)) {
    plan.tactic_source = TacticSource::Tuned;
  } else if (autotune && tactic_candidates(plan, target.sm_count).size() > 1) {
    plan.autotune_key = key;
  }
}

}  // namespace

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
    apply_activation_(out, epilogue);
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
  select_tactic(plan, target, A.scalar_type());

  // The kernel's operands before padding: with swap, D^T = B^T A^T.
  const at::Tensor a = plan.swap_ab ? B.t() : A;
  const at::Tensor b = plan.swap_ab ? A.t() : B;
  const at::Tensor d = plan.swap_ab ? out.t() : out;

  at::Tensor a_buffer, b_buffer, d_buffer;
  GemmLaunchArgs args;
  args.m = plan.m;
  args.n = plan.n;
  args.k = plan.k;
  args.lda = plan.a.ld;
  args.ldb = plan.b.ld;
  args.ldd = plan.d.ld;
  if (plan.a.source == Source::Copy) {
    a_buffer = copy_operand(a, plan.a, poison);
    args.a = a_buffer.const_data_ptr();
  } else {
    args.a = a.const_data_ptr();
  }
  if (plan.b.source == Source::Copy) {
    b_buffer = copy_operand(b, plan.b, poison);
    args.b = b_buffer.const_data_ptr();
  } else {
    args.b = b.const_data_ptr();
  }
  if (plan.d.source == Source::Copy) {
    d_buffer = new_buffer(d, plan.m, plan.d.ld, poison);
    args.d = d_buffer.data_ptr();
  } else {
    args.d = d.data_ptr();
  }
  at::Tensor bias_buffer;
  if (bias.defined()) {
    // The kernel reads plan.n bias values (N, zero-padded when N was padded) from a 16-byte aligned,
    // contiguous vector: copy the user's bias only when it is not already that.
    const bool usable = plan.n == N && bias.is_contiguous() &&
                        reinterpret_cast<uintptr_t>(bias.const_data_ptr()) % 16 == 0;
    if (usable) {
      bias_buffer = bias;
    } else {
      bias_buffer = at::zeros({plan.n}, bias.options());
      bias_buffer.narrow(0, 0, N).copy_(bias);
    }
    args.bias = bias_buffer.const_data_ptr();
  }
  launch(plan, args);
  if (plan.d.source == Source::Copy) {
    d.copy_(d_buffer.narrow(1, 0, d.size(1)));
  }
  return plan;
}

void emulate_launch(const GemmPlan& plan, const GemmLaunchArgs& args, at::ScalarType dtype) {
  const auto options = at::TensorOptions().dtype(dtype).device(at::kCPU);
  auto strides = [](Layout layout, int64_t ld) {
    return layout == Layout::Row ? std::vector<int64_t>{ld, 1} : std::vector<int64_t>{1, ld};
  };
  // from_blob over exactly the memory the kernel would touch.
  const at::Tensor a = at::from_blob(const_cast<void*>(args.a), {args.m, args.k},
                                     strides(plan.a.layout, args.lda), options);
  const at::Tensor b = at::from_blob(const_cast<void*>(args.b), {args.k, args.n},
                                     strides(plan.b.layout, args.ldb), options);
  at::Tensor d = at::from_blob(args.d, {args.m, args.n}, {args.ldd, 1}, options);
  // fp32 accumulation (and epilogue) for half types, like the tensor-core kernels.
  const at::ScalarType compute = (dtype == at::kHalf || dtype == at::kBFloat16) ? at::kFloat : dtype;
  at::Tensor acc = at::mm(a.to(compute), b.to(compute));
  if (args.bias != nullptr) {
    acc.add_(at::from_blob(const_cast<void*>(args.bias), {args.n}, options).to(compute));
  }
  apply_activation_(acc, kernel_info(plan.tactic.kernel).epilogue);
  d.copy_(acc);
}

namespace {

struct TacticControls {
  std::mutex mutex;
  std::string forced;
  std::map<std::string, TuningRecord> cache;
};

TacticControls& controls() {
  static TacticControls* instance = new TacticControls();  // never destroyed: usable at exit
  return *instance;
}

}  // namespace

void set_forced_tactic(const std::string& name) {
  std::lock_guard<std::mutex> lock(controls().mutex);
  controls().forced = name;
  forced_flag.store(!name.empty());
}

std::string forced_tactic() {
  if (!forced_flag.load(std::memory_order_relaxed)) return std::string();
  std::lock_guard<std::mutex> lock(controls().mutex);
  return controls().forced;
}

void set_autotune(bool enabled) { autotune_flag.store(enabled); }

bool autotune_enabled() { return autotune_flag.load(std::memory_order_relaxed); }

std::string tuning_key(const GemmPlan& plan, const DeviceTarget& target) {
  return target.name + " sm" + std::to_string(target.cc_major) + std::to_string(target.cc_minor) + "x" +
         std::to_string(target.sm_count) + " " +
         (plan.family.empty() ? std::string("none") : family_name(plan.family.front())) +
         " m=" + std::to_string(plan.m) + " n=" + std::to_string(plan.n) + " k=" + std::to_string(plan.k) +
         " ld=" + std::to_string(plan.a.ld) + "," + std::to_string(plan.b.ld) + "," +
         std::to_string(plan.d.ld);
}

bool find_tuned(const std::string& key, const GemmPlan& plan, const DeviceTarget& target, Tactic* tactic) {
  std::string dropped;
  {
    std::lock_guard<std::mutex> lock(controls().mutex);
    const auto it = controls().cache.find(key);
    if (it == controls().cache.end()) return false;
    TuningRecord& record = it->second;
    // Resolved once; again if the family differs (an emulated target with or without the candidates).
    if (!record.resolved ||
        std::find(plan.family.begin(), plan.family.end(), record.tactic.kernel) == plan.family.end()) {
      record.resolved = candidate_named(plan, target.sm_count, record.best, &record.tactic);
    }
    if (record.resolved) {
      *tactic = record.tactic;
      return true;
    }
    dropped = record.best;
    controls().cache.erase(it);
    tuning_cache_used.store(!controls().cache.empty());
  }
  const std::string note = why_not_a_candidate(dropped, plan, target);
  TORCH_WARN("cutlass_gemm: the tuning cache chose '", dropped, "' for '", key,
             "', which is not a candidate of this GEMM in this build of ops",
             note.empty() ? std::string(" (a cache saved by another version?)") : note,
             "; dropped that entry, the GEMM runs the ", autotune_enabled() ? "autotuner's" : "heuristic's",
             " choice.");
  return false;
}

void store_tuned(std::vector<std::pair<std::string, TuningRecord>> records) {
  std::lock_guard<std::mutex> lock(controls().mutex);  // one lock: a reader sees all of a loaded file or none
  for (auto& [key, record] : records) controls().cache[key] = std::move(record);
  tuning_cache_used.store(!controls().cache.empty());
}

std::string tuning_cache_json() {
  std::lock_guard<std::mutex> lock(controls().mutex);
  std::string out = "[";
  bool first = true;
  for (const auto& [key, record] : controls().cache) {
    JsonObject timings;
    for (const auto& [name, ms] : record.timings_ms) {
      if (ms < 0) {
        timings.null(name);  // could not run (refused by CUTLASS, or out of memory)
      } else {
        timings.add(name, ms);
      }
    }
    JsonObject entry;
    entry.add("key", key).add("best", record.best).add("timings_ms", timings);
    out += (first ? "" : ",") + entry.str();
    first = false;
  }
  return out + "]";
}

void clear_tuning_cache() {
  std::lock_guard<std::mutex> lock(controls().mutex);
  controls().cache.clear();
  tuning_cache_used.store(false);
}

}  // namespace ops::cutlass_gemm
