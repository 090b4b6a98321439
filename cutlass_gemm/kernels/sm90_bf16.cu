// SM90 bf16 GEMMs, one per operand layout (see kernel_list.h).
#include "../sm90_gemm.cuh"

using ops::cutlass_gemm::KernelId;
using ops::cutlass_gemm::Sm90HalfConfig;

OPS_DEFINE_CUTLASS_GEMM(sm90_bf16_rr, Sm90HalfConfig<KernelId::sm90_bf16_rr>)
OPS_DEFINE_CUTLASS_GEMM(sm90_bf16_rc, Sm90HalfConfig<KernelId::sm90_bf16_rc>)
OPS_DEFINE_CUTLASS_GEMM(sm90_bf16_cr, Sm90HalfConfig<KernelId::sm90_bf16_cr>)
OPS_DEFINE_CUTLASS_GEMM(sm90_bf16_cc, Sm90HalfConfig<KernelId::sm90_bf16_cc>)
