"""The public GEMM functions call their ops through overloads resolved at import (an overload packet matches
the arguments against each schema at every call: benchmarks/host_cost.py), and through the overload packets
in TorchScript, which compiles only that branch: scripted callers of every function, with and without out=,
compute what the eager calls compute. benchmarks.host_cost runs and checks that its rows agree."""

import json
import warnings

import pytest
import torch

import ops
from fp8_support import torch_scaled_mm_on_cpu

TS_SCRIPT_DEPRECATION = r"`torch\.jit\.script` is deprecated"


def _script(fn):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=TS_SCRIPT_DEPRECATION, category=FutureWarning)
        return torch.jit.script(fn)


def _gemm(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return ops.cutlass_gemm(A, B) + ops.cutlass_gemm(A, B, out=out)


def _scaled(A: torch.Tensor, B: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, bias: torch.Tensor,
            out: torch.Tensor) -> torch.Tensor:
    ops.scaled_gemm(A, B, sa, sb, bias, torch.float32, "relu", False, out)
    return ops.scaled_gemm(A, B, sa, sb, None, torch.bfloat16, "silu")


def _grouped(A: torch.Tensor, B: torch.Tensor, offs: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    ops.grouped_gemm(A, B, offs, torch.float32, out)
    return ops.grouped_gemm(A, B, offs)


def _inputs():
    g = torch.Generator().manual_seed(0)
    A, B = torch.randn(5, 12, generator=g, dtype=torch.float64), torch.randn(12, 7, generator=g, dtype=torch.float64)
    A8 = (torch.randn(6, 32, generator=g) * 4).to(torch.float8_e4m3fn)
    B8 = (torch.randn(16, 32, generator=g) * 4).to(torch.float8_e4m3fn).t()  # column-major, as a Linear weight
    sa, sb = torch.rand(6, 1, generator=g) + 0.5, torch.rand(1, 16, generator=g) + 0.5
    bias = torch.randn(16, generator=g)
    X, W = torch.randn(10, 8, generator=g).bfloat16(), torch.randn(3, 8, 8, generator=g).bfloat16()
    offs = torch.tensor([2, 2, 10], dtype=torch.int32)
    return A, B, A8, B8, sa, sb, bias, X, W, offs


def test_scripted_callers_compute_what_eager_calls_compute():
    A, B, A8, B8, sa, sb, bias, X, W, offs = _inputs()
    for fn, args, out_like in [(_gemm, (A, B), torch.empty(5, 7, dtype=torch.float64)),
                               (_scaled, (A8, B8, sa, sb, bias), torch.empty(6, 16)),
                               (_grouped, (X, W, offs), torch.empty(10, 8))]:
        scripted = _script(fn)
        assert "prim::PythonOp" not in str(scripted.graph)  # every call compiled to the op itself
        out_eager, out_script = torch.full_like(out_like, float("nan")), torch.full_like(out_like, float("nan"))
        expected = fn(*args, out_eager)
        assert torch.equal(scripted(*args, out_script), expected), fn.__name__
        assert torch.equal(out_script, out_eager), fn.__name__
    # The eager values are torch's: mm, _scaled_mm's formula (relu of the float32 product plus bias), _grouped_mm.
    out = torch.empty(5, 7, dtype=torch.float64)
    assert torch.equal(_gemm(A, B, out), 2 * torch.mm(A, B))
    out = torch.empty(6, 16)
    _scaled(A8, B8, sa, sb, bias, out)
    assert torch.equal(out, torch.relu(torch_scaled_mm_on_cpu(A8, B8, sa, sb, None, torch.float32) + bias))
    out = torch.empty(10, 8)
    assert torch.equal(_grouped(X, W, offs, out), torch._grouped_mm(X, W, offs))
    torch.testing.assert_close(out, torch._grouped_mm(X.float(), W.float(), offs))  # unrounded float32


def test_eager_calls_raise_the_ops_errors():
    A, B = torch.randn(4, 3, generator=torch.Generator().manual_seed(1)), torch.zeros(3, 5)
    with pytest.raises(RuntimeError, match=r"^cutlass_gemm: expected out of shape \(M, N\) = \(4, 5\), got \[5, 4\]"):
        ops.cutlass_gemm(A, B, out=torch.empty(5, 4))
    with pytest.raises(RuntimeError, match="^cutlass_gemm: out overlaps A in memory"):
        ops.cutlass_gemm(A[:, :3], B[:, :3], out=A[:, :3])
    with pytest.raises(RuntimeError, match=r"^grouped_gemm: expected out of shape \[4, 5\] \(2D x 3D\), got \[4, 4\]"):
        ops.grouped_gemm(A, torch.zeros(2, 3, 5), torch.tensor([1, 4], dtype=torch.int32), out=torch.empty(4, 4))


def test_host_cost_benchmark_runs_and_checks_its_rows(tmp_path, monkeypatch):
    from benchmarks import host_cost

    threads = torch.get_num_threads()
    try:
        host_cost.main(["--rounds", "1", "--min-run-time", "0.001", "--out", str(tmp_path / "h.json")])
    finally:
        torch.set_num_threads(threads)
    report = json.loads((tmp_path / "h.json").read_text())
    assert set(report["x_overload"]) == {name for name, _, _ in host_cost.GROUPS}
    rows = {(r["function"], r["role"]): r for r in report["rows"]}
    for name, _, group in host_cost.GROUPS:
        overload = rows[(name, "overload")]
        assert overload["x_overload"] == 1.0
        ops_row = rows[(name, "ops")]
        assert ops_row["us"] > 0 and report["x_overload"][name] == pytest.approx(ops_row["us"] / overload["us"])
    # A statement that computes something else is refused before anything is timed.
    wrong = [(name, out, [(role, stmt.replace("ops.cutlass_gemm(A, B)", "ops.cutlass_gemm(B, A)"))
                          for role, stmt in group]) for name, out, group in host_cost.GROUPS]
    monkeypatch.setattr(host_cost, "GROUPS", wrong)
    with pytest.raises(RuntimeError, match=r"ops\.cutlass_gemm\(B, A\) computes other values than the reference "
                                           "of cutlass_gemm"):
        host_cost.main(["--rounds", "1", "--out", str(tmp_path / "never.json")])
    assert not (tmp_path / "never.json").exists()
