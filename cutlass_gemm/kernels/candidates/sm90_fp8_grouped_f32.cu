// The SM90 FP8 grouped GEMMs with f32 output (sm90_scaled_grouped_gemm.cuh): blockwise and rowwise scales.
// Candidate-only until measured against torch._scaled_grouped_mm on an H100 or H200.
#include "../sm90_scaled_grouped_gemm.cuh"

OPS_DEFINE_SM90_SCALED_GROUPED_GEMM(f32, float)
