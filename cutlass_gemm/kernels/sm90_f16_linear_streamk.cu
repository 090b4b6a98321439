// SM90 f16 GEMMs with bias + activation fused (ops.linear) on the stream-K scheduler, for small M (kernel_list.h).
#include "../sm90_gemm.cuh"

OPS_DEFINE_SM90_GEMM(sm90_f16_rc_none_streamk)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_relu_streamk)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_gelu_streamk)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_gelu_tanh_streamk)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_silu_streamk)
