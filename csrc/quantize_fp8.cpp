// ops::quantize_fp8: FP8 codes and their float32 scales (value = code * scale) per tensor, per row, per
// 1x128 group of a row or per 128x128 block of a matrix, from the data (dynamic) or given (static). The
// formula in ATen and the CPU op (its per-row and per-group forms by the CPU kernel in
// fused_cpu_kernels.h; CUDA: quantize_fp8_cuda.cpp; the same bits): amax in float32,
// scale = amax / max(dtype) (at least 1e-12 / max, so an all-zero group gives zeros), optionally rounded
// up to a power of two, code = x / scale clamped to +-max(dtype), cast once (round to nearest even). The
// scales are what ops.scaled_gemm takes.
#include <ostream>
#include <string>

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "checks.h"
#include "quantize_fp8.h"

namespace ops {
namespace {

constexpr int64_t kBlock = kScaleBlock;

using Granularity = Fp8Quantization::Granularity;

Granularity parse_granularity(const char* op, c10::string_view name) {
  if (name == "tensor") return Granularity::Tensor;
  if (name == "row") return Granularity::Row;
  if (name == "group") return Granularity::Group;
  if (name == "block") return Granularity::Block;
  TORCH_CHECK_VALUE(false, op, ": expected granularity to be one of \"tensor\", \"row\", \"group\" (1x128), "
                    "\"block\" (128x128), got \"", std::string(name), "\"");
}

int64_t blocks(int64_t n) { return (n + kBlock - 1) / kBlock; }

// The scale's shape for input of `sizes`.
std::vector<int64_t> scale_shape(at::IntArrayRef sizes, Granularity g) {
  std::vector<int64_t> shape(sizes.begin(), sizes.end());
  switch (g) {
    case Granularity::Tensor: return {};
    case Granularity::Row: shape.back() = 1; return shape;
    case Granularity::Group: shape.back() = blocks(shape.back()); return shape;
    case Granularity::Block: return {blocks(sizes[0]), blocks(sizes[1])};
  }
  return shape;
}

// The scale (of scale_shape) broadcast over x's elements.
at::Tensor expand(const at::Tensor& scale, at::IntArrayRef sizes, Granularity g) {
  const int64_t last = static_cast<int64_t>(sizes.size()) - 1;
  switch (g) {
    case Granularity::Tensor:
    case Granularity::Row: return scale;
    case Granularity::Group: return expand_block_scale(scale, last, sizes[last]);
    case Granularity::Block:
      return expand_block_scale(expand_block_scale(scale, 0, sizes[0]), 1, sizes[1]);
  }
  return scale;
}

// |x|'s maximum over each group, float32, of scale_shape (0 for an empty input).
at::Tensor amax(const at::Tensor& xf, Granularity g) {
  if (xf.numel() == 0) return at::zeros(scale_shape(xf.sizes(), g), xf.options());
  const at::Tensor a = xf.abs();
  const int64_t last = a.dim() - 1;
  switch (g) {
    case Granularity::Tensor: return a.amax();
    case Granularity::Row: return a.amax({last}, /*keepdim=*/true);
    case Granularity::Group: {
      const int64_t k = a.size(last), padded = blocks(k) * kBlock;
      at::Tensor p = at::constant_pad_nd(a, {0, padded - k});
      std::vector<int64_t> grouped(a.sizes().begin(), a.sizes().end() - 1);
      grouped.push_back(blocks(k));
      grouped.push_back(kBlock);
      return p.reshape(grouped).amax({last + 1});
    }
    case Granularity::Block: {
      const int64_t r = a.size(0), c = a.size(1);
      at::Tensor p = at::constant_pad_nd(a, {0, blocks(c) * kBlock - c, 0, blocks(r) * kBlock - r});
      return p.reshape({blocks(r), kBlock, blocks(c), kBlock}).amax({1, 3});
    }
  }
  return a;
}

// The smallest power of two >= each (positive) scale, from the bits; NaN and inf stay. exp2(ceil(log2(s)))
// is not it: float32 log2 rounds 512 * (1 + 2^-23) to 9, a scale below s (the CUDA kernels' pow2_ceil).
at::Tensor pow2_ceil(const at::Tensor& s) {
  const at::Tensor bits = s.view(at::kInt);
  const at::Tensor exponent = bits.bitwise_and(0x7f800000);
  const at::Tensor keep = bits.bitwise_and(0x007fffff).eq(0).logical_or_(exponent.eq(0x7f800000));
  return at::where(keep, bits, exponent.add(0x00800000)).view(at::kFloat);
}

// How the errors name the quantized tensor: input, or silu_and_mul_fp8's product of input's halves (sizes).
// Streamed only when a check fails.
struct QuantizedName {
  at::IntArrayRef input, sizes;
};

std::ostream& operator<<(std::ostream& os, const QuantizedName& q) {
  os << "input of shape " << q.input;
  if (!q.sizes.equals(q.input)) os << " (silu(gate) * up: " << q.sizes << ")";
  return os;
}

}  // namespace

Fp8Quantization check_quantize_fp8(const char* op, const at::Tensor& input, at::IntArrayRef sizes,
                                   c10::string_view granularity, c10::optional<at::ScalarType> dtype,
                                   const c10::optional<at::Tensor>& scale, bool pow2_scale) {
  TORCH_CHECK(input.defined(), op, ": input must be a defined tensor");
  TORCH_CHECK(input.dim() >= 1, op, ": expected input of shape (..., K), got a 0-D tensor");
  TORCH_CHECK(is_gemm_dtype(input.scalar_type()), op, ": expected input's dtype to be ", gemm_dtypes_text(),
              ", got ", torch_dtype_name(input.scalar_type()));
  TORCH_CHECK(input.layout() == at::kStrided, op, ": input must be a dense (strided) tensor");
  const QuantizedName quantized{input.sizes(), sizes};
  Fp8Quantization q;
  q.granularity = parse_granularity(op, granularity);
  TORCH_CHECK(q.granularity != Granularity::Block || sizes.size() == 2, op,
              ": granularity \"block\" (128x128) takes a 2-D matrix, got ", quantized);
  q.dtype = dtype.value_or(at::kFloat8_e4m3fn);
  TORCH_CHECK(q.dtype == at::kFloat8_e4m3fn || q.dtype == at::kFloat8_e5m2, op,
              ": expected dtype to be torch.float8_e4m3fn or torch.float8_e5m2, got ", torch_dtype_name(q.dtype));
  q.max = q.dtype == at::kFloat8_e4m3fn ? 448.0 : 57344.0;
  q.scale_shape = scale_shape(sizes, q.granularity);
  q.given = scale.has_value() && scale->defined();
  if (q.given) {
    TORCH_CHECK(!pow2_scale, op, ": pow2_scale rounds computed scales; a given scale is used as it is");
    TORCH_CHECK(scale->scalar_type() == at::kFloat, op, ": expected scale to be torch.float32, got ",
                torch_dtype_name(scale->scalar_type()));
    TORCH_CHECK(scale->device() == input.device(), op, ": expected scale on ", input.device(),
                " (input's device), got ", scale->device());
    TORCH_CHECK(scale->sizes().vec() == q.scale_shape || (q.granularity == Granularity::Tensor && scale->numel() == 1),
                op, ": expected scale of shape ", at::IntArrayRef(q.scale_shape), " for granularity \"",
                std::string(granularity), "\" and ", quantized, ", got ", scale->sizes());
  }
  return q;
}

std::tuple<at::Tensor, at::Tensor> quantize_fp8_formula(const Fp8Quantization& q, const at::Tensor& input,
                                                        const c10::optional<at::Tensor>& scale, bool pow2_scale) {
  const at::AutoDispatchBelowADInplaceOrView below_autograd;  // a backend kernel: not differentiable
  // Row-major, as the fake kernel and the kernels give the codes.
  const at::Tensor xf = input.contiguous().to(at::kFloat);
  at::Tensor s;
  if (q.given) {
    s = scale->reshape(q.scale_shape).clone(at::MemoryFormat::Contiguous);  // an output of its own
  } else {
    s = amax(xf, q.granularity).clamp_min(1e-12).div_(q.max);
    if (pow2_scale) s = pow2_ceil(s);
  }
  const at::Tensor codes = xf.div(expand(s, input.sizes(), q.granularity)).clamp_(-q.max, q.max).to(q.dtype);
  return {codes, s};
}

std::tuple<at::Tensor, at::Tensor> quantize_fp8_call(const char* op, const at::Tensor& input,
                                                     c10::string_view granularity, c10::optional<at::ScalarType> dtype,
                                                     const c10::optional<at::Tensor>& scale, bool pow2_scale) {
  check_quantize_fp8(op, input, input.sizes(), granularity, dtype, scale, pow2_scale);
  static const auto quantize =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("ops::quantize_fp8", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, c10::string_view,
                                                    c10::optional<at::ScalarType>, const c10::optional<at::Tensor>&,
                                                    bool)>();
  return quantize.call(input, granularity, dtype, scale, pow2_scale);
}

namespace {

// The CPU kernel: per row and per 1x128 group (dynamic or given), per tensor with a given scale, of float32,
// float16 and bfloat16 input; the formula for the rest (per tensor dynamic, 128x128 blocks, float64, empty).
std::tuple<at::Tensor, at::Tensor> quantize_fp8(const at::Tensor& input, c10::string_view granularity,
                                                c10::optional<at::ScalarType> dtype,
                                                const c10::optional<at::Tensor>& scale, bool pow2_scale) {
  const Fp8Quantization q = check_quantize_fp8("quantize_fp8", input, input.sizes(), granularity, dtype, scale,
                                               pow2_scale);
  const bool by_rows = q.granularity == Granularity::Row || q.granularity == Granularity::Group ||
                       (q.granularity == Granularity::Tensor && q.given);
  const at::ScalarType t = input.scalar_type();
  if (!by_rows || input.numel() == 0 || (t != at::kFloat && t != at::kHalf && t != at::kBFloat16)) {
    return quantize_fp8_formula(q, input, scale, pow2_scale);
  }
  const at::AutoDispatchBelowADInplaceOrView below_autograd;  // a backend kernel: not differentiable
  const at::Tensor x = input.contiguous();
  at::Tensor codes = at::empty(input.sizes(), input.options().dtype(q.dtype));
  const int64_t group = q.granularity == Granularity::Group ? kBlock : input.size(-1);
  if (q.given) {
    at::Tensor s = scale->reshape(q.scale_shape).clone(at::MemoryFormat::Contiguous);  // an output of its own
    quantize_fp8_rows_cpu(x, group, s.const_data_ptr<float>(), q.granularity == Granularity::Tensor ? 0 : 1,
                          false, codes, nullptr);
    return {codes, s};
  }
  at::Tensor s = at::empty(q.scale_shape, input.options().dtype(at::kFloat));
  quantize_fp8_rows_cpu(x, group, nullptr, 1, pow2_scale, codes, s.mutable_data_ptr<float>());
  return {codes, s};
}

}  // namespace
}  // namespace ops

TORCH_LIBRARY_IMPL(ops, CPU, m) { m.impl("quantize_fp8", &ops::quantize_fp8); }
