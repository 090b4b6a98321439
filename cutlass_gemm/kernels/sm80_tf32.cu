// SM80 float32 GEMMs on tf32 tensor cores (used when TF32 is allowed), one per operand layout.
#include "../sm80_gemm.cuh"

using ops::cutlass_gemm::KernelId;
using ops::cutlass_gemm::Sm80Tf32Config;

OPS_DEFINE_CUTLASS_GEMM(sm80_tf32_rr, Sm80Tf32Config<KernelId::sm80_tf32_rr>)
OPS_DEFINE_CUTLASS_GEMM(sm80_tf32_rc, Sm80Tf32Config<KernelId::sm80_tf32_rc>)
OPS_DEFINE_CUTLASS_GEMM(sm80_tf32_cr, Sm80Tf32Config<KernelId::sm80_tf32_cr>)
OPS_DEFINE_CUTLASS_GEMM(sm80_tf32_cc, Sm80Tf32Config<KernelId::sm80_tf32_cc>)
