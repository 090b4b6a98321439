"""ops' pluggable CUDA allocator (csrc/allocator/): a stream-ordered memory pool per device
(``cudaMallocFromPoolAsync`` on a ``cudaMemPool_t`` of its own), usable two ways:

* ``ops.allocator.install()``: the global swap (``torch.cuda.memory.change_current_allocator``); every
  CUDA allocation of the process goes through it. Possible only before CUDA memory is first allocated.
  PyTorch's own statistics and ``empty_cache`` do not apply then; use ``stats()`` and ``trim()``.
  Frees are ordered after the work of every stream the allocator has seen allocate or been given by
  ``tensor.record_stream(stream)``, so memory still used by a side stream is not handed out early.
  CUDA graphs: allocations during capture are graph memory, and memory allocated before a capture
  but freed during it is freed once the capture is over. The pool's memory is mapped for every peer
  GPU that can access it (``cudaMemPoolSetAccess``), as PyTorch's caching allocators allow.
* ``ops.allocator.pool()``: a ``torch.cuda.MemPool`` backed by it, used with
  ``torch.cuda.use_mem_pool(pool)``. PyTorch's caching allocator stays in charge (its stats,
  ``record_stream`` and graph pools work) and takes whole segments from our pool.

Statistics (``stats()``) are bytes and counts per device; out of memory is meant to raise
``torch.cuda.OutOfMemoryError`` and leave the pool usable. On the one GPU run
(benchmarks/results/2026-11-30-h200) that test crashed under ``install()``; the allocator has changed since
and has not run on a GPU, nor has anything else this docstring says about the device.

Errors: every function raises ``RuntimeError`` with a message saying what is missing when this build
of ops has no CUDA (``OPS_WITH_CUDA=0`` or no nvcc at build time), and all but ``pluggable()`` (which
needs no GPU to construct) when no GPU is visible.
``pluggable()``, ``install()`` and ``pool()`` raise ``ValueError`` when the environment variable
``OPS_ALLOCATOR_RELEASE_THRESHOLD`` is set to anything but a number of bytes.
"""

import ctypes
import functools
import os
import re
from typing import Dict, Optional

import torch

from . import _library

__all__ = ["install", "pool", "pluggable", "stats", "reset_peak", "trim", "set_release_threshold", "ALLOC_FN",
           "POOL_ALLOC_FN", "FREE_FN", "RELEASE_THRESHOLD_ENV"]

ALLOC_FN = "ops_alloc"            # global install: raises OutOfMemoryError on failure
POOL_ALLOC_FN = "ops_pool_alloc"  # MemPool: returns NULL on failure (the caching allocator's protocol)
FREE_FN = "ops_free"
RELEASE_THRESHOLD_ENV = "OPS_ALLOCATOR_RELEASE_THRESHOLD"
_MAX_THRESHOLD = 2**64 - 1


class _Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in (
        "bytes_in_use", "peak_bytes_in_use", "bytes_reserved", "allocations", "frees", "failed_allocations",
        "peak_bytes_reserved", "deferred_frees")]  # OpsAllocatorStats' order and types (csrc/allocator/allocator.h)


@functools.lru_cache(maxsize=None)
def _lib():
    if not _library.build_info.WITH_CUDA:
        raise RuntimeError(
            "ops.allocator: this build of ops has no CUDA code (it was built without nvcc or with "
            "OPS_WITH_CUDA=0); rebuild with a CUDA build of torch and nvcc to use the allocator.")
    lib = ctypes.CDLL(_library.library_path())
    lib.ops_allocator_stats.argtypes = [ctypes.c_int, ctypes.POINTER(_Stats)]
    lib.ops_allocator_reset_peak.argtypes = [ctypes.c_int]
    lib.ops_allocator_trim.argtypes = [ctypes.c_int, ctypes.c_size_t]
    lib.ops_allocator_set_release_threshold.argtypes = [ctypes.c_uint64]
    lib.ops_allocator_release_threshold.argtypes = []
    lib.ops_allocator_release_threshold.restype = ctypes.c_uint64
    lib.ops_allocator_error_string.restype = ctypes.c_char_p
    return lib


def _require_gpu():
    lib = _lib()
    if not torch.cuda.is_available():
        raise RuntimeError("ops.allocator: no CUDA GPU is available (torch.cuda.is_available() is False); "
                           "the allocator manages GPU memory.")
    return lib


def _check(code: int, what: str) -> None:
    if code != 0:
        raise RuntimeError(f"ops.allocator: {what} failed: {_lib().ops_allocator_error_string(code).decode()}")


def _device_index(device) -> int:
    if device is None:
        return torch.cuda.current_device()
    d = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if d.type != "cuda":
        raise ValueError(f"ops.allocator: expected a CUDA device, got {d}")
    return d.index if d.index is not None else torch.cuda.current_device()


def _release_threshold_from_environment() -> Optional[int]:
    """The bytes ``OPS_ALLOCATOR_RELEASE_THRESHOLD`` sets, or None where it is unset or blank (keep
    everything until ``trim()``). The rule csrc/allocator/allocator.cpp applies: decimal digits, blanks
    around them allowed, at most 2**64 - 1. That code can only warn (it runs inside allocations), so a
    bad value is a ValueError here, before the allocator is handed to PyTorch."""
    value = os.environ.get(RELEASE_THRESHOLD_ENV)
    if value is None or not value.strip(" \t\n\r\f\v"):
        return None
    match = re.fullmatch(r"[ \t\n\r\f\v]*([0-9]+)[ \t\n\r\f\v]*", value)
    if match is None or int(match.group(1)) > _MAX_THRESHOLD:
        raise ValueError(f"ops.allocator: environment variable {RELEASE_THRESHOLD_ENV}={value!r}: expected a "
                         f"non-negative integer number of bytes (at most 2**64 - 1), or unset to keep pool "
                         "memory until trim()")
    return int(match.group(1))


def pluggable(alloc_fn: str = ALLOC_FN) -> "torch.cuda.memory.CUDAPluggableAllocator":
    """The ``CUDAPluggableAllocator`` over this library's functions (no GPU needed to construct).

    Raises:
        ValueError: ``alloc_fn`` is not ``ALLOC_FN`` or ``POOL_ALLOC_FN``; ``OPS_ALLOCATOR_RELEASE_THRESHOLD`` is
            set and is not a number of bytes.
    """
    if alloc_fn not in (ALLOC_FN, POOL_ALLOC_FN):  # any other exported symbol would be called as an allocator
        raise ValueError(f"ops.allocator.pluggable: expected alloc_fn to be {ALLOC_FN!r} (global install) or "
                         f"{POOL_ALLOC_FN!r} (MemPool), got {alloc_fn!r}")
    _lib()
    _release_threshold_from_environment()
    return torch.cuda.memory.CUDAPluggableAllocator(_library.library_path(), alloc_fn, FREE_FN)


def install() -> None:
    """Make ops' allocator the process-wide CUDA allocator.

    Raises:
        RuntimeError: no CUDA build or no GPU; or CUDA memory was already allocated in this process
            (PyTorch cannot swap an initialised allocator): call install() first thing, or use
            ``pool()`` with ``torch.cuda.use_mem_pool`` instead.
        ValueError: ``OPS_ALLOCATOR_RELEASE_THRESHOLD`` is set and is not a number of bytes.
    """
    _require_gpu()
    try:
        torch.cuda.memory.change_current_allocator(pluggable(ALLOC_FN))
    except RuntimeError as exc:
        raise RuntimeError(
            "ops.allocator.install(): PyTorch's CUDA allocator is already initialised in this process "
            f"({exc}). Call install() before the first CUDA tensor is created, or use "
            "`with torch.cuda.use_mem_pool(ops.allocator.pool()):` to route a scope's allocations "
            "through ops' allocator instead.") from exc
    # PyTorch ignores record_stream for pluggable allocators unless given a function for it.
    if not torch.ops.ops._allocator_install_record_stream_hook():
        raise RuntimeError("ops.allocator.install(): the current CUDA allocator is not the pluggable allocator "
                           "just installed (record_stream could not be connected)")


def pool() -> "torch.cuda.MemPool":
    """A ``torch.cuda.MemPool`` whose segments come from ops' allocator; use it with
    ``torch.cuda.use_mem_pool(pool)``. Our free runs on ``torch.cuda.empty_cache()`` or when the pool
    and its tensors are gone. ValueError: ``OPS_ALLOCATOR_RELEASE_THRESHOLD`` is not a number of bytes.
    RuntimeError: the process's CUDA allocator is not PyTorch's caching allocator (after ``install()``, say),
    which alone keeps MemPools (``CUDAAllocator::createOrIncrefPool``)."""
    _require_gpu()
    backend = torch.cuda.get_allocator_backend()
    if backend != "native":
        raise RuntimeError(f"ops.allocator.pool(): the process's CUDA allocator is {backend!r}, not PyTorch's caching "
                           "allocator, the one that keeps MemPools; after ops.allocator.install() every CUDA "
                           "allocation goes through ops' allocator already")
    return torch.cuda.MemPool(pluggable(POOL_ALLOC_FN).allocator())


def stats(device=None) -> Dict[str, int]:
    """Per-device statistics: bytes_in_use, peak_bytes_in_use, bytes_reserved (held by the pool),
    peak_bytes_reserved (the pool's high-water mark, what torch.cuda.max_memory_reserved is for the
    caching allocator), allocations, frees, failed_allocations, deferred_frees (frees asked for during a
    CUDA graph capture of memory the graph does not own, run once it ends). Bytes are bytes; counts are
    calls. Graph allocations are the graph's memory (cudaMallocFromPoolAsync during capture): counted in
    bytes_in_use, not in bytes_reserved."""
    lib = _require_gpu()
    out = _Stats()
    _check(lib.ops_allocator_stats(_device_index(device), ctypes.byref(out)), "stats")
    return {name: getattr(out, name) for name, _ in _Stats._fields_}


def reset_peak(device=None) -> None:
    """Reset peak_bytes_in_use to the current bytes_in_use, and peak_bytes_reserved to the current
    bytes_reserved."""
    _check(_require_gpu().ops_allocator_reset_peak(_device_index(device)), "reset_peak")


def trim(device=None, keep_bytes: int = 0) -> None:
    """Return free pool memory above ``keep_bytes`` to the driver (``cudaMemPoolTrimTo``)."""
    _check(_require_gpu().ops_allocator_trim(_device_index(device), keep_bytes), "trim")


def set_release_threshold(num_bytes: Optional[int]) -> None:
    """Bytes each pool keeps cached at synchronisation points (``cudaMemPoolAttrReleaseThreshold``);
    ``None`` keeps everything until ``trim()``. The default: ``None``, or the environment variable
    ``OPS_ALLOCATOR_RELEASE_THRESHOLD`` (a decimal number of bytes, read when the first pool is made).

    Raises:
        TypeError: ``num_bytes`` is not an int or None.
        ValueError: ``num_bytes`` is negative or above 2**64 - 1.
    """
    op = "ops.allocator.set_release_threshold"
    if num_bytes is not None and (isinstance(num_bytes, bool) or not isinstance(num_bytes, int)):
        raise TypeError(f"{op}: expected num_bytes to be an int (bytes) or None, got {type(num_bytes).__name__}")
    if num_bytes is not None and not 0 <= num_bytes <= _MAX_THRESHOLD:
        raise ValueError(f"{op}: expected num_bytes in [0, 2**64 - 1], got {num_bytes}")
    value = _MAX_THRESHOLD if num_bytes is None else num_bytes
    _check(_require_gpu().ops_allocator_set_release_threshold(value), "set_release_threshold")
