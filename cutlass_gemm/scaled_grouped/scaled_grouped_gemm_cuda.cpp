// ops::scaled_grouped_gemm on CUDA: no FP8 grouped kernel is built yet, so the CPU kernel's ATen formula per
// group runs on the device (scaled_grouped_gemm.cpp), the group ends copied to the host.
#include <torch/library.h>

#include "scaled_grouped_gemm.h"

TORCH_LIBRARY_IMPL(ops, CUDA, m) {
  m.impl("scaled_grouped_gemm", &ops::cutlass_gemm::scaled_grouped_gemm);
  m.impl("scaled_grouped_gemm.out", &ops::cutlass_gemm::scaled_grouped_gemm_out);
}
