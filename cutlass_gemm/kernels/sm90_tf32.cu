// SM90 float32 GEMMs on tf32 wgmma (used when TF32 is allowed), one per operand layout.
#include "../sm90_gemm.cuh"

using ops::cutlass_gemm::KernelId;
using ops::cutlass_gemm::Sm90Tf32Config;

OPS_DEFINE_CUTLASS_GEMM(sm90_tf32_rr, Sm90Tf32Config<KernelId::sm90_tf32_rr>)
OPS_DEFINE_CUTLASS_GEMM(sm90_tf32_rc, Sm90Tf32Config<KernelId::sm90_tf32_rc>)
OPS_DEFINE_CUTLASS_GEMM(sm90_tf32_cr, Sm90Tf32Config<KernelId::sm90_tf32_cr>)
OPS_DEFINE_CUTLASS_GEMM(sm90_tf32_cc, Sm90Tf32Config<KernelId::sm90_tf32_cc>)
