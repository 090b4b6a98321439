// Choosing how a planned GEMM runs: which configuration (tile, cluster, schedule; kernel_list.h) and
// which scheduler settings (data-parallel, split-K, stream-K; swizzle). Plain host C++, unit-tested on
// CPU through the planner (tests/test_gemm_tactics.py).
//
// Two ways to choose:
//   * choose_tactic: a shape heuristic (the default). It reasons in waves: an output tile is one unit
//     of work for one SM, so a problem with fewer 128x128 tiles than SMs leaves SMs idle unless the K
//     loop is split (split-K / stream-K) or the tiles are made smaller; a problem with many tiles gains
//     from a larger tile (more arithmetic per byte loaded). Its thresholds are priors written before
//     any Hopper measurement of this library; `python -m benchmarks.gemm --candidates` times every
//     candidate per shape on a GPU, and those tables are what the thresholds should be fitted to.
//   * autotuning (opt-in, gemm_cuda.cpp): time every tactic_candidates() entry once per shape on the
//     device and cache the fastest.
//
// Small M (decode) is memory-bound: what matters is that every SM streams its share of B. The usual
// recipe swaps A and B (C^T = B^T A^T) so that N fills 64-row ping-pong tiles; here the stream-K
// kernel is used instead, unswapped: its K split keeps all SMs streaming even when N / 128 is below the
// SM count (swapped ping-pong tiles give N / 64 CTAs: 64 for N = 4096), and the wasted MMA rows of a
// 128-row tile at M = 1 still cost less than the B tile's load (per k-block and SM: 0.28 us of MMA vs
// 0.45 us to load 16 KB at 1/132 of 4.8 TB/s). The swapped variant is built too, as a candidate to
// measure against it (SwapStreamK128x32: D^T = B^T A^T on 128x32 tiles, column-major D, the same
// stream-K scheduler; the wasted MMA rows drop from 127/128 to 31/32 at M = 1, and the smaller B'
// tile leaves shared memory for 10 pipeline stages); `benchmarks.gemm --candidates` decides, and
// choose_tactic takes it only once measurements say so.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "plan.h"

namespace ops::cutlass_gemm {

// The output tile (rows x cols of D) of a configuration.
struct TileMN {
  int m = 128, n = 128;
};
TileMN tile_of(TileConfig config);

// Output tiles of an m x n problem under `tile`.
int64_t tile_count(int64_t m, int64_t n, TileMN tile);

// The heuristic's choice among plan.family for plan.m x plan.n x plan.k on `sm_count` SMs. Always one
// of tactic_candidates(plan, sm_count).
Tactic choose_tactic(const GemmPlan& plan, int sm_count);

// Every tactic worth timing for this plan: each kernel of plan.family with the scheduler settings its
// config supports (stream-K kernels: data-parallel; stream-K where the last wave is partial and the K
// loop has more than 8 iterations; split-K into 2, 4, 8 slices of at least 4 iterations, for problems
// under two waves; persistent kernels: every launch_variants() entry for problems of four waves or
// more, else the default swizzle and raster; the swap-AB kernels only for M <= 64; the SIMT GEMV kernels
// only for M <= 16). The heuristic's choice
// is always among them.
std::vector<Tactic> tactic_candidates(const GemmPlan& plan, int sm_count);

// tactic_candidates(plan, sm_count), computed on the first call for this plan and kept in it (GemmPlan::candidates):
// the choice, the autotuner and plan() read the one list.
const std::vector<Tactic>& candidates_of(const GemmPlan& plan, int sm_count);

// The candidate of `candidates` named `name` (tactic_name), or one of its launch_variants(): its tactic.
std::optional<Tactic> tactic_named(const std::vector<Tactic>& candidates, const std::string& name);

// The problem part of a dense GEMM's tuning-cache key (choice.h, tuning_key): its kernel family (dtype, math,
// epilogue, layouts), M, N, K and the leading dimensions.
std::string tuning_problem(const GemmPlan& plan);

// A stable, readable name: the kernel's name, then "/dp", "/streamk" or "/splitk<n>" for stream-K
// kernels, "/swz<n>" for a swizzle other than 1 and "/raster_m" or "/raster_n" for a raster order other
// than CUTLASS's heuristic, e.g. "sm90_bf16_..._stream_k_warpspecialized_cooperative/splitk4" or
// "sm90_bf16_128x256x64_2x1x1_tnt_align8_warpspecialized_cooperative/swz8/raster_m".
std::string tactic_name(const Tactic& tactic);

// Whether a kernel takes a swizzle and a raster order (every CUTLASS SM90 kernel).
bool takes_launch_variants(KernelId kernel);

// The tactic with every swizzle (1, 2, 4, 8) and raster order (heuristic, along M, along N) where its
// kernel takes them (12 tactics, the tactic's own among them), else the tactic alone. A forced or cached
// tactic may name any of them (gemm_host.cpp).
std::vector<Tactic> launch_variants(const Tactic& tactic);

const char* raster_name(Raster raster);

const char* config_name(TileConfig config);

// Whether a config runs on CUTLASS's stream-K tile scheduler (data-parallel, split-K or stream-K
// chosen at run time).
bool has_stream_k_scheduler(TileConfig config);
const char* decomposition_name(Decomposition decomposition);

}  // namespace ops::cutlass_gemm
