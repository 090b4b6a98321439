"""Memory-overlap analysis of tensor metadata, for the fake kernels: the same answers as ATen's
``get_overlap_status`` and ``has_internal_overlap`` (aten/src/ATen/MemoryOverlap.cpp), which the C++
checks (csrc/checks.cpp) use, computed from storage identity, offsets and strides, and the two C++
in-place checks built on them, message for message, so fake and meta tensors get the C++ kernels'
errors too."""

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false

FULL, PARTIAL, NO, TOO_HARD = "full", "partial", "no", "too_hard"


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b are views of one storage (``Tensor::is_alias_of``)."""
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata


def overlap_status(a: torch.Tensor, b: torch.Tensor) -> str:
    """FULL (the same memory), PARTIAL, NO, or TOO_HARD (a or b is not dense and non-overlapping, so
    their byte ranges do not describe their elements)."""
    if a is b:
        return FULL
    if a.numel() == 0 or b.numel() == 0:
        return NO
    if not (is_non_overlapping_and_dense_or_false(a) and is_non_overlapping_and_dense_or_false(b)):
        return TOO_HARD
    if not same_storage(a, b):
        return NO
    a0, b0 = a.storage_offset() * a.element_size(), b.storage_offset() * b.element_size()
    a1, b1 = a0 + a.numel() * a.element_size(), b0 + b.numel() * b.element_size()
    if a0 == b0 and a1 == b1:
        return FULL
    return PARTIAL if a0 < b1 and b0 < a1 else NO


def check_written_in_place(op: str, name: str, t: torch.Tensor) -> None:
    """csrc/checks.cpp's check_written_in_place: no two elements of `t` share memory (e.g. expanded)."""
    # torch._debug_has_internal_overlap is ATen's has_internal_overlap: 1 = MemOverlap::Yes.
    torch._check(torch._debug_has_internal_overlap(t) != 1, lambda: f"{op}: {name} has internally overlapping "
                 "memory (e.g. an expanded tensor) but is written in place; pass a tensor whose elements each "
                 "have their own memory")


def shifted_views_overlap(a: torch.Tensor, b: torch.Tensor):
    """csrc/checks.cpp's shifted_views_overlap: for views of one storage of equal sizes and strides, whether
    they share an element, decided exactly where the strides nest strictly (each, sorted by size, larger
    than twice the span of the smaller ones: a shift then has at most one representation sum d_k stride_k
    with |d_k| < size_k, which the nearest d_k finds); None where it cannot decide."""
    if not same_storage(a, b) or a.shape != b.shape or a.stride() != b.stride():
        return None
    dims = sorted(((st, n) for st, n in zip(a.stride(), a.shape) if n > 1), reverse=True)
    if any(st <= 0 for st, _ in dims):
        return None
    span = [0] * (len(dims) + 1)  # span[k]: sum over j >= k of (size_j - 1) stride_j
    for k in range(len(dims) - 1, -1, -1):
        span[k] = span[k + 1] + (dims[k][1] - 1) * dims[k][0]
    if any(dims[k][0] <= 2 * span[k + 1] for k in range(len(dims))):
        return None
    rest = b.storage_offset() - a.storage_offset()
    for k, (stride, size) in enumerate(dims):
        d = (rest + stride // 2) // stride if rest >= 0 else -((-rest + stride // 2) // stride)  # nearest
        if abs(d) > size - 1:
            return False
        rest -= d * stride
        if abs(rest) > span[k + 1]:
            return False
    return rest == 0


def check_no_shared_memory(op: str, written: str, w: torch.Tensor, other_name: str, other: torch.Tensor) -> None:
    """csrc/checks.cpp's check_no_shared_memory: `w` (written in place) and `other` share no memory;
    strided views of one buffer that the analysis cannot decide count as sharing, unless they are
    equal-shaped shifted views that shifted_views_overlap decides are disjoint."""
    if w.numel() == 0 or other.numel() == 0:
        return
    status = overlap_status(w, other)
    shifted = shifted_views_overlap(w, other) if status == TOO_HARD else None
    if shifted is False:
        return
    torch._check(status not in (FULL, PARTIAL) and not (status == TOO_HARD and same_storage(w, other)), lambda: (
        f"{op}: {written} and {other_name} share memory"
        + (" (or may: strided views of one buffer)" if status == TOO_HARD and shifted is None else "")
        + f"; {written} is written in place, so the result would depend on the order of the writes. Pass "
        "tensors with memory of their own (e.g. .clone())."))
