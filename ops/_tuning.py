"""The tuning cache's files: ``ops.gemm.save_tuning_cache`` and ``ops.gemm.load_tuning_cache`` (re-exported
there, their public names). The cache itself lives in C++ (cutlass_gemm/); this module writes it to JSON and
adds a file's entries back through ``torch.ops.ops._cutlass_gemm_add_tuning``."""

import errno
import os

import torch

from . import _library  # noqa: F401  (loads the op library: registers torch.ops.ops.*)

_TUNING_FORMAT = "ops.gemm tuning cache"
# Version 2: kernel names spelled from their configuration (version 1 named them by kernel_list.h id).
_TUNING_VERSION = 2


# The most bytes load_tuning_cache reads: a cache has one small entry per tuned GEMM shape, so a larger
# file is not one (and /proc files, pipes or devices named by mistake are never read without end).
TUNING_CACHE_MAX_BYTES = 64 * 2**20


def _tuning_path(op: str, path) -> str:
    """`path` as a str, or TypeError: an int would be taken for a file descriptor, a bool for 0 or 1."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{op}: expected path to be a file path (str or os.PathLike), got "
                        f"{type(path).__name__} {path!r}")
    path = os.fsdecode(os.fspath(path))
    if not path or "\0" in path:
        raise ValueError(f"{op}: expected path to be a file path, got {path!r}")
    return path


def _os_error(op: str, verb: str, path: str, error: OSError) -> OSError:
    """`error` (of the same class) saying which call failed to `verb` which path."""
    return type(error)(error.errno, f"{op}: cannot {verb} {path}: {error.strerror}")


def _file_kind(mode: int) -> str:
    import stat

    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return f"mode {oct(mode)}"


def _new_file_mode() -> int:
    """The mode open(path, "w") gives a new file: 0o666 less the umask (read without changing it, as
    os.umask would for every thread; 0o644 where /proc/self/status has no Umask line)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o644


def save_tuning_cache(path) -> int:
    """Write the tuning cache (``tuning_cache()``) to the JSON file ``path``, for ``load_tuning_cache`` in
    another process: tune once (for example in a warm-up run with ``set_autotune(True)``), then serve
    with the choices loaded, autotuning off, and CUDA graphs captured with the tuned kernels.

    The file is written whole or not at all: into a temporary file in the same folder (which must be
    writable), flushed to disk (fsync), then renamed onto ``path`` (``os.replace``). Processes saving to
    one path at once leave the file of one of them, a reader never sees a partial file, and a failed
    save leaves the previous file as it was (the temporary file is removed). A symbolic link is followed
    (its target is replaced); an existing file keeps its permission bits, a new one gets those
    ``open(path, "w")`` would give.

    Returns:
        The number of entries written.

    Raises:
        TypeError: ``path`` is not a str or os.PathLike.
        ValueError: ``path`` is empty, or exists and is not a regular file (a directory, FIFO, device); the
            file would be larger than ``TUNING_CACHE_MAX_BYTES`` (what ``load_tuning_cache`` reads).
        OSError: the file cannot be written; PermissionError for an existing file that is read-only (no
            write permission bit, or none for this user: root too).
    """
    import json
    import stat
    import tempfile

    from . import build_info

    op = "ops.gemm.save_tuning_cache"
    path = _tuning_path(op, path)
    target = os.path.realpath(path)
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        raise ValueError(f"{op}: {path} is not a regular file ({_file_kind(mode)}); a tuning cache is "
                         "written to a file path")
    # No write bit, or none for this user: read-only, for root too (whom os.access lets write anything), as
    # rm asks before removing a write-protected file.
    if mode is not None and (not stat.S_IMODE(mode) & 0o222 or not os.access(target, os.W_OK)):
        raise PermissionError(errno.EACCES, f"{op}: {path} is read-only; it is kept (make it writable to replace it)")
    file_mode = stat.S_IMODE(mode) if mode is not None else _new_file_mode()
    entries = json.loads(torch.ops.ops._cutlass_gemm_tuning_cache())  # as ops.gemm.tuning_cache()
    payload = {"format": _TUNING_FORMAT, "version": _TUNING_VERSION, "torch_version": torch.__version__,
               "cutlass_version": build_info.CUTLASS_VERSION, "cuda_arch_list": build_info.CUDA_ARCH_LIST,
               "entries": entries}
    text = json.dumps(payload, indent=1).encode("utf-8")
    if len(text) > TUNING_CACHE_MAX_BYTES:
        raise ValueError(f"{op}: {len(entries)} entries take {len(text)} bytes, more than load_tuning_cache reads "
                         f"(TUNING_CACHE_MAX_BYTES, {TUNING_CACHE_MAX_BYTES / 2**20:g} MiB); {path} is kept. Save "
                         "fewer shapes (clear_tuning_cache() between runs)")
    folder, name = os.path.split(target)
    try:
        fd, temp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    except OSError as e:
        raise _os_error(op, "write", path, e) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temp, file_mode)  # mkstemp makes it 0o600
        os.replace(temp, target)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
    return len(entries)


def load_tuning_cache(path) -> int:
    """Add the choices of a file written by ``save_tuning_cache`` to the tuning cache (at import too:
    environment variable ``OPS_GEMM_TUNING_CACHE=<file>``; an entry replaces
    the cached choice of the same key). Keys name the device model and SM count, so entries of another
    GPU model are loaded but never match. An entry whose tactic is not a candidate of its GEMM in this
    build (a file from another version of ops) is dropped with a warning when that GEMM first runs, and
    the GEMM runs as if it had no entry.

    Only a regular file is read (a FIFO, device or directory is an error, never a wait), and at most
    ``TUNING_CACHE_MAX_BYTES`` (64 MiB) of it.

    Returns:
        The number of entries loaded.

    Raises:
        TypeError: ``path`` is not a str or os.PathLike (an int is not taken for a file descriptor).
        OSError: the file cannot be read.
        ValueError: ``path`` is not a regular file, or is larger than ``TUNING_CACHE_MAX_BYTES``, or not
            JSON, or not a tuning cache of a version this library reads, or an entry is malformed
            (nothing is loaded then).
    """
    import json
    import math

    op = "ops.gemm.load_tuning_cache"
    path = _tuning_path(op, path)

    def bad(what):
        return ValueError(f"{op}: {path}: {what}")

    data = _read_tuning_file(op, path)
    try:
        payload = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, too many digits
        raise ValueError(f"{op}: {path} is not JSON ({type(e).__name__}: {e})") from None
    if not isinstance(payload, dict) or payload.get("format") != _TUNING_FORMAT:
        raise ValueError(f"ops.gemm.load_tuning_cache: {path} is not a tuning cache written by "
                         f"ops.gemm.save_tuning_cache (no \"format\": \"{_TUNING_FORMAT}\")")
    version = payload.get("version")
    if type(version) is not int or version != _TUNING_VERSION:
        old = ("; version 1 files name kernels by their former names: autotune again to write one"
               if type(version) is int and version == 1 else "")
        raise ValueError(f"ops.gemm.load_tuning_cache: {path} has version {version!r}; this library reads "
                         f"version {_TUNING_VERSION}{old}")
    entries = payload.get("entries")
    if not isinstance(entries, list):
        raise bad(f"expected a list of entries, got {type(entries).__name__}")

    def text(value):
        if not isinstance(value, str) or not value:
            return False
        try:
            value.encode("utf-8")  # a lone surrogate from a JSON escape cannot reach C++
        except UnicodeEncodeError:
            return False
        return True

    def millis(value):  # a median time in ms, or None for a candidate that could not run
        if value is None:
            return -1.0
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError
        ms = float(value)  # OverflowError for integers beyond float
        if not math.isfinite(ms) or ms < 0:
            raise ValueError
        return ms

    keys, bests, counts, names, times = [], [], [], [], []
    for i, entry in enumerate(entries):
        timings = entry.get("timings_ms", {}) if isinstance(entry, dict) else None
        try:
            if not (text(entry.get("key")) and text(entry.get("best")) and isinstance(timings, dict)
                    and all(text(name) for name in timings)):
                raise TypeError
            entry_times = [millis(value) for value in timings.values()]
        except (AttributeError, TypeError, ValueError, OverflowError):
            raise bad(f"entry {i} is malformed (expected {{\"key\": str, \"best\": str, \"timings_ms\": "
                      f"{{tactic: ms >= 0 or null}}}}), got {str(entry)[:200]}") from None
        keys.append(entry["key"])
        bests.append(entry["best"])
        counts.append(len(timings))
        names += list(timings)
        times += entry_times
    torch.ops.ops._cutlass_gemm_add_tuning(keys, bests, counts, names, times)  # all entries, or none
    return len(keys)


def _read_tuning_file(op: str, path: str) -> bytes:
    """The bytes of the regular file `path`, at most TUNING_CACHE_MAX_BYTES. O_NONBLOCK: opening a FIFO
    returns at once instead of waiting for a writer; fstat then rejects it."""
    import stat

    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise _os_error(op, "read", path, e) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{op}: {path} is not a regular file ({_file_kind(info.st_mode)}); a tuning cache "
                             "is read from a file written by ops.gemm.save_tuning_cache")
        too_large = ValueError(f"{op}: {path} is larger than {TUNING_CACHE_MAX_BYTES} bytes "
                               f"({TUNING_CACHE_MAX_BYTES / 2**20:g} MiB, ops.gemm.TUNING_CACHE_MAX_BYTES), the "
                               "most a tuning cache is read to")
        if info.st_size > TUNING_CACHE_MAX_BYTES:
            raise too_large
        chunks, size = [], 0
        while size <= TUNING_CACHE_MAX_BYTES:  # st_size is not trusted: /proc files say 0
            chunk = os.read(fd, min(1 << 20, TUNING_CACHE_MAX_BYTES + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > TUNING_CACHE_MAX_BYTES:
            raise too_large
        return b"".join(chunks)
    finally:
        os.close(fd)
