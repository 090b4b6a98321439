#include "tactic.h"

#include <algorithm>

namespace ops::cutlass_gemm {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// K elements per mainloop iteration of the SM90 configs (128 bytes of each operand row).
int64_t tile_k(DType dtype) { return config_shape(TileConfig::Coop128x128, dtype, Math::Standard).tile_k; }

// The family member with `config`, or kCount.
KernelId find_config(const GemmPlan& plan, TileConfig config) {
  for (KernelId id : plan.family) {
    if (kernel_info(id).config == config) return id;
  }
  return KernelId::kCount;
}

// CUTLASS's stream-K scheduler gives a tile stream-K work only when its K loop has more than this
// many iterations (min_iters_per_sk_unit_ in cutlass/gemm/kernel/tile_scheduler_params.h); below
// that, "stream-K" runs data-parallel.
constexpr int64_t kMinStreamKIterations = 8;

// The largest M (the plan's rows) for which the swap-AB kernels are candidates: two of their 32-wide
// tile columns.
constexpr int64_t kSwapAbMaxM = 64;

// The swizzle sizes of the SM90 tile schedulers (max_swizzle_size: 1, 2, 4 or 8).
constexpr int kSwizzles[] = {1, 2, 4, 8};

// Persistent kernels get every swizzle and raster order as candidates from this many waves of tiles.
constexpr int64_t kLaunchVariantWaves = 4;

// The heuristic's stream-K bounds, priors from CUTLASS's stream-K mechanics (a memset of the workspace
// per call, deterministic peer-after-peer reduction of 64 KiB fp32 partial tiles) for the GPU sweep to
// refit: no K split for a weight (N x K) under kSplitMinBytes, at most kMaxPeers CTAs per output tile.
constexpr int64_t kSplitMinBytes = 4 << 20;
constexpr int64_t kMaxPeers = 4;

// Fraction of the SMs a problem of `tiles` keeps busy over its waves.
double wave_efficiency(int64_t tiles, int64_t sms) {
  return tiles <= 0 ? 0.0 : static_cast<double>(tiles) / static_cast<double>(ceil_div(tiles, sms) * sms);
}

// Split-K slice counts worth trying: each slice keeps at least 4 mainloop iterations.
std::vector<int> split_counts(int64_t k_iterations) {
  std::vector<int> splits;
  for (int s : {2, 4, 8}) {
    if (k_iterations >= 4 * s) splits.push_back(s);
  }
  return splits;
}

}  // namespace

bool has_stream_k_scheduler(TileConfig config) {
  return config_shape(config, DType::Half, Math::Standard).stream_k;
}

const char* config_name(TileConfig config) {
  switch (config) {
    case TileConfig::Sm80: return "sm80";
    case TileConfig::Coop128x128: return "coop_128x128_c2x1";
    case TileConfig::Coop128x256: return "coop_128x256_c2x1";
    case TileConfig::Ping64x128: return "pingpong_64x128_c1x1";
    case TileConfig::StreamK128x128: return "streamk_128x128_c1x1";
    case TileConfig::Ping128x128: return "pingpong_128x128_c2x1";
    case TileConfig::Coop128x256C1x2: return "coop_128x256_c1x2";
    case TileConfig::Coop256x128: return "coop_256x128_c2x1";
    case TileConfig::Ping64x128C2x1: return "pingpong_64x128_c2x1";
    case TileConfig::SwapPing64x16: return "swap_ab_pingpong_64x16_c1x1";
    case TileConfig::SwapPing64x32: return "swap_ab_pingpong_64x32_c1x1";
    case TileConfig::SwapStreamK128x32: return "swap_ab_streamk_128x32_c1x1";
    case TileConfig::SimtGemv: return "simt_gemv_m16";
  }
  return "?";
}

const char* raster_name(Raster raster) {
  switch (raster) {
    case Raster::Heuristic: return "heuristic";
    case Raster::AlongM: return "along_m";
    case Raster::AlongN: return "along_n";
  }
  return "?";
}

const char* decomposition_name(Decomposition decomposition) {
  switch (decomposition) {
    case Decomposition::DataParallel: return "data_parallel";
    case Decomposition::SplitK: return "split_k";
    case Decomposition::StreamK: return "stream_k";
  }
  return "?";
}

TileMN tile_of(TileConfig config) {
  // The 16-bit tiles (tile M and N do not depend on the dtype but for SM80's fp32 and fp64).
  const ConfigShape shape = config_shape(config, DType::Half, Math::Standard);
  if (shape.swap_ab) return {shape.tile_n, shape.tile_m};  // the kernel's tile of D^T
  return {shape.tile_m, shape.tile_n};
}

int64_t tile_count(int64_t m, int64_t n, TileMN tile) {
  return ceil_div(m, tile.m) * ceil_div(n, tile.n);
}

std::string tactic_name(const Tactic& tactic) {
  if (tactic.kernel == KernelId::kCount) return "none";
  std::string name = kernel_name(tactic.kernel);
  if (has_stream_k_scheduler(kernel_info(tactic.kernel).config)) {
    switch (tactic.decomposition) {
      case Decomposition::DataParallel: name += "/dp"; break;
      case Decomposition::StreamK: name += "/streamk"; break;
      case Decomposition::SplitK: name += "/splitk" + std::to_string(tactic.splits); break;
    }
  }
  if (tactic.swizzle != 1) name += "/swz" + std::to_string(tactic.swizzle);
  if (tactic.raster == Raster::AlongM) name += "/raster_m";
  if (tactic.raster == Raster::AlongN) name += "/raster_n";
  return name;
}

bool takes_launch_variants(KernelId kernel) {
  const KernelInfo& info = kernel_info(kernel);
  return info.sm == 90 && info.config != TileConfig::SimtGemv;
}

std::vector<Tactic> launch_variants(const Tactic& tactic) {
  std::vector<Tactic> out;
  if (tactic.kernel == KernelId::kCount || !takes_launch_variants(tactic.kernel)) return {tactic};
  for (int swizzle : kSwizzles) {
    for (Raster raster : {Raster::Heuristic, Raster::AlongM, Raster::AlongN}) {
      Tactic t = tactic;
      t.swizzle = swizzle;
      t.raster = raster;
      out.push_back(t);
    }
  }
  return out;
}

std::vector<Tactic> tactic_candidates(const GemmPlan& plan, int sm_count) {
  std::vector<Tactic> out;
  if (plan.family.empty()) return out;
  const int64_t k_iterations = ceil_div(plan.k, tile_k(kernel_info(plan.family.front()).dtype));
  for (KernelId id : plan.family) {
    const KernelInfo& info = kernel_info(id);
    const ConfigShape shape = config_shape(info);
    // Swap-AB serves small M only (M is its narrow tile side): elsewhere it cannot win and would only
    // lengthen autotuning.
    if (shape.swap_ab && plan.m > kSwapAbMaxM) continue;
    // The SIMT GEMV kernel takes M <= 16 only (simt_gemv.cuh), and has no scheduler settings.
    if (info.config == TileConfig::SimtGemv) {
      if (plan.m <= kSimtGemvMaxRows) out.push_back(Tactic{id});
      continue;
    }
    if (info.sm != 90) {  // CUTLASS 2.x kernels: no run-time scheduler settings
      out.push_back(Tactic{id});
      continue;
    }
    const int64_t tiles = tile_count(plan.m, plan.n, tile_of(info.config));
    if (shape.stream_k) {
      out.push_back(Tactic{id, Decomposition::DataParallel});
      // Stream-K differs from data-parallel only with a partial last wave and a long enough K loop.
      if (k_iterations > kMinStreamKIterations && tiles % std::max(sm_count, 1) != 0) {
        out.push_back(Tactic{id, Decomposition::StreamK});
      }
      // Split-K only for problems of few tiles: its workspace holds a partial fp32 tile per split
      // (64 KiB per 128x128 tile and slice), far too much for problems many waves deep.
      if (tiles < 2 * static_cast<int64_t>(sm_count)) {
        for (int s : split_counts(k_iterations)) out.push_back(Tactic{id, Decomposition::SplitK, s});
      }
      continue;
    }
    // Persistent data-parallel kernels: the tile order matters (L2 reuse) once there are several waves
    // of tiles; then every swizzle and raster order is a candidate.
    if (tiles >= kLaunchVariantWaves * static_cast<int64_t>(sm_count)) {
      for (const Tactic& t : launch_variants(Tactic{id})) out.push_back(t);
    } else {
      out.push_back(Tactic{id});
    }
  }
  return out;
}

Tactic choose_tactic(const GemmPlan& plan, int sm_count) {
  if (plan.family.empty()) return Tactic{};
  const KernelId general = find_config(plan, TileConfig::Coop128x128);
  // Only one configuration (SM80 kernels, tf32, fp64, the column-major layouts): nothing to choose.
  if (plan.family.size() == 1 || general == KernelId::kCount) return Tactic{plan.family.front()};

  const int64_t sms = std::max(sm_count, 1);
  const DType dtype = kernel_info(general).dtype;
  const int64_t k_iterations = ceil_div(plan.k, tile_k(dtype));
  const int64_t tiles_128 = tile_count(plan.m, plan.n, {128, 128});

  // Large problems: 128x256 tiles halve the loads per FLOP. Take them when they fill nearly a wave and
  // their last wave is as full as 128x128's (q_proj at T = 1024: 128 tiles in 0.97 wave against 256 in
  // 1.94, both 97 % efficient; gate_up at T = 1024: 85 % against 97 %, so 128x128).
  const KernelId wide = find_config(plan, TileConfig::Coop128x256);
  if (wide != KernelId::kCount && plan.m >= 256 && plan.n >= 256) {
    const int64_t tiles_256 = tile_count(plan.m, plan.n, tile_of(TileConfig::Coop128x256));
    if (tiles_256 * 10 >= sms * 9 && wave_efficiency(tiles_256, sms) + 0.02 >= wave_efficiency(tiles_128, sms)) {
      return Tactic{wide};
    }
  }
  const KernelId streamk = find_config(plan, TileConfig::StreamK128x128);
  const KernelId ping = find_config(plan, TileConfig::Ping64x128);
  // M within one tile row: the general kernel's 2x1 cluster pairs each tile with an empty one (CUTLASS
  // rounds the M tile count up to the cluster), idling half its CTAs; the stream-K kernel has a 1x1
  // cluster.
  const bool one_tile_row = plan.m <= 128 && streamk != KernelId::kCount;
  // At least one wave of 128x128 tiles: the general kernel, data-parallel.
  if (tiles_128 >= sms) {
    return one_tile_row ? Tactic{streamk, Decomposition::DataParallel} : Tactic{general};
  }

  // Under one wave: SMs would idle. A small problem runs as one plain kernel: a K split's fixed costs
  // (the stream-K workspace is cleared with a memset every call; partial tiles are reduced peer after
  // peer) are the size of its whole memory traffic (MiniLM's 384 x 1536 weight: 1.2 MB).
  const int64_t weight_bytes = plan.n * plan.k * element_size(dtype);
  if (streamk != KernelId::kCount && k_iterations > kMinStreamKIterations && weight_bytes >= kSplitMinBytes) {
    // A long K: split it across CTAs so that every SM streams. Stream-K gives each of its units (at most
    // one per SM, at least 8 K iterations each: CUTLASS's get_num_sk_units) a share of every tile's K;
    // a tile split over more peers than kMaxPeers waits on a longer reduction chain than split-K into
    // kMaxPeers (kv_proj at T <= 128: 8 tiles, 64 units, 8 peers per tile).
    const int64_t units = std::min(sms, tiles_128 * k_iterations / kMinStreamKIterations);
    if (ceil_div(units, tiles_128) <= kMaxPeers) return Tactic{streamk, Decomposition::StreamK};
    int splits = 1;
    for (int s : split_counts(k_iterations)) {
      if (s <= kMaxPeers) splits = s;
    }
    if (splits > 1) return Tactic{streamk, Decomposition::SplitK, splits};
    return Tactic{streamk, Decomposition::StreamK};
  }
  // A short K or a small problem: smaller tiles instead (twice the CTAs), ping-pong overlapping each
  // tile's epilogue.
  if (ping != KernelId::kCount) return Tactic{ping};
  // No ping-pong kernel (ops.linear).
  if (one_tile_row) return Tactic{streamk, Decomposition::DataParallel};
  return Tactic{general};
}

const std::vector<Tactic>& candidates_of(const GemmPlan& plan, int sm_count) {
  if (!plan.candidates_known) {
    plan.candidates = tactic_candidates(plan, sm_count);
    plan.candidates_known = true;
  }
  return plan.candidates;
}

std::optional<Tactic> tactic_named(const std::vector<Tactic>& candidates, const std::string& name) {
  const std::string kernel = name.substr(0, name.find('/'));
  for (const Tactic& candidate : candidates) {
    if (kernel_name(candidate.kernel) != kernel) continue;  // a static string: no name built for the others
    for (const Tactic& variant : launch_variants(candidate)) {
      if (tactic_name(variant) == name) return variant;
    }
  }
  return std::nullopt;
}

std::string tuning_problem(const GemmPlan& plan) {
  return (plan.family.empty() ? std::string("none") : family_name(plan.family.front())) +
         " m=" + std::to_string(plan.m) + " n=" + std::to_string(plan.n) + " k=" + std::to_string(plan.k) +
         " ld=" + std::to_string(plan.a.ld) + "," + std::to_string(plan.b.ld) + "," + std::to_string(plan.d.ld);
}

}  // namespace ops::cutlass_gemm
