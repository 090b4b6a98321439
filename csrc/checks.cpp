#include "checks.h"

#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

namespace ops {
namespace {

bool is_gemm_dtype(at::ScalarType t) {
  return t == at::kHalf || t == at::kBFloat16 || t == at::kFloat || t == at::kDouble;
}

}  // namespace

void check_gemm_inputs(const char* op, const at::Tensor& A, const at::Tensor& B) {
  TORCH_CHECK(A.defined() && B.defined(), op, ": A and B must be defined tensors");
  TORCH_CHECK(A.dim() == 2, op, ": expected A to be a 2-D matrix (M, K), got a ", A.dim(),
              "-D tensor of shape ", A.sizes());
  TORCH_CHECK(B.dim() == 2, op, ": expected B to be a 2-D matrix (K, N), got a ", B.dim(),
              "-D tensor of shape ", B.sizes());
  TORCH_CHECK(A.size(1) == B.size(0), op, ": A (M, K) and B (K, N) must agree on K, got A of shape ",
              A.sizes(), " and B of shape ", B.sizes());
  TORCH_CHECK(is_gemm_dtype(A.scalar_type()), op,
              ": expected A's dtype to be float16, bfloat16, float32 or float64, got ",
              A.scalar_type());
  TORCH_CHECK(A.scalar_type() == B.scalar_type(), op,
              ": A and B must have the same dtype, got A ", A.scalar_type(), " and B ",
              B.scalar_type());
  TORCH_CHECK(A.device() == B.device(), op, ": A and B must be on the same device, got A on ",
              A.device(), " and B on ", B.device());
  TORCH_CHECK(A.layout() == at::kStrided && B.layout() == at::kStrided, op,
              ": A and B must be dense (strided) tensors, got ", A.layout(), " and ", B.layout());
}

void check_gemm_out(const char* op, const at::Tensor& A, const at::Tensor& B,
                    const at::Tensor& out) {
  TORCH_CHECK(out.defined(), op, ": out must be a defined tensor");
  TORCH_CHECK(out.dim() == 2 && out.size(0) == A.size(0) && out.size(1) == B.size(1), op,
              ": expected out of shape (M, N) = (", A.size(0), ", ", B.size(1), "), got ",
              out.sizes());
  TORCH_CHECK(out.scalar_type() == A.scalar_type(), op, ": expected out's dtype to be ",
              A.scalar_type(), " (the dtype of A and B), got ", out.scalar_type());
  TORCH_CHECK(out.device() == A.device(), op, ": expected out on ", A.device(),
              " (the device of A and B), got ", out.device());
  TORCH_CHECK(out.layout() == at::kStrided, op, ": out must be a dense (strided) tensor");
  TORCH_CHECK(at::has_internal_overlap(out) != at::MemOverlap::Yes, op,
              ": out has internally overlapping memory (e.g. an expanded tensor); pass a tensor "
              "whose elements each have their own memory");
  for (const auto& [name, input] : {std::pair<const char*, const at::Tensor&>{"A", A}, {"B", B}}) {
    const auto status = at::get_overlap_status(out, input);
    TORCH_CHECK(status != at::MemOverlapStatus::Full && status != at::MemOverlapStatus::Partial, op,
                ": out overlaps ", name,
                " in memory; the result would overwrite its own input. Pass a separate out tensor.");
  }
}

}  // namespace ops
