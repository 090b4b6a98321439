// Input checks shared by the CPU and CUDA kernels. Every message names the op, the argument and what
// was expected, so a user can fix the call without reading our source.
#pragma once

#include <ATen/core/Tensor.h>

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace ops {

// The floating dtypes cutlass_gemm, linear and the fused ops take: one table, read by every check and
// message and exported to Python (ops._library.GEMM_DTYPES, from the _tables op).
inline constexpr at::ScalarType kGemmDtypes[] = {at::kHalf, at::kBFloat16, at::kFloat, at::kDouble};
bool is_gemm_dtype(at::ScalarType t);
// "float16, bfloat16, float32 or float64", for messages.
const std::string& gemm_dtypes_text();

// The dtype as Python spells it ("torch.float32", not "Float"), so C++ errors read like the fake
// kernels' (torch._check) and like PyTorch's own.
std::string torch_dtype_name(at::ScalarType t);

// A and B are defined tensors (the part of check_gemm_inputs that reads no sizes: autograd kernels
// call it, and reading sizes there would specialize symbolic shapes under torch.export / compile).
void check_gemm_defined(const char* op, const at::Tensor& A, const at::Tensor& B);

// A (M, K) and B (K, N): 2-D matrices agreeing on K (any dtype).
void check_gemm_shapes(const char* op, const at::Tensor& A, const at::Tensor& B);

// A (M, K) and B (K, N): 2-D, same dtype (kGemmDtypes), same device.
void check_gemm_inputs(const char* op, const at::Tensor& A, const at::Tensor& B);

// out: shape (M, N), A's dtype and device, not overlapping A or B, no internal overlap.
// Returns true when out shares storage with A or B in a way the overlap analysis cannot decide
// (strided views of one buffer, e.g. out = X[:, :4] with A = X[:, 4:]): the kernels must then compute
// into a temporary and copy it into out, so a real overlap can never give a wrong result.
bool check_gemm_out(const char* op, const at::Tensor& A, const at::Tensor& B, const at::Tensor& out);
// The same with out's dtype `dtype`, named in the message as `dtype_origin` (e.g. "out_dtype").
bool check_gemm_out(const char* op, const at::Tensor& A, const at::Tensor& B, const at::Tensor& out,
                    at::ScalarType dtype, const char* dtype_origin);

// linear: input (..., K), weight (N, K), bias (N,) or undefined; same floating dtype and device.
void check_linear_inputs(const char* op, const at::Tensor& input, const at::Tensor& weight,
                         const c10::optional<at::Tensor>& bias);

// rms_norm-style ops: input (..., hidden) of a kGemmDtypes dtype, weight
// (hidden,) of the same dtype and device.
void check_norm_inputs(const char* op, const at::Tensor& input, const at::Tensor& weight);

// silu_and_mul: input (..., 2 * d) floating.
void check_silu_and_mul_input(const char* op, const at::Tensor& input);

// How scaled_gemm's float32 scales cover A (M, K) and B (K, N), in the pairs torch defines:
//   Tensorwise   scale_a and scale_b one element each;
//   Rowwise      scale_a (M, 1), scale_b (1, N);
//   Block128     scale_a (M, ceil(K/128)) per 1x128 group of A, scale_b (ceil(K/128), ceil(N/128)) per
//                128x128 block of B (DeepSeek-V3's layout);
//   Block1x128   scale_a as Block128, scale_b (ceil(K/128), N) per 128x1 group of B (1x128 of B^T).
// Where two recipes fit one pair of shapes (K <= 128, or M = 1), they compute the same thing.
enum class ScaleRecipe : int8_t { Tensorwise, Rowwise, Block128, Block1x128 };
// The two blockwise recipes.
constexpr bool scaled_block_recipe(ScaleRecipe recipe) {
  return recipe == ScaleRecipe::Block128 || recipe == ScaleRecipe::Block1x128;
}
const char* scale_recipe_name(ScaleRecipe recipe);
inline constexpr int64_t kScaleBlock = 128;

// A block scale (one value per kScaleBlock elements along `dim`) repeated to `size` elements along it.
inline at::Tensor expand_block_scale(const at::Tensor& scale, int64_t dim, int64_t size) {
  return scale.repeat_interleave(kScaleBlock, dim).narrow(dim, 0, size);
}

// scaled_gemm: A (M, K) and B (K, N) float8_e4m3fn or float8_e5m2 (not both e5m2), K and N multiples
// of 16; float32 scales of a recipe; bias (N,) of out_dtype; out_dtype bfloat16, float16 or float32; one
// device; dense tensors. Returns the recipe.
ScaleRecipe check_scaled_gemm_inputs(const char* op, const at::Tensor& A, const at::Tensor& B,
                                     const at::Tensor& scale_a, const at::Tensor& scale_b,
                                     const c10::optional<at::Tensor>& bias, at::ScalarType out_dtype,
                                     const char* dtype_origin = "out_dtype");

// grouped_gemm's modes, torch._grouped_mm's, named by what offs (int32 cumulative group ends) cuts:
//   RaggedM  A (M, K), B (G, K, N), offs (G,) over M; out (M, N)     the MoE forward
//   RaggedK  A (M, K), B (K, N), offs (G,) over K; out (G, M, N)     the weight gradient
//   Batched  A (G, M, K), B (G, K, N), no offs; out (G, M, N)
//   RaggedN  A (G, M, K), B (K, N), offs (G,) over N; out (M, N)
// Output rows (RaggedM) or columns (RaggedN) past the last offset are zero.
enum class GroupedMode : int8_t { RaggedM, RaggedK, Batched, RaggedN };
struct GroupedProblem {
  GroupedMode mode;
  int64_t groups;                  // G
  int64_t extent;                  // the size offs cuts (M, K or N); 0 for Batched
  const char* cut;                 // "M", "K", "N" or ""
  std::vector<int64_t> out_sizes;  // (M, N) or (G, M, N)
};
const char* grouped_mode_name(GroupedMode mode);  // "2D x 3D", ...

// grouped_gemm: A and B 2-D or 3-D of one kGemmDtypes dtype and device, dense, agreeing on K (the
// contraction) and on G; offs given exactly where a side is 2-D: 1-D int32 of G elements, contiguous, on
// A's device; out_dtype A's dtype, or float32 for half types. Reads no offsets' values (on CUDA that is a host sync).
GroupedProblem check_grouped_gemm_inputs(const char* op, const at::Tensor& A, const at::Tensor& B,
                                         const c10::optional<at::Tensor>& offs, at::ScalarType out_dtype,
                                         const char* dtype_origin = "out_dtype");
// offs's values, on the host: non-negative, non-decreasing, at most the extent they cut.
void check_group_offsets(const char* op, const GroupedProblem& problem, const int32_t* offs);
// grouped_gemm.out's out: problem.out_sizes, `dtype` (named as dtype_origin), A's device, and what
// check_out_memory checks against A, B and offs.
bool check_grouped_gemm_out(const char* op, const GroupedProblem& problem, const at::Tensor& A, const at::Tensor& B,
                            const c10::optional<at::Tensor>& offs, const at::Tensor& out, at::ScalarType dtype,
                            const char* dtype_origin);

// scaled_grouped_gemm: grouped_gemm's modes of float8_e4m3fn A and B (K and N multiples of 16), float32
// scales whose shapes tell the recipe (M, N: A's rows and B's columns of one group; G groups):
//   rowwise    2D x 3D scale_a (M,), scale_b (G, N);  3D x 3D (G, M), (G, N);  3D x 2D (G, M), (N,);
//              2D x 2D (G * M,), (G * N,) (each group's own rows and columns)
//   Block128   2D x 3D scale_a (M, K/128), scale_b (G, K/128, ceil(N/128)); 3D x 3D (G, M, K/128),
//              (G, K/128, ceil(N/128)); K a multiple of 128
// bias (G, N), or (N,) in 3D x 2D, of out_dtype; out_dtype bfloat16, float16 or float32.
struct ScaledGroupedProblem {
  GroupedProblem grouped;
  ScaleRecipe recipe;  // Rowwise or Block128
};
ScaledGroupedProblem check_scaled_grouped_gemm_inputs(const char* op, const at::Tensor& A, const at::Tensor& B,
                                                      const at::Tensor& scale_a, const at::Tensor& scale_b,
                                                      const c10::optional<at::Tensor>& offs,
                                                      const c10::optional<at::Tensor>& bias, at::ScalarType out_dtype,
                                                      const char* dtype_origin = "out_dtype");
// check_grouped_gemm_out, and out overlapping neither scale nor bias.
bool check_scaled_grouped_gemm_out(const char* op, const GroupedProblem& problem, const at::Tensor& A,
                                   const at::Tensor& B, const at::Tensor& scale_a, const at::Tensor& scale_b,
                                   const c10::optional<at::Tensor>& offs, const c10::optional<at::Tensor>& bias,
                                   const at::Tensor& out, at::ScalarType dtype, const char* dtype_origin);

// An out tensor: dense, no internal overlap, overlapping none of `inputs`. Returns true where the overlap
// analysis cannot decide (check_gemm_out).
bool check_out_memory(const char* op, const at::Tensor& out,
                      std::initializer_list<std::pair<const char*, const at::Tensor*>> inputs);

// Whether torch's float32 matmul precision allows TF32 on CUDA, as torch.mm (cuBLAS) reads it: the
// per-backend setting (torch.backends.cuda.matmul.fp32_precision, inheriting from
// torch.backends.fp32_precision where it is "none"), which the legacy allow_tf32 flag and
// set_float32_matmul_precision also set. Not the legacy getter (allowTF32CuBLAS): it throws once a user
// has set the new API ("mix of the legacy and new APIs").
bool matmul_allows_tf32();

// `other` has `input`'s shape, dtype and device (e.g. fused_add_rms_norm's residual).
void check_same_as(const char* op, const char* name, const at::Tensor& other, const at::Tensor& input);

// `t` is written in place: no element may share memory with another (e.g. an expanded tensor).
void check_written_in_place(const char* op, const char* name, const at::Tensor& t);

// Whether the memory of a's storage and b's intersect (neither empty): the same storage, or distinct
// storage objects over one buffer (torch.from_numpy of one array twice, torch.frombuffer, DLPack), which
// ATen's overlap analysis (storage identity) takes for disjoint.
bool storages_intersect(const at::Tensor& a, const at::Tensor& b);

// `w` (named `written`) is written in place while `other` is read or written: they must not share
// memory (also through distinct storages over one buffer: storages_intersect). Strided views of one
// buffer that ATen's overlap analysis cannot decide count as sharing, unless they are equal-shaped views
// shifted against each other by a shift this decides exactly (the two halves of x.chunk(2, -1) share
// nothing; checks.cpp, shifted_views_overlap).
void check_no_shared_memory(const char* op, const char* written, const at::Tensor& w, const char* other_name,
                            const at::Tensor& other);

// fused_add_rms_norm: check_norm_inputs, residual like input, and both written tensors free of
// internal overlap and sharing memory with nothing else.
void check_fused_add_rms_norm_inputs(const at::Tensor& input, const at::Tensor& residual,
                                     const at::Tensor& weight, const char* op = "fused_add_rms_norm");

}  // namespace ops
