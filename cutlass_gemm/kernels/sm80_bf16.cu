// SM80 bfloat16 GEMMs, one per operand layout (see kernel_list.h).
#include "../sm80_gemm.cuh"

OPS_DEFINE_SM80_GEMM(sm80_bf16_rr)
OPS_DEFINE_SM80_GEMM(sm80_bf16_rc)
OPS_DEFINE_SM80_GEMM(sm80_bf16_cr)
OPS_DEFINE_SM80_GEMM(sm80_bf16_cc)
