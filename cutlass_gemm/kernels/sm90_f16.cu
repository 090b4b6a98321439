// Every default SM90 float16 GEMM of kernel_list.h in one TU: the CUTLASS/CuTe templates the kernels
// share are instantiated once (measured with nvcc 13.0: 25 kernels in one TU compile in ~140 s, in
// seven TUs in ~560 s).
#include "sm90_gemm.cuh"

// General config (cooperative 128x128, 2x1 cluster), every layout.
OPS_DEFINE_SM90_GEMM(sm90_f16_rr)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc)
OPS_DEFINE_SM90_GEMM(sm90_f16_cr)
OPS_DEFINE_SM90_GEMM(sm90_f16_cc)

// Shape-specific configs for the rr and rc layouts.
OPS_DEFINE_SM90_GEMM(sm90_f16_rr_coop256)
OPS_DEFINE_SM90_GEMM(sm90_f16_rr_ping)
OPS_DEFINE_SM90_GEMM(sm90_f16_rr_streamk)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_coop256)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_ping)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_streamk)

// ops.linear: bias + activation in the epilogue (rc layout), on the general, stream-K and 128x256 configs.
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_none)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_none_streamk)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_none_coop256)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_relu)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_relu_streamk)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_relu_coop256)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_gelu)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_gelu_streamk)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_gelu_coop256)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_gelu_tanh)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_gelu_tanh_streamk)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_gelu_tanh_coop256)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_silu)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_silu_streamk)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_silu_coop256)
