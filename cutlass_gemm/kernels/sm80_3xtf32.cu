// SM80 float32 3xTF32 GEMMs: fp32-accurate, used when TF32 is not allowed (also on Hopper).
#include "../sm80_gemm.cuh"

OPS_DEFINE_SM80_GEMM(sm80_3xtf32_rr)
OPS_DEFINE_SM80_GEMM(sm80_3xtf32_rc)
OPS_DEFINE_SM80_GEMM(sm80_3xtf32_cr)
OPS_DEFINE_SM80_GEMM(sm80_3xtf32_cc)
