// The SM90 grouped GEMMs of bfloat16 (sm90_grouped_gemm.cuh): the three layouts the op runs. Candidate-only
// until measured against torch._grouped_mm on an H200.
#include "../sm90_grouped_gemm.cuh"

OPS_DEFINE_SM90_GROUPED_GEMM(bf16, cutlass::bfloat16_t)
