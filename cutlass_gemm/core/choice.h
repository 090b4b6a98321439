// Which kernel a GEMM of any kind runs, among its candidates (computed once per GEMM by its family): the
// forced tactic, else the tuning cache's choice, else the family's heuristic; and the process-wide controls
// behind that choice (thread-safe; set through ops.gemm's Python API). The autotuner that fills the cache on
// the device is cuda/services.h's autotune().
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "device_target.h"
#include "gemm_kind.h"

namespace ops::cutlass_gemm {

// A GEMM's candidates as the choice sees them. `names`: what the autotuner times and plan() lists;
// `heuristic`: the family's pick among them. The hooks, all optional, let a family accept more than names:
// `find` maps a forced or cached name to an index (>= names().size(): one the family holds beside them,
// e.g. the dense kernels' launch variants; nullopt: none), `why_not` adds to the error about a name that is
// not a candidate, `listing` spells the candidates in that error (default: the names as JSON).
struct Candidates {
  std::function<const std::vector<std::string>&()> names;  // read only when forced, tuned or autotuned
  size_t heuristic = 0;
  std::function<std::optional<size_t>(const std::string&)> find;
  std::function<std::string(const std::string&)> why_not;
  std::function<std::string()> listing;
};

struct Choice {
  size_t index = 0;
  TacticSource source = TacticSource::Heuristic;
  bool autotune = false;  // autotuning on, nothing forced or cached, several candidates: the launcher times them
};

// The choice for a GEMM of `op` whose problem reads `problem` in errors ("call", or "GEMM (M=..., N=...)");
// key(): its tuning-cache key (tuning_key below), built only when the cache or the autotuner is in use. A
// forced tactic that is no candidate raises; a cached one that is none is dropped with a warning.
Choice choose(const char* op, const std::string& problem, const std::function<std::string()>& key,
              const Candidates& candidates);

// The one tuning-cache key schema: the device model, compute capability and SM count, then `problem` (the
// kind's kernels and extents, as its family spells them).
std::string tuning_key(const DeviceTarget& target, const std::string& problem);

// A tactic name that every CUTLASS GEMM must run with, or "" (the default) for the normal choice. For
// benchmarks (`benchmarks.gemm --candidates`) and tests.
void set_forced_tactic(const std::string& name);
std::string forced_tactic();

// Autotuning (off by default): on a GEMM shape without a cached choice, time every candidate on the device
// (synchronizing), keep the fastest for that shape and use it from then on. Never during CUDA graph capture.
void set_autotune(bool enabled);
bool autotune_enabled();

// Whether a build's candidate-only kernels (OPS_CANDIDATE_KERNELS=1) take calls (on by default); off, every op
// chooses as the default build does: its torch and ATen paths can run in a candidate build.
void set_candidate_kernels(bool enabled);
bool candidate_kernels_enabled();

// The tuning cache: one choice per key, filled by the autotuner or loaded (ops.gemm.load_tuning_cache). A
// cached choice is used whenever present, with autotuning on or off; set_tactic takes precedence.
struct TuningRecord {
  std::string best;
  std::vector<std::pair<std::string, double>> timings_ms;  // candidate name -> median ms (failed: < 0)
};
// Caches names[best] under `key` with each candidate's median ms (< 0: it could not run).
void store_tuned(const std::string& key, const std::vector<std::string>& names, const std::vector<double>& ms,
                 size_t best);
// Adds or replaces the record of each key (a loaded file's entries), all under one lock.
void store_tuned(std::vector<std::pair<std::string, TuningRecord>> records);
// [{"key", "best", "timings_ms": {name: ms}}...] and clearing, for ops.gemm's API.
std::string tuning_cache_json();
void clear_tuning_cache();

std::string json_names(const std::vector<std::string>& names);  // a JSON array, for plan() and errors
const char* tactic_source_name(TacticSource source);            // "heuristic", "forced", "tuned"

}  // namespace ops::cutlass_gemm
