// SM80 float32 GEMMs on tf32 tensor cores (used when TF32 is allowed), one per operand layout.
#include "../sm80_gemm.cuh"

OPS_DEFINE_SM80_GEMM(sm80_tf32_rr)
OPS_DEFINE_SM80_GEMM(sm80_tf32_rc)
OPS_DEFINE_SM80_GEMM(sm80_tf32_cr)
OPS_DEFINE_SM80_GEMM(sm80_tf32_cc)
