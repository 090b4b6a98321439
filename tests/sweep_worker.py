"""A candidate sweep on CPU whose tactics are stand-ins, run by tests/test_benchmarks.py under
benchmarks.watchdog.supervise: tactic "hangs" never returns, tactic "crashes" kills its process and tactic
"loses" raises with the CUDA context left unusable (a sticky error), as a CUTLASS kernel can on a GPU. Writes <out>/sweep.json when every case is done. With --stuck, the first
tactic ignores SIGINT and never returns (a worker blocked in a launch); its pid goes to <out>/worker.pid.

    python -m sweep_worker OUT [--stuck] [--worker]
"""

import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ops.gemm  # noqa: E402
from benchmarks import common, watchdog  # noqa: E402
from benchmarks.common import PartialLog, sweep_tactics  # noqa: E402

CASES = ["bf16 case A", "bf16 case B"]
TACTICS = ["fast", "hangs", "slow", "crashes", "loses", "last"]
LOST = []  # the "loses" tactic ran in this process: its CUDA context is gone


def run_tactic(name):
    if name == "hangs":
        time.sleep(3600)
    if name == "crashes":
        os.kill(os.getpid(), signal.SIGSEGV)
    if name == "loses":
        LOST.append(name)
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    return name


def main():
    out = sys.argv[1]
    current = {}
    ops.gemm.set_tactic = lambda name: current.update(name=name)  # sweep_tactics forces each tactic
    resume = watchdog.ResumeState(os.path.join(out, "sweep.partial.jsonl"), kinds=("case",))
    log = PartialLog(out, "sweep", append=True)
    common.cuda_context_usable = lambda: not LOST
    progress = watchdog.Progress(log, supervised=watchdog.WORKER_FLAG in sys.argv)
    if "--stuck" in sys.argv:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with open(os.path.join(out, "worker.pid"), "w") as f:
            f.write(str(os.getpid()))
        progress.start(CASES[0], "stuck")
        time.sleep(3600)
    done = {r["case"]: r for r in resume.of("case")}
    for case in CASES:
        if case in done:
            continue
        def fn():
            return run_tactic(current.get("name"))

        def timer(f):
            f()
            return 1e-3

        times, problems = sweep_tactics(fn, TACTICS, timer, progress=progress, case=case,
                                        skip=resume.skips.get(case, {}))
        record = {"case": case, "times": times, "problems": problems}
        log.write("case", record)
        done[case] = record
    with open(os.path.join(out, "sweep.json"), "w") as f:
        json.dump(list(done.values()), f)
    log.finish()


if __name__ == "__main__":
    main()
