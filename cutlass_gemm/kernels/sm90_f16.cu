// SM90 float16 GEMMs, one per operand layout (see kernel_list.h).
#include "../sm90_gemm.cuh"

using ops::cutlass_gemm::KernelId;
using ops::cutlass_gemm::Sm90HalfConfig;

OPS_DEFINE_CUTLASS_GEMM(sm90_f16_rr, Sm90HalfConfig<KernelId::sm90_f16_rr>)
OPS_DEFINE_CUTLASS_GEMM(sm90_f16_rc, Sm90HalfConfig<KernelId::sm90_f16_rc>)
OPS_DEFINE_CUTLASS_GEMM(sm90_f16_cr, Sm90HalfConfig<KernelId::sm90_f16_cr>)
OPS_DEFINE_CUTLASS_GEMM(sm90_f16_cc, Sm90HalfConfig<KernelId::sm90_f16_cc>)
