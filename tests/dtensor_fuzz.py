"""Every op on DTensors of fuzzed placements against the same op on the full tensors (run inside each
rank by tests/dtensor_worker.py). Hypothesis is derandomized, so every rank draws the same examples;
each check gathers full tensors (a collective), so every rank sees the same outcome."""

import time

import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

import ops


def placements(ndim, mesh_ndim, partial=True):
    choices = [Replicate()] + [Shard(d) for d in range(ndim)] + ([Partial()] if partial else [])
    return st.tuples(*[st.sampled_from(choices)] * mesh_ndim)


def dt(full, mesh, where):
    """A DTensor holding `full` with placements `where`: Shard and Replicate as distribute_tensor lays
    them out; along a Partial mesh dimension of size n, coordinate c holds the local rows i with
    i % n == c and zeros elsewhere, so the sum is `full`. (torch 2.11 refuses to redistribute to a
    Partial.)"""
    local = distribute_tensor(full, mesh, [Replicate() if p.is_partial() else p for p in where]).to_local()
    for dim, p in enumerate(where):
        if p.is_partial():
            rows = torch.arange(local.shape[0], device=local.device) % mesh.size(dim) == mesh.get_local_rank(dim)
            local = local * rows.view(-1, *[1] * (local.dim() - 1)).to(local.dtype)
    return DTensor.from_local(local, mesh, list(where), run_check=False, shape=full.shape, stride=full.stride())


def close(got, expected, what):
    got = got.full_tensor() if hasattr(got, "full_tensor") else got
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5, msg=what)


def run(world_size, seconds):
    mesh = init_device_mesh("cpu", (world_size,) if world_size < 4 else (2, world_size // 2))
    m = mesh.ndim
    dims = st.sampled_from([4, 5, 6, 8])  # 5 (and 6 on a 2 x 2 mesh): uneven shards
    deadline = time.monotonic() + seconds
    failures = []

    def fuzz(strategy, examples):
        def wrap(check):
            @settings(derandomize=True, max_examples=examples, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck), print_blob=False)
            @given(strategy)
            def test(case):
                if time.monotonic() < deadline:
                    torch.manual_seed(0)
                    try:
                        check(case)
                    except Exception as e:
                        raise AssertionError(f"{case}: {e}") from e
            try:
                test()
            except Exception as e:  # noqa: BLE001 - recorded with its example for the test to report
                failures.append(f"{check.__name__}: {e!r}"[:2000])
            return check
        return wrap

    @fuzz(st.tuples(dims, dims, dims, placements(2, m), placements(2, m)), 30)
    def cutlass_gemm(case):
        M, K, N, pa, pb = case
        A, B = torch.randn(M, K), torch.randn(K, N)
        close(ops.cutlass_gemm(dt(A, mesh, pa), dt(B, mesh, pb)), A @ B, case)

    acts = st.sampled_from(["none", "relu", "gelu", "gelu_tanh", "silu"])

    @fuzz(st.tuples(st.sampled_from([2, 3]), dims, dims, st.booleans(), acts, st.data()), 40)
    def linear(case):
        ndim, K, N, bias, act, data = case
        x, w = torch.randn(*(3, 4, K)[-ndim:]), torch.randn(N, K)
        b = torch.randn(N) if bias else None
        px, pw = data.draw(placements(ndim, m)), data.draw(placements(2, m))
        pb = data.draw(placements(1, m)) if bias else None
        got = ops.linear(dt(x, mesh, px), dt(w, mesh, pw), None if b is None else dt(b, mesh, pb), act)
        close(got, ops.linear(x, w, b, act), (ndim, K, N, act, px, pw, pb))

    @fuzz(st.tuples(st.sampled_from([2, 3]), st.data()), 30)
    def rms_norm(case):
        ndim, data = case
        x, w = torch.randn(*(3, 4, 8)[-ndim:]), torch.rand(8) + 0.5
        px, pw = data.draw(placements(ndim, m)), data.draw(placements(1, m))
        close(ops.rms_norm(dt(x, mesh, px), dt(w, mesh, pw), 1e-5), ops.rms_norm(x, w, 1e-5), (px, pw))

    @fuzz(st.tuples(st.sampled_from([2, 3]), st.data()), 30)
    def silu_and_mul(case):
        ndim, data = case
        x = torch.randn(*(3, 4, 8)[-ndim:])
        px = data.draw(placements(ndim, m))
        close(ops.silu_and_mul(dt(x, mesh, px)), ops.silu_and_mul(x), px)

    @fuzz(st.tuples(placements(3, m), placements(3, m), placements(1, m, partial=False)), 30)
    def fused_add_rms_norm(case):
        px, pr, pw = case
        x, r, w = torch.randn(3, 4, 8), torch.randn(3, 4, 8), torch.rand(8) + 0.5
        dx, dr = dt(x.clone(), mesh, px), dt(r.clone(), mesh, pr)  # a replicated local tensor may be x itself
        allowed = px == pr and all(p == Replicate() or p in (Shard(0), Shard(1)) for p in px)
        try:
            ops.fused_add_rms_norm(dx, dr, dt(w, mesh, pw), 1e-5)
        except RuntimeError as e:
            assert not allowed and "must have one placement" in str(e), (case, e)
            return
        assert allowed, case
        assert dx.placements == px and dr.placements == pr  # written in place, placements kept
        ops.fused_add_rms_norm(x, r, w, 1e-5)
        close(dx, x, case)
        close(dr, r, case)

    granularities = st.sampled_from(["row", "group", "tensor"])

    def codes_close(got, expected, what):  # FP8 tensors cannot cross gloo: compared as float32 values
        close(got[0].float(), expected[0].float(), what)
        close(got[1], expected[1], what)

    @fuzz(st.tuples(st.sampled_from([2, 3]), granularities, st.data()), 30)
    def fp8_norm_and_silu(case):
        ndim, granularity, data = case
        x, w = torch.randn(*(3, 4, 256)[-ndim:]), torch.rand(256) + 0.5
        px, pw = data.draw(placements(ndim, m)), data.draw(placements(1, m))
        codes_close(ops.rms_norm_fp8(dt(x, mesh, px), dt(w, mesh, pw), 1e-5, granularity),
                    ops.rms_norm_fp8(x, w, 1e-5, granularity), (px, pw))
        codes_close(ops.silu_and_mul_fp8(dt(x, mesh, px), granularity), ops.silu_and_mul_fp8(x, granularity), px)

    @fuzz(st.tuples(placements(3, m), placements(3, m, partial=False), granularities), 30)
    def fused_add_rms_norm_fp8(case):
        px, pr, granularity = case
        x, r, w = torch.randn(3, 4, 256), torch.randn(3, 4, 256), torch.rand(256) + 0.5
        dr = dt(r.clone(), mesh, pr)
        rows = ("row", "group")
        allowed = all(p == Replicate() or (granularity in rows and p in (Shard(0), Shard(1))) for p in pr)
        try:
            got = ops.fused_add_rms_norm_fp8(dt(x, mesh, px), dr, dt(w, mesh, (Replicate(),) * m), 1e-5, granularity)
        except RuntimeError as e:
            assert not allowed and "residual is written in place, so it keeps its placement" in str(e), (case, e)
            return
        assert allowed and dr.placements == pr, case
        expected = ops.fused_add_rms_norm_fp8(x, r, w, 1e-5, granularity)
        close(dr, r, case)
        codes_close(got, expected, case)

    @fuzz(st.tuples(st.sampled_from([(2, 3), (2, 2), (3, 3), (3, 2)]), st.lists(st.integers(0, 4), min_size=3,
                                                                             max_size=3), st.data()), 40)
    def grouped_gemm(case):
        mode, sizes, data = case
        ends = torch.tensor(sizes).cumsum(0).to(torch.int32)
        total = int(ends[-1]) + 1  # a tail in no group
        A = torch.randn(*{(2, 3): (total, 6), (2, 2): (4, total), (3, 3): (3, 4, 6), (3, 2): (3, 4, 6)}[mode])
        B = torch.randn(*{(2, 3): (3, 6, 8), (2, 2): (total, 8), (3, 3): (3, 6, 8), (3, 2): (6, total)}[mode])
        offs = None if mode == (3, 3) else ends
        pa, pb = data.draw(placements(A.dim(), m)), data.draw(placements(B.dim(), m))
        po = None if offs is None else data.draw(placements(1, m, partial=False))
        got = ops.grouped_gemm(dt(A, mesh, pa), dt(B, mesh, pb), None if offs is None else dt(offs, mesh, po))
        close(got, ops.grouped_gemm(A, B, offs), (mode, sizes, pa, pb, po))

    def fp8_dt(full, where):  # FP8 tensors cannot cross gloo: laid out as bytes, then viewed back
        local = dt(full.view(torch.uint8), mesh, where).to_local().view(full.dtype)
        return DTensor.from_local(local, mesh, list(where), run_check=False, shape=full.shape, stride=full.stride())

    def fp8_placements(ndim):  # those the op's rules reach without moving FP8 bytes between ranks
        return st.tuples(*[st.sampled_from([Replicate()] + ([Shard(0)] if ndim == 3 else []))] * m)

    compared = []  # the modes of the cases compared

    @fuzz(st.tuples(st.sampled_from(["2D x 3D", "3D x 3D"]), st.lists(st.integers(0, 4), min_size=3, max_size=3),
                    st.booleans(), st.data()), 30)
    def scaled_grouped_gemm(case):
        mode, sizes, with_bias, data = case
        g, k, n = 3, 32, 16
        if mode == "2D x 3D":
            ends = torch.tensor(sizes).cumsum(0).to(torch.int32)
            A, scale_a, offs = torch.randn(int(ends[-1]) + 1, k), torch.rand(int(ends[-1]) + 1) + 0.5, ends
        else:
            A, scale_a, offs = torch.randn(g, 4, k), torch.rand(g, 4) + 0.5, None
        A, B = A.to(torch.float8_e4m3fn), torch.randn(g, n, k).to(torch.float8_e4m3fn).transpose(1, 2)
        scale_b, bias = torch.rand(g, n) + 0.5, torch.randn(g, n) if with_bias else None
        pa, pb = data.draw(fp8_placements(A.dim())), data.draw(fp8_placements(A.dim()))  # 2D x 3D: replicated
        psa, psb = data.draw(placements(scale_a.dim(), m, partial=False)), data.draw(placements(2, m, partial=False))
        args = [fp8_dt(A, pa), fp8_dt(B, pb), dt(scale_a, mesh, psa), dt(scale_b, mesh, psb),
                None if offs is None else dt(offs, mesh, (Replicate(),) * m),
                None if bias is None else dt(bias, mesh, data.draw(placements(2, m, partial=False)))]
        try:
            got = ops.scaled_grouped_gemm(*args, out_dtype=torch.float32)
        except RuntimeError as e:  # DTensor chose to move an FP8 operand, which gloo refuses (NCCL takes it)
            if "Invalid scalar type" in str(e):
                return
            raise
        close(got, ops.scaled_grouped_gemm(A, B, scale_a, scale_b, offs, bias, out_dtype=torch.float32), case)
        compared.append(mode)

    if time.monotonic() < deadline and not {"2D x 3D", "3D x 3D"} <= set(compared):
        failures.append(f"scaled_grouped_gemm: compared {sorted(set(compared))} only: every drawn case needed FP8 "
                        "tensors to cross gloo")
    return failures
