#include "tactic_select.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>

#include <c10/util/Exception.h>

#include "../csrc/json.h"
#include "plan_json.h"
#include "tactic.h"

namespace ops::cutlass_gemm {
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

struct TacticControls {
  std::mutex mutex;
  std::string forced;
  std::map<std::string, TuningRecord> cache;
};

TacticControls& controls() {
  static TacticControls* instance = new TacticControls();  // never destroyed: usable at exit
  return *instance;
}

// The device part of a tuning key: model, compute capability and SM count.
std::string device_key(const DeviceTarget& target) {
  return target.name + " sm" + std::to_string(target.cc_major) + std::to_string(target.cc_minor) + "x" +
         std::to_string(target.sm_count);
}

}  // namespace

void select_tactic(GemmPlan& plan, const DeviceTarget& target, const char* op, const std::string& dtype) {
  const std::string forced = forced_tactic();
  if (!forced.empty()) {
    std::string names;
    const bool found = candidate_named(plan, target.sm_count, forced, &plan.tactic, &names);
    TORCH_CHECK(found, op, ": the forced tactic '", forced, "' cannot run this GEMM (M=", plan.m,
                ", N=", plan.n, ", K=", plan.k, ", ", dtype, ")", why_not_a_candidate(forced, plan, target),
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

NamedChoice choose_named(const char* op, const std::function<std::string()>& key_of,
                         const std::vector<std::string>& candidates, size_t heuristic) {
  NamedChoice choice;
  choice.index = heuristic;
  const std::string forced = forced_tactic();
  if (!forced.empty()) {
    const auto it = std::find(candidates.begin(), candidates.end(), forced);
    TORCH_CHECK(it != candidates.end(), op, ": the forced tactic '", forced,
                "' cannot run this call; its candidates are: ", json_names(candidates),
                ". Clear it with ops.gemm.set_tactic(None).");
    choice.index = static_cast<size_t>(it - candidates.begin());
    choice.source = TacticSource::Forced;
    return choice;
  }
  const bool autotune = autotune_flag.load(std::memory_order_relaxed);
  if (!autotune && !tuning_cache_used.load(std::memory_order_relaxed)) return choice;
  const std::string key = key_of();
  std::string dropped;
  {
    std::lock_guard<std::mutex> lock(controls().mutex);
    const auto it = controls().cache.find(key);
    if (it != controls().cache.end()) {
      const auto named = std::find(candidates.begin(), candidates.end(), it->second.best);
      if (named != candidates.end()) {
        choice.index = static_cast<size_t>(named - candidates.begin());
        choice.source = TacticSource::Tuned;
        return choice;
      }
      dropped = it->second.best;
      controls().cache.erase(it);
      tuning_cache_used.store(!controls().cache.empty());
    }
  }
  if (!dropped.empty()) {
    TORCH_WARN(op, ": the tuning cache chose '", dropped, "' for '", key, "', which is not one of its candidates ",
               json_names(candidates), " in this build of ops (a cache saved by another version?); dropped that ",
               "entry, the call runs the ", autotune ? "autotuner's" : "heuristic's", " choice.");
  }
  choice.autotune = autotune && candidates.size() > 1;
  return choice;
}

std::string named_tuning_key(const DeviceTarget& target, const std::string& problem) {
  return device_key(target) + " " + problem;
}

void store_tuned_named(const std::string& key, const std::vector<std::string>& names, const std::vector<double>& ms,
                       size_t best) {
  TuningRecord record;
  record.best = names.at(best);
  for (size_t i = 0; i < names.size() && i < ms.size(); ++i) record.timings_ms.emplace_back(names[i], ms[i]);
  store_tuned({{key, std::move(record)}});
}

const char* tactic_source_name(TacticSource source) {
  return source == TacticSource::Forced ? "forced" : source == TacticSource::Tuned ? "tuned" : "heuristic";
}

std::string json_names(const std::vector<std::string>& names) {
  std::string out = "[";
  for (const std::string& name : names) out += (out.size() > 1 ? "," : "") + JsonObject::quote(name);
  return out + "]";
}

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
  return device_key(target) + " " +
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
