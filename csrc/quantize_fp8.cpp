// ops::quantize_fp8: FP8 codes and their float32 scales (value = code * scale) per tensor, per row, per
// 1x128 group of a row or per 128x128 block of a matrix, from the data (dynamic) or given (static). The
// formula in ATen, for CPU and CUDA: amax in float32, scale = amax / max(dtype) (at least 1e-12 / max,
// so an all-zero group gives zeros), optionally rounded up to a power of two, code = x / scale clamped to
// +-max(dtype), cast once. The scales are what ops.scaled_gemm takes for each recipe.
#include <string>

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include "checks.h"
#include "quantize_fp8.h"

namespace ops {
namespace {

constexpr int64_t kBlock = kScaleBlock;

enum class Granularity { Tensor, Row, Group, Block };

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

}  // namespace

std::tuple<at::Tensor, at::Tensor> quantize_fp8_as(const char* op, const at::Tensor& input,
                                                   c10::string_view granularity, c10::optional<at::ScalarType> dtype,
                                                   const c10::optional<at::Tensor>& scale, bool pow2_scale) {
  TORCH_CHECK(input.defined(), op, ": input must be a defined tensor");
  TORCH_CHECK(input.dim() >= 1, op, ": expected input of shape (..., K), got a 0-D tensor");
  TORCH_CHECK(is_gemm_dtype(input.scalar_type()), op, ": expected input's dtype to be ", gemm_dtypes_text(),
              ", got ", torch_dtype_name(input.scalar_type()));
  TORCH_CHECK(input.layout() == at::kStrided, op, ": input must be a dense (strided) tensor");
  const Granularity g = parse_granularity(op, granularity);
  TORCH_CHECK(g != Granularity::Block || input.dim() == 2, op,
              ": granularity \"block\" (128x128) takes a 2-D matrix, got input of shape ", input.sizes());
  const at::ScalarType out = dtype.value_or(at::kFloat8_e4m3fn);
  TORCH_CHECK(out == at::kFloat8_e4m3fn || out == at::kFloat8_e5m2, op,
              ": expected dtype to be torch.float8_e4m3fn or torch.float8_e5m2, got ", torch_dtype_name(out));
  const double max = out == at::kFloat8_e4m3fn ? 448.0 : 57344.0;
  const std::vector<int64_t> shape = scale_shape(input.sizes(), g);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;  // a backend kernel: not differentiable
  const at::Tensor xf = input.to(at::kFloat);
  at::Tensor s;
  if (scale.has_value() && scale->defined()) {
    TORCH_CHECK(!pow2_scale, op, ": pow2_scale rounds computed scales; a given scale is used as it is");
    TORCH_CHECK(scale->scalar_type() == at::kFloat, op, ": expected scale to be torch.float32, got ",
                torch_dtype_name(scale->scalar_type()));
    TORCH_CHECK(scale->device() == input.device(), op, ": expected scale on ", input.device(),
                " (input's device), got ", scale->device());
    TORCH_CHECK(scale->sizes().vec() == shape || (g == Granularity::Tensor && scale->numel() == 1), op,
                ": expected scale of shape ", at::IntArrayRef(shape), " for granularity \"", std::string(granularity),
                "\" and input of shape ", input.sizes(), ", got ", scale->sizes());
    s = scale->reshape(shape).clone();  // an output of its own (the schema's outputs alias no input)
  } else {
    s = amax(xf, g).clamp_min(1e-12).div_(max);
    if (pow2_scale) s = at::exp2(at::ceil(at::log2(s)));
  }
  const at::Tensor q = xf.div(expand(s, input.sizes(), g)).clamp_(-max, max).to(out);
  return {q, s};
}

namespace {

std::tuple<at::Tensor, at::Tensor> quantize_fp8(const at::Tensor& input, c10::string_view granularity,
                                                c10::optional<at::ScalarType> dtype,
                                                const c10::optional<at::Tensor>& scale, bool pow2_scale) {
  return quantize_fp8_as("quantize_fp8", input, granularity, dtype, scale, pow2_scale);
}

}  // namespace
}  // namespace ops

TORCH_LIBRARY_IMPL(ops, CPU, m) { m.impl("quantize_fp8", &ops::quantize_fp8); }
TORCH_LIBRARY_IMPL(ops, CUDA, m) { m.impl("quantize_fp8", &ops::quantize_fp8); }
