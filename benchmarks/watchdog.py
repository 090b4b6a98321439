"""A per-tactic watchdog for candidate sweeps: a kernel that never returns (CUTLASS's stream-K hang
reports at small M: NVIDIA/cutlass#1801, #1917, #2238) costs one row of the report, not the stage.

The benchmark runs as a worker process under a supervisor (``supervise``). Before each tactic the worker
writes a "start" record to its partial log (benchmarks.common.PartialLog, flushed at once) and an "end"
record after it. The supervisor polls the log: a "start" older than the limit, or a worker that dies in
the middle of a tactic (a crash), gets a "hang" (or "crash") record, the worker is killed and started
again, and the new worker (``ResumeState``) keeps what the log holds, skips the cases already measured
and the tactics that hung or crashed, and goes on. SIGINT to the supervisor (device_check.sh's time
limit) is passed to the worker, which reports what it measured.
"""

import json
import os
import signal
import subprocess
import sys
import time

WORKER_FLAG = "--worker"
# Seconds a worker has to report after SIGINT before its process group is killed: under device_check.sh's
# kill grace (timeout -k 20), whose SIGKILL reaches the supervisor only (the worker has a session of its
# own) and would leave a worker stuck in a kernel running on the GPU.
INTERRUPT_GRACE_S = 10
# A worker's exit status after a tactic left its CUDA context unusable (a sticky error: nothing after it can run
# in that process): the supervisor records it as a crash of that tactic and goes on in a new worker.
DEVICE_LOST_EXIT = 5


def read_records(path):
    """The JSON records of a partial log (a line cut short by a kill is dropped)."""
    records = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    except FileNotFoundError:
        pass
    return records


def _append(path, record):
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


class Progress:
    """Worker side: start/end records of each tactic (and of any other launch worth watching). `supervised`: the
    process is a worker of ``supervise``, which restarts it past a tactic that loses the device."""

    def __init__(self, log, supervised=False):
        self.log = log
        self.supervised = supervised

    def device_lost(self, case, tactic, error):
        """Under a supervisor, ends the process at once, the tactic's "start" record last (its crash row);
        otherwise returns (the caller raises)."""
        if self.supervised:
            print(f"  [{case}] {tactic} left the CUDA context unusable ({error}): a new worker goes on",
                  file=sys.stderr, flush=True)
            os._exit(DEVICE_LOST_EXIT)

    def start(self, case, tactic):
        print(f"  [{case}] {tactic}", file=sys.stderr, flush=True)  # named before it launches
        self.log.write("start", {"case": case, "tactic": tactic, "t": time.time()})

    def end(self, case, tactic):
        self.log.write("end", {"case": case, "tactic": tactic, "t": time.time()})


class ResumeState:
    """What an earlier worker left in the partial log: its records of `kinds` (in order), the cases they
    cover, and per case the tactics to skip ({tactic: "HANG: ..." or "CRASH: ..."})."""

    def __init__(self, path, kinds=("result", "candidates")):
        self.records = []
        self.skips = {}
        for r in read_records(path):
            if r.get("kind") in kinds:
                self.records.append(r)
            elif r.get("kind") in ("hang", "crash"):
                why = (f"HANG: no return within {r.get('limit_s')} s" if r["kind"] == "hang"
                       else "CRASH: the tactic left the CUDA context unusable"
                       if r.get("returncode") == DEVICE_LOST_EXIT else "CRASH: the process died in this tactic")
                self.skips.setdefault(r["case"], {})[r["tactic"]] = why

    def of(self, kind):
        return [{k: v for k, v in r.items() if k != "kind"} for r in self.records if r["kind"] == kind]


def supervise(module, argv, partial_path, limit_s, max_restarts=24, poll_s=0.25):
    """Runs ``python -m module *argv --worker`` and restarts it past each tactic that hangs for more than
    `limit_s` seconds or crashes (at most `max_restarts` times). Returns the last worker's exit status."""
    cmd = [sys.executable, "-m", module, *argv, WORKER_FLAG]
    # SIGINT (device_check.sh's time limit) must interrupt the wait below, also where the process started
    # with SIGINT ignored (a background job of a non-interactive shell: Python then installs no handler).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if os.path.exists(partial_path):
        os.remove(partial_path)  # a fresh run; only this run's workers resume from it
    restarts = 0
    while True:
        proc = subprocess.Popen(cmd, start_new_session=True)
        outcome = None
        try:
            while proc.poll() is None:
                time.sleep(poll_s)
                records = read_records(partial_path)
                last = records[-1] if records else None
                if last and last.get("kind") == "start" and time.time() - last["t"] > limit_s:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    outcome = ("hang", last)
                    break
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                return proc.wait(timeout=INTERRUPT_GRACE_S)
            except subprocess.TimeoutExpired:  # stuck in a launch: it cannot report
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                print(f"watchdog: the worker did not stop within {INTERRUPT_GRACE_S} s of SIGINT; killed",
                      file=sys.stderr, flush=True)
                return 130
        if outcome is None:
            records = read_records(partial_path)
            last = records[-1] if records else None
            if proc.returncode in (0, 3) or not last or last.get("kind") != "start":
                return proc.returncode
            outcome = ("crash", last)
        kind, last = outcome
        _append(partial_path, {"kind": kind, "case": last["case"], "tactic": last["tactic"], "limit_s": limit_s,
                               "returncode": proc.returncode})
        print(f"watchdog: {last['tactic']} ({last['case']}) {'did not return within %g s' % limit_s if kind == 'hang' else 'crashed'}"
              f"; recorded, going on with a new worker", file=sys.stderr, flush=True)
        restarts += 1
        if restarts > max_restarts:
            print(f"watchdog: {restarts} restarts, giving up", file=sys.stderr)
            return 4
