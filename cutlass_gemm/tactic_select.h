// Which tactic a planned GEMM runs: the heuristic's (tactic.h), a forced one, or the tuning cache's;
// and the process-wide controls behind that choice (thread-safe; set through ops.gemm's Python API).
// Shared by every GEMM of the family.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "device_target.h"
#include "plan.h"

namespace ops::cutlass_gemm {

// plan.tactic is the heuristic's choice; replaces it with the forced tactic (which must be a candidate:
// else an error naming `op`, the problem and the candidates) or the tuning cache's choice, in that
// order, and sets plan.autotune_key when the launcher should autotune. `dtype`: for messages.
void select_tactic(GemmPlan& plan, const DeviceTarget& target, const char* op, const std::string& dtype);

// A tactic name (tactic.h, tactic_name) that every CUTLASS GEMM must run with, or "" (the default) for
// the normal choice. A GEMM whose candidates do not include it raises, naming the candidates. For
// benchmarks (`benchmarks.gemm --candidates`) and tests.
void set_forced_tactic(const std::string& name);
std::string forced_tactic();

// The GEMMs whose candidates are a short list of kernel names (scaled_gemm's and grouped_gemm's SM90 kernels)
// choose as cutlass_gemm does: the forced tactic (one not among them raises, naming `op` and the candidates),
// else the tuning cache's choice under key() (a record naming none of them is dropped with a warning), else
// `heuristic`. plan() and the launch make the same choice; `autotune`: autotuning is on, nothing is forced
// or cached, and there are several candidates (the launcher times them: autotune_named, gemm_cuda.h).
struct NamedChoice {
  size_t index = 0;
  TacticSource source = TacticSource::Heuristic;
  bool autotune = false;
};
NamedChoice choose_named(const char* op, const std::function<std::string()>& key,
                         const std::vector<std::string>& candidates, size_t heuristic);
// Their cache key: the device model and SM count, as tuning_key's, then `problem` (the op, its kernels and
// extents, as the caller spells them).
std::string named_tuning_key(const DeviceTarget& target, const std::string& problem);
// Caches names[best] for `key` with each candidate's median ms (< 0: it could not run).
void store_tuned_named(const std::string& key, const std::vector<std::string>& names, const std::vector<double>& ms,
                       size_t best);
// The names as a JSON array, for plan().
std::string json_names(const std::vector<std::string>& names);
const char* tactic_source_name(TacticSource source);  // "heuristic", "forced", "tuned"

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
