"""The benchmark programs (the README's main job) run and write their reports: CI runs only the tests,
so without these a broken benchmark would first show on the scarce GPU machine. On CPU, on small
suites; an interrupted run (Ctrl-C, or device_check.sh's time limit) reports the cases measured so far."""

import json
import os
import subprocess
import sys

import pytest
import torch

import ops

from conftest import REPO


@pytest.mark.slow
def test_gemm_benchmark_cli_writes_json_markdown_and_plot(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.gemm", "--cpu", "--suite", "square", "--dtypes", "fp32",
         "--out", str(tmp_path)],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads((tmp_path / "gemm.json").read_text())
    assert report["device"] == "cpu" and "interrupted" not in report
    assert [(r["M"], r["N"], r["K"]) for r in report["results"]] == [(s, s, s) for s in (256, 512, 1024)]
    for r in report["results"]:
        assert r["ops_ms"] > 0 and r["torch_ms"] > 0 and r["ratio"] == pytest.approx(r["torch_ms"] / r["ops_ms"])
        assert r["ops_max_rel_err"] < 1e-5 and r["torch_max_rel_err"] < 1e-5  # fp32 vs the fp64 reference
    assert report["summary"]["fp32"]["min_ratio"] == min(r["ratio"] for r in report["results"])
    assert "| fp32 | square 1024 |" in (tmp_path / "gemm.md").read_text()
    assert (tmp_path / "gemm.png").stat().st_size > 10_000


@pytest.mark.slow
def test_model_benchmark_cli_on_cpu(tmp_path):
    pytest.importorskip("transformers")
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.model", "--no-compile", "--batch", "2", "--out", str(tmp_path)],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES=""), capture_output=True,
        text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads((tmp_path / "model.json").read_text())
    assert report["device"] == "cpu" and set(report["results"]) == {"minilm_eager", "llama_mlp_T16"}
    assert report["results"]["minilm_eager"]["min_cosine"] >= 0.99999  # converted vs stock embeddings
    assert report["results"]["llama_mlp_T16"]["max_abs_diff"] < 1e-4
    assert all(r["stock_ms"] > 0 and r["ops_ms"] > 0 for r in report["results"].values())
    assert "| MiniLM-L6 eager (batch 2) |" in (tmp_path / "model.md").read_text()


def test_sanitizer_smoke_runs_as_device_check_runs_it():
    """device_check.sh runs it under compute-sanitizer as `python -m benchmarks.sanitizer_smoke`; on CPU the
    same calls (less the CUDA tactics) run and are checked against float64."""
    result = subprocess.run([sys.executable, "-m", "benchmarks.sanitizer_smoke"], cwd=REPO,
                            env=dict(os.environ, PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES=""), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "sanitizer smoke: ok" in result.stdout


@pytest.mark.skipif(not ops.build_info.WITH_CUDA, reason="the allocator functions exist in CUDA builds only")
def test_device_check_diag_names_the_native_frame_of_a_crash(tmp_path):
    """The diag stage's tools: segv_backtrace.so prints the native frames of a crashing process and
    symbolize_backtrace.sh names them. Crash inside ops' library on purpose: stats written to address 8."""
    preload = tmp_path / "segv_backtrace.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(preload),
                    os.path.join(REPO, "benchmarks", "diag", "segv_backtrace.c")], check=True)
    code = ("import ctypes, ops; lib = ops.allocator._lib(); "
            "lib.ops_allocator_stats(0, ctypes.cast(ctypes.c_void_p(8), ctypes.POINTER(ops.allocator._Stats)))")
    crash = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], cwd=REPO, capture_output=True,
                           text=True, timeout=120, env=dict(os.environ, LD_PRELOAD=str(preload)))
    assert crash.returncode == -11, crash.stderr[-2000:]
    assert "=== native backtrace" in crash.stderr and "ops_allocator_stats" in crash.stderr, crash.stderr[-3000:]
    named = subprocess.run([os.path.join(REPO, "benchmarks", "diag", "symbolize_backtrace.sh"), ops.library_path()],
                           input=crash.stderr, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "ops_allocator_stats" in named and "_Py" in named  # our frame and the interpreter's below it


def test_interrupted_gemm_benchmark_reports_what_it_measured(tmp_path, monkeypatch):
    from benchmarks import gemm

    real, calls = gemm.measure_case, []

    def measure_then_interrupt(*args):
        calls.append(args)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(*args)

    monkeypatch.setattr(gemm, "measure_case", measure_then_interrupt)
    precision = torch.get_float32_matmul_precision()
    with pytest.raises(SystemExit, match="interrupted: 1 of 3 cases measured"):
        gemm.main(["--cpu", "--suite", "square", "--dtypes", "fp32", "--out", str(tmp_path)])
    assert torch.get_float32_matmul_precision() == precision  # the benchmark's setting was undone
    report = json.loads((tmp_path / "gemm.json").read_text())
    assert report["interrupted"] == {"measured": 1, "planned": 3}
    assert [r["M"] for r in report["results"]] == [256]
    assert "INTERRUPTED: 1 of 3 cases measured" in (tmp_path / "gemm.md").read_text()


def test_interrupted_ops_benchmark_reports_what_it_measured(tmp_path, monkeypatch):
    from benchmarks import ops as ops_benchmark

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU timer, also on a GPU machine
    timings = []

    def time_then_interrupt(fn, *args, **kwargs):
        timings.append(fn)
        if len(timings) == 4:  # the first case has an ops, a same-bytes copy and a reference timing
            raise KeyboardInterrupt
        fn()
        return 1e-3

    monkeypatch.setattr(ops_benchmark, "cpu_time", time_then_interrupt)
    assert ops_benchmark.main(["--dtypes", "fp32", "--out", str(tmp_path)]) == 3
    report = json.loads((tmp_path / "ops.json").read_text())
    planned = report["interrupted"]["planned"]
    assert report["interrupted"] == {"measured": 1, "planned": planned} and planned > 1
    assert len(report["results"]) == 1 and report["results"][0]["op"] == "rms_norm"
    assert f"INTERRUPTED: 1 of {planned} cases measured" in (tmp_path / "ops.md").read_text()


def test_linear_tactic_sweep_times_every_candidate_and_reports(tmp_path):
    # The GPU-only `--candidates` sweep of benchmarks.ops, run with an emulated Hopper plan and a fake timer.
    if not ops.build_info.WITH_CUDA:
        pytest.skip("a CPU-only build has no CUTLASS kernels to plan")
    from benchmarks import ops as ops_benchmark

    x, w = torch.randn(16, 256, dtype=torch.bfloat16), torch.randn(512, 256, dtype=torch.bfloat16)
    forced = []
    sweep = ops_benchmark.sweep_linear_tactics(
        "linear[silu]", "T=16", "bf16", lambda: forced.append(ops.gemm.get_tactic()), x, w, "silu",
        lambda fn: (fn(), 1e-3 * len(forced))[1], 2e-3, (9, 0), 132)
    assert list(sweep["times_ms"]) == forced and len(forced) > 1  # each candidate forced in turn, timed
    assert sweep["best"] == forced[0]  # the fake timer makes the first candidate the fastest
    assert sweep["heuristic"] in forced and sweep["heuristic_ms"] == 2.0
    assert ops.gemm.get_tactic() is None
    ops_benchmark.report_linear_tactics([sweep], {"gpu": "emulated"}, str(tmp_path))
    assert "| linear[silu] | T=16 | bf16 |" in (tmp_path / "ops_linear_candidates.md").read_text()


def test_rms_kernel_sweep_selects_each_variant_and_restores_the_default(tmp_path):
    # The GPU-only `--candidates` sweep of the rms_norm kernels, with a fake timer that records which
    # variant (packs per thread) is selected while it times.
    if not hasattr(torch.ops.ops, "_rms_norm_set_packs_per_thread"):
        pytest.skip("a CPU-only build has no CUDA rms_norm kernels")
    from benchmarks import ops as ops_benchmark

    selected = []

    def timer(fn):
        current = torch.ops.ops._rms_norm_set_packs_per_thread(0)
        torch.ops.ops._rms_norm_set_packs_per_thread(current)
        selected.append(current)
        return 1e-6 * (10 - len(selected))

    sweep = ops_benchmark.sweep_rms_kernels("rms_norm", "T=4 x 4096", "bf16", lambda: None, timer, 2e-5,
                                            4 * 4096 * 2 * 2, 4000.0)
    assert selected == [1, 2, 4, 8] and torch.ops.ops._rms_norm_set_packs_per_thread(0) == 0
    assert sweep["times_ms"] == pytest.approx({"0": 0.02, "1": 0.009, "2": 0.008, "4": 0.007, "8": 0.006})
    ops_benchmark.report_rms_kernels([sweep], {"gpu": "emulated"}, str(tmp_path))
    assert "| rms_norm | T=4 x 4096 | bf16 | 4000 |" in (tmp_path / "ops_rms_kernels.md").read_text()

