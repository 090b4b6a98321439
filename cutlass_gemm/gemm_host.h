// The device-generic half of the CUTLASS GEMM wrapper: turns at::Tensors into a planned launch
// (plan.h), materialises the copies and temporaries the plan asks for, calls a launch function, and
// copies a temporary output back. The CUDA wrapper passes a launch function that runs the CUTLASS
// kernel; tests pass one that replays the launch descriptor on CPU tensors (see emulate_launch), so
// this whole path is checked without a GPU.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "plan.h"

namespace ops::cutlass_gemm {

struct DeviceTarget {
  int cc_major = 0, cc_minor = 0;
  std::vector<BuiltArch> built;
  bool allow_tf32 = false;
  int sm_count = 132;  // multiprocessors (the tactic heuristic's wave size)
  // The device model (cudaDeviceProp::name; "emulated" for the CPU emulation): tuning-cache keys name
  // the model, not the ordinal, so a saved cache applies to every GPU of that model.
  std::string name = "emulated";
  // GemmRequest::sm80_on_sm90 (the environment variable OPS_CUTLASS_SM80_ON_SM90=1: sm80_on_sm90_from_env).
  bool sm80_on_sm90 = false;
  // GemmRequest::candidates_built: OPS_WITH_CANDIDATE_KERNELS for the device; chosen by the emulation.
  bool candidates_built = false;
};

// Whether the environment asks for the SM80 kernels on Hopper (OPS_CUTLASS_SM80_ON_SM90=1).
bool sm80_on_sm90_from_env();

using LaunchFn = std::function<void(const GemmPlan&, const GemmLaunchArgs&)>;

// Computes out = A @ B through `launch`. A (M, K), B (K, N), out (M, N) already checked
// (csrc/checks.h). M, N or K = 0 are handled here without a launch. `poison` fills temporaries with
// NaN first (tests: an element the kernel should write but does not, or a pad that is not zeroed,
// shows up as NaN). Returns the plan (kernel = kCount when nothing was launched).
//
// With a Bias<Act> epilogue (ops.linear): out = act(A @ B + bias), bias (N,) optional (undefined:
// none), fused into the kernel's epilogue.
GemmPlan gemm_into(const at::Tensor& A, const at::Tensor& B, const at::Tensor& out,
                   const DeviceTarget& target, const LaunchFn& launch, bool poison = false,
                   Epilogue epilogue = Epilogue::Plain, const at::Tensor& bias = at::Tensor());

// The plan (with the heuristic's tactic; no forced tactic, no autotuning) gemm_into would make for
// out = A @ B with M, N, K > 0 (out undefined: a new row-major output; nothing is allocated). Raises
// the planner's error when no kernel can run.
GemmPlan plan_for(const at::Tensor& A, const at::Tensor& B, const at::Tensor& out,
                  const DeviceTarget& target, Epilogue epilogue = Epilogue::Plain);

// A plan as JSON (kernel, tactic and where it came from, candidates, the candidate-only kernels of the
// family this build leaves out, operands, tuning-cache key), for the introspection ops.
std::string plan_json(const GemmPlan& plan, const DeviceTarget& target);

// act(x) for a Bias<Act> epilogue, with ATen ops (in place); identity for Plain and BiasIdentity.
void apply_activation_(const at::Tensor& x, Epilogue epilogue);

// A LaunchFn that computes the described GEMM with at::mm on CPU memory, reading and writing exactly
// the memory a CUTLASS kernel would (from the raw pointers, leading dimensions and layouts).
void emulate_launch(const GemmPlan& plan, const GemmLaunchArgs& args, at::ScalarType dtype);

// Parses ops.linear's activation argument ("none", "relu", "gelu", "gelu_tanh", "silu"); throws a
// clear error naming `op` otherwise.
Epilogue epilogue_for_activation(const char* op, c10::string_view activation);

DType to_dtype(at::ScalarType type);

// ---- Tactic selection controls (process-wide, thread-safe; set through ops.gemm's Python API) ----

// A tactic name (tactic.h, tactic_name) that every CUTLASS GEMM must run with, or "" (the default) for
// the normal choice. A GEMM whose candidates do not include it raises, naming the candidates. For
// benchmarks (`benchmarks.gemm --candidates`) and tests.
void set_forced_tactic(const std::string& name);
std::string forced_tactic();

// Autotuning (off by default): on a GEMM shape without a cached choice, time every candidate tactic on
// the device (synchronizing), keep the fastest for that shape and use it from then on. Never during
// CUDA graph capture (the heuristic's choice runs, nothing is cached).
void set_autotune(bool enabled);
bool autotune_enabled();

// The tuning cache: one tactic per GEMM shape and device model, filled by the autotuner or loaded
// (ops.gemm.load_tuning_cache). A cached choice is used whenever present, with autotuning on or off;
// set_tactic takes precedence.
struct TuningRecord {
  std::string best;  // tactic name (tactic_name)
  std::vector<std::pair<std::string, double>> timings_ms;  // tactic name -> median ms (failed: < 0)
  // `best` resolved against the GEMM's candidates, on first use (a loaded record names a tactic only).
  bool resolved = false;
  Tactic tactic;
};
// The cache key of a plan on a device model: the model and its SM count, the kernel family (dtype,
// math, epilogue, layouts), M, N, K and the leading dimensions.
std::string tuning_key(const GemmPlan& plan, const DeviceTarget& target);
// The cached tactic for `key`, resolved against plan's candidates. A record whose tactic is not among
// them (a cache written by another build) is dropped with a warning and false is returned.
bool find_tuned(const std::string& key, const GemmPlan& plan, const DeviceTarget& target, Tactic* tactic);
// Adds or replaces the record of each key (the autotuner's result, or the entries of a loaded file),
// all under one lock.
void store_tuned(std::vector<std::pair<std::string, TuningRecord>> records);
// [{"key", "best", "timings_ms": {name: ms}}...] and clearing, for ops.gemm's API.
std::string tuning_cache_json();
void clear_tuning_cache();

}  // namespace ops::cutlass_gemm
