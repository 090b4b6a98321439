#include "plan.h"

#include "tactic.h"

#include <algorithm>
#include <climits>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

namespace ops::cutlass_gemm {
namespace {

int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }


struct Option {
  OperandPlan plan;
  int64_t copied = 0;
};

// Can the kernel use `view` (rows x cols) in place with `layout`? If so, returns its leading dimension.
// The contiguous extent, the leading dimension and the address must all be aligned: CUTLASS's
// can_implement checks the first two, and TMA needs the third (CUTLASS does not check it).
bool in_place(const MatrixView& view, Layout layout, int64_t alignment, int esize, int64_t* ld) {
  const bool row = layout == Layout::Row;
  const int64_t outer = row ? view.rows : view.cols;   // strided dimension
  const int64_t inner = row ? view.cols : view.rows;   // contiguous dimension
  const int64_t inner_stride = row ? view.stride1 : view.stride0;
  const int64_t outer_stride = row ? view.stride0 : view.stride1;
  if (inner > 1 && inner_stride != 1) return false;
  if (view.address % static_cast<uint64_t>(alignment * esize) != 0) return false;
  if (inner % alignment != 0) return false;
  // A single row (column) never steps by the leading dimension: any aligned value >= inner will do.
  const int64_t lead = outer <= 1 ? round_up(std::max<int64_t>(inner, 1), alignment) : outer_stride;
  // Leading dimensions shorter than the row would make rows alias (expanded tensors): copy those.
  if (lead < std::max<int64_t>(inner, 1) || lead % alignment != 0) return false;
  *ld = lead;
  return true;
}

void add_in_place(std::vector<Option>* options, const MatrixView& view, Layout layout,
                  int64_t alignment, int esize) {
  int64_t ld = 0;
  if (in_place(view, layout, alignment, esize, &ld)) {
    options->push_back({{Source::InPlace, layout, view.rows, view.cols, ld}, 0});
  }
}

// A copy of an input into a fresh (rows x cols, zero-padded beyond the view) buffer of `layout`.
void add_copy(std::vector<Option>* options, const MatrixView& view, Layout layout, int64_t rows,
              int64_t cols, int64_t alignment) {
  const int64_t inner = layout == Layout::Row ? cols : rows;
  const int64_t outer = layout == Layout::Row ? rows : cols;
  if (inner % alignment != 0) return;
  (void)outer;
  const int64_t ld = round_up(std::max<int64_t>(inner, 1), alignment);
  options->push_back({{Source::Copy, layout, rows, cols, ld}, 2 * view.rows * view.cols});
}

int layout_rank(Layout a, Layout b) {
  // K-major A and B first ("TN"), then the others.
  if (a == Layout::Row && b == Layout::Col) return 0;
  if (a == Layout::Row && b == Layout::Row) return 1;
  if (a == Layout::Col && b == Layout::Col) return 2;
  return 3;
}

std::string describe_built(const std::vector<BuiltArch>& built) {
  std::ostringstream out;
  for (size_t i = 0; i < built.size(); ++i) {
    out << (i ? ";" : "") << built[i].major << "." << built[i].minor
        << (built[i].arch_specific ? "a" : "");
  }
  return built.empty() ? std::string("no CUDA archs") : out.str();
}

}  // namespace


std::vector<BuiltArch> parse_arch_list(const std::string& arch_list) {
  std::vector<BuiltArch> built;
  std::string token;
  std::istringstream in(arch_list);
  auto parse = [&](std::string entry) {
    if (entry.empty()) return;
    const auto plus = entry.find('+');
    if (plus != std::string::npos) entry = entry.substr(0, plus);  // "+PTX"
    BuiltArch arch;
    if (!entry.empty() && (entry.back() == 'a' || entry.back() == 'f')) {
      arch.arch_specific = entry.back() == 'a';
      entry.pop_back();
    }
    const auto dot = entry.find('.');
    try {
      if (dot == std::string::npos) throw std::invalid_argument(entry);
      size_t used_major = 0, used_minor = 0;
      arch.major = std::stoi(entry.substr(0, dot), &used_major);
      arch.minor = std::stoi(entry.substr(dot + 1), &used_minor);
      if (used_major != dot || used_minor != entry.size() - dot - 1) throw std::invalid_argument(entry);
    } catch (const std::exception&) {
      throw std::invalid_argument("malformed CUDA arch list entry '" + entry + "' in '" + arch_list +
                                  "'");
    }
    built.push_back(arch);
  };
  for (char ch : arch_list) {
    if (ch == ';' || ch == ' ' || ch == ',') {
      parse(token);
      token.clear();
    } else {
      token += ch;
    }
  }
  parse(token);
  return built;
}

Math math_for(DType dtype, bool allow_tf32) {
  if (dtype == DType::Float) return allow_tf32 ? Math::TF32 : Math::Fast3xTF32;
  return Math::Standard;
}

bool kernel_runs_on(const KernelInfo& info, int cc_major, int cc_minor,
                    const std::vector<BuiltArch>& built, bool sm80_on_sm90) {
  for (const BuiltArch& arch : built) {
    if (info.sm == 90) {
      // wgmma/TMA kernels exist only in an sm_90a image, which runs only on cc 9.0.
      if (cc_major == 9 && cc_minor == 0 && arch.major == 9 && arch.minor == 0 && arch.arch_specific)
        return true;
    } else {
      // SM80 kernels: an 8.x image runs on 8.y >= x; an sm_90 image holds them only if on_sm90, and
      // they run there only when asked for (sm80_on_sm90: they gave wrong results on an H200).
      if (cc_major == 8 && arch.major == 8 && arch.minor <= cc_minor) return true;
      if (info.on_sm90 && sm80_on_sm90 && cc_major == 9 && cc_minor == 0 && arch.major == 9 &&
          arch.minor == 0)
        return true;
    }
  }
  return false;
}

namespace {

// Everything plan_gemm reads from a request, with addresses reduced to their alignment (all the planner
// asks of an address is whether it is a multiple of alignment * element size, which divides 16).
constexpr bool alignments_divide_16() {
  for (const KernelInfo& info : kKernels) {
    if (16 % (info.alignment * element_size(info.dtype)) != 0) return false;
  }
  return true;
}
static_assert(alignments_divide_16(), "the plan cache keys addresses by address % 16");

struct PlanKey {
  int64_t values[27];
  std::vector<BuiltArch> built;

  explicit PlanKey(const GemmRequest& r)
      : values{static_cast<int64_t>(r.dtype), r.allow_tf32, r.cc_major, r.cc_minor, r.m, r.n, r.k,
               r.a.rows, r.a.cols, r.a.stride0, r.a.stride1, static_cast<int64_t>(r.a.address % 16),
               r.b.rows, r.b.cols, r.b.stride0, r.b.stride1, static_cast<int64_t>(r.b.address % 16),
               r.c.rows, r.c.cols, r.c.stride0, r.c.stride1, static_cast<int64_t>(r.c.address % 16),
               static_cast<int64_t>(r.epilogue), r.allow_swap, r.sm_count, r.sm80_on_sm90,
               r.candidates_built},
        built(r.built) {}

  bool operator==(const PlanKey& o) const {
    if (!std::equal(std::begin(values), std::end(values), std::begin(o.values))) return false;
    if (built.size() != o.built.size()) return false;
    for (size_t i = 0; i < built.size(); ++i) {
      if (built[i].major != o.built[i].major || built[i].minor != o.built[i].minor ||
          built[i].arch_specific != o.built[i].arch_specific)
        return false;
    }
    return true;
  }
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& key) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the values
    for (int64_t v : key.values) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return static_cast<size_t>(h ^ key.built.size());
  }
};

std::string plan_gemm_uncached(const GemmRequest& req, GemmPlan* plan);

}  // namespace

std::string plan_gemm(const GemmRequest& req, GemmPlan* plan) {
  // Planning costs ~1 us (it enumerates every layout x copy x padding option); a model calls the same
  // few shapes over and over, so successful plans are memoized per thread (no locks). Bounded: the
  // table is dropped when it reaches kMaxEntries (shapes of a dynamic workload keep it churning only
  // at that rate).
  constexpr size_t kMaxEntries = 1024;
  thread_local std::unordered_map<PlanKey, GemmPlan, PlanKeyHash> cache;
  PlanKey key(req);
  const auto it = cache.find(key);
  if (it != cache.end()) {
    *plan = it->second;
    return "";
  }
  std::string error = plan_gemm_uncached(req, plan);
  if (error.empty()) {
    if (cache.size() >= kMaxEntries) cache.clear();
    cache.emplace(std::move(key), *plan);
  }
  return error;
}

namespace {

// Whether the kernel's grid can cover n columns. The SM80 kernels' swizzle
// (GemmIdentityThreadblockSwizzle<8>, sm80_gemm.cuh) puts ceil(column tiles / 8) in gridDim.y, at most
// 65535 (CUTLASS's can_implement refuses more: N above ~33.5M with 64-wide tiles); the SM90 kernels are
// persistent and the SIMT GEMV's column blocks lie along gridDim.x.
bool grid_fits(const KernelInfo& info, int64_t n) {
  if (info.config != TileConfig::Sm80) return true;
  const int tile_n = config_shape(info.config, info.dtype, info.math).tile_n;
  return round_up(round_up(n, tile_n) / tile_n, 8) / 8 <= 65535;
}

std::string plan_gemm_uncached(const GemmRequest& req, GemmPlan* plan) {
  if (req.m <= 0 || req.n <= 0 || req.k <= 0) {
    return "cutlass_gemm: internal error: planner called for an empty problem";
  }
  const Math math = math_for(req.dtype, req.allow_tf32);
  std::vector<KernelId> candidates;
  bool withheld = false;  // a kernel would run here but for sm80_on_sm90 (SM80 kernels on Hopper)
  for (int i = 0; i < kNumKernels; ++i) {
    const KernelInfo& info = kKernels[i];
    if (info.dtype != req.dtype || info.math != math || info.epilogue != req.epilogue) continue;
    if (candidate_only(info.config) && !req.candidates_built) continue;
    if (kernel_runs_on(info, req.cc_major, req.cc_minor, req.built, req.sm80_on_sm90)) {
      candidates.push_back(static_cast<KernelId>(i));
    } else if (kernel_runs_on(info, req.cc_major, req.cc_minor, req.built, /*sm80_on_sm90=*/true)) {
      withheld = true;
    }
  }
  if (candidates.empty() && withheld) {  // ATen computes it
    *plan = GemmPlan{};
    plan->m = req.m;
    plan->n = req.n;
    plan->k = req.k;
    plan->aten_fallback = std::string("the CUTLASS 2.x (SM80) kernels for ") + dtype_name(req.dtype) + " (" +
                          math_name(math) +
                          ") gave wrong results on Hopper (H200) and are not run there; ATen computes "
                          "this GEMM (OPS_CUTLASS_SM80_ON_SM90=1 runs them anyway)";
    return "";
  }
  if (candidates.empty()) {
    std::ostringstream msg;
    msg << "cutlass_gemm: no CUTLASS kernel for " << dtype_name(req.dtype)
        << (req.dtype == DType::Float ? std::string(" (") + math_name(math) + ")" : "")
        << " runs on a device of compute capability " << req.cc_major << "." << req.cc_minor
        << " with this build (built for " << describe_built(req.built)
        << "). The CUTLASS kernels need sm80-sm89 (built with an 8.x arch) or sm90 (built with "
           "9.0a); set TORCH_CUDA_ARCH_LIST and rebuild, or run on the CPU.";
    return msg.str();
  }
  // CUTLASS 2.x problem sizes are int.
  const int64_t max_dim = std::max({req.m, req.n, req.k});
  if (max_dim > INT_MAX - 64) {
    return "cutlass_gemm: M, N and K must each be below 2^31 for the CUTLASS kernels (got " +
           std::to_string(req.m) + ", " + std::to_string(req.n) + ", " + std::to_string(req.k) + ")";
  }
  const int esize = element_size(req.dtype);
  const int64_t alignment = kKernels[static_cast<int>(candidates.front())].alignment;

  bool found = false;
  GemmPlan best;
  std::tuple<int64_t, int, int> best_key;
  for (int swap = 0; swap < (req.allow_swap && req.epilogue == Epilogue::Plain ? 2 : 1); ++swap) {
    const int64_t m = swap ? req.n : req.m;
    const int64_t n = swap ? req.m : req.n;
    const int64_t k = req.k;
    const MatrixView a = swap ? req.b.transposed() : req.a;  // m x k
    const MatrixView b = swap ? req.a.transposed() : req.b;  // k x n
    const MatrixView c = swap ? req.c.transposed() : req.c;  // m x n
    for (int pad_k = 0; pad_k < 2; ++pad_k) {
      if (pad_k && k % alignment == 0) continue;
      for (int pad_n = 0; pad_n < 2; ++pad_n) {
        if (pad_n && n % alignment == 0) continue;
        const int64_t kk = pad_k ? round_up(k, alignment) : k;
        const int64_t nn = pad_n ? round_up(n, alignment) : n;

        std::vector<Option> a_options, b_options, d_options;
        if (!pad_k) {
          add_in_place(&a_options, a, Layout::Row, alignment, esize);
          add_in_place(&a_options, a, Layout::Col, alignment, esize);
        }
        add_copy(&a_options, a, Layout::Row, m, kk, alignment);
        add_copy(&a_options, a, Layout::Col, m, kk, alignment);
        if (!pad_k && !pad_n) {
          add_in_place(&b_options, b, Layout::Row, alignment, esize);
          add_in_place(&b_options, b, Layout::Col, alignment, esize);
        }
        add_copy(&b_options, b, Layout::Row, kk, nn, alignment);
        add_copy(&b_options, b, Layout::Col, kk, nn, alignment);
        if (!pad_n) add_in_place(&d_options, c, Layout::Row, alignment, esize);
        // Output temporary: written by the kernel, then copied (read + write) into C.
        if (nn % alignment == 0) {
          d_options.push_back(
              {{Source::Copy, Layout::Row, m, nn, round_up(nn, alignment)}, 3 * m * n});
        }

        for (const Option& ao : a_options) {
          for (const Option& bo : b_options) {
            for (const Option& dop : d_options) {
              KernelId kernel = KernelId::kCount;
              for (KernelId id : candidates) {
                const KernelInfo& info = kernel_info(id);
                if (info.a == ao.plan.layout && info.b == bo.plan.layout && grid_fits(info, nn)) kernel = id;
              }
              if (kernel == KernelId::kCount) continue;
              const int64_t cost = ao.copied + bo.copied + dop.copied;
              const auto key = std::make_tuple(cost, layout_rank(ao.plan.layout, bo.plan.layout),
                                               swap);
              if (!found || key < best_key) {
                found = true;
                best_key = key;
                best.tactic = Tactic{kernel};
                best.swap_ab = swap != 0;
                best.m = m;
                best.n = nn;
                best.k = kk;
                best.a = ao.plan;
                best.b = bo.plan;
                best.d = dop.plan;
                best.copied_elements = cost;
              }
            }
          }
        }
      }
    }
  }
  if (!found) {
    return "cutlass_gemm: internal error: no valid CUTLASS plan (please report this shape)";
  }
  // The layouts are fixed; now the configuration (tile, cluster, schedule) for this shape.
  const KernelInfo& chosen = kernel_info(best.tactic.kernel);
  for (KernelId id : candidates) {
    const KernelInfo& info = kernel_info(id);
    if (info.a == chosen.a && info.b == chosen.b) best.family.push_back(id);
  }
  best.tactic = choose_tactic(best, req.sm_count);
  *plan = std::move(best);
  return "";
}

}  // namespace

}  // namespace ops::cutlass_gemm
