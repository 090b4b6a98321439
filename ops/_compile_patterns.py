"""The formulas the compile pass (ops.compile) rewrites, their replacements, and ``ROWS``: the table of
traced patterns, one row per pattern (its name, search and replacement functions, example inputs and
the checks of ops._compile_checks a match must pass). ``passes(kind)`` traces the rows into Inductor
pattern-matcher passes, once per process.
"""

import dataclasses
import inspect
import threading
from typing import Callable, Dict, Tuple

import torch
import torch.nn.functional as F

from . import _library  # noqa: F401  (loads the op library: the replacements call its ops)
from . import fused  # noqa: F401  (the fake kernels and autograd of the ops the replacements call)
from ._compile_checks import (add_shapes, buffers_of_their_own, check, eps_is_a_cpu_scalar, eps_is_a_number, even,
                              input_not_written_back, known, layout_kept, linear_shapes, norm_shapes, not_float64,
                              val)
from .linear import ACTIVATION_FUNCTIONS

ACTIVATIONS = {name: fn for name, fn in ACTIVATION_FUNCTIONS.items() if name != "none"}  # what linear_act fuses
_OPS_DEFAULT_EPS = torch.ops.ops.rms_norm.default._schema.arguments[2].default_value
EPS = 2.0 ** -20  # the traced eps: a float32 value, so F.rms_norm's float32 rounding keeps it (the
#                    pattern matcher then treats it as the argument eps, whatever the model's value)


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


_HF_NORMS = (_hf_norm, _hf_norm_cast)  # in float32 via .float(), whatever the input's dtype
_NORMS = _HF_NORMS + (_f_norm,)  # the formulas rewritten into ops.rms_norm
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

    def fused_add_tensor_eps(x, residual, w, eps):
        from torch._higher_order_ops.auto_functionalize import auto_functionalized

        out = auto_functionalized(torch.ops.ops._fused_add_rms_norm_tensor_eps.default, input=x, residual=residual,
                                  weight=w, eps=eps, round_before_weight=round_before_weight)
        return out[1], out[2]

    return {"norm": norm, "fused_add": fused_add, "residual": residual, "norm_tensor_eps": norm_tensor_eps,
            "residual_tensor_eps": residual_tensor_eps, "fused_add_tensor_eps": fused_add_tensor_eps}


_REPLACEMENTS = {rounded: _add_norm_replacements(rounded) for rounded in (False, True)}


def _replacement(norm, which: str):
    """The replacement `which` (of _add_norm_replacements) of the norm formula `norm`."""
    return _REPLACEMENTS[_ROUNDS_BEFORE_WEIGHT[norm]][which]


def _ops_norm_default_eps(round_before_weight: bool):
    """The search and replacement of x + residual and ops.rms_norm of it without eps (graphs drop a default)."""
    def search(x, residual, w):
        r = x + residual
        return torch.ops.ops.rms_norm(r, w, round_before_weight=round_before_weight), r

    def replacement(x, residual, w):
        return _REPLACEMENTS[round_before_weight]["fused_add"](x, residual, w, _OPS_DEFAULT_EPS)

    return search, replacement


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
    fn = ACTIVATIONS[act]
    if bias:
        return (lambda x, w, b: fn(F.linear(x, w, b))), (lambda x, w, b: torch.ops.ops.linear(x, w, b, act))
    return (lambda x, w: fn(F.linear(x, w))), (lambda x, w: torch.ops.ops.linear(x, w, None, act))


# ---- the table ----------------------------------------------------------------------------------------

KINDS = ("inference", "training")
INFERENCE, TRAINING = KINDS[:1], KINDS[1:]
EPS_TENSOR = "eps_tensor"  # an example input: EPS as a 0-d float32 CPU tensor

# Training graphs: which inputs of a formula need a gradient, each a traced pattern of its own (the
# backward differs). All (the middle layers), all but the input (the first layer's, a frozen
# embedding's), only the input (frozen weights: LoRA-style fine-tuning).
_GRADS = {2: ((True, True), (False, True), (True, False)),
          3: ((True, True, True), (False, True, True), (True, False, False))}
# The residual norm's inputs (x, residual, weight): both summands or one, a trained or a frozen weight.
_RESIDUAL_GRADS = ((True, True, True), (True, False, True), (True, True, False), (True, False, False))
# A norm whose input is used again (other_gradient): that input needs a gradient.
_OTHER_GRADIENT_GRADS = ((True, True), (True, False))


def _frozen_eps(grads):  # an eps tensor needs no gradient
    return tuple(g + (False,) for g in grads)


@dataclasses.dataclass(frozen=True)
class Row:
    """One traced pattern: a match of ``search`` that passes ``check(pattern, tensors, *checks)`` becomes
    ``replacement``.

    ``pattern``: the name it is enabled and counted under (ops.compile.PATTERNS); ``examples``: its example
    inputs, a shape for a random tensor of the traced dtype, EPS_TENSOR, or a number; ``tensors``: the
    match's inputs that must share a device and a dtype the ops take, the first deciding ``RULES``;
    ``kinds``: the graphs it is traced for; ``grads``: training, which tensor examples need a gradient, a
    traced pattern per entry (none for an op without autograd); ``scalar_eps``: eps traced as the number
    EPS and matched as an argument (Inductor's scalar_workaround); ``other_gradient``: training, the first
    input also used outside the formula (_joint_with_other_gradient)."""

    pattern: str
    search: Callable
    replacement: Callable
    examples: Tuple
    tensors: Tuple[str, ...]
    checks: Tuple[Callable, ...]
    kinds: Tuple[str, ...] = KINDS
    grads: Tuple[Tuple[bool, ...], ...] = ()
    scalar_eps: bool = False
    other_gradient: bool = False


def _number_eps_checks(norm):  # the hand-written norms compute in float32: float64 input is left alone
    return ((not_float64,) if norm in _HF_NORMS else ()) + (eps_is_a_number, norm_shapes)


_TENSOR_EPS_CHECKS = (not_float64, eps_is_a_cpu_scalar, norm_shapes)
_X, _W, _LINEAR_W, _LINEAR_B = (3, 8), (8,), (4, 8), (4,)
_ADD_NORM = ("x", "residual", "w")

# A match is re-traced at the graph's own shapes and dtypes, so one example per graph structure is
# enough: passes() traces each row in float32 (no casts; float64 alike) and bfloat16 (casts; float16
# alike); linear's 3-D input adds views around the GEMM. Within a pattern the rows keep their order: a
# node is rewritten by the first row that matches it.
ROWS: Tuple[Row, ...] = (
    # rms_norm: the norm formulas; in training graphs also the norm of a residual sum used again, whose
    # backward autograd merges with the sum's other gradient (the plain norm's backward is not in the graph).
    *(row for norm in _NORMS for row in (
        Row("rms_norm", norm, _replacement(norm, "norm"), (_X, _W, EPS), ("x", "w"),
            (*_number_eps_checks(norm), layout_kept("x")), grads=_GRADS[2], scalar_eps=True),
        Row("rms_norm", _add_norm_search(norm), _replacement(norm, "residual"), (_X, _X, _W, EPS), _ADD_NORM,
            (*_number_eps_checks(norm), add_shapes, layout_kept("x", "residual")), kinds=TRAINING,
            grads=_RESIDUAL_GRADS, scalar_eps=True),
        Row("rms_norm", norm, _replacement(norm, "norm"), (_X, _W, EPS), ("x", "w"),
            (*_number_eps_checks(norm), layout_kept("x")), kinds=TRAINING, grads=_OTHER_GRADIENT_GRADS,
            scalar_eps=True, other_gradient=True))),
    # torch.compile(dynamic=True) passes a float argument (a module's eps attribute too) as a 0-d CPU
    # tensor, which the hand-written norms add: those norms become _rms_norm_tensor_eps.
    *(row for norm in _HF_NORMS for row in (
        Row("rms_norm", norm, _replacement(norm, "norm_tensor_eps"), (_X, _W, EPS_TENSOR), ("x", "w"),
            (*_TENSOR_EPS_CHECKS, layout_kept("x")), grads=_frozen_eps(_GRADS[2])),
        Row("rms_norm", _add_norm_search(norm), _replacement(norm, "residual_tensor_eps"),
            (_X, _X, _W, EPS_TENSOR), _ADD_NORM, (*_TENSOR_EPS_CHECKS, add_shapes, layout_kept("x", "residual")),
            kinds=TRAINING, grads=_frozen_eps(_RESIDUAL_GRADS)),
        Row("rms_norm", norm, _replacement(norm, "norm_tensor_eps"), (_X, _W, EPS_TENSOR), ("x", "w"),
            (*_TENSOR_EPS_CHECKS, layout_kept("x")), kinds=TRAINING, grads=_frozen_eps(_OTHER_GRADIENT_GRADS),
            other_gradient=True))),
    # fused_add_rms_norm (inference: the op has no autograd): the sum and a norm formula of it, the sum
    # used afterwards; also the ops' own norm (a converted model), with eps or without it; the hand-written
    # norms with a tensor eps (dynamic=True).
    *(Row("fused_add_rms_norm", _add_norm_search(norm), _replacement(norm, "fused_add"), (_X, _X, _W, EPS),
          _ADD_NORM, (*_number_eps_checks(norm), add_shapes, buffers_of_their_own, input_not_written_back),
          kinds=INFERENCE, scalar_eps=True)
      for norm in _NORMS + (_ops_norm, _ops_norm_rounded)),
    *(Row("fused_add_rms_norm", *_ops_norm_default_eps(rounded), (_X, _X, _W), _ADD_NORM,
          (norm_shapes, add_shapes, buffers_of_their_own, input_not_written_back), kinds=INFERENCE)
      for rounded in (False, True)),
    *(Row("fused_add_rms_norm", _add_norm_search(norm), _replacement(norm, "fused_add_tensor_eps"),
          (_X, _X, _W, EPS_TENSOR), _ADD_NORM,
          (*_TENSOR_EPS_CHECKS, add_shapes, buffers_of_their_own, input_not_written_back), kinds=INFERENCE)
      for norm in _HF_NORMS),
    # silu_and_mul: silu(a) * b (either order) of the halves of one tensor, by chunk, split or slices.
    *(Row("silu_and_mul", search, _silu_and_mul_replacement, (_X,), ("x",), (even, layout_kept("x")),
          grads=((True,),))
      for search in _silu_mul_searches()),
    # linear_act: act(F.linear(x, w, b)), bias optional, x 2-D or 3-D.
    *(Row("linear_act", *_linear_act(act, bias), (shape, _LINEAR_W) + ((_LINEAR_B,) if bias else ()),
          ("x", "w", "b")[:3 if bias else 2], (linear_shapes,), grads=_GRADS[3 if bias else 2])
      for shape in (_X, (2,) + _X) for act in ACTIVATIONS for bias in (True, False)),
)
NAMES = tuple(dict.fromkeys(row.pattern for row in ROWS))  # the patterns of the table


# ---- registration -------------------------------------------------------------------------------------

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


def _joint_with_other_gradient(fn, args, **kwargs):
    """Inductor's joint trace of `fn`, for a first input that the graph also uses elsewhere: that use's
    gradient becomes one more input, ``tangents_<n + 1>``, added into the first input's gradient where
    autograd adds it. The engine adds gradients in the order they arrive, the other use's first (it comes
    later in the forward): in float32, where a norm's ``x.float()`` is no node, x's gradient is
    ``(other + g1) + g2``, which the formula's own ``g1 + g2`` never matches (the first layer's norm of
    the embedding in a Llama). The replacement's traced gradient gets ``other + dx``."""
    from torch._inductor import pattern_matcher as pm

    gm = pm.joint_fwd_bwd(fn, args, **kwargs)
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    primals = [n for n in placeholders if n.name.startswith("primals")]
    tangents = [n for n in placeholders if n.name.startswith("tangents")]
    output = next(n for n in graph.nodes if n.op == "output")
    outs = list(output.args[0])
    # The outputs end with a gradient (or None) per primal; the first tensor primal is fn's first input
    # (_exact_check puts symbolic sizes before it).
    first = next(i for i, p in enumerate(primals) if isinstance(p.meta.get("val"), torch.Tensor))
    index = len(outs) - len(primals) + first
    grad = outs[index]
    with graph.inserting_after(placeholders[-1]):
        other = graph.placeholder(f"tangents_{len(tangents) + 1}")
    other.meta = dict(grad.meta)
    if grad.target is torch.ops.aten.add.Tensor and all(isinstance(a, torch.fx.Node) for a in grad.args):
        with graph.inserting_before(grad):
            summed = graph.call_function(torch.ops.aten.add.Tensor, (other, grad.args[0]))
        summed.meta = dict(grad.meta)
        grad.args = (summed, grad.args[1])
    else:
        with graph.inserting_before(output):
            total = graph.call_function(torch.ops.aten.add.Tensor, (other, grad))
        total.meta = dict(grad.meta)
        outs[index] = total
        output.args = (outs,)
    gm.recompile()
    return gm


def _examples(row: Row, dtype: torch.dtype, generator: torch.Generator) -> list:
    return [torch.randn(e, dtype=dtype, generator=generator) if isinstance(e, tuple)
            else torch.tensor(EPS, dtype=torch.float32) if e == EPS_TENSOR else e for e in row.examples]


def unshare_symbolic_sizes(graph: torch.fx.Graph) -> None:
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


def constant_sizes(graph: torch.fx.Graph) -> None:
    """Puts the number in place of each computed size that the guards fix to it. A formula traced at the
    graph's shapes has that number: F.rms_norm(t, (4,), w) of a chunk half whose size (s + 1) // 2 a guard fixes
    to 4 divides by 4 in the re-trace and by the half's size in the backward of the graph, which never match."""
    for node in list(graph.nodes):
        v = node.meta.get("val")
        if node.op != "call_function" or not isinstance(v, torch.SymInt) or not v.node.has_hint():
            continue
        number = int(v.node.hint)
        if known(v == number):  # a graph's output stays as it is
            node.replace_all_uses_with(number, delete_user_cb=lambda user: user.op != "output")
    graph.eliminate_dead_code()


def sizes_from_inputs(graph: torch.fx.Graph) -> None:
    """Computes each size that a ``sym_size`` node reads from an intermediate tensor from the graph's
    symbolic inputs instead. Such a read is a user outside any match of the tensor: the second half of a
    chunk whose size the next chunk reads was not matched under dynamic=True. A size whose expression has
    other symbols or functions than +, *, // and % of the inputs' symbols is left as it is."""
    import operator

    import sympy
    from torch.utils._sympy.functions import FloorDiv, Mod, PythonMod

    symbols = {}
    for node in graph.nodes:
        v = node.meta.get("val")
        if node.op == "placeholder" and isinstance(v, torch.SymInt) and isinstance(v.node.expr, sympy.Symbol):
            symbols.setdefault(v.node.expr, node)
    if not symbols:
        return
    binary = {sympy.Add: operator.add, sympy.Mul: operator.mul, FloorDiv: operator.floordiv, Mod: operator.mod,
              PythonMod: operator.mod}

    def build(expr):  # (node or int, its value), or None
        if isinstance(expr, sympy.Integer):
            return int(expr), int(expr)
        if expr in symbols:
            return symbols[expr], symbols[expr].meta["val"]
        fn = binary.get(type(expr))
        parts = [build(a) for a in expr.args] if fn is not None else [None]
        if any(p is None for p in parts):
            return None
        (node, value), rest = parts[0], parts[1:]
        for other, other_value in rest:
            node, value = graph.call_function(fn, (node, other)), fn(value, other_value)
            node.meta["val"] = value
        return node, value

    for node in list(graph.nodes):
        v = node.meta.get("val")
        if (node.target is not torch.ops.aten.sym_size.int or not isinstance(v, torch.SymInt)
                or getattr(node.args[0], "op", None) == "placeholder"):
            continue
        with graph.inserting_before(node):
            built = build(v.node.expr)
        if built is not None and isinstance(built[0], torch.fx.Node) and known(built[1] == v):
            node.replace_all_uses_with(built[0])
            graph.erase_node(node)
    graph.eliminate_dead_code()


def _symbolic_sizes(tensors) -> list:
    """The distinct symbolic sizes and strides of `tensors`, in order. Inductor's re-trace passes such sizes
    as inputs but keeps only those known to differ from the ones before it (torch 2.11-2.14.1), so that of
    two unrelated symbols (rows and hidden size under dynamic=True) it keeps the first and traces the
    other as `sym_size(x, i)`, which the graph's own symbol input never matches."""
    sizes = []
    for t in tensors:
        for v in (*t.shape, *t.stride()):
            if isinstance(v, torch.SymInt) and not any(known(v == s) for s in sizes):
                sizes.append(v)
    return sizes


def _trace(trace, fn, args):
    """trace(fn, args), or None where the formula cannot be traced at these sizes. AOT autograd's float pass
    asks Dynamo once to specialize each symbolic float of the shape env (Gemma's embedding scale under
    dynamic=True) that a graph does not use, marking it specialized for this compile: a formula traced in
    that shape env is traced again after it."""
    from torch._dynamo.exc import TensorifyScalarRestartAnalysis

    try:
        try:
            return trace(fn, args)
        except TensorifyScalarRestartAnalysis:
            return trace(fn, args)
    except RuntimeError:
        return None


def _exact_check(search, trace, scalar_workaround: dict, requires_grad: list, extra_check):
    """The extra_check of a pattern registered with its general form (sizes ignored): the match again,
    against `search` traced at the graph's own shapes, dtypes and symbolic sizes (each symbol an input, as
    the graph has it); then `extra_check` on that exact match."""
    from torch._inductor import pattern_matcher as pm
    from torch._guards import detect_fake_mode

    names = list(inspect.signature(search).parameters)

    def exact(match) -> bool:
        values = [val(match.kwargs[n]) if isinstance(match.kwargs.get(n), torch.fx.Node) else match.kwargs.get(n)
                  for n in names]
        if any(v is None for v in values):
            return False
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        fake_mode = detect_fake_mode(tensors)
        if fake_mode is None:
            return False
        with fake_mode:
            args = [torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device,
                                        requires_grad=grad and v.dtype.is_floating_point)
                    if isinstance(v, torch.Tensor) else v for v, grad in zip(values, requires_grad)]
            sizes = _symbolic_sizes([a for a in args if isinstance(a, torch.Tensor)])
            gm = _trace(trace, lambda *a: search(*a[len(sizes):]), [*sizes, *args])
            if gm is None:
                return False
        size_names = [f"ops_size_{i}" for i in range(len(sizes))]
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for node, name in zip(placeholders, size_names + names):
            node.target = node.name = name
        values = _sizes_as_inputs(gm.graph)
        value_names = list(values)
        pattern = pm.fx_to_pattern(gm, argnames=value_names + size_names + names, scalar_workaround=scalar_workaround)
        exact_match = pattern.match(match.output_nodes()[0])
        return (pm.is_match(exact_match) and all(_same_size(exact_match.kwargs.get(n), v) for n, v in values.items())
                and extra_check(exact_match))
    return exact


def _sizes_as_inputs(graph: torch.fx.Graph) -> dict:
    """Makes each size that a tensor op of `graph` takes (a symbolic size, or an expression of them) an input
    of its own, one per use; returns {input name: the traced size}. The match then compares sizes by value
    (_same_size), not by how they are computed: a graph whose guards tie a chunk half's size to a literal
    (``F.rms_norm(t, (8,), w)``) or to a weight's symbolic size spells it another way than the formula
    traced again."""
    def is_size(node):
        return isinstance(node, torch.fx.Node) and isinstance(node.meta.get("val"), torch.SymInt)

    first = next(iter(graph.nodes))
    values = {}
    for node in list(graph.nodes):
        if node.op == "call_function" and not is_size(node):
            for used in [a for a in node.all_input_nodes if is_size(a)]:
                name = f"ops_value_{len(values)}"
                with graph.inserting_before(first):
                    value = graph.placeholder(name)
                value.meta["val"] = values[name] = used.meta["val"]
                node.replace_input_with(used, value)
    graph.eliminate_dead_code()
    return values


def _same_size(matched, size) -> bool:
    """Whether a matched size (a node or a number) is known to equal `size` for every size the graph admits."""
    value = matched.meta.get("val") if isinstance(matched, torch.fx.Node) else matched
    return isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool) and known(value == size)


def _register(row: Row, kind: str, examples: list, pattern_pass, seen: set) -> None:
    """Inference: the formula traced forward. Training: traced forward and backward once per entry of
    row.grads. Each registered in its general form (sizes ignored), checked exactly by _exact_check;
    `seen`: the (general form, trace) pairs registered in pattern_pass."""
    from torch._inductor import pattern_matcher as pm

    scalar_workaround = {"eps": EPS} if row.scalar_eps else {}
    trace = (_fwd_functional if kind == "inference" else _joint_with_other_gradient if row.other_gradient
             else pm.joint_fwd_bwd)
    extra = check(row.pattern, row.tensors, *row.checks)
    for flags in ((False,) * len(examples),) if kind == "inference" else row.grads:
        flags = iter(flags)
        inputs = [e.detach().requires_grad_(next(flags)) if isinstance(e, torch.Tensor) else e for e in examples]
        grads = [isinstance(e, torch.Tensor) and e.requires_grad for e in inputs]
        general, gm = pm.gen_pattern_and_search_gm(row.search, inputs, trace, scalar_workaround)
        general_repr = pm.PatternPrettyPrinter.run(general)
        if (general_repr, str(gm.graph)) in seen:
            continue  # the same trace from another dtype's examples
        seen.add((general_repr, str(gm.graph)))
        # Inductor drops a pattern whose general form it has seen when it has no trace to compare (as
        # here): a number eps and a tensor eps share one. Both are kept; the exact check tells them apart.
        pattern_pass.seen_patterns.pop(general_repr, None)
        pm.register_replacement(row.search, row.replacement, inputs, trace, pattern_pass,
                                extra_check=_exact_check(row.search, trace, scalar_workaround, grads, extra),
                                scalar_workaround=scalar_workaround, search_fn_pattern=general)


def _register_all(kind: str) -> dict:
    from torch._inductor import pattern_matcher as pm

    passes = {name: pm.PatternMatcherPass(pass_name=f"ops_{name}_{kind}") for name in NAMES}
    # The example values do not shape the traces: a generator of their own leaves torch's global one as the
    # caller left it.
    generator = torch.Generator().manual_seed(0)
    seen = {name: set() for name in NAMES}
    for dtype in (torch.float32, torch.bfloat16):
        for row in ROWS:
            if kind in row.kinds:
                _register(row, kind, _examples(row, dtype, generator), passes[row.pattern], seen[row.pattern])
    return passes


_REGISTERED: Dict[str, Dict[str, object]] = {}  # kind -> {pattern name: its PatternMatcherPass}, once per process
_REGISTER_LOCK = threading.Lock()


def passes(kind: str) -> Dict[str, object]:
    """{pattern name: its Inductor PatternMatcherPass} for graphs of `kind` ("inference" or "training"),
    every name of NAMES (a pass with no rows of that kind matches nothing)."""
    with _REGISTER_LOCK:
        if kind not in _REGISTERED:
            from torch._subclasses.fake_tensor import unset_fake_temporarily
            # Traced with real CPU tensors, as Inductor's own patterns are; outside inference mode, in which
            # register_replacement skips the training patterns.
            with unset_fake_temporarily(), torch.device("cpu"), torch.inference_mode(False):
                _REGISTERED[kind] = _register_all(kind)
        return _REGISTERED[kind]
