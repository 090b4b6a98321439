"""Memory-overlap analysis of tensor metadata, for the fake kernels: the same answers as ATen's
``get_overlap_status`` (aten/src/ATen/MemoryOverlap.cpp), which the C++ checks (csrc/checks.cpp) use,
computed from storage identity, offsets and strides, so fake and meta tensors get the C++ kernels'
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
