// The FP8 quantization kernels (quantize_fp8_kernels.cuh) behind fused_kernels.h's plain-C++ launcher.
#include "quantize_fp8_kernels.cuh"

namespace ops::fused {

cudaError_t quantize_fp8(const QuantizeFp8Args& args, cudaStream_t stream) {
  if (!quant::run(args, stream)) return cudaErrorNotSupported;
  return cudaGetLastError();
}

}  // namespace ops::fused
