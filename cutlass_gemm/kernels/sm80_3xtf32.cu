// SM80 float32 3xTF32 GEMMs: fp32-accurate, used when TF32 is not allowed (also on Hopper).
#include "../sm80_gemm.cuh"

using ops::cutlass_gemm::KernelId;
using ops::cutlass_gemm::Sm80Fast3xTf32Config;

OPS_DEFINE_CUTLASS_GEMM(sm80_3xtf32_rr, Sm80Fast3xTf32Config<KernelId::sm80_3xtf32_rr>)
OPS_DEFINE_CUTLASS_GEMM(sm80_3xtf32_rc, Sm80Fast3xTf32Config<KernelId::sm80_3xtf32_rc>)
OPS_DEFINE_CUTLASS_GEMM(sm80_3xtf32_cr, Sm80Fast3xTf32Config<KernelId::sm80_3xtf32_cr>)
OPS_DEFINE_CUTLASS_GEMM(sm80_3xtf32_cc, Sm80Fast3xTf32Config<KernelId::sm80_3xtf32_cc>)
