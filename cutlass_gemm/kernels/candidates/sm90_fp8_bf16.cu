// The SM90 FP8 scaled GEMMs with bf16 output (sm90_scaled_gemm.cuh): every activation, fast and two-level
// accumulation. Candidate-only until measured against torch._scaled_mm on an H200.
#include "../sm90_scaled_gemm.cuh"

OPS_DEFINE_SM90_SCALED_GEMM(bf16, cutlass::bfloat16_t)
