"""Batching rules: how ``torch.vmap`` / ``torch.func.vmap`` runs each op on a batch (``FuncTorchBatched``
kernels, registered with ``torch.library.register_vmap``).

Without a rule, functorch runs an op once per sample through its slow fallback (with a "performance
drop" warning), and cannot run in-place ops at all: ``fused_add_rms_norm`` raised "Batching rule not
implemented". With these rules:

- an op whose batched arguments are only the ones it already treats as "any leading dimensions" runs
  once on the whole batch, with the batch dimension moved to the front: ``rms_norm``,
  ``fused_add_rms_norm`` (in place, on views of the batched tensors) and ``silu_and_mul`` over input,
  ``linear`` over input, ``cutlass_gemm`` over A (one (batch*M, K) x (K, N) GEMM) or over B (one
  (M, K) x (K, batch*N) GEMM);
- ``scaled_gemm`` over A with per-row scales (rowwise, blockwise) runs one GEMM of batch * M rows;
- ``grouped_gemm`` 3D x 3D over A, B or both runs one 3D x 3D of batch * G entries, and 2D x 3D over B
  (per-sample weights) one 2D x 3D of batch * N columns;
- per-sample parameters (a batched weight or bias, or both GEMM operands batched; scaled_gemm's and
  grouped_gemm's other batchings, batched offsets among them; every batching of scaled_grouped_gemm) run
  one call per sample, stacked: the same work as the fallback, without its warning.

Each rule computes what the op computes per sample, through the registered ops, so ``grad(vmap(op))`` and
``vmap(grad(op))`` differentiate through the ops' own autograd (csrc/autograd.cpp).

``cutlass_gemm.out`` has no rule (functorch cannot batch out= overloads); vmapping it raises functorch's
error.
"""

import functools

import torch

from . import _library, fp8 as _fp8  # noqa: F401  (_library loads the op library)

_ops = torch.ops.ops


def _front(t, bdim):
    """The physical tensor with its batch dimension first (a view)."""
    return t.movedim(bdim, 0)


def _pad(in_dims, n):
    """in_dims for all n positional arguments: the dispatcher leaves trailing defaulted arguments out of
    the call (and so out of in_dims); those are never batched."""
    return tuple(in_dims) + (None,) * (n - len(in_dims))


def _meta_sample(a, bdim):
    """One sample of argument `a` (batched at `bdim`, or None) as metadata only: a meta tensor without
    the batch dimension, or `a` itself when it is not a tensor."""
    if not isinstance(a, torch.Tensor):
        return a
    shape = list(a.shape)
    if bdim is not None:
        del shape[bdim]
    return torch.empty(shape, dtype=a.dtype, device="meta")


def _per_sample(info, in_dims, fn, *args):
    """``torch.stack([fn(*args_i) for i in range(batch)])``, where args_i is sample i of each batched
    argument and the unbatched ones as they are. Also the path for samples the merged call would
    misread (e.g. 0-D samples, or shapes that do not chain): the op then raises its own error about one
    sample's shapes. For an empty batch the sample's output shape comes from the op's fake kernel on
    the meta device (which raises the same errors)."""
    if info.batch_size == 0:
        like = next(a for a, d in zip(args, in_dims) if d is not None)
        sample = fn(*(_meta_sample(a, d) for a, d in zip(args, in_dims)))
        if isinstance(sample, tuple):  # the FP8 ops' (codes, scales): not differentiable
            return tuple(torch.empty((0, *t.shape), dtype=t.dtype, device=like.device) for t in sample), \
                (0,) * len(sample)
        out = torch.empty((0, *sample.shape), dtype=sample.dtype, device=like.device)
        tracked = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        if tracked:
            # Keep the empty result in its inputs' autograd graph, as the op's own result would be:
            # a backward through it gives them zero gradients.
            out = out + sum(a.sum() for a in tracked) * 0
        return out, 0
    outs = [fn(*(a.select(d, i) if d is not None else a for a, d in zip(args, in_dims)))
            for i in range(info.batch_size)]
    if isinstance(outs[0], tuple):
        return tuple(torch.stack(parts) for parts in zip(*outs)), (0,) * len(outs[0])
    return torch.stack(outs), 0


def _byte_range(t):
    """[first, last) bytes of `t`'s elements in memory."""
    lo = sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if st < 0)
    hi = sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if st > 0)
    return t.data_ptr() + lo * t.element_size(), t.data_ptr() + (hi + 1) * t.element_size()


def _addresses(t):
    """The address of every byte of `t`'s elements."""
    offsets = torch.zeros((), dtype=torch.int64)
    for n, st in zip(t.shape, t.stride()):
        offsets = offsets.unsqueeze(-1) + torch.arange(n) * st
    starts = t.data_ptr() + offsets.flatten() * t.element_size()
    return (starts.unsqueeze(-1) + torch.arange(t.element_size())).flatten()


def _check_written_alone(op, written, written_name, others):
    """Raises if a byte of `written` (the whole batch an in-place op writes one sample at a time) is also
    a byte of one of `others` ((name, tensor or None)): the merged call's check (csrc/checks.cpp) over the
    whole batch, which one call per sample cannot make (sample i's write would change what sample j
    reads) and which must hold before the first sample is written. Plain CPU/CUDA tensors only: a fake one
    has no memory."""
    if type(written) is not torch.Tensor or written.device.type == "meta" or written.numel() == 0:
        return
    first, last = _byte_range(written)
    for name, other in others:
        if type(other) is not torch.Tensor or other.device != written.device or other.numel() == 0:
            continue
        other_first, other_last = _byte_range(other)
        if other_first >= last or first >= other_last:
            continue
        if torch.isin(_addresses(written), _addresses(other)).any():
            raise RuntimeError(f"{op}: under vmap, {written_name} and {name} share memory; {written_name} is "
                               "written in place, so the result would depend on the order of the writes. Pass "
                               "tensors with memory of their own (e.g. .clone())")


# The merged call (one call over the whole batch) runs only where it means the same as the per-sample
# calls: each rule checks the sample shapes the merge relies on, and leaves anything else to
# _per_sample, whose per-sample call raises the op's own error.

@torch.library.register_vmap("ops::cutlass_gemm")
def _cutlass_gemm_vmap(info, in_dims, A, B):
    a_dim, b_dim = in_dims
    if b_dim is None and A.dim() == 3 and B.dim() == 2 and _front(A, a_dim).shape[2] == B.shape[0]:
        # (batch, M, K) @ (K, N): one GEMM with batch * M rows.
        A = _front(A, a_dim)
        batch, M, K = A.shape
        return _ops.cutlass_gemm(A.reshape(batch * M, K), B).view(batch, M, B.shape[1]), 0
    if a_dim is None and A.dim() == 2 and B.dim() == 3 and A.shape[1] == _front(B, b_dim).shape[1]:
        # (M, K) @ (batch, K, N): one GEMM with batch * N columns, the batch in dimension 1.
        B = _front(B, b_dim)
        batch, K, N = B.shape
        C = _ops.cutlass_gemm(A, B.transpose(0, 1).reshape(K, batch * N))
        return C.view(A.shape[0], batch, N), 1
    return _per_sample(info, in_dims, _ops.cutlass_gemm, A, B)


@torch.library.register_vmap("ops::scaled_gemm")
def _scaled_gemm_vmap(info, in_dims, A, B, scale_a, scale_b, bias=None, out_dtype=None, activation="none",
                      use_fast_accum=False):
    in_dims = _pad(in_dims, 8)
    a_dim, b_dim, sa_dim, sb_dim, bias_dim = in_dims[:5]
    merge = (a_dim is not None and sa_dim is not None and b_dim is None and sb_dim is None and bias_dim is None
             and A.dim() == 3 and scale_a.dim() == 3 and B.dim() == 2 and scale_b.numel() > 1)
    if merge:
        A, sa = _front(A, a_dim), _front(scale_a, sa_dim)
        batch, M, K = A.shape
        # Per-row scales (rowwise, blockwise: one row of scale_a per row of A) stack like A's rows: one GEMM
        # with batch * M rows. A tensorwise sample (scale_b of one element) has no per-row scale.
        if sa.shape[:2] == (batch, M) and B.shape[0] == K:
            out = _ops.scaled_gemm(A.reshape(batch * M, K), B, sa.reshape(batch * M, sa.shape[2]), scale_b, bias,
                                   out_dtype, activation, use_fast_accum)
            return out.view(batch, M, B.shape[1]), 0
    return _per_sample(info, in_dims, _ops.scaled_gemm, A, B, scale_a, scale_b, bias, out_dtype, activation,
                       use_fast_accum)


@torch.library.register_vmap("ops::linear")
def _linear_vmap(info, in_dims, input, weight, bias=None, activation="none"):
    in_dims = _pad(in_dims, 4)
    x_dim, w_dim, b_dim, _ = in_dims
    if w_dim is None and b_dim is None and input.dim() >= 2:
        # input is (*, K) per sample: the batch is one more leading dimension.
        return _ops.linear(_front(input, x_dim), weight, bias, activation), 0
    return _per_sample(info, in_dims, _ops.linear, input, weight, bias, activation)


@torch.library.register_vmap("ops::rms_norm")
def _rms_norm_vmap(info, in_dims, input, weight, eps=1e-6, *, round_before_weight=False):
    in_dims = _pad(in_dims, 3)
    x_dim, w_dim, _ = in_dims
    op = functools.partial(_ops.rms_norm, round_before_weight=round_before_weight)
    if w_dim is None and input.dim() >= 2:
        return op(_front(input, x_dim), weight, eps), 0
    return _per_sample(info, in_dims, op, input, weight, eps)


@torch.library.register_vmap("ops::silu_and_mul")
def _silu_and_mul_vmap(info, in_dims, input):
    if input.dim() >= 2:
        return _ops.silu_and_mul(_front(input, in_dims[0])), 0
    return _per_sample(info, in_dims, _ops.silu_and_mul, input)


@torch.library.register_vmap("ops::fused_add_rms_norm")
def _fused_add_rms_norm_vmap(info, in_dims, input, residual, weight, eps=1e-6, *, round_before_weight=False):
    x_dim, r_dim, w_dim, _ = _pad(in_dims, 4)
    op = functools.partial(_ops.fused_add_rms_norm, round_before_weight=round_before_weight)
    # Both tensors are written in place: a batched result cannot be stored into an unbatched tensor
    # (functorch's rule for every in-place op).
    torch._check(x_dim is not None and r_dim is not None, lambda: (
        "fused_add_rms_norm: under vmap, input and residual must both be batched (both are written in "
        f"place); got input {'batched' if x_dim is not None else 'unbatched'} and residual "
        f"{'batched' if r_dim is not None else 'unbatched'}"))
    input, residual = _front(input, x_dim), _front(residual, r_dim)  # views: the op writes through them
    if w_dim is None and input.dim() >= 2 and input.shape == residual.shape:
        op(input, residual, weight, eps)
    else:  # one call per sample (samples share one shape: the first bad one raises before anything is written)
        weights = _front(weight, w_dim) if w_dim is not None else None
        _check_written_alone("fused_add_rms_norm", input, "input", [("residual", residual), ("weight", weight)])
        _check_written_alone("fused_add_rms_norm", residual, "residual", [("weight", weight)])
        if info.batch_size == 0:  # no sample to call: the fake kernel checks one sample's metadata
            op(_meta_sample(input, 0), _meta_sample(residual, 0), _meta_sample(weight, w_dim), eps)
        for i in range(info.batch_size):
            op(input[i], residual[i], weight if weights is None else weights[i], eps)
    return None, None


def _fp8_rows_merge(granularity, scale, x_dim, sample_dims):
    """Whether an FP8 op's batch may be one more leading dimension of rows: scales of one row ("row") or of
    1x128 groups of a row ("group"), computed (no static scale), samples of 2+ dimensions (a 1-D sample's
    scales have no row dimension)."""
    return x_dim is not None and granularity in _fp8.ROW_GRANULARITIES and scale is None and sample_dims >= 2


@torch.library.register_vmap("ops::quantize_fp8")
def _quantize_fp8_vmap(info, in_dims, input, granularity="row", dtype=None, scale=None, pow2_scale=False):
    x_dim, _, _, s_dim, _ = _pad(in_dims, 5)
    if _fp8_rows_merge(granularity, scale, x_dim, input.dim() - 1):
        return _ops.quantize_fp8(_front(input, x_dim), granularity, dtype, None, pow2_scale), (0, 0)
    return _per_sample(info, (x_dim, None, None, s_dim, None), _ops.quantize_fp8, input, granularity, dtype, scale,
                       pow2_scale)


@torch.library.register_vmap("ops::rms_norm_fp8")
def _rms_norm_fp8_vmap(info, in_dims, input, weight, eps=1e-6, granularity="row", dtype=None, scale=None,
                       pow2_scale=False, *, round_before_weight=False):
    in_dims = _pad(in_dims, 7)
    op = functools.partial(_ops.rms_norm_fp8, round_before_weight=round_before_weight)
    if in_dims[1] is None and _fp8_rows_merge(granularity, scale, in_dims[0], input.dim() - 1):
        return op(_front(input, in_dims[0]), weight, eps, granularity, dtype, None, pow2_scale), (0, 0)
    return _per_sample(info, in_dims, op, input, weight, eps, granularity, dtype, scale, pow2_scale)


@torch.library.register_vmap("ops::silu_and_mul_fp8")
def _silu_and_mul_fp8_vmap(info, in_dims, input, granularity="row", dtype=None, scale=None, pow2_scale=False):
    in_dims = _pad(in_dims, 5)
    if _fp8_rows_merge(granularity, scale, in_dims[0], input.dim() - 1):
        return _ops.silu_and_mul_fp8(_front(input, in_dims[0]), granularity, dtype, None, pow2_scale), (0, 0)
    return _per_sample(info, in_dims, _ops.silu_and_mul_fp8, input, granularity, dtype, scale, pow2_scale)


@torch.library.register_vmap("ops::fused_add_rms_norm_fp8")
def _fused_add_rms_norm_fp8_vmap(info, in_dims, input, residual, weight, eps=1e-6, granularity="row", dtype=None,
                                 scale=None, pow2_scale=False, *, round_before_weight=False):
    in_dims = _pad(in_dims, 8)
    op = functools.partial(_ops.fused_add_rms_norm_fp8, round_before_weight=round_before_weight)
    x_dim, r_dim, w_dim = in_dims[:3]
    torch._check(r_dim is not None, lambda: (
        "fused_add_rms_norm_fp8: under vmap, residual must be batched (it is written in place); got an unbatched "
        "residual"))
    residual = _front(residual, r_dim)  # a view: the op writes through it
    if (w_dim is None and _fp8_rows_merge(granularity, scale, x_dim, residual.dim() - 1)
            and _front(input, x_dim).shape == residual.shape):
        return op(_front(input, x_dim), residual, weight, eps, granularity, dtype, None, pow2_scale), (0, 0)
    # One call per sample (samples share one shape: the first bad one raises before anything is written).
    _check_written_alone("fused_add_rms_norm_fp8", residual, "residual", [("input", input), ("weight", weight)])
    return _per_sample(info, (x_dim, 0) + in_dims[2:], op, input, residual, weight, eps, granularity, dtype, scale,
                       pow2_scale)


@torch.library.register_vmap("ops::grouped_gemm")
def _grouped_gemm_vmap(info, in_dims, A, B, offs=None, out_dtype=None):
    a_dim, b_dim, offs_dim, _ = _pad(in_dims, 4)
    if offs is None and A.dim() - (a_dim is not None) == 3 and B.dim() - (b_dim is not None) == 3:
        # 3D x 3D per sample: one batched GEMM of batch * G entries.
        a = _front(A, a_dim) if a_dim is not None else A.expand(info.batch_size, *A.shape)
        b = _front(B, b_dim) if b_dim is not None else B.expand(info.batch_size, *B.shape)
        if a.shape[1] == b.shape[1] and a.shape[3] == b.shape[2]:
            batch, G, M, K = a.shape
            out = _ops.grouped_gemm(a.reshape(batch * G, M, K), b.reshape(batch * G, K, b.shape[3]), None, out_dtype)
            return out.view(batch, G, M, b.shape[3]), 0
    if offs_dim is None and a_dim is None and b_dim is not None and A.dim() == 2 and B.dim() == 4:
        # 2D x 3D with per-sample weights: the samples' columns side by side, one 2D x 3D of batch * N columns.
        b = _front(B, b_dim)
        batch, G, K, N = b.shape
        if A.shape[1] == K:
            out = _ops.grouped_gemm(A, b.permute(1, 2, 0, 3).reshape(G, K, batch * N), offs, out_dtype)
            return out.view(A.shape[0], batch, N), 1
    if offs_dim is not None:  # each sample's offsets contiguous, as the op takes them, whatever the batch dimension
        offs, offs_dim = _front(offs, offs_dim).contiguous(), 0
    return _per_sample(info, (a_dim, b_dim, offs_dim), lambda a, b, o: _ops.grouped_gemm(a, b, o, out_dtype),
                       A, B, offs)


@torch.library.register_vmap("ops::scaled_grouped_gemm")
def _scaled_grouped_gemm_vmap(info, in_dims, A, B, scale_a, scale_b, offs=None, bias=None, out_dtype=None):
    dims = _pad(in_dims, 7)
    offs_dim = dims[4]
    if offs_dim is not None:  # each sample's offsets contiguous, as the op takes them
        offs, offs_dim = _front(offs, offs_dim).contiguous(), 0
    return _per_sample(info, dims[:4] + (offs_dim, dims[5]),
                       lambda a, b, sa, sb, o, bi: _ops.scaled_grouped_gemm(a, b, sa, sb, o, bi, out_dtype),
                       A, B, scale_a, scale_b, offs, bias)
