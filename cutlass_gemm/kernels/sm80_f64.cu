// SM80 fp64 (DMMA) GEMMs, one per operand layout; also built into the sm_90a image (kernel_list.h).
#include "../sm80_gemm.cuh"

OPS_DEFINE_SM80_GEMM(sm80_f64_rr)
OPS_DEFINE_SM80_GEMM(sm80_f64_rc)
OPS_DEFINE_SM80_GEMM(sm80_f64_cr)
OPS_DEFINE_SM80_GEMM(sm80_f64_cc)
