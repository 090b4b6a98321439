// SM80 float16 GEMMs, one per operand layout (see kernel_list.h).
#include "../sm80_gemm.cuh"

using ops::cutlass_gemm::KernelId;
using ops::cutlass_gemm::Sm80HalfConfig;

OPS_DEFINE_CUTLASS_GEMM(sm80_f16_rr, Sm80HalfConfig<KernelId::sm80_f16_rr>)
OPS_DEFINE_CUTLASS_GEMM(sm80_f16_rc, Sm80HalfConfig<KernelId::sm80_f16_rc>)
OPS_DEFINE_CUTLASS_GEMM(sm80_f16_cr, Sm80HalfConfig<KernelId::sm80_f16_cr>)
OPS_DEFINE_CUTLASS_GEMM(sm80_f16_cc, Sm80HalfConfig<KernelId::sm80_f16_cc>)
