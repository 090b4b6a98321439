"""DTensor sharding rules of the ops (``torch.distributed.tensor.experimental.register_sharding``), for
tensor, sequence and data parallel and FSDP2 (docs/distributed.md).

Each rule lists, for one mesh dimension, the acceptable (output placements, input placements) pairs;
DTensor expands them over the mesh and redistributes inputs to the cheapest. A placement an op cannot
compute exactly is not offered, so DTensor redistributes first: an activation or a norm never runs on a
Partial sum, a norm never on a sharded last dimension, ``silu_and_mul`` never on halves split across
ranks. The in-place ``fused_add_rms_norm`` keeps its inputs' placements or raises (a redistributed
written argument would be a copy, and the write lost).
"""

import torch
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.experimental import register_sharding

from .fp8 import ROW_GRANULARITIES, recipe_of

R, P = Replicate(), Partial()


def _leading_shards(ndim):
    """Shard(d) for every dimension but the last: rows of a norm, of silu_and_mul, of linear's input."""
    return [Shard(d) for d in range(ndim - 1)]


@register_sharding(torch.ops.ops.cutlass_gemm.default)
def _cutlass_gemm(A, B):
    # As aten.mm: C = A @ B with A (M, K), B (K, N).
    return [([R], [R, R]), ([Shard(0)], [Shard(0), R]), ([Shard(1)], [R, Shard(1)]),
            ([P], [Shard(1), Shard(0)]), ([P], [P, R]), ([P], [R, P])]


@register_sharding(torch.ops.ops.cutlass_gemm.out)
def _cutlass_gemm_out(A, B, out):
    raise RuntimeError(
        f"cutlass_gemm: the out variant does not take DTensors (got A {list(A.placements)}, B {list(B.placements)}, "
        f"out {list(out.placements)}); call ops.cutlass_gemm(A, B) without out")


@register_sharding(torch.ops.ops.linear.default)
def _linear(input, weight, bias=None, activation="none"):
    b = (lambda placement: None if bias is None else placement)
    last = input.ndim - 1
    rules = [([R], [R, R, b(R)])]
    rules += [([s], [s, R, b(R)]) for s in _leading_shards(input.ndim)]  # data / sequence parallel
    rules.append(([Shard(last)], [R, Shard(0), b(Shard(0))]))  # colwise: out features sharded with the weight
    if activation == "none":  # row-wise and Partial inputs give Partial sums: no activation may follow
        # The bias as a Partial too (each rank adds bias / ranks; DTensor's Replicate -> Partial), so the
        # sum adds it once.
        rules += [([P], [Shard(last), Shard(1), b(P)]), ([P], [P, R, b(P)])]
    return rules


@register_sharding(torch.ops.ops.scaled_gemm.default)
def _scaled_gemm(A, B, scale_a, scale_b, bias=None, out_dtype=None, activation="none", use_fast_accum=False):
    # The scales go with the rows of A and the columns of B they scale: rows of A with scale_a's rows (all
    # recipes but tensorwise); columns of B with scale_b's columns (rowwise, 1x128 groups; a 128x128 block
    # scale would need shard edges on block edges, so B's columns are not offered there). K split: Partial
    # sums only where the scales do not depend on k (tensorwise, rowwise) and no activation follows.
    # The kernels take K and N in multiples of 16: a split of either is offered only where every rank's share
    # is one (over the whole mesh, which may split it on each of its dimensions), else DTensor gathers it.
    b = (lambda placement: None if bias is None else placement)
    recipe = recipe_of(A.shape[0], A.shape[1], B.shape[1], scale_a.shape, scale_b.shape)
    tensorwise = recipe == "tensorwise"
    splits = 16 * A.mesh.size()
    rules = [([R], [R, R, R, R, b(R)]),
             ([Shard(0)], [Shard(0), R, R if tensorwise else Shard(0), R, b(R)])]
    if recipe != "blockwise 1x128 x 128x128" and B.shape[1] % splits == 0:
        rules.append(([Shard(1)], [R, Shard(1), R, R if tensorwise else Shard(1), b(Shard(0))]))
    if activation == "none" and recipe in ("tensorwise", "rowwise") and A.shape[1] % splits == 0:
        rules.append(([P], [Shard(1), Shard(0), R, R, b(P)]))
    return rules


@register_sharding(torch.ops.ops.scaled_gemm.out)
def _scaled_gemm_out(A, B, scale_a, scale_b, bias=None, out_dtype=None, activation="none", use_fast_accum=False,
                     out=None):
    raise RuntimeError(
        f"scaled_gemm: the out variant does not take DTensors (got A {list(A.placements)}, B {list(B.placements)}); "
        "call ops.scaled_gemm(A, B, scale_a, scale_b, ...) without out")


@register_sharding(torch.ops.ops.grouped_gemm.default)
def _grouped_gemm(A, B, offs=None, out_dtype=None):
    # torch's rules for aten._grouped_mm (torch/distributed/tensor/_ops/_matrix_ops.py): the M, N or K that
    # offs does not cut, sharded with the operand that holds it, and linearity in each operand; offs whole.
    o = None if offs is None else R
    rules = [([R], [R, R, o]), ([P], [P, R, o]), ([P], [R, P, o])]
    mode = (A.ndim, B.ndim)
    if mode == (2, 3):  # offs cuts M: N (B's columns) or K
        rules += [([Shard(1)], [R, Shard(2), o]), ([P], [Shard(1), Shard(1), o])]
    elif mode == (3, 2):  # offs cuts N: M (A's rows) or K
        rules += [([Shard(0)], [Shard(1), R, o]), ([P], [Shard(2), Shard(0), o])]
    elif mode == (2, 2):  # offs cuts K: M or N, each out (G, M, N)
        rules += [([Shard(1)], [Shard(0), R, o]), ([Shard(2)], [R, Shard(1), o])]
    else:  # batched: G, M, N or K
        rules += [([Shard(0)], [Shard(0), Shard(0), o]), ([Shard(1)], [Shard(1), R, o]),
                  ([Shard(2)], [R, Shard(2), o]), ([P], [Shard(2), Shard(1), o])]
    return rules


@register_sharding(torch.ops.ops.grouped_gemm.out)
def _grouped_gemm_out(A, B, offs=None, out_dtype=None, out=None):
    raise RuntimeError(
        f"grouped_gemm: the out variant does not take DTensors (got A {list(A.placements)}, B {list(B.placements)}); "
        "call ops.grouped_gemm(A, B, offs) without out")


@register_sharding(torch.ops.ops.scaled_grouped_gemm.default)
def _scaled_grouped_gemm(A, B, scale_a, scale_b, offs=None, bias=None, out_dtype=None):
    # Replicated, or 3D x 3D sharded over its groups (expert parallel: each rank its experts' tokens, weights,
    # scales and bias, all of them (G, ...)); offs whole.
    o, b = (None if offs is None else R), (lambda placement: None if bias is None else placement)
    rules = [([R], [R, R, R, R, o, b(R)])]
    if A.ndim == 3 and B.ndim == 3:
        s = Shard(0)
        rules.append(([s], [s, s, s, s, o, b(s)]))
    return rules


@register_sharding(torch.ops.ops.scaled_grouped_gemm.out)
def _scaled_grouped_gemm_out(A, B, scale_a, scale_b, offs=None, bias=None, out_dtype=None, out=None):
    raise RuntimeError(
        f"scaled_grouped_gemm: the out variant does not take DTensors (got A {list(A.placements)}, B "
        f"{list(B.placements)}); call ops.scaled_grouped_gemm(A, B, scale_a, scale_b, ...) without out")


def _fp8_rules(ndim, granularity, scale, whole=0):
    """(codes, scales) of an FP8 op's rows: Replicate, and sharded on a leading dimension with the input (and a
    static scale) where each scale is a row's own; a tensor's or a 128x128 block's amax spans shards. `whole`:
    the tensors read whole between the input and the scale (rms_norm_fp8's weight)."""
    shards = _leading_shards(ndim) if granularity in ROW_GRANULARITIES else []
    return [([p, p], [p, *[R] * whole, None if scale is None else p]) for p in [R, *shards]]


@register_sharding(torch.ops.ops.quantize_fp8.default)
def _quantize_fp8(input, granularity="row", dtype=None, scale=None, pow2_scale=False):
    return _fp8_rules(len(input.shape), granularity, scale)


@register_sharding(torch.ops.ops.rms_norm_fp8.default)
def _rms_norm_fp8(input, weight, eps=1e-6, granularity="row", dtype=None, scale=None, pow2_scale=False, *,
                  round_before_weight=False):
    return _fp8_rules(len(input.shape), granularity, scale, whole=1)


@register_sharding(torch.ops.ops.silu_and_mul_fp8.default)
def _silu_and_mul_fp8(input, granularity="row", dtype=None, scale=None, pow2_scale=False):
    return _fp8_rules(len(input.shape), granularity, scale)


@register_sharding(torch.ops.ops.rms_norm.default)
def _rms_norm(input, weight, eps=1e-6, *, round_before_weight=False):
    return [([R], [R, R])] + [([s], [s, R]) for s in _leading_shards(input.ndim)]


@register_sharding(torch.ops.ops.silu_and_mul.default)
def _silu_and_mul(input):
    return [([R], [R])] + [([s], [s]) for s in _leading_shards(input.ndim)]


def _fused_add_rms_norm(op_schema):
    """An op strategy (not register_sharding, which lets DTensor pick any listed placement): input and
    residual are written in place, so the only strategy keeps their placements, and DTensor moves only
    the weight (read whole). Rows are independent: uneven and empty shards are fine."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor._op_schema import OpSpec, OpStrategy
    from torch.distributed.tensor._ops.utils import generate_redistribute_costs

    args = op_schema.args_schema[:3]  # input, residual, weight: OpStrategy each (eps is a float)
    input, residual, weight = (a.strategies[0].output_spec for a in args)
    ok = {R, *_leading_shards(input.ndim)}
    if input.placements != residual.placements or any(p not in ok for p in input.placements):
        raise RuntimeError(
            f"fused_add_rms_norm: input and residual are written in place, so they must have one placement, "
            f"Replicate or Shard of a dimension but the last (hidden) one, on every mesh dimension: got input "
            f"{list(input.placements)}, residual {list(residual.placements)}; redistribute them first")
    mesh = op_schema.get_mesh_from_args()
    specs = [DTensorSpec(mesh, placements, tensor_meta=spec.tensor_meta) for spec, placements in
             ((input, input.placements), (residual, input.placements), (weight, (R,) * mesh.ndim))]
    costs = [generate_redistribute_costs(a, spec) for a, spec in zip(args, specs)]
    return OpStrategy([OpSpec(output_specs=None, input_specs=specs, redistribute_cost=costs)])  # no outputs


def _fused_add_rms_norm_fp8(op_schema):
    """residual is written in place: its placement is kept (Replicate, or Shard of a dimension but the last
    where each scale is a row's own), the input and a static scale follow it, the weight is read whole."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor._op_schema import OpSpec, OpStrategy
    from torch.distributed.tensor._ops.utils import generate_redistribute_costs

    names = [a.name for a in op_schema.op._schema.arguments]
    given = dict(zip(names, op_schema.args_schema), **op_schema.kwargs_schema)
    granularity = given.get("granularity", "row")
    input, residual, weight = (given[n] for n in ("input", "residual", "weight"))
    scale = given.get("scale")
    placements = residual.strategies[0].output_spec.placements
    ndim = residual.strategies[0].output_spec.ndim
    rows = granularity in ROW_GRANULARITIES
    ok = {R, *(_leading_shards(ndim) if rows else ())}
    if any(p not in ok for p in placements):
        raise RuntimeError(
            f"fused_add_rms_norm_fp8: residual is written in place, so it keeps its placement, which must be "
            f"Replicate{' or Shard of a dimension but the last (hidden) one' if rows else ''} "
            f'on every mesh dimension for granularity "{granularity}"'
            f"{'' if rows else ' (its amax spans every row)'}: got {list(placements)}; "
            "redistribute residual first")
    mesh = op_schema.get_mesh_from_args()
    out = DTensorSpec(mesh, placements)
    args = [input, residual, weight] + ([scale] if scale is not None else [])
    wanted = [placements, placements, (R,) * mesh.ndim]
    if scale is not None:
        wanted.append(placements if scale.strategies[0].output_spec.ndim else (R,) * mesh.ndim)
    specs = [DTensorSpec(mesh, p, tensor_meta=a.strategies[0].output_spec.tensor_meta) for a, p in zip(args, wanted)]
    costs = [generate_redistribute_costs(a, spec) for a, spec in zip(args, specs)]
    if scale is None:  # the strategy lists one input spec per tensor argument, None for an absent one
        specs.append(None)
        costs.append([])
    return OpStrategy([OpSpec(output_specs=(out, DTensorSpec(mesh, placements)), input_specs=specs,
                              redistribute_cost=costs)])


def _register_op_strategies():
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo

    propagator = DTensor._op_dispatcher.sharding_propagator
    propagator.register_op_strategy(torch.ops.ops.fused_add_rms_norm.default, _fused_add_rms_norm,
                                    RuntimeSchemaInfo(needs_pytree=True))
    propagator.register_op_strategy(torch.ops.ops.fused_add_rms_norm_fp8.default, _fused_add_rms_norm_fp8,
                                    RuntimeSchemaInfo(needs_pytree=True))
    # DTensor caches a placement decision by the tensors' specs and the arguments from static_argnum on, which
    # register_sharding sets at the first int argument (none of these ops has one): every argument after the
    # tensors that decides placements (an activation, a granularity) or the output (out_dtype) enters the key.
    for op, first_static in [(torch.ops.ops.linear.default, "activation"),
                             (torch.ops.ops.scaled_gemm.default, "out_dtype"),
                             (torch.ops.ops.quantize_fp8.default, "granularity"),
                             (torch.ops.ops.rms_norm_fp8.default, "granularity"),
                             (torch.ops.ops.silu_and_mul_fp8.default, "granularity"),
                             (torch.ops.ops.fused_add_rms_norm_fp8.default, "granularity"),
                             (torch.ops.ops.grouped_gemm.default, "out_dtype"),
                             (torch.ops.ops.scaled_grouped_gemm.default, "out_dtype")]:
        names = [a.name for a in op._schema.arguments]
        start = names.index(first_static)
        propagator.op_to_schema_info[op] = RuntimeSchemaInfo(static_argnum=start, static_kwargkey=names[start:],
                                                             needs_pytree=True)


_register_op_strategies()
