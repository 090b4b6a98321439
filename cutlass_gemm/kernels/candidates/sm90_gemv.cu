// Candidate-only (built with OPS_CANDIDATE_KERNELS=1): the SIMT GEMV kernels for decode-sized GEMMs
// (M <= 16, x @ W^T), f16 and bf16, plain and with the ops.linear epilogues (kernel_list.h, simt_gemv.cuh).
#include "../simt_gemv.cuh"

OPS_DEFINE_SIMT_GEMV(sm90_f16_rc_gemv)
OPS_DEFINE_SIMT_GEMV(sm90_f16_rc_none_gemv)
OPS_DEFINE_SIMT_GEMV(sm90_f16_rc_relu_gemv)
OPS_DEFINE_SIMT_GEMV(sm90_f16_rc_gelu_gemv)
OPS_DEFINE_SIMT_GEMV(sm90_f16_rc_gelu_tanh_gemv)
OPS_DEFINE_SIMT_GEMV(sm90_f16_rc_silu_gemv)
OPS_DEFINE_SIMT_GEMV(sm90_bf16_rc_gemv)
OPS_DEFINE_SIMT_GEMV(sm90_bf16_rc_none_gemv)
OPS_DEFINE_SIMT_GEMV(sm90_bf16_rc_relu_gemv)
OPS_DEFINE_SIMT_GEMV(sm90_bf16_rc_gelu_gemv)
OPS_DEFINE_SIMT_GEMV(sm90_bf16_rc_gelu_tanh_gemv)
OPS_DEFINE_SIMT_GEMV(sm90_bf16_rc_silu_gemv)
