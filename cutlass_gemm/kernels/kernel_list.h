// The deliberate list of CUTLASS GEMM instantiations.
//
// Plain C++ (no CUTLASS, no torch): included by the host planner (metadata), by the launcher
// registry (function pointers, CUDA builds only) and by the kernel translation units (definitions).
//
// Every kernel computes D (M x N, row-major, ldd) = A (M x K) @ B (K x N) with fp32 accumulation
// (fp64 for double). A and B are row-major (R) or column-major (C); the kernel id ends in
// <layout A><layout B>, e.g. `rc` = A row-major (K-major), B column-major (K-major): the "TN" GEMM.
// A column-major output is handled by the planner as D^T = B^T A^T, so no kernel writes one.
//
// X(id, sm, dtype, math, layout_a, layout_b, alignment_elements, on_sm90, epilogue, config)
//   id        the C++ identifier (KernelId and the launcher symbols). The kernel's public name
//             (ops.kernels(), tactic names, tuning caches) is kernel_name(): spelled from its fields
//             as CUTLASS's generator spells its kernels (core/kernel_names.cpp).
//   sm        80: CUTLASS 2.x SM80 tensor-op kernel (runs on sm80..sm89 and, where built for 9.0a, sm90)
//             90: CUTLASS 3.x SM90 TMA warp-specialized kernel (sm_90a only)
//   math      Standard: the dtype's native tensor-core math; TF32: fp32 inputs rounded to tf32;
//             Fast3xTF32: fp32-accurate split-tf32 emulation (CUTLASS OpMultiplyAddFastF32)
//   alignment required alignment of base pointers, leading dimensions and contiguous extents, in
//             elements (16 bytes for 16/32-bit types; 1 for fp64, whose SM80 kernels load 8 bytes)
//   epilogue  Plain: D = A B. Bias<Act>: D = act(A B + bias), bias a per-column (length N) vector
//             (null: no bias), fused into the CUTLASS epilogue (ops.linear); act is Identity, ReLU,
//             GELU (erf), GELUTanh (tanh approximation) or SiLU.
//   on_sm90   1 if the kernel is built into the sm_90a image too (an SM80 kernel Hopper dispatches
//             to); the kernel TUs read this column, so the planner and the binary cannot disagree
//   config    tile shape, cluster shape and schedule (sm90_gemm.cuh builds the kernel from it; the
//             tactic heuristic in tactic.cpp chooses among the configs of one dtype/layout/epilogue):
//             Sm80           CUTLASS 2.x, one tile per dtype (sm80_gemm.cuh)
//             Coop128x128    cooperative (2 consumer warpgroups on one tile), 128x128 tile (K: 64
//                            for 16-bit types, 32 for tf32), 2x1 cluster, persistent data-parallel
//                            scheduler: the general-purpose kernel, every layout
//             Coop128x256    cooperative, 128x256x64 tile, 2x1 cluster: large M and N (twice the
//                            arithmetic intensity per CTA, fewer tiles to schedule)
//             Ping64x128     ping-pong (2 consumer warpgroups on alternate tiles, one's epilogue
//                            overlapping the other's mainloop), 64x128x64 tile, 1x1 cluster: twice
//                            as many tiles as 128x128 for problems under one wave with a short K
//             StreamK128x128 cooperative, 128x128x64 tile, 1x1 cluster, stream-K tile scheduler:
//                            data-parallel, split-K or stream-K chosen at run time, for problems
//                            with too few output tiles to fill the GPU (small M, e.g. decode) and
//                            a long K
//             SwapStreamK128x32  the transposed problem D^T = B^T A^T (N x M, so D column-major, i.e.
//                            the row-major D) on 128x32 tiles, cooperative, 1x1 cluster, stream-K
//                            scheduler: swap-AB for small M, where M (<= 32 in one tile column)
//                            is the kernel's N and the weight streams through the 128-row side. The
//                            layout columns are those of the GEMM served: the kernel reads B^T
//                            (flipped layout of B) as its A and A^T as its B. No bias epilogue.
//             Ping128x128    ping-pong, 128x128x64 tile, 2x1 cluster: vLLM's and PyTorch's large-M choice;
//                            one consumer warpgroup's epilogue (bias + activation) runs under the
//                            other's mainloop, where the cooperative kernels run it after theirs
//             Coop128x256C1x2  cooperative 128x256x64, 1x2 cluster: the A tile multicast instead of B
//             Coop256x128    cooperative, 256x128x64 tile, 2x1 cluster: the transposed shape of the
//                            wide tile, for M > N
//             Ping64x128C2x1 ping-pong 64x128x64 with a 2x1 cluster (B multicast to 2 CTAs): vLLM's and
//                            PyTorch's choice for M in (64, 128]
//             SwapPing64x16, SwapPing64x32  swap-AB data-parallel: D^T = B^T A^T on 64x16 / 64x32
//                            tiles of D^T (64 rows of the weight by 16 / 32 tokens), ping-pong, 1x1
//                            cluster, persistent data-parallel scheduler (one tile per CTA at decode
//                            sizes, no K split, no workspace): vLLM's decode configuration
//             SimtGemv       not CUTLASS: a hand-written CUDA-core kernel (simt_gemv.cuh) for M <= 16
//                            with B column-major (x @ W^T), each weight byte loaded once by one warp
//                            of 4 output columns, fp32 FMAs with every row of A: decode-sized GEMMs
//                            stream the weight, and this streams it with no wasted tile rows and no
//                            K-split reduction. Same epilogues (bias + activation functors), sm_90a.
//
// What each group is for:
//   sm90_{f16,bf16}_*   Hopper half-precision GEMMs (wgmma, TMA, 128x128x64 tile, 2x1 cluster,
//                       cooperative schedule).
//   sm90_tf32_*         Hopper fp32 GEMM when the user allowed TF32 (torch.backends.cuda.matmul).
//   sm80_{f16,bf16}_*   Ampere/Ada half-precision GEMMs (mma.sync, cp.async, 4 stages).
//   sm80_tf32_*         Ampere/Ada fp32 GEMM when TF32 is allowed.
//   sm80_3xtf32_*       fp32 GEMM when TF32 is NOT allowed, on Ampere, Ada and Hopper (CUTLASS 4.2 has
//                       no SM90 3xTF32 kernel): accuracy comparable to fp32 SIMT.
//   sm80_f64_*          fp64 GEMM (DMMA) on Ampere and Hopper.
//   sm{90,80}_{f16,bf16}_rc_<act>  ops.linear on half types: x (M, K) row-major times an nn.Linear
//                       weight (N, K) row-major, i.e. B column-major ("rc"), with bias + activation
//                       fused into the epilogue. One layout only: other layouts are copied first.
//   sm90_{f16,bf16}_{rr,rc}_{coop256,ping,streamk}  the shape-specific Hopper configs above, for the
//                       two layouts real workloads use (rr: torch.mm of row-major tensors; rc: x @ W^T
//                       with an nn.Linear weight). Other layouts run the Coop128x128 kernels. 12
//                       kernels instead of 24.
//   sm90_{f16,bf16}_rc_<act>_streamk  ops.linear at small M (decode): the fused epilogue on the
//                       stream-K config, so a GEMM with few output tiles still fills the GPU.
//   sm90_{f16,bf16}_rc_<act>_coop256  ops.linear at large M and N (prefill, training): the fused
//                       epilogue on 128x256 tiles, as the plain GEMM gets (on 128x128 tiles the fused
//                       linear ran at 0.88-0.96x of torch._addmm_activation at T = 1024-4096, 2026-11-30).
//   sm90_{f16,bf16}_{rr,rc}_swap  swap-AB candidates for small M (decode), to be measured against the
//                       stream-K kernels (tactic.h); the heuristic does not choose them, and they are
//                       built only with OPS_CANDIDATE_KERNELS=1.
//   sm90_{f16,bf16}_{rr,rc}_{ping128,coop256c12,coop256x128,pingc2,swap64x16,swap64x32} and
//   sm90_{f16,bf16}_rc_<act>_ping128  the configurations the references win with (vLLM, PyTorch,
//                       CUTLASS's default SM90 set), built only with OPS_CANDIDATE_KERNELS=1 for the GPU
//                       sweep to measure against the default ones (the heuristic does not choose them).
//   sm90_{f16,bf16}_rc[_<act>]_gemv  the SIMT GEMV candidates for M <= 16 (decode), plain GEMM and
//                       ops.linear: only the rc layout, which the decode GEMMs of a model have (x @ W^T);
//                       measured against the tensor-core kernels; built only with OPS_CANDIDATE_KERNELS=1.
#pragma once

#include <cstdint>

#include "../../csrc/activation.h"

#define OPS_CUTLASS_GEMM_KERNELS(X) OPS_CUTLASS_GEMM_DEFAULT_KERNELS(X) OPS_CUTLASS_GEMM_CANDIDATE_KERNELS(X)

// The configurations the dispatcher can choose on its own (tactic.cpp): always built.
#define OPS_CUTLASS_GEMM_DEFAULT_KERNELS(X) \
  X(sm90_f16_rr, 90, Half, Standard, Row, Row, 8, 1, Plain, Coop128x128) \
  X(sm90_f16_rc, 90, Half, Standard, Row, Col, 8, 1, Plain, Coop128x128) \
  X(sm90_f16_cr, 90, Half, Standard, Col, Row, 8, 1, Plain, Coop128x128) \
  X(sm90_f16_cc, 90, Half, Standard, Col, Col, 8, 1, Plain, Coop128x128) \
  X(sm90_bf16_rr, 90, BFloat16, Standard, Row, Row, 8, 1, Plain, Coop128x128) \
  X(sm90_bf16_rc, 90, BFloat16, Standard, Row, Col, 8, 1, Plain, Coop128x128) \
  X(sm90_bf16_cr, 90, BFloat16, Standard, Col, Row, 8, 1, Plain, Coop128x128) \
  X(sm90_bf16_cc, 90, BFloat16, Standard, Col, Col, 8, 1, Plain, Coop128x128) \
  X(sm90_tf32_rr, 90, Float, TF32, Row, Row, 4, 1, Plain, Coop128x128) \
  X(sm90_tf32_rc, 90, Float, TF32, Row, Col, 4, 1, Plain, Coop128x128) \
  X(sm90_tf32_cr, 90, Float, TF32, Col, Row, 4, 1, Plain, Coop128x128) \
  X(sm90_tf32_cc, 90, Float, TF32, Col, Col, 4, 1, Plain, Coop128x128) \
  X(sm80_f16_rr, 80, Half, Standard, Row, Row, 8, 0, Plain, Sm80) \
  X(sm80_f16_rc, 80, Half, Standard, Row, Col, 8, 0, Plain, Sm80) \
  X(sm80_f16_cr, 80, Half, Standard, Col, Row, 8, 0, Plain, Sm80) \
  X(sm80_f16_cc, 80, Half, Standard, Col, Col, 8, 0, Plain, Sm80) \
  X(sm80_bf16_rr, 80, BFloat16, Standard, Row, Row, 8, 0, Plain, Sm80) \
  X(sm80_bf16_rc, 80, BFloat16, Standard, Row, Col, 8, 0, Plain, Sm80) \
  X(sm80_bf16_cr, 80, BFloat16, Standard, Col, Row, 8, 0, Plain, Sm80) \
  X(sm80_bf16_cc, 80, BFloat16, Standard, Col, Col, 8, 0, Plain, Sm80) \
  X(sm80_tf32_rr, 80, Float, TF32, Row, Row, 4, 0, Plain, Sm80) \
  X(sm80_tf32_rc, 80, Float, TF32, Row, Col, 4, 0, Plain, Sm80) \
  X(sm80_tf32_cr, 80, Float, TF32, Col, Row, 4, 0, Plain, Sm80) \
  X(sm80_tf32_cc, 80, Float, TF32, Col, Col, 4, 0, Plain, Sm80) \
  X(sm80_3xtf32_rr, 80, Float, Fast3xTF32, Row, Row, 4, 1, Plain, Sm80) \
  X(sm80_3xtf32_rc, 80, Float, Fast3xTF32, Row, Col, 4, 1, Plain, Sm80) \
  X(sm80_3xtf32_cr, 80, Float, Fast3xTF32, Col, Row, 4, 1, Plain, Sm80) \
  X(sm80_3xtf32_cc, 80, Float, Fast3xTF32, Col, Col, 4, 1, Plain, Sm80) \
  X(sm80_f64_rr, 80, Double, Standard, Row, Row, 1, 1, Plain, Sm80) \
  X(sm80_f64_rc, 80, Double, Standard, Row, Col, 1, 1, Plain, Sm80) \
  X(sm80_f64_cr, 80, Double, Standard, Col, Row, 1, 1, Plain, Sm80) \
  X(sm80_f64_cc, 80, Double, Standard, Col, Col, 1, 1, Plain, Sm80) \
  X(sm90_f16_rc_none, 90, Half, Standard, Row, Col, 8, 1, BiasIdentity, Coop128x128) \
  X(sm90_f16_rc_relu, 90, Half, Standard, Row, Col, 8, 1, BiasReLU, Coop128x128) \
  X(sm90_f16_rc_gelu, 90, Half, Standard, Row, Col, 8, 1, BiasGELU, Coop128x128) \
  X(sm90_f16_rc_gelu_tanh, 90, Half, Standard, Row, Col, 8, 1, BiasGELUTanh, Coop128x128) \
  X(sm90_f16_rc_silu, 90, Half, Standard, Row, Col, 8, 1, BiasSiLU, Coop128x128) \
  X(sm90_bf16_rc_none, 90, BFloat16, Standard, Row, Col, 8, 1, BiasIdentity, Coop128x128) \
  X(sm90_bf16_rc_relu, 90, BFloat16, Standard, Row, Col, 8, 1, BiasReLU, Coop128x128) \
  X(sm90_bf16_rc_gelu, 90, BFloat16, Standard, Row, Col, 8, 1, BiasGELU, Coop128x128) \
  X(sm90_bf16_rc_gelu_tanh, 90, BFloat16, Standard, Row, Col, 8, 1, BiasGELUTanh, Coop128x128) \
  X(sm90_bf16_rc_silu, 90, BFloat16, Standard, Row, Col, 8, 1, BiasSiLU, Coop128x128) \
  X(sm80_f16_rc_none, 80, Half, Standard, Row, Col, 8, 0, BiasIdentity, Sm80) \
  X(sm80_f16_rc_relu, 80, Half, Standard, Row, Col, 8, 0, BiasReLU, Sm80) \
  X(sm80_f16_rc_gelu, 80, Half, Standard, Row, Col, 8, 0, BiasGELU, Sm80) \
  X(sm80_f16_rc_gelu_tanh, 80, Half, Standard, Row, Col, 8, 0, BiasGELUTanh, Sm80) \
  X(sm80_f16_rc_silu, 80, Half, Standard, Row, Col, 8, 0, BiasSiLU, Sm80) \
  X(sm80_bf16_rc_none, 80, BFloat16, Standard, Row, Col, 8, 0, BiasIdentity, Sm80) \
  X(sm80_bf16_rc_relu, 80, BFloat16, Standard, Row, Col, 8, 0, BiasReLU, Sm80) \
  X(sm80_bf16_rc_gelu, 80, BFloat16, Standard, Row, Col, 8, 0, BiasGELU, Sm80) \
  X(sm80_bf16_rc_gelu_tanh, 80, BFloat16, Standard, Row, Col, 8, 0, BiasGELUTanh, Sm80) \
  X(sm80_bf16_rc_silu, 80, BFloat16, Standard, Row, Col, 8, 0, BiasSiLU, Sm80) \
  X(sm90_f16_rr_coop256, 90, Half, Standard, Row, Row, 8, 1, Plain, Coop128x256) \
  X(sm90_f16_rr_ping, 90, Half, Standard, Row, Row, 8, 1, Plain, Ping64x128) \
  X(sm90_f16_rr_streamk, 90, Half, Standard, Row, Row, 8, 1, Plain, StreamK128x128) \
  X(sm90_f16_rc_coop256, 90, Half, Standard, Row, Col, 8, 1, Plain, Coop128x256) \
  X(sm90_f16_rc_ping, 90, Half, Standard, Row, Col, 8, 1, Plain, Ping64x128) \
  X(sm90_f16_rc_streamk, 90, Half, Standard, Row, Col, 8, 1, Plain, StreamK128x128) \
  X(sm90_bf16_rr_coop256, 90, BFloat16, Standard, Row, Row, 8, 1, Plain, Coop128x256) \
  X(sm90_bf16_rr_ping, 90, BFloat16, Standard, Row, Row, 8, 1, Plain, Ping64x128) \
  X(sm90_bf16_rr_streamk, 90, BFloat16, Standard, Row, Row, 8, 1, Plain, StreamK128x128) \
  X(sm90_bf16_rc_coop256, 90, BFloat16, Standard, Row, Col, 8, 1, Plain, Coop128x256) \
  X(sm90_bf16_rc_ping, 90, BFloat16, Standard, Row, Col, 8, 1, Plain, Ping64x128) \
  X(sm90_bf16_rc_streamk, 90, BFloat16, Standard, Row, Col, 8, 1, Plain, StreamK128x128) \
  X(sm90_f16_rc_none_streamk, 90, Half, Standard, Row, Col, 8, 1, BiasIdentity, StreamK128x128) \
  X(sm90_f16_rc_relu_streamk, 90, Half, Standard, Row, Col, 8, 1, BiasReLU, StreamK128x128) \
  X(sm90_f16_rc_gelu_streamk, 90, Half, Standard, Row, Col, 8, 1, BiasGELU, StreamK128x128) \
  X(sm90_f16_rc_gelu_tanh_streamk, 90, Half, Standard, Row, Col, 8, 1, BiasGELUTanh, StreamK128x128) \
  X(sm90_f16_rc_silu_streamk, 90, Half, Standard, Row, Col, 8, 1, BiasSiLU, StreamK128x128) \
  X(sm90_bf16_rc_none_streamk, 90, BFloat16, Standard, Row, Col, 8, 1, BiasIdentity, StreamK128x128) \
  X(sm90_bf16_rc_relu_streamk, 90, BFloat16, Standard, Row, Col, 8, 1, BiasReLU, StreamK128x128) \
  X(sm90_bf16_rc_gelu_streamk, 90, BFloat16, Standard, Row, Col, 8, 1, BiasGELU, StreamK128x128) \
  X(sm90_bf16_rc_gelu_tanh_streamk, 90, BFloat16, Standard, Row, Col, 8, 1, BiasGELUTanh, StreamK128x128) \
  X(sm90_bf16_rc_silu_streamk, 90, BFloat16, Standard, Row, Col, 8, 1, BiasSiLU, StreamK128x128) \
  X(sm90_f16_rc_none_coop256, 90, Half, Standard, Row, Col, 8, 1, BiasIdentity, Coop128x256) \
  X(sm90_f16_rc_relu_coop256, 90, Half, Standard, Row, Col, 8, 1, BiasReLU, Coop128x256) \
  X(sm90_f16_rc_gelu_coop256, 90, Half, Standard, Row, Col, 8, 1, BiasGELU, Coop128x256) \
  X(sm90_f16_rc_gelu_tanh_coop256, 90, Half, Standard, Row, Col, 8, 1, BiasGELUTanh, Coop128x256) \
  X(sm90_f16_rc_silu_coop256, 90, Half, Standard, Row, Col, 8, 1, BiasSiLU, Coop128x256) \
  X(sm90_bf16_rc_none_coop256, 90, BFloat16, Standard, Row, Col, 8, 1, BiasIdentity, Coop128x256) \
  X(sm90_bf16_rc_relu_coop256, 90, BFloat16, Standard, Row, Col, 8, 1, BiasReLU, Coop128x256) \
  X(sm90_bf16_rc_gelu_coop256, 90, BFloat16, Standard, Row, Col, 8, 1, BiasGELU, Coop128x256) \
  X(sm90_bf16_rc_gelu_tanh_coop256, 90, BFloat16, Standard, Row, Col, 8, 1, BiasGELUTanh, Coop128x256) \
  X(sm90_bf16_rc_silu_coop256, 90, BFloat16, Standard, Row, Col, 8, 1, BiasSiLU, Coop128x256)

// Candidate-only configurations (candidate_only() below): the heuristic never chooses them; they
// are built with OPS_CANDIDATE_KERNELS=1 (setup.py) for benchmarks.gemm --candidates, autotuning and
// set_tactic. Without it they stay in the planner's tables but not in its families.
#define OPS_CUTLASS_GEMM_CANDIDATE_KERNELS(X) \
  X(sm90_f16_rr_ping128, 90, Half, Standard, Row, Row, 8, 1, Plain, Ping128x128) \
  X(sm90_f16_rc_ping128, 90, Half, Standard, Row, Col, 8, 1, Plain, Ping128x128) \
  X(sm90_f16_rr_coop256c12, 90, Half, Standard, Row, Row, 8, 1, Plain, Coop128x256C1x2) \
  X(sm90_f16_rc_coop256c12, 90, Half, Standard, Row, Col, 8, 1, Plain, Coop128x256C1x2) \
  X(sm90_f16_rr_coop256x128, 90, Half, Standard, Row, Row, 8, 1, Plain, Coop256x128) \
  X(sm90_f16_rc_coop256x128, 90, Half, Standard, Row, Col, 8, 1, Plain, Coop256x128) \
  X(sm90_f16_rr_pingc2, 90, Half, Standard, Row, Row, 8, 1, Plain, Ping64x128C2x1) \
  X(sm90_f16_rc_pingc2, 90, Half, Standard, Row, Col, 8, 1, Plain, Ping64x128C2x1) \
  X(sm90_f16_rr_swap64x16, 90, Half, Standard, Row, Row, 8, 1, Plain, SwapPing64x16) \
  X(sm90_f16_rc_swap64x16, 90, Half, Standard, Row, Col, 8, 1, Plain, SwapPing64x16) \
  X(sm90_f16_rr_swap64x32, 90, Half, Standard, Row, Row, 8, 1, Plain, SwapPing64x32) \
  X(sm90_f16_rc_swap64x32, 90, Half, Standard, Row, Col, 8, 1, Plain, SwapPing64x32) \
  X(sm90_f16_rc_none_ping128, 90, Half, Standard, Row, Col, 8, 1, BiasIdentity, Ping128x128) \
  X(sm90_f16_rc_relu_ping128, 90, Half, Standard, Row, Col, 8, 1, BiasReLU, Ping128x128) \
  X(sm90_f16_rc_gelu_ping128, 90, Half, Standard, Row, Col, 8, 1, BiasGELU, Ping128x128) \
  X(sm90_f16_rc_gelu_tanh_ping128, 90, Half, Standard, Row, Col, 8, 1, BiasGELUTanh, Ping128x128) \
  X(sm90_f16_rc_silu_ping128, 90, Half, Standard, Row, Col, 8, 1, BiasSiLU, Ping128x128) \
  X(sm90_bf16_rr_ping128, 90, BFloat16, Standard, Row, Row, 8, 1, Plain, Ping128x128) \
  X(sm90_bf16_rc_ping128, 90, BFloat16, Standard, Row, Col, 8, 1, Plain, Ping128x128) \
  X(sm90_bf16_rr_coop256c12, 90, BFloat16, Standard, Row, Row, 8, 1, Plain, Coop128x256C1x2) \
  X(sm90_bf16_rc_coop256c12, 90, BFloat16, Standard, Row, Col, 8, 1, Plain, Coop128x256C1x2) \
  X(sm90_bf16_rr_coop256x128, 90, BFloat16, Standard, Row, Row, 8, 1, Plain, Coop256x128) \
  X(sm90_bf16_rc_coop256x128, 90, BFloat16, Standard, Row, Col, 8, 1, Plain, Coop256x128) \
  X(sm90_bf16_rr_pingc2, 90, BFloat16, Standard, Row, Row, 8, 1, Plain, Ping64x128C2x1) \
  X(sm90_bf16_rc_pingc2, 90, BFloat16, Standard, Row, Col, 8, 1, Plain, Ping64x128C2x1) \
  X(sm90_bf16_rr_swap64x16, 90, BFloat16, Standard, Row, Row, 8, 1, Plain, SwapPing64x16) \
  X(sm90_bf16_rc_swap64x16, 90, BFloat16, Standard, Row, Col, 8, 1, Plain, SwapPing64x16) \
  X(sm90_bf16_rr_swap64x32, 90, BFloat16, Standard, Row, Row, 8, 1, Plain, SwapPing64x32) \
  X(sm90_bf16_rc_swap64x32, 90, BFloat16, Standard, Row, Col, 8, 1, Plain, SwapPing64x32) \
  X(sm90_bf16_rc_none_ping128, 90, BFloat16, Standard, Row, Col, 8, 1, BiasIdentity, Ping128x128) \
  X(sm90_bf16_rc_relu_ping128, 90, BFloat16, Standard, Row, Col, 8, 1, BiasReLU, Ping128x128) \
  X(sm90_bf16_rc_gelu_ping128, 90, BFloat16, Standard, Row, Col, 8, 1, BiasGELU, Ping128x128) \
  X(sm90_bf16_rc_gelu_tanh_ping128, 90, BFloat16, Standard, Row, Col, 8, 1, BiasGELUTanh, Ping128x128) \
  X(sm90_bf16_rc_silu_ping128, 90, BFloat16, Standard, Row, Col, 8, 1, BiasSiLU, Ping128x128) \
  X(sm90_f16_rr_swap, 90, Half, Standard, Row, Row, 8, 1, Plain, SwapStreamK128x32) \
  X(sm90_f16_rc_swap, 90, Half, Standard, Row, Col, 8, 1, Plain, SwapStreamK128x32) \
  X(sm90_bf16_rr_swap, 90, BFloat16, Standard, Row, Row, 8, 1, Plain, SwapStreamK128x32) \
  X(sm90_bf16_rc_swap, 90, BFloat16, Standard, Row, Col, 8, 1, Plain, SwapStreamK128x32) \
  X(sm90_f16_rc_gemv, 90, Half, Standard, Row, Col, 8, 1, Plain, SimtGemv) \
  X(sm90_bf16_rc_gemv, 90, BFloat16, Standard, Row, Col, 8, 1, Plain, SimtGemv) \
  X(sm90_f16_rc_none_gemv, 90, Half, Standard, Row, Col, 8, 1, BiasIdentity, SimtGemv) \
  X(sm90_f16_rc_relu_gemv, 90, Half, Standard, Row, Col, 8, 1, BiasReLU, SimtGemv) \
  X(sm90_f16_rc_gelu_gemv, 90, Half, Standard, Row, Col, 8, 1, BiasGELU, SimtGemv) \
  X(sm90_f16_rc_gelu_tanh_gemv, 90, Half, Standard, Row, Col, 8, 1, BiasGELUTanh, SimtGemv) \
  X(sm90_f16_rc_silu_gemv, 90, Half, Standard, Row, Col, 8, 1, BiasSiLU, SimtGemv) \
  X(sm90_bf16_rc_none_gemv, 90, BFloat16, Standard, Row, Col, 8, 1, BiasIdentity, SimtGemv) \
  X(sm90_bf16_rc_relu_gemv, 90, BFloat16, Standard, Row, Col, 8, 1, BiasReLU, SimtGemv) \
  X(sm90_bf16_rc_gelu_gemv, 90, BFloat16, Standard, Row, Col, 8, 1, BiasGELU, SimtGemv) \
  X(sm90_bf16_rc_gelu_tanh_gemv, 90, BFloat16, Standard, Row, Col, 8, 1, BiasGELUTanh, SimtGemv) \
  X(sm90_bf16_rc_silu_gemv, 90, BFloat16, Standard, Row, Col, 8, 1, BiasSiLU, SimtGemv)


namespace ops::cutlass_gemm {

using ::ops::Activation;
using ::ops::kNumActivations;

enum class DType : int8_t { Half, BFloat16, Float, Double };
enum class Math : int8_t { Standard, TF32, Fast3xTF32 };
enum class Layout : int8_t { Row, Col };
// Plain, then one Bias<Act> epilogue per activation in csrc/activation.h's order.
enum class Epilogue : int8_t { Plain, BiasIdentity, BiasReLU, BiasGELU, BiasGELUTanh, BiasSiLU };
constexpr Epilogue bias_epilogue(Activation act) { return static_cast<Epilogue>(1 + static_cast<int>(act)); }
// The activation of a Bias<Act> epilogue; None for Plain and BiasIdentity.
constexpr Activation epilogue_activation(Epilogue e) {
  return e == Epilogue::Plain ? Activation::None : static_cast<Activation>(static_cast<int>(e) - 1);
}
static_assert(bias_epilogue(Activation::None) == Epilogue::BiasIdentity &&
              bias_epilogue(Activation::ReLU) == Epilogue::BiasReLU &&
              bias_epilogue(Activation::GELU) == Epilogue::BiasGELU &&
              bias_epilogue(Activation::GELUTanh) == Epilogue::BiasGELUTanh &&
              bias_epilogue(Activation::SiLU) == Epilogue::BiasSiLU &&
              static_cast<int>(Epilogue::BiasSiLU) == kNumActivations);
enum class TileConfig : int8_t {
  Sm80, Coop128x128, Coop128x256, Ping64x128, StreamK128x128,  // the default build's
  Ping128x128, Coop128x256C1x2, Coop256x128, Ping64x128C2x1, SwapPing64x16, SwapPing64x32, SwapStreamK128x32, SimtGemv
};

// The largest M the SimtGemv kernels take (simt_gemv.cuh: that many rows of accumulators per lane); the
// planner offers them up to it (tactic.cpp).
inline constexpr int kSimtGemvMaxRows = 16;

enum class KernelId : int {
#define OPS_KERNEL_ENUM(name, ...) name,
  OPS_CUTLASS_GEMM_KERNELS(OPS_KERNEL_ENUM)
#undef OPS_KERNEL_ENUM
      kCount
};

struct KernelInfo {
  const char* id;
  int sm;
  DType dtype;
  Math math;
  Layout a, b;
  int alignment;  // elements
  bool on_sm90;
  Epilogue epilogue;
  TileConfig config;
};

inline constexpr KernelInfo kKernels[] = {
#define OPS_KERNEL_INFO(id, sm, dtype, math, la, lb, align, on90, epilogue, config)        \
  {#id, sm, DType::dtype, Math::math, Layout::la, Layout::lb, align, on90 != 0, Epilogue::epilogue, \
   TileConfig::config},
    OPS_CUTLASS_GEMM_KERNELS(OPS_KERNEL_INFO)
#undef OPS_KERNEL_INFO
};
inline constexpr int kNumKernels = static_cast<int>(KernelId::kCount);
static_assert(sizeof(kKernels) / sizeof(kKernels[0]) == kNumKernels);

// The configurations the shape heuristic never chooses (tactic.cpp): every config after StreamK128x128.
// Their kernels form OPS_CUTLASS_GEMM_CANDIDATE_KERNELS, compiled only with OPS_CANDIDATE_KERNELS=1.
constexpr bool candidate_only(TileConfig config) {
  return static_cast<int>(config) > static_cast<int>(TileConfig::StreamK128x128);
}
#define OPS_KERNEL_COUNT_ONE(...) +1
inline constexpr int kNumDefaultKernels = 0 OPS_CUTLASS_GEMM_DEFAULT_KERNELS(OPS_KERNEL_COUNT_ONE);
#undef OPS_KERNEL_COUNT_ONE
constexpr bool candidates_listed_last() {
  for (int i = 0; i < kNumKernels; ++i) {
    if (candidate_only(kKernels[i].config) != (i >= kNumDefaultKernels)) return false;
  }
  return true;
}
static_assert(candidates_listed_last(),
              "OPS_CUTLASS_GEMM_CANDIDATE_KERNELS holds exactly the candidate_only() configurations");

constexpr const KernelInfo& kernel_info(KernelId id) { return kKernels[static_cast<int>(id)]; }

// Bytes per element.
constexpr int element_size(DType dtype) {
  switch (dtype) {
    case DType::Half:
    case DType::BFloat16: return 2;
    case DType::Float: return 4;
    case DType::Double: return 8;
  }
  return 1;
}

constexpr Layout flip(Layout l) { return l == Layout::Row ? Layout::Col : Layout::Row; }

// The mainloop schedule of a configuration: CUTLASS 2.x multistage (SM80), CUTLASS 3.x warp-specialized
// cooperative or ping-pong (SM90), or the hand-written SIMT GEMV.
enum class Schedule : int8_t { Multistage, Cooperative, Pingpong, Simt };

// What a configuration is, field by field: sm80_gemm.cuh and sm90_gemm.cuh build each kernel from
// these, tactic.cpp reasons with them, and kernel_name() spells them.
struct ConfigShape {
  int tile_m, tile_n, tile_k;  // the kernel's output tile and K step (swap-AB: a tile of D^T)
  int cluster_m, cluster_n;    // SM90 thread block cluster (1 x 1 for SM80 and SIMT)
  int stages;                  // SM80 pipeline stages; 0: CUTLASS's StageCountAutoCarveout (SM90)
  Schedule schedule;
  bool stream_k;  // CUTLASS's stream-K tile scheduler (data-parallel, split-K or stream-K at run time)
  bool swap_ab;   // the kernel runs D^T = B^T A^T (column-major D)
};

constexpr ConfigShape config_shape(TileConfig config, DType dtype, Math math) {
  const int k90 = 128 / element_size(dtype);  // SM90: 128 bytes of each operand row per stage
  switch (config) {
    case TileConfig::Sm80:  // CUTLASS's SM80 tensor-op tiles per dtype (3xTF32 as in its example 27)
      if (dtype == DType::Double) return {64, 64, 16, 1, 1, 4, Schedule::Multistage, false, false};
      if (math == Math::Fast3xTF32) return {128, 64, 16, 1, 1, 3, Schedule::Multistage, false, false};
      if (math == Math::TF32) return {128, 128, 16, 1, 1, 4, Schedule::Multistage, false, false};
      return {128, 128, 32, 1, 1, 4, Schedule::Multistage, false, false};
    case TileConfig::Coop128x128: return {128, 128, k90, 2, 1, 0, Schedule::Cooperative, false, false};
    case TileConfig::Coop128x256: return {128, 256, k90, 2, 1, 0, Schedule::Cooperative, false, false};
    case TileConfig::Ping64x128: return {64, 128, k90, 1, 1, 0, Schedule::Pingpong, false, false};
    case TileConfig::StreamK128x128: return {128, 128, k90, 1, 1, 0, Schedule::Cooperative, true, false};
    case TileConfig::Ping128x128: return {128, 128, k90, 2, 1, 0, Schedule::Pingpong, false, false};
    case TileConfig::Coop128x256C1x2: return {128, 256, k90, 1, 2, 0, Schedule::Cooperative, false, false};
    case TileConfig::Coop256x128: return {256, 128, k90, 2, 1, 0, Schedule::Cooperative, false, false};
    case TileConfig::Ping64x128C2x1: return {64, 128, k90, 2, 1, 0, Schedule::Pingpong, false, false};
    case TileConfig::SwapPing64x16: return {64, 16, k90, 1, 1, 0, Schedule::Pingpong, false, true};
    case TileConfig::SwapPing64x32: return {64, 32, k90, 1, 1, 0, Schedule::Pingpong, false, true};
    case TileConfig::SwapStreamK128x32: return {128, 32, k90, 1, 1, 0, Schedule::Cooperative, true, true};
    // A block: kSimtGemvMaxRows rows, 4 warps of 4 columns; each warp steps K by 256 (simt_gemv.cuh).
    case TileConfig::SimtGemv: return {kSimtGemvMaxRows, 16, 256, 1, 1, 0, Schedule::Simt, false, false};
  }
  return {};
}

constexpr ConfigShape config_shape(const KernelInfo& info) {
  return config_shape(info.config, info.dtype, info.math);
}

}  // namespace ops::cutlass_gemm
