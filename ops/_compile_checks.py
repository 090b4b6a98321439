"""What a match of the compile pass (ops.compile) must satisfy before it is rewritten: every argument of
every matched node is the one the pattern has, the matched tensors are ones the op takes, the pass
enables the pattern for them (``RULES`` or the names given), and each pattern's own conditions (shapes,
layouts, buffers an in-place op writes). ``check`` builds a pattern's ``extra_check`` from those.
"""

import threading
from typing import Optional

import torch

from ._library import GEMM_DTYPES

# The pass being applied: its enabled-set function (``fn``), read by ``check``.
ENABLED = threading.local()


def val(node):
    """The (fake) value of a graph node, or None."""
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def known(condition) -> bool:
    """Whether a condition on (possibly symbolic) sizes holds for every size the graph admits: as the shape
    environment knows it, or once the sizes its guards fix to a number are put in (a guard Eq(s - (s + 1) // 2,
    8) that a broadcast or a split made: such an expression is no symbol, so it is not replaced by 8). A guard
    Eq(e + c, n) of a constant c also fixes e to n - c (a split's second piece s - (s + 1) // 2 - 4 equal to 4
    fixes the chunk half it cuts); sums that hold e take its value too. Failing that, the condition is checked at
    every value of its one symbol such guards admit, and with the sizes the guards admit no odd value of halved."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if statically_known_true(condition):
        return True
    if not isinstance(condition, torch.SymBool):
        return False
    import sympy

    fixed = {}
    guards = [guard.expr for guard in getattr(condition.node.shape_env, "guards", ())]
    for guard in guards:
        if isinstance(guard, sympy.Eq):
            lhs, rhs = guard.args
            expr, value = (lhs, rhs) if rhs.is_number else (rhs, lhs)
            if value.is_number and not expr.is_number:
                fixed[expr] = value
                constant, rest = expr.as_coeff_Add()
                if constant != 0 and not rest.is_number:
                    fixed[rest] = value - constant
    expr = condition.node.expr
    if fixed and (expr.subs(fixed) is sympy.true or _holds_for_every_solution(expr, fixed)):
        return True
    return _holds_for_the_even_sizes_admitted(expr, guards)


def _holds_for_the_even_sizes_admitted(expr, guards) -> bool:
    """Whether `expr` holds once each of its symbols that a guard admits no odd value of (halves guarded equal:
    s - (s + 1) // 2 == (s + 1) // 2 is false at every s = 2k + 1) is written 2k: the halves' sizes (s + 1) // 2,
    s // 2 and s - (s + 1) // 2 are then all k."""
    import sympy

    odd = sympy.Symbol("ops_half", integer=True, nonnegative=True)
    even = [symbol for symbol in expr.free_symbols
            if any(guard.xreplace({symbol: 2 * odd + 1}) is sympy.false for guard in guards)]
    halves = {symbol: 2 * sympy.Symbol(f"ops_half_{i}", integer=True, positive=True) for i, symbol in enumerate(even)}
    return bool(halves) and expr.xreplace(halves) is sympy.true


def _holds_for_every_solution(expr, fixed, most=64) -> bool:
    """Whether `expr` holds at every integer value of its one symbol that the guards fixing a linear expression
    a * s + b, or its floor division by a constant, to a number admit (at most `most` of them). sympy writes
    nested floor divisions as one ((s + 1) // 2 // 2 is (s + 1) // 4), which substitution then misses."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv

    if len(expr.free_symbols) != 1:
        return False
    (symbol,) = expr.free_symbols
    low, high = None, None
    for fixed_expr, value in fixed.items():
        if fixed_expr.free_symbols != {symbol} or not value.is_integer:
            continue
        divisor, inner = 1, fixed_expr
        if isinstance(fixed_expr, FloorDiv) and fixed_expr.args[1].is_Integer and fixed_expr.args[1] > 0:
            inner, divisor = fixed_expr.args[0], int(fixed_expr.args[1])
        try:
            poly = sympy.Poly(inner, symbol)
        except sympy.PolynomialError:
            continue
        if poly.degree() != 1 or not all(c.is_Integer for c in poly.all_coeffs()) or poly.all_coeffs()[0] <= 0:
            continue
        a, b = (int(c) for c in poly.all_coeffs())
        # value * divisor <= a * s + b <= value * divisor + divisor - 1
        lo, hi = -((b - int(value) * divisor) // a), (int(value) * divisor + divisor - 1 - b) // a
        low, high = lo if low is None else max(low, lo), hi if high is None else min(high, hi)
    if low is None or not 0 <= high - low < most:
        return False
    return all(expr.subs({symbol: v}) is sympy.true for v in range(low, high + 1))


def decide(condition) -> bool:
    """A condition on (possibly symbolic) sizes: True or False where it is so for every size the graph
    admits, otherwise its value at the sizes' hints (the sizes the graph is being compiled at)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if not isinstance(condition, torch.SymBool):
        return bool(condition)
    if statically_known_true(condition):
        return True
    if statically_known_true(torch.sym_not(condition)):
        return False
    hint = condition.node.hint
    return bool(hint) if hint is not None else False


def _consistent(match, names) -> Optional[torch.Tensor]:
    """The (fake) value of the match's first tensor if all its tensors are there and share a floating
    dtype the ops take and a device. A pattern input matched by a number (``x + 0.25`` for ``x + residual``)
    is missing from the re-traced match, whose pattern holds the number as a constant."""
    vals = [val(match.kwargs.get(n)) for n in names]
    if not vals or any(not isinstance(v, torch.Tensor) for v in vals):
        return None
    if vals[0].dtype not in GEMM_DTYPES or any(v.dtype != vals[0].dtype or v.device != vals[0].device for v in vals):
        return None
    return vals[0]


def _allowed(name: str, value: Optional[torch.Tensor]) -> bool:
    enabled = getattr(ENABLED, "fn", None)
    return value is not None and enabled is not None and enabled(name, value)


def check(name, tensors, *extras):
    """The extra_check of a pattern counted as `name`: every argument matches, the tensors named
    `tensors` (the first decides RULES) are consistent and enabled, and every function of `extras` holds."""
    return lambda match: (_every_argument_matches(match) and _allowed(name, _consistent(match, tensors))
                          and all(extra(match) for extra in extras))


# ---- every argument of every matched node --------------------------------------------------------

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


# ---- layouts and buffers -------------------------------------------------------------------------

def _storage(value):
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(value.untyped_storage())


def _row_major(value) -> bool:
    """Whether eager's element-wise formulas of `value` give a contiguous result: its dimensions longer than
    one that it does not broadcast have decreasing strides (TensorIterator lays an output out in its inputs'
    stride order). A half or window of a row is; a transposed or permuted tensor is not."""
    if known(value.is_contiguous()):
        return True
    strides = [s for n, s in zip(value.shape, value.stride()) if not known(n == 1) and not known(s == 0)]
    return all(known(a > b) for a, b in zip(strides, strides[1:]))


def _whole_buffer(value) -> bool:
    """Whether a (fake) tensor is all of its storage: contiguous from offset 0, no other tensor's view."""
    return (value.is_contiguous() and known(value.storage_offset() == 0)
            and known(value.untyped_storage().nbytes() == value.numel() * value.element_size()))


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


# ---- each pattern's own conditions (the `extras` of check) ---------------------------------------

def _same(a, b) -> bool:
    """Two sizes that the matched ops combine (a product's K, a broadcast): equal. Symbolic sizes are at least 2
    (Dynamo specializes 0 and 1), so the graph's own ops admit only equal ones; where the graph spells them
    apart (a rewritten silu_and_mul's ``s // 2`` against the Linear's in-features, guarded equal to the chunk
    half ``s - (s + 1) // 2``), their values at the hints decide."""
    return known(a == b) or (decide(a == b) and decide(a > 1))


def norm_shapes(match) -> bool:  # the ops' contract: weight (hidden,), no broadcasting
    x, w = val(match.kwargs["x"]), val(match.kwargs["w"])
    return x.dim() >= 1 and w.dim() == 1 and _same(w.shape[0], x.shape[-1])


def layout_kept(*names):
    """Row-major inputs only. The ops return contiguous results; eager's element-wise formulas follow their
    input's layout. Graph outputs keep the strides traced before the pass in training graphs (torch 2.13
    and 2.14.1) and in inference graphs under torch 2.13, which a rewrite on a transposed or permuted input
    breaks (a caller's .view() then fails)."""
    def row_major(match):
        return all(_row_major(val(match.kwargs[k])) for k in names)
    return row_major


def add_shapes(match) -> bool:
    x, residual = val(match.kwargs["x"]), val(match.kwargs["residual"])
    return x.dim() == residual.dim() and all(_same(a, b) for a, b in zip(x.shape, residual.shape))


def buffers_of_their_own(match) -> bool:
    """The op writes both summands' buffers: each must be all of its storage (not a half, slice or
    expansion of a tensor: Inductor's copies of such views for auto_functionalized drop their storage
    offset, torch 2.14.1), and neither may be the other's or the weight's. That holds for whatever
    Inductor may later put in place of each as a no-op (_noop_sources)."""
    sources = {k: [v for v in map(val, _noop_sources(match.kwargs[k])) if isinstance(v, torch.Tensor)]
               for k in ("x", "residual")}
    if not all(_whole_buffer(v) for k in sources for v in sources[k]
               if v.shape == val(match.kwargs[k]).shape):
        return False
    x, residual, w = (val(match.kwargs[k]) for k in ("x", "residual", "w"))
    sx, sr = _storage(x), _storage(residual)
    return sx != sr and _storage(w) not in (sx, sr)


def input_not_written_back(match) -> bool:
    """The op writes the norm into its `input`: where that is a graph input the graph writes back to
    (r.add_(x) in the model), Inductor's re-inplacing would leave the norm in the caller's tensor."""
    return not any(user.target is torch.ops.aten.copy_.default
                   for source in _noop_sources(match.kwargs["x"]) for user in source.users)


def linear_shapes(match) -> bool:
    x, w = val(match.kwargs["x"]), val(match.kwargs["w"])
    b = val(match.kwargs.get("b"))
    return (x.dim() >= 1 and w.dim() == 2 and _same(w.shape[1], x.shape[-1])
            and (b is None or (b.dim() == 1 and _same(b.shape[0], w.shape[0]))))


def not_float64(match) -> bool:  # the hand-written norms compute float64 input in float32; ops.rms_norm in float64
    return val(match.kwargs["x"]).dtype != torch.float64


def eps_is_a_number(match) -> bool:
    """eps is not a traced value (dynamic-shape graphs can carry floats as tensors). Run on the match of
    the pattern re-traced at the graph's own arguments: there torch 2.11 leaves out a number eps (a
    constant of that pattern), 2.14 fills it in from the first match."""
    eps = match.kwargs.get("eps")
    return eps is None or isinstance(eps, (int, float))


def eps_is_a_cpu_scalar(match) -> bool:  # what _rms_norm_tensor_eps reads on the host
    eps = val(match.kwargs.get("eps"))
    return (isinstance(eps, torch.Tensor) and eps.dim() == 0 and eps.device.type == "cpu"
            and eps.dtype.is_floating_point)


def even(match) -> bool:
    """x's last dimension is even. A symbolic one is known to be only in the form the graph guards: the
    product of its halves (chunk, split or slices) guards that they are equal."""
    size = val(match.kwargs["x"]).shape[-1]
    if not isinstance(size, torch.SymInt):
        return size % 2 == 0
    up, down = (size + 1) // 2, size // 2
    return any(known(c) for c in (size % 2 == 0, size - up == up, size - down == down, 2 * down == size))
