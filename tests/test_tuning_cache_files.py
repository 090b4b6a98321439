"""ops.gemm.save_tuning_cache / load_tuning_cache and OPS_GEMM_TUNING_CACHE on the file system, checked
without a GPU (entries are added with torch.ops.ops._cutlass_gemm_add_tuning): a save replaces the file
whole (processes saving at once, a save cut short), a load reads only a regular file of bounded size and
never waits on a FIFO, and both take only file paths."""

import json
import os
import stat
import subprocess
import sys
import threading
import time

import pytest
import torch

import ops
from conftest import REPO


def add_entries(tag, n):
    """Adds n entries keyed by `tag` to the tuning cache; returns them as tuning_cache() lists them."""
    keys = [f"test {tag} key {i}" for i in range(n)]
    torch.ops.ops._cutlass_gemm_add_tuning(keys, ["t0"] * n, [2] * n, ["t0", "t1"] * n, [0.5, -1.0] * n)
    return [{"key": key, "best": "t0", "timings_ms": {"t0": 0.5, "t1": None}} for key in keys]


@pytest.fixture
def clean_tuning_cache():
    ops.gemm.clear_tuning_cache()
    yield
    ops.gemm.clear_tuning_cache()


def python_env():
    return dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))


# ---- saving: the whole file or nothing ------------------------------------------------------------

SAVER = r"""
import json, os, sys, time
import torch, ops

path, ready, tag, workers, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
n = 150 * (tag + 1)  # files of different lengths: writes interleaved in place are not valid JSON
keys = [f"worker {tag} key {i}" for i in range(n)]
open(os.path.join(ready, str(tag)), "w").close()
deadline = time.monotonic() + 60
while len(os.listdir(ready)) < workers and time.monotonic() < deadline:  # all start saving together
    time.sleep(0.002)
failures = []
for _ in range(rounds):
    ops.gemm.clear_tuning_cache()
    torch.ops.ops._cutlass_gemm_add_tuning(keys, ["t0"] * n, [3] * n, ["t0", "t1", "t2"] * n, [0.5, 1.5, -1.0] * n)
    ops.gemm.save_tuning_cache(path)
    ops.gemm.clear_tuning_cache()
    try:  # whatever the other processes are doing, the file is one whole cache
        ops.gemm.load_tuning_cache(path)
    except ValueError as e:
        failures.append(str(e)[:200])
print(json.dumps(failures))
"""


def test_processes_saving_to_one_path_leave_a_loadable_file(tmp_path, clean_tuning_cache):
    folder, ready = tmp_path / "cache", tmp_path / "ready"
    folder.mkdir()
    ready.mkdir()
    path = folder / "tuning.json"
    workers, rounds = 4, 20
    procs = [subprocess.Popen([sys.executable, "-c", SAVER, str(path), str(ready), str(tag), str(workers), str(rounds)],
                              cwd=REPO, env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for tag in range(workers)]
    failures = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-3000:]
        failures += json.loads(out.strip().splitlines()[-1])
    assert failures == [], f"{len(failures)} loads saw a partial file, e.g. {failures[0]}"
    assert os.listdir(folder) == ["tuning.json"]  # no temporary file left behind
    loaded = ops.gemm.load_tuning_cache(path)
    tags = {entry["key"].split(" key ")[0] for entry in ops.gemm.tuning_cache()}
    assert len(tags) == 1 and loaded == 150 * (int(tags.pop().split()[-1]) + 1)  # one worker's whole cache


class CutShort:
    """A file whose write stores part of the data, then raises `error` (a full disk, Ctrl-C)."""

    def __init__(self, f, error):
        self.f, self.error = f, error

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def write(self, data):
        self.f.write(data[:100])
        self.f.flush()
        raise self.error

    def __getattr__(self, name):
        return getattr(self.f, name)


@pytest.mark.parametrize("step", ["write", "os.fsync", "os.replace", "KeyboardInterrupt"])
def test_a_save_cut_short_leaves_the_previous_file(tmp_path, clean_tuning_cache, monkeypatch, step):
    path = tmp_path / "tuning.json"
    old = add_entries("old", 3)
    assert ops.gemm.save_tuning_cache(path) == 3
    before = path.read_bytes()
    add_entries("new", 5)
    if step in ("write", "KeyboardInterrupt"):
        error = OSError(28, "No space left on device") if step == "write" else KeyboardInterrupt()
        fdopen = os.fdopen
        monkeypatch.setattr(os, "fdopen", lambda *args, **kwargs: CutShort(fdopen(*args, **kwargs), error))
        error = type(error)
    else:
        def fail(*args):
            raise OSError(5, "Input/output error")
        monkeypatch.setattr(os, step.split(".")[1], fail)
        error = OSError
    with pytest.raises(error):
        ops.gemm.save_tuning_cache(path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["tuning.json"]  # the temporary file is removed
    ops.gemm.clear_tuning_cache()
    assert ops.gemm.load_tuning_cache(path) == 3 and ops.gemm.tuning_cache() == old


def test_a_save_keeps_the_mode_of_an_existing_file_and_follows_links(tmp_path, clean_tuning_cache):
    add_entries("mode", 2)
    new = tmp_path / "new.json"
    ops.gemm.save_tuning_cache(new)
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(new.stat().st_mode) == 0o666 & ~umask  # as open(path, "w") creates it
    existing = tmp_path / "existing.json"
    existing.write_text("{}")
    existing.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(existing)
    assert ops.gemm.save_tuning_cache(link) == 2
    assert link.is_symlink() and stat.S_IMODE(existing.stat().st_mode) == 0o640
    assert json.loads(existing.read_text())["entries"] == ops.gemm.tuning_cache()
    assert sorted(os.listdir(tmp_path)) == ["existing.json", "link.json", "new.json"]


def unblock_fifo_after(fifo, seconds, flags=os.O_WRONLY):
    """Opens `fifo` (for writing by default) after `seconds`, then closes it: a reader (or, with
    os.O_RDONLY, a writer) blocked in open(fifo) goes on instead of waiting for ever. Returns the timer,
    to cancel."""
    def unblock():
        try:
            fd = os.open(fifo, flags | os.O_NONBLOCK)
            time.sleep(0.5)
            os.close(fd)
        except OSError:  # nobody waiting
            pass
    timer = threading.Timer(seconds, unblock)
    timer.daemon = True
    timer.start()
    return timer


def test_save_refuses_what_is_not_a_regular_file(tmp_path, clean_tuning_cache):
    fifo = tmp_path / "cache.fifo"
    os.mkfifo(fifo)
    timer = unblock_fifo_after(fifo, 10, os.O_RDONLY)
    try:
        for path, kind in ((fifo, "a FIFO"), (tmp_path, "a directory")):
            with pytest.raises(ValueError, match=f"ops.gemm.save_tuning_cache: {path} is not a regular file \\({kind}\\)"):
                ops.gemm.save_tuning_cache(path)
    finally:
        timer.cancel()
    assert stat.S_ISFIFO(fifo.stat().st_mode) and os.listdir(tmp_path) == ["cache.fifo"]


# ---- loading: regular files only, a bounded read ---------------------------------------------------


def test_load_refuses_a_fifo_without_waiting(tmp_path, clean_tuning_cache):
    fifo = tmp_path / "cache.fifo"
    os.mkfifo(fifo)
    timer = unblock_fifo_after(fifo, 10)
    start = time.monotonic()
    try:
        with pytest.raises(ValueError, match=f"ops.gemm.load_tuning_cache: {fifo} is not a regular file \\(a FIFO\\)"):
            ops.gemm.load_tuning_cache(fifo)
    finally:
        timer.cancel()
    assert time.monotonic() - start < 5


def test_load_refuses_a_directory(tmp_path, clean_tuning_cache):
    with pytest.raises(ValueError, match=f"ops.gemm.load_tuning_cache: {tmp_path} is not a regular file "
                                         "\\(a directory\\)"):
        ops.gemm.load_tuning_cache(tmp_path)


ENDLESS = r"""
import json, resource, sys
import ops

# Room for 1 GiB more: an unbounded read fails with MemoryError instead of taking the machine's memory.
vm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + 2**30, resource.getrlimit(resource.RLIMIT_AS)[1]))
results = {}
for path in sys.argv[1:]:
    try:
        ops.gemm.load_tuning_cache(path)
        results[path] = "loaded"
    except BaseException as e:
        results[path] = f"{type(e).__name__}: {e}"
print(json.dumps(results))
"""


def test_load_refuses_endless_devices():
    devices = [d for d in ("/dev/zero", "/dev/urandom") if os.path.exists(d)]
    if not devices:
        pytest.skip("no /dev/zero")
    out = subprocess.run([sys.executable, "-c", ENDLESS, *devices], cwd=REPO, env=python_env(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    for device in devices:
        assert results[device] == (f"ValueError: ops.gemm.load_tuning_cache: {device} is not a regular file (a "
                                   "character device); a tuning cache is read from a file written by "
                                   "ops.gemm.save_tuning_cache"), results[device]


def test_load_refuses_a_file_above_the_bound(tmp_path, clean_tuning_cache, monkeypatch):
    assert ops.gemm.TUNING_CACHE_MAX_BYTES == 64 * 2**20
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(ops.gemm.TUNING_CACHE_MAX_BYTES + 1)  # sparse: no disk space used
    with pytest.raises(ValueError, match=f"ops.gemm.load_tuning_cache: {big} is larger than 67108864 bytes "
                                         "\\(64 MiB, ops.gemm.TUNING_CACHE_MAX_BYTES\\)"):
        ops.gemm.load_tuning_cache(big)
    # A file that says it is empty (as /proc files do) is still read only up to the bound.
    add_entries("bound", 4)
    path = tmp_path / "t.json"
    ops.gemm.save_tuning_cache(path)
    ops.gemm.clear_tuning_cache()
    size = path.stat().st_size
    real_fstat = os.fstat

    def fstat_says_empty(fd):
        st = real_fstat(fd)
        return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid, st.st_gid, 0,
                               st.st_atime, st.st_mtime, st.st_ctime))

    monkeypatch.setattr(os, "fstat", fstat_says_empty)
    monkeypatch.setattr(ops._tuning, "TUNING_CACHE_MAX_BYTES", size - 1)
    with pytest.raises(ValueError, match=f"is larger than {size - 1} bytes"):
        ops.gemm.load_tuning_cache(path)
    monkeypatch.setattr(ops._tuning, "TUNING_CACHE_MAX_BYTES", size)
    assert ops.gemm.load_tuning_cache(path) == 4


def test_import_with_a_fifo_as_tuning_cache_warns_without_waiting(tmp_path):
    fifo = tmp_path / "cache.fifo"
    os.mkfifo(fifo)
    code = "import ops; print(ops.gemm.tuning_cache())"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env=dict(python_env(), OPS_GEMM_TUNING_CACHE=str(fifo)))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"
    assert (f"OPS_GEMM_TUNING_CACHE={str(fifo)!r}: not loaded (ValueError: ops.gemm.load_tuning_cache: {fifo} is "
            "not a regular file (a FIFO)") in out.stderr, out.stderr[-3000:]


# ---- only file paths ----------------------------------------------------------------------------

@pytest.mark.parametrize("path", [True, False, None, 3.5, b"tuning.json", ["tuning.json"]], ids=repr)
@pytest.mark.parametrize("fn", ["save_tuning_cache", "load_tuning_cache"])
def test_only_file_paths_are_accepted(fn, path, clean_tuning_cache):
    with pytest.raises(TypeError, match=f"ops.gemm.{fn}: expected path to be a file path \\(str or os.PathLike\\), "
                                        f"got {type(path).__name__}"):
        getattr(ops.gemm, fn)(path)


@pytest.mark.parametrize("fn", ["save_tuning_cache", "load_tuning_cache"])
def test_an_int_is_not_taken_for_a_file_descriptor(fn, clean_tuning_cache):
    read_end, write_end = os.pipe()
    os.write(write_end, b"{}")
    os.close(write_end)  # a reader of the pipe gets "{}" and an end, never a wait
    # A writer gets the read end: an error (EBADF), never a wait either.
    try:
        with pytest.raises(TypeError, match=f"ops.gemm.{fn}: expected path to be a file path .*got int {read_end}"):
            getattr(ops.gemm, fn)(read_end)
        assert os.read(read_end, 10) == b"{}"  # still open: nothing read from it or closed
    finally:
        try:
            os.fstat(read_end)
        except OSError:
            pass  # closed by the call
        else:
            os.close(read_end)


@pytest.mark.parametrize("path", ["", "cache\0.json"], ids=["empty", "nul"])
@pytest.mark.parametrize("fn", ["save_tuning_cache", "load_tuning_cache"])
def test_an_empty_path_or_one_with_a_nul_is_refused(fn, path, clean_tuning_cache):
    with pytest.raises(ValueError, match=f"ops.gemm.{fn}: expected path to be a file path, got"):
        getattr(ops.gemm, fn)(path)


def test_os_errors_name_the_call_and_the_path(tmp_path, clean_tuning_cache):
    missing = tmp_path / "missing.json"
    with pytest.raises(FileNotFoundError, match=f"ops.gemm.load_tuning_cache: cannot read {missing}"):
        ops.gemm.load_tuning_cache(missing)
    nowhere = tmp_path / "no folder" / "t.json"  # not the temporary file's name
    with pytest.raises(FileNotFoundError, match=f"ops.gemm.save_tuning_cache: cannot write {nowhere}"):
        ops.gemm.save_tuning_cache(nowhere)


# ---- what a save writes, a load reads back ------------------------------------------------------------

def test_a_save_load_makes_would_refuse_is_not_written(tmp_path, clean_tuning_cache, monkeypatch):
    path = tmp_path / "t.json"
    add_entries("kept", 2)
    ops.gemm.save_tuning_cache(path)
    kept = path.read_bytes()
    add_entries("more", 50)
    monkeypatch.setattr(ops._tuning, "TUNING_CACHE_MAX_BYTES", len(kept) * 2)
    with pytest.raises(ValueError, match=f"ops.gemm.save_tuning_cache: 52 entries take \\d+ bytes, more than "
                                         f"load_tuning_cache reads .*; {path} is kept"):
        ops.gemm.save_tuning_cache(path)
    assert path.read_bytes() == kept and sorted(os.listdir(tmp_path)) == ["t.json"]


def test_timings_round_trip_exactly(tmp_path, clean_tuning_cache):
    times = [1.2345678901234567, 123456789.123, 5e-324, 0.1, 1e300]
    names = [f"t{i}" for i in range(len(times))]
    torch.ops.ops._cutlass_gemm_add_tuning(["exact"], ["t0"], [len(times)], names, times)
    assert ops.gemm.tuning_cache()[0]["timings_ms"] == dict(zip(names, times))
    ops.gemm.save_tuning_cache(tmp_path / "t.json")
    ops.gemm.clear_tuning_cache()
    ops.gemm.load_tuning_cache(tmp_path / "t.json")
    assert ops.gemm.tuning_cache()[0]["timings_ms"] == dict(zip(names, times))


def test_a_read_only_file_is_kept(tmp_path, clean_tuning_cache):
    # For root too, who may write any file: no write bit means keep it.
    path = tmp_path / "t.json"
    path.write_text("mine")
    path.chmod(0o444)
    add_entries("ro", 1)
    with pytest.raises(PermissionError, match=f"ops.gemm.save_tuning_cache: {path} is read-only"):
        ops.gemm.save_tuning_cache(path)
    assert path.read_text() == "mine"


@pytest.mark.parametrize("value", ["no", "0", 1, None], ids=repr)
def test_set_autotune_takes_a_bool_only(value):
    before = ops.gemm.autotune_enabled()
    with pytest.raises(TypeError, match="ops.gemm.set_autotune: expected enabled to be True or False"):
        ops.gemm.set_autotune(value)
    assert ops.gemm.autotune_enabled() == before
