#include "operands.h"

#include <algorithm>
#include <limits>

#include <ATen/ATen.h>

#include "../../csrc/checks.h"  // torch_dtype_name

namespace ops::cutlass_gemm {
namespace {

at::Tensor new_buffer(const at::Tensor& like, int64_t outer, int64_t ld, bool poison) {
  if (poison) {
    return at::full({outer, ld}, std::numeric_limits<double>::quiet_NaN(), like.options());
  }
  return at::empty({outer, ld}, like.options());
}

// The user's matrix `x` (the kernel's view before padding) copied into a buffer laid out as
// `plan` says, zero-filling the padded extents the kernel reads. Returns the buffer.
at::Tensor copy_operand(const at::Tensor& x, const OperandPlan& plan, bool poison) {
  const bool row = plan.layout == Layout::Row;
  // A column-major (rows x cols) matrix is a row-major (cols x rows) one.
  const at::Tensor src = row ? x : x.t();
  const int64_t outer = row ? plan.rows : plan.cols;
  const int64_t inner = row ? plan.cols : plan.rows;
  at::Tensor buffer = new_buffer(x, outer, plan.ld, poison);
  buffer.narrow(0, 0, src.size(0)).narrow(1, 0, src.size(1)).copy_(src);
  if (inner > src.size(1)) buffer.narrow(1, src.size(1), inner - src.size(1)).zero_();
  if (outer > src.size(0)) buffer.narrow(0, src.size(0), outer - src.size(0)).narrow(1, 0, inner).zero_();
  return buffer;
}

}  // namespace

bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0; }

std::string int32_extents_refusal(std::initializer_list<int64_t> extents) {
  return std::max(extents) > std::numeric_limits<int32_t>::max()
             ? "an extent of 2^31 or more (CUTLASS's problem sizes are int32)"
             : "";
}

at::Tensor aligned_contiguous(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return aligned16(c) ? c : c.clone();
}

bool tma_in_place(const at::Tensor& t, bool row_major) {
  const int64_t last = t.dim() - 1, bytes = t.element_size();
  const int64_t inner = row_major ? last : last - 1, outer = row_major ? last - 1 : last;
  return t.stride(inner) == 1 && t.stride(outer) >= std::max<int64_t>(1, t.size(inner)) &&
         t.stride(outer) * bytes % 16 == 0 && (t.dim() == 2 || t.stride(0) * bytes % 16 == 0) && aligned16(t);
}

at::Tensor tma_operand(const at::Tensor& t, bool row_major) {
  if (tma_in_place(t, row_major)) return t;
  // A fresh tensor of that layout: contiguous() keeps a view whose size-1 dimension has stride 1 (a (1, K)
  // transpose of (K, 1)), a leading dimension of 1 that CUTLASS's can_implement refuses.
  const int64_t last = t.dim() - 1;
  return row_major ? t.clone(at::MemoryFormat::Contiguous)
                   : t.transpose(last - 1, last).clone(at::MemoryFormat::Contiguous).transpose(last - 1, last);
}

MatrixView view_of(const at::Tensor& t) {
  return {t.size(0), t.size(1), t.stride(0), t.stride(1),
          reinterpret_cast<uint64_t>(t.const_data_ptr())};
}

StagedOperands::StagedOperands(const GemmPlan& plan, const at::Tensor& a, const at::Tensor& b,
                               const at::Tensor& d, const at::Tensor& bias, bool poison)
    : d_(d) {
  args_.m = plan.m;
  args_.n = plan.n;
  args_.k = plan.k;
  args_.lda = plan.a.ld;
  args_.ldb = plan.b.ld;
  args_.ldd = plan.d.ld;
  if (plan.a.source == Source::Copy) {
    a_buffer_ = copy_operand(a, plan.a, poison);
    args_.a = a_buffer_.const_data_ptr();
  } else {
    args_.a = a.const_data_ptr();
  }
  if (plan.b.source == Source::Copy) {
    b_buffer_ = copy_operand(b, plan.b, poison);
    args_.b = b_buffer_.const_data_ptr();
  } else {
    args_.b = b.const_data_ptr();
  }
  if (plan.d.source == Source::Copy) {
    d_buffer_ = new_buffer(d, plan.m, plan.d.ld, poison);
    args_.d = d_buffer_.data_ptr();
  } else {
    args_.d = d.data_ptr();
  }
  if (bias.defined()) {
    // The kernel reads plan.n bias values (N, zero-padded when N was padded) from a 16-byte aligned,
    // contiguous vector: copy the user's bias only when it is not already that.
    const int64_t n = bias.size(0);
    const bool usable = plan.n == n && bias.is_contiguous() &&
                        reinterpret_cast<uintptr_t>(bias.const_data_ptr()) % 16 == 0;
    if (usable) {
      bias_buffer_ = bias;
    } else {
      bias_buffer_ = at::zeros({plan.n}, bias.options());
      bias_buffer_.narrow(0, 0, n).copy_(bias);
    }
    args_.bias = bias_buffer_.const_data_ptr();
  }
}

void StagedOperands::finish() {
  if (d_buffer_.defined()) d_.copy_(d_buffer_.narrow(1, 0, d_.size(1)));
}

DType to_dtype(at::ScalarType type) {
  switch (type) {
    case at::kHalf: return DType::Half;
    case at::kBFloat16: return DType::BFloat16;
    case at::kFloat: return DType::Float;
    case at::kDouble: return DType::Double;
    default: TORCH_CHECK(false, "cutlass_gemm: unsupported dtype ", torch_dtype_name(type));
  }
}

}  // namespace ops::cutlass_gemm
