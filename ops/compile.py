"""A torch.compile graph pass that rewrites known formulas into the ops, in any model's graph.

    model = torch.compile(model, backend=ops.compile.backend())
    # or in your own Inductor configuration (one pass object, before Inductor's own joint-graph patterns):
    torch._inductor.config.joint_custom_pre_pass = ops.compile.FusionPass()

It runs on the joint graph Inductor builds (the forward alone for inference; forward and backward for
training), with Inductor's pattern matcher, as vLLM's compilation passes do: each pattern is a Python
function traced to an aten graph (``register_replacement``), so it matches whatever the formula
decomposes to in the running torch, and a match is re-traced at the graph's own shapes and dtypes
before it is replaced. The patterns:

* ``linear_act``: ``act(F.linear(x, w, b))`` (bias optional), act in relu, gelu, gelu_tanh, silu ->
  ``ops.linear(x, w, b, act)``;
* ``rms_norm``: ``F.rms_norm(x, (d,), w, eps)`` and the hand-written norm
  ``w * (x.float() * rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)`` (also with
  the weight multiply before the cast) -> ``ops.rms_norm``;
* ``fused_add_rms_norm``: ``r = x + residual`` followed by that norm of r, r used afterwards ->
  ``ops.fused_add_rms_norm`` (inference graphs: the op has no autograd);
* ``silu_and_mul``: ``silu(a) * b`` where a, b are the halves of one tensor's last dimension (chunk,
  split or slices) -> ``ops.silu_and_mul``.

Training graphs get the ops' registered autograd (the replacement is traced forward and backward), so
the backward runs the ops' backward formulas.

By default a rewrite is made only on a device type, and from a size, where it was measured faster than
the code Inductor generates for the same formula: ``RULES`` (docs/fusion.md gives the measurements).
``FusionPass(patterns=...)`` overrides that with an explicit set of pattern names for every device. ``counts`` tells how many
rewrites each pattern made (a graph served from Inductor's cache is not rewritten again).
"""

import dataclasses
import threading
import warnings
from typing import Dict, Iterable, Optional

import torch
import torch.nn.functional as F

from . import _library  # noqa: F401  (loads the op library: the replacements call its ops)
from .gemm import _GEMM_DTYPES
from .linear import ACTIVATION_FUNCTIONS

__all__ = ["PATTERNS", "RULES", "Rule", "FusionPass", "backend"]

PATTERNS = ("fused_add_rms_norm", "rms_norm", "silu_and_mul", "linear_act")  # in the order they are applied


@dataclasses.dataclass(frozen=True)
class Rule:
    """Rewrite an input whose last dimension is at least ``min_last`` and which has at most ``max_numel``
    elements (None: no bound). A symbolic size is covered only where it is known to be in range."""

    min_last: int
    max_numel: Optional[int] = None

    def covers(self, value: torch.Tensor) -> bool:
        last = value.shape[-1] if value.dim() else 0
        return _known(last >= self.min_last) and (self.max_numel is None or _known(value.numel() <= self.max_numel))


# The patterns the default pass applies per device type, over the shapes at which each op was measured
# faster than the code Inductor generates for the formula it replaces (python -m benchmarks.compile_rules;
# docs/fusion.md). CPU, benchmarks/results/2026-12-02-cpu: rms_norm and fused_add_rms_norm 1.03-12x at
# every measured shape (rows 1-4096 x hidden 128-4096: memory-bound at the largest, no bound set);
# silu_and_mul 1.05-7.5x at 2 * d = 1024-28672 up to 29.4M elements, 0.88-0.99x at 4096 x 8192 and
# 4096 x 28672. ops.linear, ATen's linear plus the activation on CPU, 0.95-1.31x
# (benchmarks/results/2026-12-01-cpu): not applied. CUDA: not measured against Inductor, none.
RULES: Dict[str, Dict[str, Rule]] = {
    "cpu": {"rms_norm": Rule(128), "fused_add_rms_norm": Rule(128), "silu_and_mul": Rule(1024, max_numel=29360128)},
    "cuda": {},
}

_ACTIVATIONS = {name: fn for name, fn in ACTIVATION_FUNCTIONS.items() if name != "none"}
_OPS_DEFAULT_EPS = torch.ops.ops.rms_norm.default._schema.arguments[2].default_value
_EPS = 2.0 ** -20  # the traced eps: a float32 value, so F.rms_norm's float32 rounding keeps it (the
#                     pattern matcher then treats it as the argument eps, whatever the model's value)


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _known(condition) -> bool:
    """Whether a condition on (possibly symbolic) sizes holds for every size the graph admits."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return bool(statically_known_true(condition))


def _consistent(match, names) -> Optional[torch.Tensor]:
    """The (fake) value of the match's first tensor if all its tensors are there and share a floating
    dtype the ops take and a device. A pattern input matched by a number (``x + 0.25`` for ``x + residual``)
    is missing from the re-traced match, whose pattern holds the number as a constant."""
    vals = [_val(match.kwargs.get(n)) for n in names]
    if not vals or any(not isinstance(v, torch.Tensor) for v in vals):
        return None
    if vals[0].dtype not in _GEMM_DTYPES or any(v.dtype != vals[0].dtype or v.device != vals[0].device for v in vals):
        return None
    return vals[0]


# ---- what every rewrite checks ---------------------------------------------------------------------

def _schema_values(target, args, kwargs) -> Optional[dict]:
    """Every argument of a call of the OpOverload `target` by name, defaults filled in; None if the call
    does not bind to the schema."""
    arguments = target._schema.arguments
    names = {a.name for a in arguments}
    positional = [a for a in arguments if not a.kwarg_only]
    if len(args) > len(positional) or any(name not in names for name in kwargs):
        return None
    values = {}
    for i, argument in enumerate(arguments):
        if i < len(args) and not argument.kwarg_only:
            values[argument.name] = args[i]
        elif argument.name in kwargs:
            values[argument.name] = kwargs[argument.name]
        elif argument.has_default_value():
            values[argument.name] = argument.default_value
        else:
            return None
    return values


def _same_constant(expected, got) -> bool:
    """Whether a matched node's argument `got` is the pattern's `expected` (a sub-pattern, matched
    structurally by the pattern matcher, or a constant)."""
    from torch._inductor.pattern_matcher import PatternExpr

    if isinstance(expected, PatternExpr):
        return True
    if isinstance(expected, (list, tuple)):
        return (isinstance(got, (list, tuple)) and len(got) == len(expected)
                and all(_same_constant(e, g) for e, g in zip(expected, got)))
    if isinstance(got, (torch.fx.Node, list, tuple)):
        return False
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(expected) is type(got) and expected == got
    return bool(expected == got)  # 2 == 2.0: the same exponent


def _every_argument_matches(match) -> bool:
    """Whether every argument of every matched node, keyword and default ones included, is the one the
    pattern (traced again at the graph's shapes and dtypes) has. Inductor's matcher compares only the
    arguments a pattern's node spells out: ``add(x, r, alpha=-0.5)`` matches a traced ``x + r``."""
    from torch._inductor.pattern_matcher import _TargetArgsExpr

    for pattern, node in match.ctx.pattern_to_node.items():
        if node is None or not isinstance(pattern, _TargetArgsExpr):
            continue
        if isinstance(node.target, torch._ops.OpOverload):
            got = _schema_values(node.target, node.args, node.kwargs)
            expected = _schema_values(node.target, pattern.args, pattern.kwargs)
            if got is None or expected is None or any(not _same_constant(expected[k], got[k]) for k in got):
                return False
        elif (len(node.args) != len(pattern.args) or set(node.kwargs) != set(pattern.kwargs)
              or not all(_same_constant(e, g) for e, g in zip(pattern.args, node.args))
              or not all(_same_constant(pattern.kwargs[k], node.kwargs[k]) for k in node.kwargs)):
            return False
    return True


def _storage(value):
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(value.untyped_storage())


def _row_major(value) -> bool:
    """Whether eager's element-wise formulas of `value` give a contiguous result: its dimensions longer than
    one that it does not broadcast have decreasing strides (TensorIterator lays an output out in its inputs'
    stride order). A half or window of a row is; a transposed or permuted tensor is not."""
    if _known(value.is_contiguous()):
        return True
    strides = [s for n, s in zip(value.shape, value.stride()) if not _known(n == 1) and not _known(s == 0)]
    return all(_known(a > b) for a, b in zip(strides, strides[1:]))


def _whole_buffer(value) -> bool:
    """Whether a (fake) tensor is all of its storage: contiguous from offset 0, no other tensor's view."""
    return (value.is_contiguous() and _known(value.storage_offset() == 0)
            and _known(value.untyped_storage().nbytes() == value.numel() * value.element_size()))


def _noop_sources(node) -> list:
    """`node` and every node Inductor's later passes may put in its place as a no-op (+ 0, - 0, * 1, / 1
    in its joint-graph passes, with the identity a number or a constant tensor; clone, alias, copy, a
    full slice, a cast to the same dtype and the rest of post_grad's noop_registry): what a rewrite's
    argument can become after the pass (torch 2.14.1: `view * 1.0` became the view, a chunk's second
    half, whose storage offset auto_functionalized's copy then dropped). Every candidate, removed or not."""
    from torch._inductor.fx_passes.post_grad import noop_registry

    aten = torch.ops.aten
    # (identity element, the operands that can be the result): x + 0, 0 + x, x - 0, x * 1, 1 * x, x / 1.
    arithmetic = {aten.add.Tensor: (0, (0, 1)), aten.sub.Tensor: (0, (0,)), aten.mul.Tensor: (1, (0, 1)),
                  aten.div.Tensor: (1, (0,))}
    constants = {aten.full.default, aten.zeros.default, aten.ones.default, aten.full_like.default,
                 aten.zeros_like.default, aten.ones_like.default, aten.scalar_tensor.default}

    def identity(arg, value):  # the element itself, or a node that may hold it (a constant tensor)
        if isinstance(arg, torch.fx.Node):
            return arg.op == "call_function" and arg.target in constants
        return isinstance(arg, (int, float)) and arg == value

    found, todo = [], [node]
    while todo:
        n = todo.pop()
        if not isinstance(n, torch.fx.Node) or n in found:
            continue
        found.append(n)
        if n.op != "call_function":
            continue
        if n.target in arithmetic:
            value, results = arithmetic[n.target]
            if len(n.args) == 2:
                todo.extend(n.args[i] for i in results if identity(n.args[1 - i], value))
        else:
            entry = noop_registry.get(n.target) or noop_registry.get(getattr(n.target, "overloadpacket", None))
            if entry is not None:
                _, index = entry
                try:
                    todo.append(n.args[index] if isinstance(index, int) else index(n.args))
                except (IndexError, TypeError):
                    pass
    return found


# ---- the formulas (search functions) and their replacements -----------------------------------------

def _hf_norm(x, w, eps):  # Llama's: the weight multiply after rounding to the input's dtype
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _hf_norm_cast(x, w, eps):  # Olmo2's: one rounding at the end
    xf = x.float()
    return (w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


def _f_norm(x, w, eps):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def _ops_norm(x, w, eps):  # a model converted with ops.nn.convert
    return torch.ops.ops.rms_norm(x, w, eps)


def _ops_norm_rounded(x, w, eps):  # a converted Llama-style norm
    return torch.ops.ops.rms_norm(x, w, eps, round_before_weight=True)


def _ops_norm_default_eps(round_before_weight: bool):
    """The search and replacement of x + residual and ops.rms_norm of it without eps (graphs drop a default)."""
    def search(x, residual, w):
        r = x + residual
        return torch.ops.ops.rms_norm(r, w, round_before_weight=round_before_weight), r

    def replacement(x, residual, w):
        return _add_norm_replacements(round_before_weight)["fused_add"](x, residual, w, _OPS_DEFAULT_EPS)

    return search, replacement


_NORMS = (_hf_norm, _hf_norm_cast, _f_norm)
# Whether a norm formula rounds x_hat to x's dtype before the weight multiply: its replacement passes
# round_before_weight, so that the rewrite computes the formula's bits.
_ROUNDS_BEFORE_WEIGHT = {_hf_norm: True, _hf_norm_cast: False, _f_norm: False, _ops_norm: False,
                         _ops_norm_rounded: True}


def _add_norm_search(norm):
    def search(x, residual, w, eps):
        r = x + residual
        return norm(r, w, eps), r
    return search


def _add_norm_replacements(round_before_weight: bool) -> dict:
    """The norm replacements of one rounding convention: ``norm`` (ops.rms_norm), ``fused_add`` (the in-place
    fused_add_rms_norm, inference), ``residual`` (training graphs: the sum, then the norm with its autograd),
    and their ``_tensor_eps`` forms (eps a 0-d CPU tensor: a float under dynamic=True)."""
    def norm(x, w, eps):
        return torch.ops.ops.rms_norm(x, w, eps, round_before_weight=round_before_weight)

    def fused_add(x, residual, w, eps):
        from torch._higher_order_ops.auto_functionalize import auto_functionalized

        out = auto_functionalized(torch.ops.ops.fused_add_rms_norm.default, input=x, residual=residual, weight=w,
                                  eps=eps, round_before_weight=round_before_weight)
        return out[1], out[2]

    def residual(x, residual, w, eps):
        r = x + residual
        return torch.ops.ops.rms_norm(r, w, eps, round_before_weight=round_before_weight), r

    def norm_tensor_eps(x, w, eps):
        return torch.ops.ops._rms_norm_tensor_eps(x, w, eps, round_before_weight=round_before_weight)

    def residual_tensor_eps(x, residual, w, eps):
        r = x + residual
        return torch.ops.ops._rms_norm_tensor_eps(r, w, eps, round_before_weight=round_before_weight), r

    return {"norm": norm, "fused_add": fused_add, "residual": residual, "norm_tensor_eps": norm_tensor_eps,
            "residual_tensor_eps": residual_tensor_eps}


def _halves_chunk(x):
    return x.chunk(2, dim=-1)


def _halves_split(x):
    d = x.shape[-1] // 2
    return x.split([d, d], dim=-1)


def _halves_slice(x):
    d = x.shape[-1] // 2
    return x[..., :d], x[..., d:]


def _silu_mul_searches():
    def searches(halves):
        def gate_first(x):
            a, b = halves(x)
            return F.silu(a) * b

        def up_first(x):  # Phi-3's up_states * act(gate): the product commutes exactly
            a, b = halves(x)
            return b * F.silu(a)
        return gate_first, up_first
    return searches(_halves_chunk) + searches(_halves_split) + searches(_halves_slice)


def _silu_and_mul_replacement(x):
    return torch.ops.ops.silu_and_mul(x)


def _linear_act(act, bias):
    fn = _ACTIVATIONS[act]
    if bias:
        return (lambda x, w, b: fn(F.linear(x, w, b))), (lambda x, w, b: torch.ops.ops.linear(x, w, b, act))
    return (lambda x, w: fn(F.linear(x, w))), (lambda x, w: torch.ops.ops.linear(x, w, None, act))


# ---- registration --------------------------------------------------------------------------------

def _fwd_functional(fn, args, **kwargs):
    """Inductor's fwd_only trace, with the in-place ops of decompositions (F.rms_norm's ``add_`` on its
    own temporary) made functional, as they are in the graphs AOT autograd hands the pass."""
    from torch._inductor import pattern_matcher as pm

    gm = pm.fwd_only(fn, args, **kwargs)
    for node in gm.graph.nodes:
        target = node.target
        if not isinstance(target, torch._ops.OpOverload) or not target._schema.name.endswith("_"):
            continue
        functional = getattr(torch.ops.aten, target._schema.name.split("::")[-1][:-1], None)
        written = node.args[0] if node.args else None
        if (functional is not None and hasattr(functional, target._overloadname) and isinstance(written, torch.fx.Node)
                and len(written.users) == 1):
            node.target = getattr(functional, target._overloadname)
    gm.recompile()
    return gm


_KINDS = ("inference", "training")
_REGISTERED: Dict[str, Dict[str, object]] = {}  # kind -> {pattern name: its PatternMatcherPass}, once per process
_REGISTER_LOCK = threading.Lock()
_ENABLED = threading.local()  # the pass being applied: its enabled-set function, read by the checks

# Training graphs: which inputs of a formula need a gradient, each a traced pattern of its own (the
# backward differs). All (the middle layers), all but the input (the first layer's, a frozen
# embedding's), only the input (frozen weights: LoRA-style fine-tuning).
_GRADS = {2: ((True, True), (False, True), (True, False)),
          3: ((True, True, True), (False, True, True), (True, False, False))}
# The residual norm's inputs (x, residual, weight): both summands or one, a trained or a frozen weight.
_RESIDUAL_GRADS = ((True, True, True), (True, False, True), (True, True, False), (True, False, False))


def _allowed(name: str, value: Optional[torch.Tensor]) -> bool:
    enabled = getattr(_ENABLED, "fn", None)
    return value is not None and enabled is not None and enabled(name, value)


def _register_all(kind: str):
    from torch._inductor import pattern_matcher as pm

    passes = {name: pm.PatternMatcherPass(pass_name=f"ops_{name}_{kind}") for name in PATTERNS}
    training = kind == "training"

    def check(name, tensors, *extras):
        return lambda match: (_every_argument_matches(match) and _allowed(name, _consistent(match, tensors))
                              and all(extra(match) for extra in extras))

    def same(a, b):
        return _known(a == b)

    def norm_shapes(match):  # the ops' contract: weight (hidden,), no broadcasting
        x, w = _val(match.kwargs["x"]), _val(match.kwargs["w"])
        return x.dim() >= 1 and w.dim() == 1 and same(w.shape[0], x.shape[-1])

    def layout_kept(*names):
        # The ops return contiguous results; eager's element-wise formulas follow their input's layout. Graph
        # outputs keep the strides traced before the pass in training graphs (torch 2.13 and 2.14.1) and in
        # inference graphs under torch 2.13, which a rewrite on a transposed or permuted input breaks (a
        # caller's .view() then fails): row-major inputs only.
        def row_major(match):
            return all(_row_major(_val(match.kwargs[k])) for k in names)
        return row_major

    def add_shapes(match):
        x, residual = _val(match.kwargs["x"]), _val(match.kwargs["residual"])
        return x.dim() == residual.dim() and all(same(a, b) for a, b in zip(x.shape, residual.shape))

    def buffers_of_their_own(match):
        # The op writes both summands' buffers: each must be all of its storage (not a half, slice or
        # expansion of a tensor: Inductor's copies of such views for auto_functionalized drop their
        # storage offset, torch 2.14.1), and neither may be the other's or the weight's.
        # That holds for whatever Inductor may later put in place of each as a no-op (_noop_sources).
        sources = {k: [v for v in map(_val, _noop_sources(match.kwargs[k])) if isinstance(v, torch.Tensor)]
                   for k in ("x", "residual")}
        if not all(_whole_buffer(v) for k in sources for v in sources[k]
                   if v.shape == _val(match.kwargs[k]).shape):
            return False
        x, residual, w = (_val(match.kwargs[k]) for k in ("x", "residual", "w"))
        sx, sr = _storage(x), _storage(residual)
        return sx != sr and _storage(w) not in (sx, sr)

    def input_not_written_back(match):
        # The op writes the norm into its `input`: where that is a graph input the graph writes back to
        # (r.add_(x) in the model), Inductor's re-inplacing would leave the norm in the caller's tensor.
        return not any(user.target is torch.ops.aten.copy_.default
                       for source in _noop_sources(match.kwargs["x"]) for user in source.users)

    def linear_shapes(match):
        x, w = _val(match.kwargs["x"]), _val(match.kwargs["w"])
        b = _val(match.kwargs.get("b"))
        return (x.dim() >= 1 and w.dim() == 2 and same(w.shape[1], x.shape[-1])
                and (b is None or (b.dim() == 1 and same(b.shape[0], w.shape[0]))))

    def not_float64(match):  # the hand-written norms compute float64 input in float32; ops.rms_norm in float64
        return _val(match.kwargs["x"]).dtype != torch.float64

    def eps_is_a_number(match):  # not a traced value (dynamic-shape graphs can carry floats as tensors)
        # Run on the match of the pattern re-traced at the graph's own arguments: there torch 2.11 leaves
        # out a number eps (a constant of that pattern), 2.14 fills it in from the first match.
        eps = match.kwargs.get("eps")
        return eps is None or isinstance(eps, (int, float))

    def eps_is_a_cpu_scalar(match):  # what _rms_norm_tensor_eps reads on the host
        eps = _val(match.kwargs.get("eps"))
        return (isinstance(eps, torch.Tensor) and eps.dim() == 0 and eps.device.type == "cpu"
                and eps.dtype.is_floating_point)

    def even(match):
        return _val(match.kwargs["x"]).shape[-1] % 2 == 0

    def register(name, search, replace, examples, check_fn, grads=(), scalars=None):
        """Inference: the formula traced forward. Training: traced forward and backward once per entry of
        `grads` (which tensor examples need a gradient); none for an op without autograd."""
        kwargs = dict(extra_check=check_fn, scalar_workaround=scalars or {}, skip_duplicates=True)
        if not training:
            pm.register_replacement(search, replace, examples, _fwd_functional, passes[name], **kwargs)
            return
        for flags in grads:
            flags = iter(flags)
            inputs = [e.detach().requires_grad_(next(flags)) if isinstance(e, torch.Tensor) else e for e in examples]
            pm.register_replacement(search, replace, inputs, pm.joint_fwd_bwd, passes[name], **kwargs)

    # A match is re-traced at the graph's own shapes and dtypes, so one example per graph structure is
    # enough: float32 (no casts; float64 alike) and bfloat16 (casts; float16 alike); linear's 3-D input
    # adds views around the GEMM.
    for dtype in (torch.float32, torch.bfloat16):
        x, r, w, eps = torch.randn(3, 8, dtype=dtype), torch.randn(3, 8, dtype=dtype), torch.randn(8, dtype=dtype), _EPS
        for norm in _NORMS + (_ops_norm, _ops_norm_rounded):
            cast = norm in (_hf_norm, _hf_norm_cast)
            norm_checks = ((not_float64,) if cast else ()) + (eps_is_a_number, norm_shapes)
            replace = _add_norm_replacements(_ROUNDS_BEFORE_WEIGHT[norm])
            if norm in _NORMS:
                register("rms_norm", norm, replace["norm"], [x, w, eps],
                         check("rms_norm", ("x", "w"), *norm_checks, layout_kept("x")),
                         grads=_GRADS[2], scalars={"eps": _EPS})
            if norm in _NORMS and training:
                # A norm of a sum used again (a residual stream): autograd adds the sum's other gradient
                # into the norm's own, so the plain norm's backward is not in the graph; the sum is.
                register("rms_norm", _add_norm_search(norm), replace["residual"], [x, r, w, eps],
                         check("rms_norm", ("x", "residual", "w"), *norm_checks, add_shapes,
                               layout_kept("x", "residual")),
                         grads=_RESIDUAL_GRADS, scalars={"eps": _EPS})
            if not training:
                register("fused_add_rms_norm", _add_norm_search(norm), replace["fused_add"], [x, r, w, eps],
                         check("fused_add_rms_norm", ("x", "residual", "w"), *norm_checks, add_shapes,
                               buffers_of_their_own, input_not_written_back),
                         scalars={"eps": _EPS})
        # torch.compile(dynamic=True) passes a float argument (a module's eps attribute too) as a 0-d CPU
        # tensor, which the hand-written norms add: those norms become _rms_norm_tensor_eps.
        eps_t = torch.tensor(_EPS, dtype=torch.float32)
        for norm in (_hf_norm, _hf_norm_cast):
            tensor_checks = (not_float64, eps_is_a_cpu_scalar, norm_shapes)
            replace = _add_norm_replacements(_ROUNDS_BEFORE_WEIGHT[norm])
            register("rms_norm", norm, replace["norm_tensor_eps"], [x, w, eps_t],
                     check("rms_norm", ("x", "w"), *tensor_checks, layout_kept("x")),
                     grads=[g + (False,) for g in _GRADS[2]])
            if training:
                register("rms_norm", _add_norm_search(norm), replace["residual_tensor_eps"], [x, r, w, eps_t],
                         check("rms_norm", ("x", "residual", "w"), *tensor_checks, add_shapes,
                               layout_kept("x", "residual")),
                         grads=[g + (False,) for g in _RESIDUAL_GRADS])
        for rounded in ((False, True) if not training else ()):
            search, replacement = _ops_norm_default_eps(rounded)
            register("fused_add_rms_norm", search, replacement, [x, r, w],
                     check("fused_add_rms_norm", ("x", "residual", "w"), norm_shapes, add_shapes, buffers_of_their_own,
                           input_not_written_back))
        for search in _silu_mul_searches():
            register("silu_and_mul", search, _silu_and_mul_replacement, [x],
                     check("silu_and_mul", ("x",), even, layout_kept("x")),
                     grads=((True,),))
        for shape in ((3, 8), (2, 3, 8)):
            for act in _ACTIVATIONS:
                for bias in (True, False):
                    search, replace = _linear_act(act, bias)
                    args = [torch.randn(shape, dtype=dtype), torch.randn(4, 8, dtype=dtype)]
                    args += [torch.randn(4, dtype=dtype)] if bias else []
                    register("linear_act", search, replace, args,
                             check("linear_act", ("x", "w", "b")[:len(args)], linear_shapes), grads=_GRADS[len(args)])
    return passes


def _patterns(kind: str):
    with _REGISTER_LOCK:
        if kind not in _REGISTERED:
            from torch._subclasses.fake_tensor import unset_fake_temporarily
            # Traced with real CPU tensors, as Inductor's own patterns are; outside inference mode, in which
            # register_replacement skips the training patterns.
            with unset_fake_temporarily(), torch.device("cpu"), torch.inference_mode(False):
                _REGISTERED[kind] = _register_all(kind)
        return _REGISTERED[kind]


def _is_training_graph(graph: torch.fx.Graph) -> bool:
    """A joint forward-backward graph: AOT autograd names its gradient inputs tangents_*."""
    return any(node.op == "placeholder" and str(node.target).startswith("tangents") for node in graph.nodes)


try:
    from torch._inductor.custom_graph_pass import CustomGraphPass as _CustomGraphPass
except ImportError:  # pragma: no cover - torch without Inductor's custom pass API
    _CustomGraphPass = object


class FusionPass(_CustomGraphPass):
    """The ops' rewrite pass, for ``torch._inductor.config.joint_custom_pre_pass``.

    Args:
        patterns: None (the measured ``RULES`` per device type), one name from ``PATTERNS`` or an iterable
            of them, applied on every device.

    ``counts``: {pattern name: rewrites made by this pass object so far}.
    """

    def __init__(self, patterns: Optional[Iterable[str]] = None):
        if patterns is not None:
            if isinstance(patterns, str):
                patterns = (patterns,)
            try:
                patterns = frozenset(patterns)
            except TypeError:
                raise TypeError(f"ops.compile.FusionPass: patterns must be None, a pattern name or an iterable of "
                                f"them, got {type(patterns).__name__}") from None
            unknown = sorted(map(repr, patterns - set(PATTERNS)))
            if unknown:
                raise ValueError(f"ops.compile.FusionPass: unknown patterns [{', '.join(unknown)}]; choose from "
                                 f"{list(PATTERNS)}")
        self.patterns = patterns
        self.counts = {name: 0 for name in PATTERNS}

    def enabled(self, name: str, value: torch.Tensor) -> bool:
        """Whether to rewrite pattern `name` whose first input is `value` (a fake tensor)."""
        if self.patterns is not None:
            return name in self.patterns
        rule = RULES.get(value.device.type, {}).get(name)
        return rule is not None and rule.covers(value)

    def __call__(self, graph: torch.fx.Graph) -> None:
        from torch._inductor.fx_passes.post_grad import remove_noop_ops
        from torch._inductor.pattern_matcher import stable_topological_sort

        # Training graphs: the forward-and-backward patterns first, then the forward ones (parts of the
        # graph no gradient flows through).
        kinds = ("training", "inference") if _is_training_graph(graph) else ("inference",)
        passes = [_patterns(kind) for kind in kinds]
        remove_noop_ops(graph)  # the joint graph still has aliases here; the patterns were traced without
        _unshare_symbolic_sizes(graph)
        _ENABLED.fn = self.enabled
        try:
            for name in PATTERNS:
                for kind_passes in passes:
                    with warnings.catch_warnings():
                        # A training match whose gradient output appears twice (both summands of a residual
                        # need it) has its node erased once per appearance.
                        warnings.filterwarnings("ignore", message=r"erase_node\(.*\) on an already erased node")
                        rewrites = kind_passes[name].apply(graph) or 0
                    if rewrites:  # a training match's replacement is inserted before the gradient it reads
                        stable_topological_sort(graph)
                    self.counts[name] += rewrites
        finally:
            _ENABLED.fn = None
        graph.eliminate_dead_code()

    def uuid(self):
        from torch._inductor.custom_graph_pass import get_hash_for_files

        rules = sorted((device, sorted(names.items())) for device, names in RULES.items())
        return get_hash_for_files((__file__,), repr((sorted(self.patterns or ()), self.patterns is None, rules)))


def _unshare_symbolic_sizes(graph: torch.fx.Graph) -> None:
    """Gives each user of a computed symbolic size (``2 * s0``, a view's row count) a copy of its own. A
    match may not take a node with users outside it: two Linears reading one input with a symbolic row
    count share that count, and neither matched. The copies are pure integer expressions; Inductor's own
    passes merge them again."""
    for node in reversed(list(graph.nodes)):  # users first: a copied expression's own inputs gain users
        if node.op != "call_function" or not isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat,
                                                                              torch.SymBool)):
            continue
        for user in list(node.users)[1:]:
            with graph.inserting_before(user):
                copy = graph.node_copy(node)
            user.replace_input_with(node, copy)


class _Chained(_CustomGraphPass):
    """Two joint-graph passes, one after the other: the user's own, then the ops' rewrites."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.first(graph)
        self.second(graph)

    def uuid(self):
        # A plain function has no uuid: Inductor then does not cache the graph, as without the chain.
        first = self.first.uuid() if hasattr(self.first, "uuid") else None
        return None if first is None else (first, self.second.uuid())


class backend:
    """A torch.compile backend: Inductor with ``FusionPass(patterns)`` as its joint-graph pre-pass.

        compiled = torch.compile(model, backend=ops.compile.backend())
        compiled = torch.compile(model, backend=ops.compile.backend(), mode="max-autotune")

    ``counts`` reads the pass's rewrite counts. Other keyword arguments, and torch.compile's ``mode`` and
    ``options``, are Inductor's, with Inductor's meanings (an unknown one is an error). A
    ``joint_custom_pre_pass`` already set (in ``torch._inductor.config`` or in the options) runs first,
    then the ops' pass.
    """

    def __init__(self, patterns: Optional[Iterable[str]] = None, **inductor_options):
        self.fusion_pass = FusionPass(patterns)
        self.options = _inductor_options(inductor_options, "keyword arguments")

    @property
    def counts(self) -> Dict[str, int]:
        return self.fusion_pass.counts

    def __call__(self, gm, example_inputs, *, mode: Optional[str] = None, options: Optional[dict] = None):
        from torch._inductor.compile_fx import compile_fx

        patches = {}
        if mode not in (None, "default"):
            from torch._inductor import list_mode_options

            modes = list_mode_options()
            if mode not in modes:
                raise ValueError(f"ops.compile.backend: unknown torch.compile mode {mode!r}; Inductor's modes are "
                                 f"{sorted(modes)}")
            patches.update(list_mode_options(mode))
        patches.update(self.options)
        if options is not None:
            if not isinstance(options, dict):
                raise TypeError(f"ops.compile.backend: torch.compile options must be a dict, got "
                                f"{type(options).__name__}")
            patches.update(_inductor_options(options, "torch.compile options"))
        own = patches.pop("joint_custom_pre_pass", None) or torch._inductor.config.joint_custom_pre_pass
        fusion = self.fusion_pass if own is None or own is self.fusion_pass else _Chained(own, self.fusion_pass)
        return compile_fx(gm, example_inputs, config_patches={**patches, "joint_custom_pre_pass": fusion})


def _inductor_options(options: dict, where: str) -> dict:
    known = torch._inductor.config.get_config_copy()
    unknown = sorted(str(k) for k in options if k not in known)
    if unknown:
        raise ValueError(f"ops.compile.backend: {where} {unknown} are not Inductor config options "
                         "(torch._inductor.config)")
    return dict(options)
