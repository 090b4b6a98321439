#include "checks.h"

#include <ATen/Context.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/ScalarType.h>
#include <c10/core/impl/COW.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ops {
namespace {

// Whether views a and b of one storage, of equal sizes and strides (b is a shifted by the difference of
// their storage offsets), share an element, where ATen's analysis gives up (get_overlap_status: TooHard), e.g. the two halves of
// x.chunk(2, -1). Decided exactly when the strides nest strictly: sorted by size, each stride exceeds
// twice the span sum_{j>k} (size_j - 1) stride_j of the smaller ones. Then a shift has at most one
// representation sum_k d_k stride_k with |d_k| < size_k, and the greedy choice of the nearest d_k finds
// it. nullopt where it cannot decide (other shapes or strides, or strides that do not nest).
std::optional<bool> shifted_views_overlap(const at::Tensor& a, const at::Tensor& b) {
  if (!a.is_alias_of(b) || a.sizes() != b.sizes() || a.strides() != b.strides()) return std::nullopt;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dimensions of size > 1
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (a.size(d) > 1) {
      if (a.stride(d) <= 0) return std::nullopt;
      dims.emplace_back(a.stride(d), a.size(d));
    }
  }
  std::sort(dims.begin(), dims.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  std::vector<int64_t> span(dims.size() + 1, 0);  // span[k]: sum over j >= k of (size_j - 1) stride_j
  for (size_t k = dims.size(); k-- > 0;) span[k] = span[k + 1] + (dims[k].second - 1) * dims[k].first;
  for (size_t k = 0; k < dims.size(); ++k) {
    if (dims[k].first <= 2 * span[k + 1]) return std::nullopt;
  }
  int64_t rest = b.storage_offset() - a.storage_offset();
  for (size_t k = 0; k < dims.size(); ++k) {
    const int64_t stride = dims[k].first;
    const int64_t d = (rest >= 0 ? rest + stride / 2 : rest - stride / 2) / stride;  // nearest multiple
    if (d > dims[k].second - 1 || d < 1 - dims[k].second) return false;
    rest -= d * stride;
    if (rest > span[k + 1] || rest < -span[k + 1]) return false;
  }
  return rest == 0;
}

// ATen's get_overlap_status, also for tensors whose storages are distinct objects over the same memory
// (torch.from_numpy of one array twice, torch.frombuffer, DLPack imports): ATen decides sharing by storage
// identity and calls those disjoint. Their element byte ranges are then compared as ATen compares views
// of one storage (TooHard where either tensor is not dense and non-overlapping).
at::MemOverlapStatus overlap_status(const at::Tensor& a, const at::Tensor& b) {
  const auto status = at::get_overlap_status(a, b);
  if (status != at::MemOverlapStatus::No || a.is_alias_of(b) || !storages_intersect(a, b)) return status;
  if (!a.is_non_overlapping_and_dense() || !b.is_non_overlapping_and_dense()) return at::MemOverlapStatus::TooHard;
  const auto* a0 = static_cast<const char*>(a.const_data_ptr());  // const: a copy-on-write input stays one
  const auto* b0 = static_cast<const char*>(b.const_data_ptr());
  const auto* a1 = a0 + a.numel() * a.element_size();
  const auto* b1 = b0 + b.numel() * b.element_size();
  if (a0 == b0 && a1 == b1) return at::MemOverlapStatus::Full;
  return a0 < b1 && b0 < a1 ? at::MemOverlapStatus::Partial : at::MemOverlapStatus::No;
}

}  // namespace

bool storages_intersect(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0 || !a.has_storage() || !b.has_storage()) return false;
  if (a.is_alias_of(b)) return true;
  // Copy-on-write storages (torch._lazy_clone) share their memory only until one is written, which
  // gives it a copy of its own first: not shared for these checks.
  if (c10::impl::cow::is_cow_data_ptr(a.storage().data_ptr()) || c10::impl::cow::is_cow_data_ptr(b.storage().data_ptr())) {
    return false;
  }
  const auto* a0 = static_cast<const char*>(a.storage().data());
  const auto* b0 = static_cast<const char*>(b.storage().data());
  if (a0 == nullptr || b0 == nullptr || a.device() != b.device()) return false;  // meta tensors have no memory
  return a0 < b0 + b.storage().nbytes() && b0 < a0 + a.storage().nbytes();
}

bool is_gemm_dtype(at::ScalarType t) {
  return std::find(std::begin(kGemmDtypes), std::end(kGemmDtypes), t) != std::end(kGemmDtypes);
}

const std::string& gemm_dtypes_text() {
  static const std::string text = [] {
    std::string out;
    const size_t n = std::size(kGemmDtypes);
    for (size_t i = 0; i < n; ++i) {
      out += (i == 0 ? "" : i + 1 == n ? " or " : ", ") + std::string(c10::getDtypeNames(kGemmDtypes[i]).first);
    }
    return out;
  }();
  return text;
}

std::string torch_dtype_name(at::ScalarType t) {
  return "torch." + std::string(c10::getDtypeNames(t).first);
}

void check_gemm_defined(const char* op, const at::Tensor& A, const at::Tensor& B) {
  TORCH_CHECK(A.defined(), op, ": A must be a defined tensor (M, K), got an undefined tensor (None)");
  TORCH_CHECK(B.defined(), op, ": B must be a defined tensor (K, N), got an undefined tensor (None)");
}

void check_gemm_shapes(const char* op, const at::Tensor& A, const at::Tensor& B) {
  TORCH_CHECK(A.dim() == 2, op, ": expected A to be a 2-D matrix (M, K), got a ", A.dim(),
              "-D tensor of shape ", A.sizes());
  TORCH_CHECK(B.dim() == 2, op, ": expected B to be a 2-D matrix (K, N), got a ", B.dim(),
              "-D tensor of shape ", B.sizes());
  TORCH_CHECK(A.size(1) == B.size(0), op, ": A (M, K) and B (K, N) must agree on K, got A of shape ",
              A.sizes(), " and B of shape ", B.sizes());
}

void check_gemm_inputs(const char* op, const at::Tensor& A, const at::Tensor& B) {
  check_gemm_defined(op, A, B);
  check_gemm_shapes(op, A, B);
  TORCH_CHECK(is_gemm_dtype(A.scalar_type()), op,
              ": expected A's dtype to be ", gemm_dtypes_text(), ", got ", torch_dtype_name(A.scalar_type()));
  TORCH_CHECK(A.scalar_type() == B.scalar_type(), op,
              ": A and B must have the same dtype, got A ", torch_dtype_name(A.scalar_type()), " and B ",
              torch_dtype_name(B.scalar_type()));
  TORCH_CHECK(A.device() == B.device(), op, ": A and B must be on the same device, got A on ",
              A.device(), " and B on ", B.device());
  TORCH_CHECK(A.layout() == at::kStrided && B.layout() == at::kStrided, op,
              ": A and B must be dense (strided) tensors, got ", A.layout(), " and ", B.layout());
}

bool check_gemm_out(const char* op, const at::Tensor& A, const at::Tensor& B,
                    const at::Tensor& out) {
  return check_gemm_out(op, A, B, out, A.scalar_type(), "the dtype of A and B");
}

bool check_gemm_out(const char* op, const at::Tensor& A, const at::Tensor& B, const at::Tensor& out,
                    at::ScalarType dtype, const char* dtype_origin) {
  TORCH_CHECK(out.defined(), op, ": out must be a defined tensor");
  TORCH_CHECK(out.dim() == 2 && out.size(0) == A.size(0) && out.size(1) == B.size(1), op,
              ": expected out of shape (M, N) = (", A.size(0), ", ", B.size(1), "), got ",
              out.sizes());
  TORCH_CHECK(out.scalar_type() == dtype, op, ": expected out's dtype to be ",
              torch_dtype_name(dtype), " (", dtype_origin, "), got ", torch_dtype_name(out.scalar_type()));
  TORCH_CHECK(out.device() == A.device(), op, ": expected out on ", A.device(),
              " (the device of A and B), got ", out.device());
  return check_out_memory(op, out, {{"A", &A}, {"B", &B}});
}

bool check_out_memory(const char* op, const at::Tensor& out,
                      std::initializer_list<std::pair<const char*, const at::Tensor*>> inputs) {
  TORCH_CHECK(out.layout() == at::kStrided, op, ": out must be a dense (strided) tensor");
  check_written_in_place(op, "out", out);
  bool undecided = false;
  for (const auto& [name, input] : inputs) {
    if (!input->defined()) continue;
    const auto status = overlap_status(out, *input);
    TORCH_CHECK(status != at::MemOverlapStatus::Full && status != at::MemOverlapStatus::Partial, op,
                ": out overlaps ", name,
                " in memory; the result would overwrite its own input. Pass a separate out tensor.");
    undecided = undecided || (status == at::MemOverlapStatus::TooHard && storages_intersect(out, *input));
  }
  return undecided;
}

const char* grouped_mode_name(GroupedMode mode) {
  switch (mode) {
    case GroupedMode::RaggedM: return "2D x 3D";
    case GroupedMode::RaggedK: return "2D x 2D";
    case GroupedMode::Batched: return "3D x 3D";
    case GroupedMode::RaggedN: return "3D x 2D";
  }
  return "";
}

namespace {

// The mode, groups and output of A and B 2-D or 3-D agreeing on K and G, and offs's checks (grouped_gemm's
// and scaled_grouped_gemm's); reads no dtypes.
GroupedProblem grouped_problem(const char* op, const at::Tensor& A, const at::Tensor& B,
                               const c10::optional<at::Tensor>& offs) {
  TORCH_CHECK(A.dim() == 2 || A.dim() == 3, op, ": expected A to be 2-D (M, K) or 3-D (G, M, K), got a ", A.dim(),
              "-D tensor of shape ", A.sizes());
  TORCH_CHECK(B.dim() == 2 || B.dim() == 3, op, ": expected B to be 2-D (K, N) or 3-D (G, K, N), got a ", B.dim(),
              "-D tensor of shape ", B.sizes());
  TORCH_CHECK(A.device() == B.device(), op, ": A and B must be on the same device, got A on ", A.device(),
              " and B on ", B.device());
  TORCH_CHECK(A.layout() == at::kStrided && B.layout() == at::kStrided, op,
              ": A and B must be dense (strided) tensors, got ", A.layout(), " and ", B.layout());
  TORCH_CHECK(A.size(-1) == B.size(-2), op, ": A and B must agree on K (A's last dimension, B's second to last), "
              "got A of shape ", A.sizes(), " and B of shape ", B.sizes());
  GroupedProblem p;
  const bool a2 = A.dim() == 2, b2 = B.dim() == 2;
  p.mode = a2 ? (b2 ? GroupedMode::RaggedK : GroupedMode::RaggedM) : (b2 ? GroupedMode::RaggedN : GroupedMode::Batched);
  const bool has_offs = offs.has_value() && offs->defined();
  TORCH_CHECK(has_offs == (a2 || b2), op, ": ",
              has_offs ? "offs must be None when A and B are both 3-D (one GEMM per batch entry), got a tensor"
                       : "offs is required when A or B is 2-D (int32 cumulative ends of the groups), got None");
  switch (p.mode) {
    case GroupedMode::RaggedM:
      p.groups = B.size(0), p.extent = A.size(0), p.cut = "M", p.out_sizes = {A.size(0), B.size(2)};
      break;
    case GroupedMode::RaggedK:
      p.groups = offs->numel(), p.extent = A.size(1), p.cut = "K", p.out_sizes = {p.groups, A.size(0), B.size(1)};
      break;
    case GroupedMode::Batched:
      TORCH_CHECK(A.size(0) == B.size(0), op, ": A (G, M, K) and B (G, K, N) must agree on G, got A of shape ",
                  A.sizes(), " and B of shape ", B.sizes());
      p.groups = A.size(0), p.extent = 0, p.cut = "", p.out_sizes = {A.size(0), A.size(1), B.size(2)};
      break;
    case GroupedMode::RaggedN:
      p.groups = A.size(0), p.extent = B.size(1), p.cut = "N", p.out_sizes = {A.size(1), B.size(1)};
      break;
  }
  if (has_offs) {
    TORCH_CHECK(offs->dim() == 1, op, ": expected offs to be 1-D (G,), got a ", offs->dim(), "-D tensor of shape ",
                offs->sizes());
    TORCH_CHECK(offs->scalar_type() == at::kInt, op, ": expected offs to be torch.int32 (as torch._grouped_mm), got ",
                torch_dtype_name(offs->scalar_type()));
    TORCH_CHECK(offs->device() == A.device(), op, ": expected offs on ", A.device(), " (A's device), got ",
                offs->device());
    TORCH_CHECK(offs->layout() == at::kStrided && offs->is_contiguous(), op, ": offs must be a contiguous tensor");
    TORCH_CHECK(offs->numel() == p.groups, op, ": expected offs of G = ", p.groups, " elements (",
                p.mode == GroupedMode::RaggedM ? "B's first dimension" : "A's first dimension", " in ",
                grouped_mode_name(p.mode), "), got ", offs->numel());
  }
  return p;
}

}  // namespace

GroupedProblem check_grouped_gemm_inputs(const char* op, const at::Tensor& A, const at::Tensor& B,
                                         const c10::optional<at::Tensor>& offs, at::ScalarType out_dtype,
                                         const char* dtype_origin) {
  check_gemm_defined(op, A, B);
  TORCH_CHECK(is_gemm_dtype(A.scalar_type()), op, ": expected A's dtype to be ", gemm_dtypes_text(), ", got ",
              torch_dtype_name(A.scalar_type()));
  TORCH_CHECK(A.scalar_type() == B.scalar_type(), op, ": A and B must have the same dtype, got A ",
              torch_dtype_name(A.scalar_type()), " and B ", torch_dtype_name(B.scalar_type()));
  const bool half = A.scalar_type() == at::kHalf || A.scalar_type() == at::kBFloat16;
  TORCH_CHECK(out_dtype == A.scalar_type() || (half && out_dtype == at::kFloat), op, ": expected ", dtype_origin, " to be ",
              torch_dtype_name(A.scalar_type()), " (A's dtype)", half ? " or torch.float32" : "", ", got ",
              torch_dtype_name(out_dtype));
  return grouped_problem(op, A, B, offs);
}

void check_group_offsets(const char* op, const GroupedProblem& p, const int32_t* offs) {
  int64_t previous = 0;
  for (int64_t g = 0; g < p.groups; ++g) {
    TORCH_CHECK(offs[g] >= previous, op, ": expected offs to be non-negative and non-decreasing (cumulative ends of ",
                "the groups along ", p.cut, "), got offs[", g, "] = ", offs[g],
                g ? " after offs[" + std::to_string(g - 1) + "] = " + std::to_string(previous) : std::string());
    previous = offs[g];
  }
  TORCH_CHECK(previous <= p.extent, op, ": offs's last end must be at most ", p.cut, " = ", p.extent,
              " (in ", grouped_mode_name(p.mode), "), got ", previous);
}

bool check_grouped_gemm_out(const char* op, const GroupedProblem& p, const at::Tensor& A, const at::Tensor& B,
                            const c10::optional<at::Tensor>& offs, const at::Tensor& out, at::ScalarType dtype,
                            const char* dtype_origin) {
  TORCH_CHECK(out.defined(), op, ": out must be a defined tensor");
  TORCH_CHECK(out.sizes() == at::IntArrayRef(p.out_sizes), op, ": expected out of shape ", at::IntArrayRef(p.out_sizes),
              " (", grouped_mode_name(p.mode), "), got ", out.sizes());
  TORCH_CHECK(out.scalar_type() == dtype, op, ": expected out's dtype to be ", torch_dtype_name(dtype), " (",
              dtype_origin, "), got ", torch_dtype_name(out.scalar_type()));
  TORCH_CHECK(out.device() == A.device(), op, ": expected out on ", A.device(), " (the device of A and B), got ",
              out.device());
  const at::Tensor o = offs.has_value() ? *offs : at::Tensor();
  return check_out_memory(op, out, {{"A", &A}, {"B", &B}, {"offs", &o}});
}

namespace {

// Each side's M, N and the scales' shapes per recipe in a grouped mode (checks.h ScaledGroupedProblem).
struct GroupedScaleShapes {
  int64_t M, N, K;
  std::vector<int64_t> row_a, row_b, block_a, block_b;  // block_*: empty where the mode takes no blocks
};

GroupedScaleShapes grouped_scale_shapes(const GroupedProblem& p, const at::Tensor& A, const at::Tensor& B) {
  GroupedScaleShapes s;
  const int64_t G = p.groups;
  s.M = A.size(-2), s.N = B.size(-1), s.K = A.size(-1);
  const int64_t kb = (s.K + kScaleBlock - 1) / kScaleBlock, nb = (s.N + kScaleBlock - 1) / kScaleBlock;
  switch (p.mode) {
    case GroupedMode::RaggedM:
      s.row_a = {s.M}, s.row_b = {G, s.N}, s.block_a = {s.M, kb}, s.block_b = {G, kb, nb};
      break;
    case GroupedMode::Batched:
      s.row_a = {G, s.M}, s.row_b = {G, s.N}, s.block_a = {G, s.M, kb}, s.block_b = {G, kb, nb};
      break;
    case GroupedMode::RaggedN:
      s.row_a = {G, s.M}, s.row_b = {s.N};
      break;
    case GroupedMode::RaggedK:
      s.row_a = {G * s.M}, s.row_b = {G * s.N};
      break;
  }
  return s;
}

}  // namespace

ScaledGroupedProblem check_scaled_grouped_gemm_inputs(const char* op, const at::Tensor& A, const at::Tensor& B,
                                                      const at::Tensor& scale_a, const at::Tensor& scale_b,
                                                      const c10::optional<at::Tensor>& offs,
                                                      const c10::optional<at::Tensor>& bias, at::ScalarType out_dtype,
                                                      const char* dtype_origin) {
  check_gemm_defined(op, A, B);
  TORCH_CHECK(scale_a.defined() && scale_b.defined(), op, ": scale_a and scale_b must be defined tensors");
  ScaledGroupedProblem result;
  result.grouped = grouped_problem(op, A, B, offs);
  const GroupedProblem& p = result.grouped;
  TORCH_CHECK(A.scalar_type() == at::kFloat8_e4m3fn && B.scalar_type() == at::kFloat8_e4m3fn, op,
              ": expected A and B to be torch.float8_e4m3fn (as torch._scaled_grouped_mm), got A ",
              torch_dtype_name(A.scalar_type()), " and B ", torch_dtype_name(B.scalar_type()));
  TORCH_CHECK(out_dtype == at::kBFloat16 || out_dtype == at::kHalf || out_dtype == at::kFloat, op,
              ": expected ", dtype_origin, " to be torch.bfloat16, torch.float16 or torch.float32, got ",
              torch_dtype_name(out_dtype));
  const GroupedScaleShapes s = grouped_scale_shapes(p, A, B);
  TORCH_CHECK(s.K % 16 == 0 && s.N % 16 == 0, op,
              ": expected K and N to be multiples of 16 (the FP8 tensor cores' 16-byte rows), got K = ", s.K,
              " and N = ", s.N);
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"scale_a", &scale_a}, {"scale_b", &scale_b}}) {
    TORCH_CHECK(t->device() == A.device(), op, ": expected ", name, " on ", A.device(), " (A's device), got ",
                t->device());
    TORCH_CHECK(t->layout() == at::kStrided, op, ": ", name, " must be a dense (strided) tensor");
    TORCH_CHECK(t->scalar_type() == at::kFloat, op, ": expected ", name, " to be torch.float32, got ",
                torch_dtype_name(t->scalar_type()));
  }
  const at::IntArrayRef sa = scale_a.sizes(), sb = scale_b.sizes();
  if (sa == at::IntArrayRef(s.row_a) && sb == at::IntArrayRef(s.row_b)) {
    result.recipe = ScaleRecipe::Rowwise;
  } else if (!s.block_a.empty() && sa == at::IntArrayRef(s.block_a) && sb == at::IntArrayRef(s.block_b)) {
    TORCH_CHECK(s.K % kScaleBlock == 0, op, ": the blockwise recipe takes K in whole 128-blocks, got K = ", s.K,
                " (the rowwise recipe takes it)");
    result.recipe = ScaleRecipe::Block128;
  } else {
    TORCH_CHECK(false, op, ": scale_a of shape ", sa, " and scale_b of shape ", sb, " are no recipe for A of shape ",
                A.sizes(), " and B of shape ", B.sizes(), " (", grouped_mode_name(p.mode), "); expected rowwise: ",
                at::IntArrayRef(s.row_a), " and ", at::IntArrayRef(s.row_b),
                s.block_a.empty() ? std::string(" (blockwise scales take 2D x 3D and 3D x 3D)")
                                  : c10::str("; blockwise 1x128 x 128x128: ", at::IntArrayRef(s.block_a), " and ",
                                             at::IntArrayRef(s.block_b)));
  }
  if (bias.has_value() && bias->defined()) {
    const std::vector<int64_t> shape = p.mode == GroupedMode::RaggedN ? std::vector<int64_t>{s.N}
                                                                      : std::vector<int64_t>{p.groups, s.N};
    TORCH_CHECK(bias->sizes() == at::IntArrayRef(shape), op, ": expected bias of shape ", at::IntArrayRef(shape),
                p.mode == GroupedMode::RaggedN ? " (N,)" : " (G, N)", ", got ", bias->sizes());
    TORCH_CHECK(bias->scalar_type() == out_dtype, op, ": expected bias's dtype to be ", torch_dtype_name(out_dtype),
                " (", dtype_origin, "), got ", torch_dtype_name(bias->scalar_type()));
    TORCH_CHECK(bias->device() == A.device(), op, ": expected bias on ", A.device(), " (A's device), got ",
                bias->device());
    TORCH_CHECK(bias->layout() == at::kStrided, op, ": bias must be a dense (strided) tensor");
  }
  return result;
}

bool check_scaled_grouped_gemm_out(const char* op, const GroupedProblem& p, const at::Tensor& A, const at::Tensor& B,
                                   const at::Tensor& scale_a, const at::Tensor& scale_b,
                                   const c10::optional<at::Tensor>& offs, const c10::optional<at::Tensor>& bias,
                                   const at::Tensor& out, at::ScalarType dtype, const char* dtype_origin) {
  const bool undecided = check_grouped_gemm_out(op, p, A, B, offs, out, dtype, dtype_origin);
  const at::Tensor no_bias;
  return check_out_memory(op, out, {{"scale_a", &scale_a}, {"scale_b", &scale_b},
                                    {"bias", bias.has_value() ? &*bias : &no_bias}}) || undecided;
}

void check_linear_inputs(const char* op, const at::Tensor& input, const at::Tensor& weight,
                         const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(input.defined() && weight.defined(), op, ": input and weight must be defined tensors");
  TORCH_CHECK(input.dim() >= 1, op, ": expected input of shape (..., in_features), got a 0-D tensor");
  TORCH_CHECK(is_gemm_dtype(input.scalar_type()), op,
              ": expected input's dtype to be ", gemm_dtypes_text(), ", got ", torch_dtype_name(input.scalar_type()));
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == input.size(-1), op,
              ": expected weight of shape (out_features, in_features) with in_features = ", input.size(-1),
              " (input's last dimension), got ", weight.sizes());
  TORCH_CHECK(weight.scalar_type() == input.scalar_type(), op, ": expected weight's dtype to be ",
              torch_dtype_name(input.scalar_type()), " (input's dtype), got ", torch_dtype_name(weight.scalar_type()));
  TORCH_CHECK(weight.device() == input.device(), op, ": input and weight must be on the same device, got input on ",
              input.device(), " and weight on ", weight.device());
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == weight.size(0), op,
                ": expected bias of shape (out_features,) = (", weight.size(0), ",), got ", bias->sizes());
    TORCH_CHECK(bias->scalar_type() == input.scalar_type(), op, ": expected bias's dtype to be ",
                torch_dtype_name(input.scalar_type()), " (input's dtype), got ", torch_dtype_name(bias->scalar_type()));
    TORCH_CHECK(bias->device() == input.device(), op, ": expected bias on ", input.device(),
                " (input's device), got ", bias->device());
  }
}

const char* scale_recipe_name(ScaleRecipe recipe) {
  switch (recipe) {
    case ScaleRecipe::Tensorwise: return "tensorwise";
    case ScaleRecipe::Rowwise: return "rowwise";
    case ScaleRecipe::Block128: return "blockwise 1x128 x 128x128";
    case ScaleRecipe::Block1x128: return "blockwise 1x128 x 1x128";
  }
  return "?";
}

namespace {

bool is_fp8(at::ScalarType t) { return t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2; }

void check_dense_on(const char* op, const char* name, const at::Tensor& t, const at::Tensor& A) {
  TORCH_CHECK(t.device() == A.device(), op, ": expected ", name, " on ", A.device(), " (A's device), got ",
              t.device());
  TORCH_CHECK(t.layout() == at::kStrided, op, ": ", name, " must be a dense (strided) tensor");
}

}  // namespace

ScaleRecipe check_scaled_gemm_inputs(const char* op, const at::Tensor& A, const at::Tensor& B,
                                     const at::Tensor& scale_a, const at::Tensor& scale_b,
                                     const c10::optional<at::Tensor>& bias, at::ScalarType out_dtype,
                                     const char* dtype_origin) {
  check_gemm_defined(op, A, B);
  TORCH_CHECK(scale_a.defined() && scale_b.defined(), op, ": scale_a and scale_b must be defined tensors");
  check_gemm_shapes(op, A, B);
  TORCH_CHECK(is_fp8(A.scalar_type()) && is_fp8(B.scalar_type()), op,
              ": expected A and B to be torch.float8_e4m3fn or torch.float8_e5m2, got A ",
              torch_dtype_name(A.scalar_type()), " and B ", torch_dtype_name(B.scalar_type()));
  TORCH_CHECK(!(A.scalar_type() == at::kFloat8_e5m2 && B.scalar_type() == at::kFloat8_e5m2), op,
              ": A and B cannot both be torch.float8_e5m2 (as torch._scaled_mm: the tensor cores take e5m2 "
              "for one operand at most)");
  TORCH_CHECK(out_dtype == at::kBFloat16 || out_dtype == at::kHalf || out_dtype == at::kFloat, op,
              ": expected ", dtype_origin, " to be torch.bfloat16, torch.float16 or torch.float32, got ",
              torch_dtype_name(out_dtype));
  const int64_t M = A.size(0), K = A.size(1), N = B.size(1);
  TORCH_CHECK(K % 16 == 0 && N % 16 == 0, op,
              ": expected K and N to be multiples of 16 (the FP8 tensor cores' 16-byte rows), got K = ", K,
              " and N = ", N);
  check_dense_on(op, "A", A, A);
  check_dense_on(op, "B", B, A);
  check_dense_on(op, "scale_a", scale_a, A);
  check_dense_on(op, "scale_b", scale_b, A);
  TORCH_CHECK(scale_a.scalar_type() == at::kFloat && scale_b.scalar_type() == at::kFloat, op,
              ": expected scale_a and scale_b to be torch.float32, got ", torch_dtype_name(scale_a.scalar_type()),
              " and ", torch_dtype_name(scale_b.scalar_type()));
  const int64_t kb = (K + kScaleBlock - 1) / kScaleBlock, nb = (N + kScaleBlock - 1) / kScaleBlock;
  const auto is = [](const at::Tensor& t, int64_t rows, int64_t cols) {
    return t.dim() == 2 && t.size(0) == rows && t.size(1) == cols;
  };
  ScaleRecipe recipe;
  if (scale_a.numel() == 1 && scale_b.numel() == 1) {
    recipe = ScaleRecipe::Tensorwise;
  } else if (is(scale_a, M, 1) && is(scale_b, 1, N)) {
    recipe = ScaleRecipe::Rowwise;
  } else if (is(scale_a, M, kb) && is(scale_b, kb, nb)) {
    recipe = ScaleRecipe::Block128;
  } else if (is(scale_a, M, kb) && is(scale_b, kb, N)) {
    recipe = ScaleRecipe::Block1x128;
  } else {
    TORCH_CHECK(false, op, ": scale_a of shape ", scale_a.sizes(), " and scale_b of shape ", scale_b.sizes(),
                " are no recipe for A (M, K) = (", M, ", ", K, ") and B (K, N) = (", K, ", ", N,
                "); expected tensorwise: one element each; rowwise: (M, 1) = (", M, ", 1) and (1, N) = (1, ", N,
                "); blockwise: scale_a (M, ceil(K/128)) = (", M, ", ", kb, ") with scale_b (ceil(K/128), ceil(N/128)) = (",
                kb, ", ", nb, ") for 128x128 blocks of B or (ceil(K/128), N) = (", kb, ", ", N, ") for 1x128 groups");
  }
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N, op, ": expected bias of shape (N,) = (", N, ",), got ",
                bias->sizes());
    TORCH_CHECK(bias->scalar_type() == out_dtype, op, ": expected bias's dtype to be ", torch_dtype_name(out_dtype),
                " (", dtype_origin, "), got ", torch_dtype_name(bias->scalar_type()));
    check_dense_on(op, "bias", *bias, A);
  }
  return recipe;
}

void check_norm_inputs(const char* op, const at::Tensor& input, const at::Tensor& weight) {
  TORCH_CHECK(input.defined() && weight.defined(), op, ": input and weight must be defined tensors");
  TORCH_CHECK(input.dim() >= 1, op, ": expected input of shape (..., hidden), got a 0-D tensor");
  TORCH_CHECK(is_gemm_dtype(input.scalar_type()), op,
              ": expected input's dtype to be ", gemm_dtypes_text(), ", got ", torch_dtype_name(input.scalar_type()));
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == input.size(-1), op,
              ": expected weight of shape (hidden,) = (", input.size(-1),
              ",) matching input's last dimension, got ", weight.sizes());
  TORCH_CHECK(weight.scalar_type() == input.scalar_type(), op, ": expected weight's dtype to be ",
              torch_dtype_name(input.scalar_type()), " (input's dtype), got ", torch_dtype_name(weight.scalar_type()));
  TORCH_CHECK(weight.device() == input.device(), op, ": input and weight must be on the same device, got input on ",
              input.device(), " and weight on ", weight.device());
  TORCH_CHECK(input.layout() == at::kStrided && weight.layout() == at::kStrided, op,
              ": input and weight must be dense (strided) tensors");
}

void check_silu_and_mul_input(const char* op, const at::Tensor& input) {
  TORCH_CHECK(input.defined(), op, ": input must be a defined tensor");
  TORCH_CHECK(input.dim() >= 1, op, ": expected input of shape (..., 2 * d), got a 0-D tensor");
  TORCH_CHECK(is_gemm_dtype(input.scalar_type()), op,
              ": expected input's dtype to be ", gemm_dtypes_text(), ", got ", torch_dtype_name(input.scalar_type()));
  TORCH_CHECK(input.size(-1) % 2 == 0, op,
              ": expected input's last dimension to be even (2 * d: the gate half, then the up half), got ",
              input.size(-1));
  TORCH_CHECK(input.layout() == at::kStrided, op, ": input must be a dense (strided) tensor");
}

void check_same_as(const char* op, const char* name, const at::Tensor& other, const at::Tensor& input) {
  TORCH_CHECK(other.defined(), op, ": ", name, " must be a defined tensor");
  TORCH_CHECK(other.sizes() == input.sizes(), op, ": expected ", name, " of input's shape ", input.sizes(),
              ", got ", other.sizes());
  TORCH_CHECK(other.scalar_type() == input.scalar_type(), op, ": expected ", name, "'s dtype to be ",
              torch_dtype_name(input.scalar_type()), " (input's dtype), got ", torch_dtype_name(other.scalar_type()));
  TORCH_CHECK(other.device() == input.device(), op, ": expected ", name, " on ", input.device(),
              " (input's device), got ", other.device());
}

void check_no_shared_memory(const char* op, const char* written, const at::Tensor& w, const char* other_name,
                            const at::Tensor& other) {
  if (w.numel() == 0 || other.numel() == 0) return;
  const auto status = overlap_status(w, other);
  const std::optional<bool> shifted =
      status == at::MemOverlapStatus::TooHard ? shifted_views_overlap(w, other) : std::nullopt;
  if (shifted == std::optional<bool>(false)) {
    return;  // disjoint views of one buffer, computed through private copies (run_in_place_on_contiguous)
  }
  TORCH_CHECK(status != at::MemOverlapStatus::Full && status != at::MemOverlapStatus::Partial &&
                  !(status == at::MemOverlapStatus::TooHard && storages_intersect(w, other)),
              op, ": ", written, " and ", other_name, " share memory",
              status == at::MemOverlapStatus::TooHard && !shifted ? " (or may: strided views of one buffer)" : "", "; ",
              written, " is written in place, so the result would depend on the order of the writes. "
              "Pass tensors with memory of their own (e.g. .clone()).");
}

void check_written_in_place(const char* op, const char* name, const at::Tensor& t) {
  // ATen's in-place and out= ops refuse this in their ADInplaceOrView kernels, which a call whose tensors
  // are all inference tensors never reaches.
  TORCH_CHECK(!t.is_inference() || c10::InferenceMode::is_enabled(), op, ": ", name,
              " is an inference tensor (made under torch.inference_mode()) written in place outside inference "
              "mode, which PyTorch does not allow (\"Inplace update to inference tensor outside InferenceMode\"); "
              "call it under torch.inference_mode() or pass a tensor made outside it (e.g. its clone())");
  TORCH_CHECK(at::has_internal_overlap(t) != at::MemOverlap::Yes, op, ": ", name,
              " has internally overlapping memory (e.g. an expanded tensor) but is written in place; pass "
              "a tensor whose elements each have their own memory");
}

void check_fused_add_rms_norm_inputs(const at::Tensor& input, const at::Tensor& residual,
                                     const at::Tensor& weight, const char* op) {
  check_norm_inputs(op, input, weight);
  check_same_as(op, "residual", residual, input);
  check_written_in_place(op, "input", input);
  check_written_in_place(op, "residual", residual);
  check_no_shared_memory(op, "input", input, "residual", residual);
  check_no_shared_memory(op, "input", input, "weight", weight);
  check_no_shared_memory(op, "residual", residual, "weight", weight);
}

bool matmul_allows_tf32() {
  return at::globalContext().float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL) ==
         at::Float32Precision::TF32;
}

}  // namespace ops
