#include "choice.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>

#include <c10/util/Exception.h>

#include "../../csrc/json.h"

namespace ops::cutlass_gemm {
namespace {

std::atomic<bool> autotune_flag{false};
std::atomic<bool> candidate_kernels_flag{true};
std::atomic<bool> forced_flag{false};       // forced non-empty: lets every GEMM skip the mutex
std::atomic<bool> tuning_cache_used{false};  // the tuning cache is not empty: worth a look-up

struct TacticControls {
  std::mutex mutex;
  std::string forced;
  std::map<std::string, TuningRecord> cache;
};

TacticControls& controls() {
  static TacticControls* instance = new TacticControls();  // never destroyed: usable at exit
  return *instance;
}

std::optional<size_t> find_name(const Candidates& c, const std::string& name) {
  if (c.find) return c.find(name);
  const std::vector<std::string>& names = c.names();
  const auto it = std::find(names.begin(), names.end(), name);
  if (it == names.end()) return std::nullopt;
  return static_cast<size_t>(it - names.begin());
}

}  // namespace

Choice choose(const char* op, const std::string& problem, const std::function<std::string()>& key_of,
              const Candidates& candidates) {
  Choice choice;
  choice.index = candidates.heuristic;
  const std::string forced = forced_tactic();
  if (!forced.empty()) {
    const std::optional<size_t> index = find_name(candidates, forced);
    TORCH_CHECK(index.has_value(), op, ": the forced tactic '", forced, "' cannot run this ", problem,
                candidates.why_not ? candidates.why_not(forced) : std::string(), "; its candidates are: ",
                candidates.listing ? candidates.listing() : json_names(candidates.names()),
                ". Clear it with ops.gemm.set_tactic(None).");
    choice.index = *index;
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
      const std::optional<size_t> index = find_name(candidates, it->second.best);
      if (index.has_value()) {
        choice.index = *index;
        choice.source = TacticSource::Tuned;
        return choice;
      }
      dropped = it->second.best;
      controls().cache.erase(it);
      tuning_cache_used.store(!controls().cache.empty());
    }
  }
  if (!dropped.empty()) {
    const std::string note = candidates.why_not ? candidates.why_not(dropped) : std::string();
    TORCH_WARN(op, ": the tuning cache chose '", dropped, "' for '", key, "', which is not a candidate of this ",
               problem.substr(0, problem.find(' ')), " in this build of ops",
               note.empty() ? std::string(" (a cache saved by another version?)") : note, "; dropped that entry, ",
               "it runs the ", autotune ? "autotuner's" : "heuristic's", " choice.");
  }
  choice.autotune = autotune && candidates.names().size() > 1;
  return choice;
}

std::string tuning_key(const DeviceTarget& target, const std::string& problem) {
  return target.name + " sm" + std::to_string(target.cc_major) + std::to_string(target.cc_minor) + "x" +
         std::to_string(target.sm_count) + " " + problem;
}

void store_tuned(const std::string& key, const std::vector<std::string>& names, const std::vector<double>& ms,
                 size_t best) {
  TuningRecord record;
  record.best = names.at(best);
  for (size_t i = 0; i < names.size() && i < ms.size(); ++i) record.timings_ms.emplace_back(names[i], ms[i]);
  store_tuned({{key, std::move(record)}});
}

void store_tuned(std::vector<std::pair<std::string, TuningRecord>> records) {
  std::lock_guard<std::mutex> lock(controls().mutex);  // one lock: a reader sees all of a loaded file or none
  for (auto& [key, record] : records) controls().cache[key] = std::move(record);
  tuning_cache_used.store(!controls().cache.empty());
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

void set_candidate_kernels(bool enabled) { candidate_kernels_flag.store(enabled); }

bool candidate_kernels_enabled() { return candidate_kernels_flag.load(std::memory_order_relaxed); }

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
