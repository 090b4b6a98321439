// SM80 fp64 (DMMA) GEMMs, one per operand layout; also built into the sm_90a image (kernel_list.h).
#include "../sm80_gemm.cuh"

using ops::cutlass_gemm::KernelId;
using ops::cutlass_gemm::Sm80F64Config;

OPS_DEFINE_CUTLASS_GEMM(sm80_f64_rr, Sm80F64Config<KernelId::sm80_f64_rr>)
OPS_DEFINE_CUTLASS_GEMM(sm80_f64_rc, Sm80F64Config<KernelId::sm80_f64_rc>)
OPS_DEFINE_CUTLASS_GEMM(sm80_f64_cr, Sm80F64Config<KernelId::sm80_f64_cr>)
OPS_DEFINE_CUTLASS_GEMM(sm80_f64_cc, Sm80F64Config<KernelId::sm80_f64_cc>)
