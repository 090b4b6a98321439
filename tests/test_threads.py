"""The library used from several Python threads at once (torch.ops calls release the GIL, so the C++ host
code really runs concurrently). On CPU. From a review of thread safety (2026-12-01), whose first four tests
failed before its fixes: two concurrent ops.nn.convert calls left torch.fx's patched Module.__call__
installed for the whole process; convert rewound other threads' random numbers (fork_rng); convert reused
a per-class parse of a forward replaced later; set_tactic could return a value another thread had
already replaced. The stress test (tests/thread_stress.py) found nothing in the C++ host code.
"""

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import torch

import ops
from conftest import REPO


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.act = torch.nn.GELU()
        self.fc2 = torch.nn.Linear(32, 16)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def _model():
    return torch.nn.Sequential(*[torch.nn.ModuleList([_Block()]) for _ in range(4)])


def _run_threads(targets, seconds):
    stop, errors = threading.Event(), []

    def wrap(fn):
        def run():
            try:
                while not stop.is_set():
                    fn()
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        return run

    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=wrap(fn)) for fn in targets]
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(previous)
    return errors


def test_concurrent_converts_restore_module_call():
    orig_call, orig_getattr = torch.nn.Module.__call__, torch.nn.Module.__getattr__

    def convert():
        report = ops.nn.convert(_model())
        assert len(report.fused) == 4, report

    try:
        errors = _run_threads([convert, convert], seconds=2.0)
        assert torch.nn.Module.__call__ is orig_call and torch.nn.Module.__getattr__ is orig_getattr
        assert not errors, errors[:2]
    finally:
        torch.nn.Module.__call__, torch.nn.Module.__getattr__ = orig_call, orig_getattr


def test_convert_leaves_other_threads_rng_alone():
    drawn = []
    errors = _run_threads([lambda: ops.nn.convert(_model()),
                           lambda: drawn.append(torch.rand(1, dtype=torch.float64).item())], seconds=2.0)
    assert not errors
    assert len(drawn) > 100 and len(set(drawn)) == len(drawn), f"{len(drawn) - len(set(drawn))} repeated draws"


def test_convert_reads_a_replaced_forward(tmp_path):
    # In a fresh process: convert once, replace the parent's forward with one that calls fc1 directly, convert
    # a new instance: the pair must not be fused (it was, from the per-class cache of the old forward).
    code = textwrap.dedent("""
        import torch, ops
        class MLP(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1, self.act, self.fc2 = torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8)
            def forward(self, x):
                return self.fc2(self.act(self.fc1(x)))
        class Top(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.mlp = MLP()
            def forward(self, x):
                return self.mlp(x)
        def probing_forward(self, x):
            return self.mlp(x) + self.mlp.fc1(x).sum(-1, keepdim=True)
        ops.nn.convert(Top())
        Top.forward = probing_forward
        model, x = Top(), torch.randn(4, 8)
        expected = model(x)
        report = ops.nn.convert(model)
        assert report.fused == [], report.fused
        torch.testing.assert_close(model(x), expected)
    """)
    script = tmp_path / "replaced_forward.py"  # a file: convert reads forwards from their source
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_set_tactic_returns_what_it_replaced():
    # Each set_tactic returns the value it replaced: the values returned, plus the final one, are exactly
    # the initial None plus every value set (no value returned twice, none lost).
    names = [f"t{i}" for i in range(4)]
    returned, lock = [], threading.Lock()
    ops.gemm.set_tactic(None)
    barrier = threading.Barrier(len(names))

    def setter(name):
        barrier.wait()
        for k in range(1000):
            previous = ops.gemm.set_tactic(f"{name}.{k}")
            with lock:
                returned.append(previous)

    threads = [threading.Thread(target=setter, args=(n,)) for n in names]
    previous_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(previous_interval)
        final = ops.gemm.set_tactic(None)
    assert sorted(map(str, returned + [final])) == sorted(map(str, [None] + [f"{n}.{k}" for n in names
                                                                            for k in range(1000)]))


def test_ops_from_many_threads_match_single_threaded():
    # The stress test, shortened (about 15 s on 2 cores).
    result = subprocess.run([sys.executable, os.path.join(REPO, "tests", "thread_stress.py"), "--seconds", "10"],
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


def test_a_loaded_tuning_cache_appears_all_at_once(tmp_path):
    # load_tuning_cache stored each entry under its own lock, so a reader in another thread could see
    # part of a file (found by the thread-safety review); now all entries are stored under one lock.
    entries = [{"key": f"test key {i}", "best": "sm90_bf16_rc", "timings_ms": {}} for i in range(300)]
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"format": "ops.gemm tuning cache", "version": 1, "entries": entries}))
    seen, stop = set(), threading.Event()

    def reader():
        while not stop.is_set():
            seen.add(len(ops.gemm.tuning_cache()))

    thread = threading.Thread(target=reader)
    previous_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread.start()
    try:
        for _ in range(200):
            ops.gemm.clear_tuning_cache()
            ops.gemm.load_tuning_cache(str(path))
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(previous_interval)
        ops.gemm.clear_tuning_cache()
    assert seen <= {0, len(entries)}, sorted(seen)[:10]
