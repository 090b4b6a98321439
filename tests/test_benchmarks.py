"""The benchmark programs (the README's main job) run and write their reports: CI runs only the tests,
so without these a broken benchmark would first show on the scarce GPU machine. On CPU, on small
suites; an interrupted run (Ctrl-C, or device_check.sh's time limit) reports the cases measured so far."""

import copy
import glob
import json
import os
import random
import re
import signal
import subprocess
import sys
import tarfile
import time

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
    table = (tmp_path / "gemm.md").read_text()
    assert "| fp32 | square 1024 |" in table and "| spread | CPU wait |" in table
    # Both columns are ATen's CPU mm: the first thing every output says.
    assert report["reference_is_same_kernel"] is True and all(r["same_kernel"] for r in report["results"])
    assert table.split("\n")[2] == f"**{report['note']}**" and "the kernel torch.mm runs" in report["note"]
    assert report["note"] in result.stdout.split("dtype")[0]
    noisy = [f"fp32 {r['shape']}" for r in report["results"] if r["cpu_spread"] > 0.1 or r["cpu_wait"] > 0.1]
    assert report["noisy_rows"] == noisy and (f"{len(noisy)} of 3 rows NOISY" in table) == bool(noisy)
    assert report["summary"]["fp32"].get("quiet_rows", 3) == 3 - len(noisy)
    assert (tmp_path / "gemm.png").stat().st_size > 10_000


def test_gemm_summary_also_leaves_the_noisy_rows_out():
    from benchmarks.gemm import summary_text

    assert summary_text({"geomean_ratio": 0.9, "min_ratio": 0.5}) == "0.900, lowest 0.500"
    assert summary_text({"geomean_ratio": 0.9, "min_ratio": 0.005, "quiet_rows": 16, "quiet_geomean_ratio": 0.985,
                         "quiet_min_ratio": 0.948}) == "0.900, lowest 0.005; without the NOISY rows: 0.985, lowest 0.948 (16 rows)"
    assert summary_text({"geomean_ratio": 0.9, "min_ratio": 0.5, "quiet_rows": 0, "quiet_geomean_ratio": None,
                         "quiet_min_ratio": None}).endswith("; every row NOISY")


def test_cpu_comparison_reports_a_drift_between_rounds_as_noise():
    from benchmarks.common import BUSY, NOISE, cpu_compare

    steady_calls = []

    def drifting():  # 1 ms in the first round, 3 ms after it: the machine slowed down under the measurement
        time.sleep(0.003 if steady_calls else 0.001)

    def steady():
        steady_calls.append(None)
        time.sleep(0.002)

    (t_drift, t_steady), spread, wait = cpu_compare([drifting, steady], rounds=2, min_run_time=0.005)
    # A round timed while another process held the CPUs (BUSY) is reported as such and leaves the spread.
    assert spread > NOISE or (wait or 0.0) > BUSY
    assert 0.0009 < t_drift < 0.002 and t_steady >= 0.002  # each side's fastest round


@pytest.mark.skipif(not os.path.exists("/proc/self/task") or not hasattr(os, "sched_setaffinity"),
                    reason="Linux's per-thread schedstat and CPU affinity")
def test_cpu_wait_sees_another_process_holding_the_cpu():
    # This process and a busy child on one CPU: the scheduler splits it, so this thread waits about half the time.
    from benchmarks.common import BUSY, cpu_wait

    saved = os.sched_getaffinity(0)
    cpu = min(saved)
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                             preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    try:
        os.sched_setaffinity(0, {cpu})
        time.sleep(0.1)  # the child's loop is running
        seed = random.Random(0).random()

        def spin():  # 0.3 s of Python on the shared CPU
            end, x = time.perf_counter() + 0.3, seed
            while time.perf_counter() < end:
                x = x * 1.0000001 % 7.0
            return x

        value, wait = cpu_wait(spin)
    finally:
        os.sched_setaffinity(0, saved)
        child.kill()
        child.wait()
    if wait is None:
        pytest.skip("this kernel does not report run-queue waits (schedstat)")
    assert 0.0 <= value < 7.0 and wait > 3 * BUSY, wait


def test_gemm_report_marks_busy_rows_and_says_both_sides_are_the_same_kernel(tmp_path):
    from benchmarks import gemm

    rng = random.Random(7)
    results = []
    for i, (spread, wait) in enumerate([(0.02, 0.01), (0.03, 1.2), (0.4, 0.0)]):  # quiet, BUSY, NOISY
        ops_ms, torch_ms = rng.uniform(0.05, 0.1), rng.uniform(0.05, 0.1)
        n = 256 << i
        flops = 2.0 * n ** 3
        results.append({"dtype": "fp32", "shape": f"square {n}", "M": n, "N": n, "K": n, "tactic": "cpu (ATen)",
                        "ops_ms": ops_ms, "torch_ms": torch_ms, "ops_tflops": flops / ops_ms / 1e9,
                        "torch_tflops": flops / torch_ms / 1e9, "ratio": torch_ms / ops_ms, "ops_max_rel_err": 1e-7,
                        "torch_max_rel_err": 1e-7, "cpu_spread": spread, "cpu_wait": wait, "same_kernel": True})
    gemm.report("cpu", True, results, str(tmp_path))
    report = json.loads((tmp_path / "gemm.json").read_text())
    assert report["reference_is_same_kernel"] is True and report["note"] == gemm.same_kernel_note("all")
    assert report["noisy_rows"] == ["fp32 square 512", "fp32 square 1024"]
    assert report["summary"]["fp32"]["quiet_rows"] == 1
    assert report["summary"]["fp32"]["quiet_min_ratio"] == pytest.approx(results[0]["ratio"])
    table = (tmp_path / "gemm.md").read_text()
    assert "| 3.0% | 1.20 BUSY |" in table and "| 40.0% NOISY | 0.00 |" in table and "| 2.0% | 0.01 |" in table
    assert "2 of 3 rows NOISY" in table
    assert (tmp_path / "gemm.png").stat().st_size > 10_000
    # On a GPU only the rows that fell back to ATen ran the same kernel on both sides; the note names them.
    gpu_rows = [dict(results[0], tactic="aten", same_kernel=True), dict(results[1], tactic="sm90_x", same_kernel=False)]
    facts = gemm.same_kernel_facts("cuda", "all", gpu_rows)
    assert facts["reference_is_same_kernel"] is False
    assert facts["note"] == ("1 of 2 rows ran ATen's kernel on both sides (tactic aten: ops.gemm.plan() gives the "
                             "reason): fp32 square 256")
    assert gemm.same_kernel_facts("cuda", "all", gpu_rows[1:]) == {"reference_is_same_kernel": False}


@pytest.mark.slow
def test_gemm_decode_suite_reports_bandwidth_and_fused_linears(tmp_path):
    from benchmarks import gemm

    gemm.main(["--cpu", "--suite", "decode", "--dtypes", "fp32", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "gemm_decode.json").read_text())
    assert [(r["shape"], r["M"]) for r in report["results"]] == [
        (f"llama3_8b.{name} T={t}", t) for name in ("q_proj", "kv_proj") for t in (1, 16)]
    for r in report["results"]:
        assert r["bytes"] == (r["M"] * r["K"] + r["N"] * r["K"] + r["M"] * r["N"]) * 4
        assert r["ops_GBps"] == pytest.approx(r["bytes"] / (r["ops_ms"] * 1e-3) / 1e9)
        assert r["copy_GBps"] > 0 and r["ops_graph_ms"] is None  # no CUDA graphs on CPU
        assert set(r["fused"]) == set(gemm.DECODE_ACTS)
        assert all(f["ops_ms"] > 0 and f["ref_ms"] > 0 for f in r["fused"].values())
    table = (tmp_path / "gemm_decode.md").read_text()
    assert "| fp32 | llama3_8b.kv_proj T=16 |" in table and "silu: ops.linear / F.linear+act" in table


@pytest.mark.slow
def test_fp8_models_benchmark_cli(tmp_path):
    pytest.importorskip("transformers")
    result = subprocess.run([sys.executable, "-m", "benchmarks.fp8_models", "--prompts", "1", "--new-tokens", "2",
                             "--out", str(tmp_path)],
                            cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads((tmp_path / "fp8_models.json").read_text())
    rows = {(r["family"], r["recipe"], r["init"]): r for r in report["rows"] if r["kind"] != "dense twin"}
    assert {k for k, _, _ in rows} >= {"Llama", "Qwen3Moe", "GptOss"} and len(report["totals"]) == 16
    assert all(r["cosine"] > 0.97 for r in rows.values())
    assert all(0 <= r["same_mlp_only"] <= r["prompts"] == 1 for r in rows.values())
    moe = rows["Qwen3Moe", "blockwise", "transformers"]
    assert moe["fp8_experts"] == 2 and moe["expert_bytes_vs_bf16"] < 0.55
    assert rows["GptOss", "blockwise", "unit"]["experts_rowwise"] == 2
    assert rows["Llama", "rowwise", "unit"]["fp8_experts"] == 0
    assert rows["Llama", "rowwise", "unit"]["routing_changes"] is None
    assert rows["Llama", "rowwise", "unit"]["same_routed_as_reference"] is None
    assert all(0 <= r["same_routed_as_reference"] <= 1 for r in report["rows"] if r["kind"] == "MoE")
    assert all(0 <= r["routing_changes"] < 0.5 for r in report["rows"] if r["kind"] == "MoE")
    # The dense twins hold no experts; every FP8 Linear of theirs is a dense path's.
    twins = {r["family"]: r for r in report["rows"] if r["kind"] == "dense twin" and r["recipe"] == "rowwise"
             and r["init"] == "transformers"}
    assert set(twins) == {"Qwen3Moe", "Mixtral", "DeepseekV3"}
    assert all(r["fp8_experts"] == 0 and r["routing_changes"] is None and r["fp8_linear"] >= 14
               for r in twins.values())
    # transformers' init (std 0.02) leaves Qwen3-MoE's experts a small part beside attention; "unit" does not.
    assert moe["mlp_vs_attention"] < 0.1 < rows["Qwen3Moe", "blockwise", "unit"]["mlp_vs_attention"]
    table = (tmp_path / "fp8_models.md").read_text()
    assert "| all MoE | MoE | blockwise | unit |" in table and "| all MoE with a twin | MoE | rowwise |" in table
    assert "| Mistral (twin of Mixtral) | dense twin | blockwise | unit |" in table


@pytest.mark.parametrize("family", ["DeepseekV3", "GptOss"])  # experts called with positional and keyword routing
def test_fp8_models_routed_as_gives_a_model_its_reference_routing(family):
    pytest.importorskip("transformers")
    from benchmarks import fp8_models
    reference = fp8_models.tiny(family, init="unit")
    other = copy.deepcopy(reference)
    routers = [m for n, m in other.named_modules() if n.endswith((".mlp.gate", ".mlp.router"))]
    assert routers
    with torch.no_grad():
        for router in routers:
            router.weight.normal_(0, 5.0, generator=torch.Generator().manual_seed(1))
        prompts = torch.randint(0, fp8_models.VOCAB, (4, 1, 4), generator=torch.Generator().manual_seed(0))
        expected = [reference.generate(p, max_new_tokens=6, do_sample=False) for p in prompts]

        def same():
            return sum(torch.equal(other.generate(p, max_new_tokens=6, do_sample=False), e)
                       for p, e in zip(prompts, expected))

        assert same() < 4  # another router: other tokens
        hooks = fp8_models.routed_as(reference, other)
        assert same() == 4  # across generate()'s cached steps
        for hook in hooks:
            hook.remove()
        assert same() < 4


def test_fp8_models_benchmark_cli_compares_each_experts_module(tmp_path):
    pytest.importorskip("transformers")
    result = subprocess.run([sys.executable, "-m", "benchmarks.fp8_models", "--experts", "--out", str(tmp_path)],
                            cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = json.loads((tmp_path / "fp8_experts.json").read_text())["rows"]
    # Every layer's experts of each family, both recipes and initializations (DeepSeek-V3's first layer is dense).
    assert {(r["family"], r["recipe"], r["init"]) for r in rows} >= {("Qwen3Moe", "rowwise", "transformers"),
                                                                     ("GptOss", "blockwise", "unit")}
    assert sum(r["family"] == "DeepseekV3" for r in rows) == 4 and sum(r["family"] == "Mixtral" for r in rows) == 8
    # FP8's own error (e4m3: 3 mantissa bits per operand), not a wrong expert or scale.
    assert all(0.998 < r["cosine"] < 1 for r in rows)


def test_model_benchmark_cli_on_cpu(tmp_path):
    pytest.importorskip("transformers")
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.model", "--quick", "--seconds", "0.5", "--batch", "2", "--out", str(tmp_path),
         "--patterns", "fused_add_rms_norm,rms_norm"],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES=""), capture_output=True,
        text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads((tmp_path / "model.json").read_text())
    results = report["results"]
    variants = ("eager", "compiled", "converted+compiled")
    assert report["device"] == "cpu" and set(results) == {f"{m}_{v}" for m in ("minilm", "llama_T16") for v in variants} | {
        "llama_mlp_T16"}
    for variant in variants:  # converted / the pass vs stock
        assert results[f"minilm_{variant}"]["min_cosine"] >= 0.99999, results
        case = results[f"llama_T16_{variant}"]
        assert case["max_abs_diff"] < 1e-4 and case["cosine"] > 0.99999, case
    # The named patterns rewrote the decoder's norms (add + norm where a residual add comes first), in the
    # stock model and in the converted one (each ops.rms_norm after a residual add: the 2 layers' 3 and the
    # final norm).
    assert results["llama_T16_compiled"]["rewrites"].keys() == {"rms_norm", "fused_add_rms_norm"}, results
    assert results["llama_T16_converted+compiled"]["rewrites"] == {"fused_add_rms_norm": 4}, results
    assert results["llama_mlp_T16"]["max_abs_diff"] < 1e-4
    assert all(r["stock_ms"] > 0 and r["ops_ms"] > 0 for r in results.values())
    assert "| MiniLM-L6 (batch 2) eager | converted |" in (tmp_path / "model.md").read_text()


def test_compile_models_benchmark_compares_with_and_without_the_pass(tmp_path):
    from benchmarks import compile_models

    argv = ["--tokens", "4,8", "--rounds", "1", "--models", "tiny llama", "--out", str(tmp_path)]
    assert compile_models.main(argv + ["--patterns", "all"]) == 0
    report = json.loads((tmp_path / "compile_models_all.json").read_text())
    assert [r["tokens"] for r in report["results"]] == [4, 8]
    # One graph for both token counts (checked); under dynamic=True eps is a tensor: the _tensor_eps norms.
    assert report["rewrites"] == {"tiny llama": {"fused_add_rms_norm": 4, "rms_norm": 1, "linear_act": 2}}
    assert all(r["without_us"] > 0 and r["with_us"] > 0 for r in report["results"])
    # Static shapes: a graph per token count (checked), the rewrites summed over them; named patterns.
    assert compile_models.main(argv + ["--shapes", "static", "--patterns", "fused_add_rms_norm,rms_norm"]) == 0
    report = json.loads((tmp_path / "compile_models_fused_add_rms_norm+rms_norm_static.json").read_text())
    assert report["shapes"] == "static" and report["rewrites"] == {"tiny llama": {"fused_add_rms_norm": 8, "rms_norm": 2}}
    for bad in (["--tokens", "1,8"], ["--patterns", "gemm"]):  # 1 token specializes; no such pattern
        with pytest.raises(SystemExit):
            compile_models.main(bad + ["--out", str(tmp_path)])


def test_sanitizer_smoke_runs_as_device_check_runs_it():
    """device_check.sh runs it under compute-sanitizer as `python -m benchmarks.sanitizer_smoke`; on CPU the
    same calls (less the CUDA tactics) run and are checked against float64."""
    result = subprocess.run([sys.executable, "-m", "benchmarks.sanitizer_smoke"], cwd=REPO,
                            env=dict(os.environ, PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES=""), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "sanitizer smoke: ok" in result.stdout


def test_sanitizer_smoke_runs_every_section_after_a_wrong_result(monkeypatch, capsys):
    """A wrong value (here: fp32 GEMMs doubled) is reported and the run goes on to the other sections
    (a smoke that stops at its first wrong value leaves the rest unchecked); the exit status says it failed."""
    from benchmarks import sanitizer_smoke

    real = ops.cutlass_gemm

    def wrong_in_fp32(A, B, out=None):
        result = real(A, B, out=out)
        return result.mul_(2) if A.dtype == torch.float32 else result

    monkeypatch.setattr(ops, "cutlass_gemm", wrong_in_fp32)
    monkeypatch.setattr(sanitizer_smoke, "FAILURES", [])
    assert sanitizer_smoke.main() == 1
    printed = capsys.readouterr().out
    assert "WRONG ('gemm', torch.float32, 128, 96, 64)" in printed
    assert "sanitizer smoke: gemms torch.float64" in printed and "sanitizer smoke: fused" in printed
    assert "sanitizer smoke: 4 FAILED" in printed and "sanitizer smoke: ok" not in printed
    assert all("torch.float32" in failure for failure in sanitizer_smoke.FAILURES)  # 2 shapes x (plain, out)


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
    # glibc names the exported function's frame as `_C.abi3.so(ops_allocator_stats+0x..)`: the symboliser
    # adds the source file and line (from the symbol's address, nm -D, plus the offset).
    assert "allocator.cpp:" in named, named[-3000:]


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
        if len(timings) == 5:  # the first case: ops, a same-bytes copy, eager and compiled references
            raise KeyboardInterrupt
        fn()
        return 1e-3

    monkeypatch.setattr(ops_benchmark, "cpu_time", time_then_interrupt)
    assert ops_benchmark.main(["--dtypes", "fp32", "--out", str(tmp_path)]) == 3
    report = json.loads((tmp_path / "ops.json").read_text())
    planned = report["interrupted"]["planned"]
    assert report["interrupted"] == {"measured": 1, "planned": planned} and planned > 1
    assert [(r["op"], r["reference"]) for r in report["results"]] == [("rms_norm", "F.rms_norm"),
                                                                       ("rms_norm", "torch.compile")]
    assert f"INTERRUPTED: 1 of {planned} cases measured" in (tmp_path / "ops.md").read_text()


@pytest.mark.slow
def test_interrupted_model_benchmark_reports_what_it_measured(tmp_path, monkeypatch):
    # device_check.sh's time limit (SIGINT): the cases measured are still reported.
    pytest.importorskip("transformers")
    from benchmarks import model as model_benchmark

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    comparisons = []

    def time_then_interrupt(fn_a, fn_b, **kwargs):
        comparisons.append(fn_a)
        if len(comparisons) == 2:  # the Llama-3-8B MLP block measured (it runs first); then MiniLM's
            raise KeyboardInterrupt
        return 2e-3, 1e-3

    monkeypatch.setattr(model_benchmark, "paired_calls", time_then_interrupt)
    args = ["--no-compile", "--quick", "--batch", "2", "--out", str(tmp_path)]
    assert model_benchmark.main(args) == 3
    report = json.loads((tmp_path / "model.json").read_text())
    assert report["interrupted"] == {"measured": 1, "planned": 3} and list(report["results"]) == ["llama_mlp_T16"]
    assert report["results"]["llama_mlp_T16"]["ratio"] == 2.0
    assert "INTERRUPTED: 1 of 3 cases measured" in (tmp_path / "model.md").read_text()


def test_fused_add_rms_norm_benchmark_times_fresh_data(monkeypatch):
    # The in-place op changes its input and residual on every call (the residual grew to inf in float16
    # within one case's timings): `timed` restores both before each timing.
    from benchmarks import ops as ops_benchmark

    case = next(c for c in ops_benchmark.cases("cpu", quick=True) if c[0] == "fused_add_rms_norm")
    fn, _, _ = case[2](torch.float16)
    written = dict(zip(fn.__code__.co_freevars, (cell.cell_contents for cell in fn.__closure__)))
    x, r = written["x"], written["r"]  # the buffers the op writes
    for _ in range(500):
        fn()
    assert not bool(torch.isfinite(r).all()) or r.abs().max() > 1000  # what unrestored timings would run on
    fn.restore()
    assert all(bool(torch.isfinite(t).all()) and t.abs().max() < 10 for t in (x, r))  # random data again


def test_device_check_keeps_its_deadline_and_lists_every_stage(tmp_path):
    # With DEADLINE_S too short for any stage, each is SKIPPED (exit status 200 in stages.tsv), and the
    # reports packed so far still come back in results.tgz. BUILD=0: the library built in place.
    out = tmp_path / "out"
    result = subprocess.run(["bash", os.path.join(REPO, "benchmarks", "device_check.sh"), str(out)], cwd=REPO,
                            env=dict(os.environ, DEADLINE_S="30", BUILD="0", PYTHON=sys.executable,
                                     STAGES="sm80 sweep ops model overhead allocator", CUDA_VISIBLE_DEVICES=""),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    log = (out / "device_check.log").read_text()
    assert "BUILD=0: the library built in place" in log and "SKIPPED (deadline" in log
    with tarfile.open(out / "results.tgz") as archive:
        stages = archive.extractfile("./stages.tsv").read().decode().splitlines()
    assert stages[0].split("\t") == ["stage", "exit status", "seconds"]
    from benchmarks import sweep_plan
    sweeps = tuple(f"sweep-{r['group']}" for r in sweep_plan.plan())
    assert [row.split("\t")[:2] for row in stages[1:]] == [[name, "200"] for name in (
        "diag-throw_cpu", "diag-throw_cuda", "sm80-tests", *sweeps, "ops", "ops-candidates", "model", "overhead",
        "allocator")]
    assert "=== done (status 1)" in log


@pytest.mark.slow
def test_device_check_on_sigterm_interrupts_the_stage_and_packs_its_report(tmp_path):
    # A caller giving up (SIGTERM): the stage gets SIGINT, as at its time limit, reports what it
    # measured, and the reports are packed; tee survives a signal to the process group (the log is whole).
    out = tmp_path / "out"
    proc = subprocess.Popen(["bash", os.path.join(REPO, "benchmarks", "device_check.sh"), str(out)], cwd=REPO,
                            env=dict(os.environ, BUILD="0", PYTHON=sys.executable, STAGES="ops model",
                                     CUDA_VISIBLE_DEVICES=""),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        log = out / "device_check.log"
        deadline = time.monotonic() + 240
        # The progress bar's first line: measure_all, which reports on SIGINT, is running (a SIGINT while
        # the cases are still being set up reports nothing; that took over 2 s on a loaded machine).
        while not re.search(r"\bops: +\d+%\|", log.read_text() if log.exists() else ""):
            assert proc.poll() is None and time.monotonic() < deadline, "the ops stage did not start measuring"
            time.sleep(0.5)
        time.sleep(1)
        os.killpg(proc.pid, signal.SIGTERM)  # the whole group, as a process supervisor would
        assert proc.wait(timeout=60) == 143
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    with tarfile.open(out / "results.tgz") as archive:
        stages = archive.extractfile("./stages.tsv").read().decode()
        report = archive.extractfile("./ops.md").read().decode()
    assert "ops, SIGTERM\t143" in stages and "model" not in stages
    assert "(INTERRUPTED:" in report.splitlines()[0]
    assert "=== SIGTERM" in (out / "device_check.log").read_text()  # tee outlived the group's signal


def test_linear_tactic_sweep_times_every_candidate_and_reports(tmp_path):
    # The GPU-only `--candidates` sweep of benchmarks.ops, run with an emulated Hopper plan and a fake timer.
    if not ops.build_info.WITH_CUDA:
        pytest.skip("a CPU-only build has no CUTLASS kernels to plan")
    from benchmarks import ops as ops_benchmark

    x, w = torch.randn(16, 256, dtype=torch.bfloat16), torch.randn(512, 256, dtype=torch.bfloat16) / 16
    b = torch.randn(512, dtype=torch.bfloat16)
    forced = []

    def fn():  # on CPU the forced tactic changes nothing: every candidate's output is right
        forced.append(ops.gemm.get_tactic())
        return ops.linear(x, w, b, "silu")

    timed = []
    sweep = ops_benchmark.sweep_linear_tactics(
        "linear[silu]", "T=16", "bf16", fn, x, w, b, "silu",
        lambda fn: (timed.append(fn()), 1e-3 * len(timed))[1], 2e-3, (9, 0), 132)
    names = list(sweep["times_ms"])
    assert len(names) > 1 and forced == [n for n in names for _ in range(2)]  # each one checked, then timed
    assert sweep["best"] == names[0] and sweep["problems"] == {}  # the fake timer: the first is the fastest
    # The heuristic's time is its own timing of the sweep (the fake timer's i-th call takes i ms); the
    # stream-K tactics run last.
    assert sweep["heuristic"] in names and sweep["heuristic_ms"] == names.index(sweep["heuristic"]) + 1.0
    assert "_stream_k" in names[-1] and "_stream_k" not in names[0]
    assert ops.gemm.get_tactic() is None
    ops_benchmark.report_linear_tactics([sweep], {"gpu": "emulated"}, str(tmp_path))
    assert "| linear[silu] | T=16 | bf16 |" in (tmp_path / "ops_linear_candidates.md").read_text()


def test_tactic_sweep_flags_a_wrong_result_and_does_not_time_it():
    """A candidate kernel that is fast and wrong must not come out "best": each output is checked
    against the float64 reference first. The sweep runs a real CPU GEMM; one tactic name stands for a
    broken kernel (its output is off in one element, or NaN), one for a tactic CUTLASS refuses."""
    from benchmarks.common import output_check, sweep_tactics, wrong_results

    A, B = torch.randn(64, 96, dtype=torch.bfloat16), torch.randn(96, 80, dtype=torch.bfloat16)
    reference = A.double() @ B.double()
    broken = {"off_by_one_element": lambda C: C.index_put_((torch.tensor(3), torch.tensor(7)), C[3, 7] + 1.0),
              "nan": lambda C: C.fill_(float("nan"))}

    def fn():
        C = torch.mm(A, B)
        tactic = ops.gemm.get_tactic()
        if tactic == "refused":
            raise RuntimeError("ops.cutlass_gemm: tactic 'refused' cannot run this problem\nmore context")
        return broken[tactic](C) if tactic in broken else C

    timed = []
    torch_error = (torch.mm(A, B).double() - reference).abs().max().item() / reference.abs().max().item()
    times, problems = sweep_tactics(fn, ["good", "off_by_one_element", "nan", "refused"],
                                    lambda f: (timed.append(ops.gemm.get_tactic()), 1e-6)[1],
                                    check=output_check(reference, torch.bfloat16, [torch_error]))
    assert times == {"good": 1e-6, "off_by_one_element": None, "nan": None, "refused": None}
    assert timed == ["good"] and ops.gemm.get_tactic() is None
    assert problems["off_by_one_element"].startswith("WRONG RESULT: max relative error")
    assert problems["nan"] == "WRONG RESULT: non-finite values in the output"
    assert problems["refused"] == "refused: ops.cutlass_gemm: tactic 'refused' cannot run this problem"
    assert wrong_results(problems) == ["nan", "off_by_one_element"]


def test_a_tactic_that_breaks_the_cuda_context_stops_the_sweep(monkeypatch):
    """After a sticky CUDA error (an illegal address) every later call fails: the sweep stops there with
    DeviceUnusable naming the tactic, instead of recording every later tactic as refused."""
    from benchmarks import common

    monkeypatch.setattr(common, "cuda_context_usable", lambda: False)  # what synchronize() then says

    def fn():
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors ...")

    with pytest.raises(common.DeviceUnusable, match="tactic first left the CUDA context unusable: CUDA error: an "
                                                    "illegal memory access was encountered$"):
        common.sweep_tactics(fn, ["first", "second"], lambda f: (f(), 1.0)[1])
    assert ops.gemm.get_tactic() is None


def test_aborted_gemm_benchmark_reports_what_it_measured_and_fails(tmp_path, monkeypatch):
    from benchmarks import gemm

    real, calls = gemm.measure_case, []

    def measure_then_fail(*args):
        calls.append(args)
        if len(calls) == 2:
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")
        real(*args)

    monkeypatch.setattr(gemm, "measure_case", measure_then_fail)
    with pytest.raises(SystemExit, match="aborted after 1 of 3 cases"):
        gemm.main(["--cpu", "--suite", "square", "--dtypes", "fp32", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "gemm.json").read_text())
    error = "fp32 square 512: RuntimeError: CUDA error: an illegal memory access was encountered"
    assert report["aborted"] == {"measured": 1, "planned": 3, "error": error}
    assert [r["M"] for r in report["results"]] == [256]
    assert f"ABORTED after 1 of 3 cases: {error}" in (tmp_path / "gemm.md").read_text()
    assert not (tmp_path / "gemm.partial.jsonl").exists()  # the report holds everything it had


def test_a_benchmark_that_dies_leaves_what_it_measured(tmp_path):
    """A segfault in a kernel under test kills the process before any report: the cases measured before
    it are in <stem>.partial.jsonl, one JSON line each. A real process, killed by a real SIGSEGV."""
    code = f"""
import os, signal
from benchmarks import gemm
real, calls = gemm.measure_case, []
def measure_then_crash(*args):
    calls.append(args)
    if len(calls) == 3:
        os.kill(os.getpid(), signal.SIGSEGV)
    real(*args)
gemm.measure_case = measure_then_crash
gemm.main(["--cpu", "--suite", "square", "--dtypes", "fp32", "--out", {str(tmp_path)!r}])
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == -11, result.stderr[-2000:]
    assert not (tmp_path / "gemm.json").exists()
    lines = [json.loads(line) for line in (tmp_path / "gemm.partial.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["M"]) for r in lines] == [("result", 256), ("result", 512)]
    assert all(r["ops_ms"] > 0 and r["ops_max_rel_err"] < 1e-5 for r in lines)


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



@pytest.mark.parametrize("dtypes", ["fp64", "bf16,int8", ","])
def test_ops_benchmark_rejects_unknown_dtypes_before_writing(tmp_path, dtypes, capsys):
    from benchmarks import ops as ops_benchmark

    with pytest.raises(SystemExit) as info:
        ops_benchmark.main(["--dtypes", dtypes, "--out", str(tmp_path)])
    assert info.value.code == 2 and "--dtypes" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # a previous report in --out would have been kept


@pytest.mark.parametrize("dtypes", ["bogus", "bf16,int8", ","])
def test_gemm_benchmark_rejects_bad_arguments_before_writing(tmp_path, dtypes, capsys):
    from benchmarks import gemm as gemm_benchmark

    partial = tmp_path / "gemm.partial.jsonl"  # what a crashed run left: the next run's arguments must not wipe it
    partial.write_text('{"kind": "result", "shape": "kept"}\n')
    with pytest.raises(SystemExit) as info:
        gemm_benchmark.main(["--dtypes", dtypes, "--out", str(tmp_path)])
    assert info.value.code == 2 and "--dtypes" in capsys.readouterr().err
    assert partial.read_text() == '{"kind": "result", "shape": "kept"}\n'
    with pytest.raises(SystemExit) as info:
        gemm_benchmark.main(["--out", str(partial)])
    assert info.value.code == 2 and "--out must be a folder" in capsys.readouterr().err


def test_a_sweep_goes_on_past_a_tactic_that_hangs_or_crashes(tmp_path):
    # benchmarks.watchdog: the tactic that never returns, the one that kills its process and the one that
    # leaves the CUDA context unusable each become a row of their case; every other tactic of both cases is
    # measured, each case once.
    from benchmarks import watchdog

    env_path = os.path.join(REPO, "tests")
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = env_path + os.pathsep + REPO + (os.pathsep + old if old else "")
    try:
        t0 = time.time()
        rc = watchdog.supervise("sweep_worker", [str(tmp_path)], str(tmp_path / "sweep.partial.jsonl"), limit_s=3)
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    assert rc == 0
    cases = json.loads((tmp_path / "sweep.json").read_text())
    assert [c["case"] for c in cases] == ["bf16 case A", "bf16 case B"]
    for c in cases:
        assert {k for k, v in c["times"].items() if v} == {"fast", "slow", "last"}, c
        assert c["problems"]["hangs"].startswith("HANG: no return within 3") and c["problems"]["crashes"].startswith("CRASH"), c
        assert c["problems"]["loses"] == "CRASH: the tactic left the CUDA context unusable", c
    assert not (tmp_path / "sweep.partial.jsonl").exists()
    assert time.time() - t0 < 120


def test_an_interrupted_sweep_kills_a_worker_stuck_in_a_launch(tmp_path):
    # SIGINT to the supervisor (device_check.sh's time limit) while the worker cannot report: the worker's
    # process group is killed within the grace, not left running on its own session.
    script = ("import sys; from benchmarks import watchdog; watchdog.INTERRUPT_GRACE_S = 2; "
              f"sys.exit(watchdog.supervise('sweep_worker', [{str(tmp_path)!r}, '--stuck'], "
              f"{str(tmp_path / 'sweep.partial.jsonl')!r}, limit_s=600))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "tests"), REPO]))
    supervisor = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=env)
    pid_file = tmp_path / "worker.pid"
    deadline = time.time() + 120
    while not pid_file.exists() and time.time() < deadline:
        time.sleep(0.2)
    worker = int(pid_file.read_text())
    time.sleep(0.5)
    supervisor.send_signal(signal.SIGINT)
    assert supervisor.wait(timeout=30) == 130
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)


def test_sweeps_run_the_risky_tactics_last():
    from benchmarks.common import sweep_order

    names = ["sm90_bf16_128x128x64_1x1x1_tnt_align8_stream_k_warpspecialized_cooperative/dp",
             "sm90_bf16_64x16x64_1x1x1_ttn_align8_warpspecialized_pingpong",
             "sm90_bf16_128x256x64_2x1x1_tnt_align8_warpspecialized_cooperative/swz8/raster_m",
             "sm90_bf16_128x128x64_2x1x1_tnt_align8_warpspecialized_cooperative"]
    assert sweep_order(names) == [names[2], names[3], names[0], names[1]]


@pytest.mark.parametrize("argv", [["--suite", "decode", "--models", "minilm"], ["--suite", "square", "--tokens", "4"],
                                  ["--suite", "models", "--squares", "8"], ["--rounds", "3"], ["--tokens", "4,4"],
                                  ["--tokens", "0"], ["--models", "llama3_8b,llama3_8b"], ["--tactic-limit", "nan"]])
def test_gemm_benchmark_refuses_options_that_would_be_ignored_or_repeat(argv):
    from benchmarks import gemm

    with pytest.raises(SystemExit):
        gemm.parse_args(argv)


def test_the_gpu_sweep_covers_every_candidate_configuration_within_its_budget():
    # benchmarks/sweep_plan.py: the groups device_check.sh's sweep stage runs, planned on CPU for the H200.
    from benchmarks import sweep_plan

    rows = sweep_plan.plan()
    swept = {name.split("/")[0] for r in rows for name in r["names"]}
    acts = {a for _, argv, _ in sweep_plan.FUSED for a in argv[argv.index("--acts") + 1].split(",")}
    for k in ops.kernels("cutlass_gemm"):
        # bf16 on SM90, the weight layout (row-major B: the square suite, whose M is never small), the plain
        # epilogue or the swept activations
        served = k["layout_b"] == "col" or not k["swap_ab"]
        if (k["candidate_only"] and k["sm"] == 90 and k["dtype"] == "bfloat16" and served
                and k["epilogue"] in {"plain"} | {f"bias_{a}" for a in acts}):
            assert k["name"] in swept, k["name"]
    squares = next(r for r in rows if r["group"] == "squares")["names"]
    assert {"swz1", "swz2", "swz4", "swz8", "raster_m", "raster_n"} <= {p for n in squares for p in n.split("/")[1:]} | {
        "swz1"}
    # Each group's limit is twice its estimate; the whole sweep fits one device call with the plain tables.
    assert sum(sweep_plan.limit_seconds(r["seconds"]) for r in rows) <= 480
    assert sum(sweep_plan.limit_seconds(r["seconds"]) for r in sweep_plan.plan(short=True)) <= 300
    readme = open(os.path.join(REPO, "benchmarks", "GPU_PLAN.md")).read()
    for r in rows:  # GPU_PLAN.md's table states this plan
        assert re.search(rf"^\| {re.escape(r['group'])} \| [^|]+ \| {r['tactics']} \| {r['seconds']} \|", readme, re.M), r
    assert f"add up to {sum(sweep_plan.limit_seconds(r['seconds']) for r in rows)} s" in readme
    assert f"limits {sum(sweep_plan.limit_seconds(r['seconds']) for r in sweep_plan.plan(short=True))} s)" in readme
    lines = subprocess.run([sys.executable, "-m", "benchmarks.sweep_plan", "--commands"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.splitlines()
    assert [line.split("\t")[0] for line in lines] == [r["group"] for r in rows]
    for line in lines:  # each a command its benchmark's parser takes
        _, limit_s, module, args = line.split("\t")
        assert int(limit_s) >= 30 and "--tactic-limit 20" in args
        if module == "benchmarks.gemm":
            from benchmarks import gemm
            assert gemm.planned_cases(gemm.parse_args(args.split()), "cuda")


def test_fp8_benchmark_reports_every_recipe_and_what_torch_cannot_run(tmp_path):
    from benchmarks import fp8

    assert fp8.main(["--quick", "--nk", "32x256", "--tokens", "4", "--hidden", "256", "--no-compile",
                     "--out", str(tmp_path)]) == 0
    gemm = json.loads((tmp_path / "fp8_gemm.json").read_text())["results"]
    assert [r["recipe"] for r in gemm] == ["tensorwise", "rowwise", "block128"]
    for r in gemm:
        assert r["ops_error"] < 1e-2 and r["ops_tflops"] > 0 and r["vs_bf16_mm"] > 0
    # torch runs tensorwise everywhere, rowwise on CPU from 2.14 on, no blockwise recipe on CPU.
    assert "vs_torch" in gemm[0] and "torch_unavailable" in gemm[2]
    quant = json.loads((tmp_path / "fp8_quant.json").read_text())["results"]
    assert {r["op"] for r in quant} == {"quantize row", "quantize group", "rms_norm_fp8", "silu_and_mul_fp8"}
    assert "n/a" in (tmp_path / "fp8_gemm.md").read_text()
    with pytest.raises(SystemExit):
        fp8.main(["--nk", "30x256"])


def test_grouped_benchmark_times_every_implementation_both_passes_and_the_layer(tmp_path):
    from benchmarks import grouped

    assert grouped.main(["--models", "tiny", "--tokens", "3,20", "--fp8", "--out", str(tmp_path)]) == 0
    fp8_rows = json.loads((tmp_path / "grouped_fp8.json").read_text())["results"]
    assert len(fp8_rows) == 2 * 2 * 2  # proj x tokens x routing, forward
    for r in fp8_rows:  # torch._scaled_grouped_mm runs on CUDA only
        assert r["ops_tflops"] > 0 and r["vs_bf16"] > 0 and r["ops_path"] == "formula", r
        assert ("vs_torch" in r) == torch.cuda.is_available(), r
    payload = json.loads((tmp_path / "grouped_gemm.json").read_text())
    rows = payload["results"]
    assert len(rows) == 2 * 2 * 2 * 2  # proj x tokens x routing x pass
    for r in rows:
        assert r["ops_tflops"] > 0 and r["vs_torch"] > 0 and r["vs_loop"] > 0, r
        assert r["rows"] == r["tokens"] * 2
        assert r["ops_path"] == "loop"  # on CPU; on CUDA the kernel's name (ops.grouped.plan)
    assert {r["direction"] for r in rows} == {"forward", "backward"}
    assert max(r["largest_group"] for r in rows if r["routing"] == "skewed") > 20 * 2 / 8  # skewed: uneven
    assert [r["tokens"] for r in payload["layers"]] == [3, 20]
    assert all(r["max_diff"] < 1e-1 for r in payload["layers"])
    with pytest.raises(SystemExit):
        grouped.main(["--models", "gpt-5"])


def test_interrupted_grouped_benchmark_reports_what_it_measured(tmp_path, monkeypatch):
    # device_check.sh's time limit (SIGINT) in the FP8 rows: the bf16 report is whole, the FP8 one holds the
    # rows measured before it, and nothing after runs.
    from benchmarks import grouped

    measure_fp8, calls = grouped.measure_fp8, []

    def interrupted_third(*args):
        calls.append(args)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return measure_fp8(*args)

    monkeypatch.setattr(grouped, "measure_fp8", interrupted_third)
    argv = ["--models", "tiny", "--tokens", "3", "--fp8", "--candidates", "--out", str(tmp_path)]
    assert grouped.main(argv) == 130
    assert len(json.loads((tmp_path / "grouped_gemm.json").read_text())["results"]) == 2 * 2 * 2
    # the first shape's rowwise row (its blockwise one: none, K = 64 is no whole 128-block), then the interrupt
    assert len(json.loads((tmp_path / "grouped_fp8.json").read_text())["results"]) == 1
    assert len(calls) == 3 and not (tmp_path / "grouped_candidates.json").exists()


def test_grouped_fp8_benchmark_times_both_recipes_where_k_is_whole_blocks(tmp_path, monkeypatch):
    from benchmarks import grouped

    monkeypatch.setitem(grouped.MODELS, "tiny", (8, 2, 128, 128))  # K 128 for both projections
    assert grouped.main(["--models", "tiny", "--tokens", "20", "--fp8", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "grouped_fp8.json").read_text())["results"]
    assert sorted({(r["proj"], r["recipe"]) for r in rows}) == [
        ("down", "blockwise"), ("down", "rowwise"), ("up", "blockwise"), ("up", "rowwise")]
    for r in rows:
        assert r["ops_tflops"] > 0 and r["vs_bf16"] > 0, r
    assert all("no 128x128 blockwise recipe" in r["torch_unavailable"] for r in rows if r["recipe"] == "blockwise")
    assert "| blockwise |" in (tmp_path / "grouped_fp8.md").read_text()


def test_grouped_benchmark_candidate_sweep(tmp_path, monkeypatch, capsys):
    # On CPU no call has candidate kernels: the sweep says so. With a plan that names two (as the SM90 build's
    # on CUDA), each is forced in turn, checked against float64 and timed; a wrong one is named, never best.
    from benchmarks import grouped

    assert grouped.main(["--models", "tiny", "--tokens", "3", "--candidates", "--out", str(tmp_path)]) == 0
    assert "no call here has more than one candidate kernel" in capsys.readouterr().out
    forced = []
    real_plan, real_gemm = ops.grouped.plan, ops.grouped_gemm
    monkeypatch.setattr(ops.grouped, "plan", lambda *a: {**real_plan(*a), "kernel": "k_dp", "candidates": ["k_dp", "k_swap"]})
    monkeypatch.setattr(ops.gemm, "set_tactic", forced.append)
    monkeypatch.setattr(ops, "grouped_gemm", lambda *a: real_gemm(*a) * (2 if forced and forced[-1] == "k_swap" else 1))
    assert grouped.main(["--models", "tiny", "--tokens", "20", "--candidates", "--out", str(tmp_path)]) == 0
    sweeps = json.loads((tmp_path / "grouped_candidates.json").read_text())["results"]
    assert len(sweeps) == 4 and all(r["best"] == "k_dp" and r["wrong_results"] == ["k_swap"] for r in sweeps)
    assert "| k_dp | k_swap |" in (tmp_path / "grouped_candidates.md").read_text()
    assert forced.count(None) == 4  # the heuristic restored after each sweep


def test_grouped_benchmark_group_sizes_sum_to_the_picks():
    from benchmarks.grouped import group_sizes

    for routing in ("balanced", "skewed"):
        sizes = group_sizes(37, 8, 2, routing)
        assert sizes.sum() == 74 and len(sizes) == 8 and (sizes >= 0).all()
    assert group_sizes(37, 8, 2, "balanced").tolist() == [10, 10, 9, 9, 9, 9, 9, 9]


def test_reports_are_replaced_whole(tmp_path):
    # A run stopped while it writes a report (a second signal) keeps the previous file, never a torn one.
    from benchmarks.common import replacing, write_json

    path = tmp_path / "gemm.json"
    write_json(str(path), {"rows": [1, 2]})
    with pytest.raises(KeyboardInterrupt):
        with replacing(str(path)) as f:
            f.write('{"rows": [1')
            raise KeyboardInterrupt
    assert json.loads(path.read_text()) == {"rows": [1, 2]}
    assert os.listdir(tmp_path) == ["gemm.json"]


def test_benchmark_docs_links_resolve():
    # benchmarks/README.md, GPU_PLAN.md and the results' summaries: every relative link reaches a file, its
    # #anchor a heading of that file (GitHub's anchors: lower case, punctuation dropped, spaces as hyphens), and
    # every benchmarks/....md path in the text a file.
    def anchors(path):
        return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.*)$", open(path).read(), re.M)}

    pages = [os.path.join(REPO, "benchmarks", name) for name in ("README.md", "GPU_PLAN.md")]
    pages += sorted(glob.glob(os.path.join(REPO, "benchmarks", "results", "*", "SUMMARY.md")))
    checked = 0
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", open(page).read()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            assert os.path.exists(full), (page, target)
            assert not anchor or anchor in anchors(full), (page, target, sorted(anchors(full)))
            checked += 1
        for named in re.findall(r"(?<![\w/.])(benchmarks/[\w./-]+\.md)\b", open(page).read()):  # a path in the text
            assert os.path.exists(os.path.join(REPO, named)), (page, named)
            checked += 1
    assert checked >= 5
