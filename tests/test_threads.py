"""The library used from several Python threads at once (torch.ops calls release the GIL, so the C++ host
code really runs concurrently). On CPU: concurrent ops.nn.convert calls, convert beside another thread's
random draws, the tactic and autotune controls, the tuning cache, and a stress test of every op
(tests/thread_stress.py).
"""

import json
import os
import subprocess
import sys
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


def test_concurrent_converts():
    def convert():
        report = ops.nn.convert(_model())
        assert len(report.linear) == 8, report

    errors = _run_threads([convert, convert], seconds=2.0)
    assert not errors, errors[:2]


def test_convert_leaves_other_threads_rng_alone():
    drawn = []
    errors = _run_threads([lambda: ops.nn.convert(_model()),
                           lambda: drawn.append(torch.rand(1, dtype=torch.float64).item())], seconds=2.0)
    assert not errors
    assert len(drawn) > 100 and len(set(drawn)) == len(drawn), f"{len(drawn) - len(set(drawn))} repeated draws"


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
    # load_tuning_cache stores all entries under one lock: a reader in another thread never sees part of
    # a file.
    entries = [{"key": f"test key {i}", "best": "sm90_bf16_128x128x64_2x1x1_tnt_align8_warpspecialized_cooperative", "timings_ms": {}} for i in range(300)]
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"format": "ops.gemm tuning cache", "version": 2, "entries": entries}))
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
