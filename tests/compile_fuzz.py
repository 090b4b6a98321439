"""A differential fuzzer of the torch.compile pass (ops.compile): hypothesis writes small programs from
the pass's formulas and their near-misses, and each runs eager, compiled by Inductor without the pass
and compiled with every pattern forced on; outputs, gradients and the inputs a program writes must
agree. Rewrite counts per pattern show that the pass rewrote graphs, not only left them alone.

    python tests/compile_fuzz.py --graphs 10000 --jobs 2  # the documented long run (hours on 2 cores)
    python tests/compile_fuzz.py --graphs 2000 --jobs 2 --symbolic  # symbolic sizes only
    python tests/compile_fuzz.py --graphs 50 --show       # print each program

A program is Python source (printed when a graph disagrees): one to three stages, each a formula
(linear + activation, an RMSNorm, a residual add + RMSNorm, silu(a) * b of halves) or a near-miss of one
(another alpha, beta, dimension, exponent, activation, eps form, broadcasting weight or bias,
intermediate used again), reading operands from graph inputs, intermediates, or views of one tensor
(chunk, split, unbind, slices, overlapping windows, expand, transposes). Programs run in float32,
float64, bfloat16 or float16, as inference or training graphs (some inputs need gradients), with
static shapes, dynamic=True, or a dynamic first dimension (mark_dynamic, with or without a range); a
symbolic program is also run at static sizes and must be rewritten at least as often per pattern.
"""

import argparse
import collections
import dataclasses
import itertools
import math
import os
import signal
import sys
import time
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ops  # noqa: E402

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Allowed difference from eager, relative to the largest eager magnitude (plus one): the ops round once
# where a formula rounds each step (half types), and reduce in another order.
TOL = {torch.float32: 2e-4, torch.float64: 1e-9, torch.bfloat16: 6e-2, torch.float16: 8e-3}
HIDDEN = (8, 16, 48, 510, 512, 514, 1024, 3582, 3584)  # small, and beside 512 and 3584 (halves odd and even)
EPS_VALUES = (1e-6, 1e-5, 2.0 ** -20, 1e-12, 0.1)


@dataclasses.dataclass
class Input:
    name: str
    shape: Tuple[int, ...]
    grad: bool
    kind: str = "randn"  # randn | positive (weights near 1) | scalar (a float) | eps (a 0-d tensor)
    value: float = 0.0


@dataclasses.dataclass
class Program:
    source: str
    inputs: List[Input]
    dtype: torch.dtype
    dynamic: str  # static | dynamic | mark (maybe_mark_dynamic) | range (mark_dynamic with min and max)
    training: bool

    def __str__(self):
        grads = [i.name for i in self.inputs if i.grad]
        return (f"# dtype={self.dtype}, dynamic={self.dynamic}, training={self.training}, grads={grads}\n"
                + "\n".join(f"# {i.name}: {i.kind} {list(i.shape)}" + (f" = {i.value!r}" if i.kind == "scalar" else "")
                            for i in self.inputs) + "\n" + self.source)


class _Writer:
    """Writes a program's lines while hypothesis draws its choices."""

    def __init__(self, draw, training):
        self.draw, self.training = draw, training
        self.lines: List[str] = []
        self.inputs: List[Input] = []
        self.extra_outputs: List[str] = []
        self.count = 0

    def pick(self, *options):
        return self.draw(st.sampled_from(options))

    def weighted(self, **weights):
        """One of the keywords, drawn in proportion to its weight."""
        return self.draw(st.sampled_from([name for name, weight in weights.items() for _ in range(weight)]))

    def name(self, prefix):
        self.count += 1
        return f"{prefix}{self.count}"

    def input(self, shape, kind="randn", grad=None, value=0.0):
        name = self.name("i")
        if grad is None:
            grad = self.training and kind in ("randn", "positive") and self.draw(st.booleans())
        self.inputs.append(Input(name, tuple(shape), grad, kind, value))
        return name

    def line(self, expr, prefix="t"):
        name = self.name(prefix)
        self.lines.append(f"    {name} = {expr}")
        return name

    def line2(self, expr):
        """`a, b = expr`: both halves from one call, as a model writes them."""
        a, b = self.name("t"), self.name("t")
        self.lines.append(f"    {a}, {b} = {expr}")
        return a, b

    def maybe_used_again(self, name):
        if self.draw(st.integers(0, 3)) == 0:
            self.extra_outputs.append(name)

    # ---- where operands come from ----

    def operand(self, shape, allow_views=True):
        """A tensor of `shape`: a graph input, an intermediate, or a view of a larger tensor."""
        views = dict(chunk=1, split=1, unbind=1, slice=1, window=1, expand=1, transpose=1) if allow_views else {}
        kind = self.weighted(input=6, intermediate=4, **views)
        *batch, n = shape
        if kind == "input":
            return self.input(shape)
        if kind == "intermediate":
            t = self.line(f"{self.input(shape)} * 0.5 + 0.25")
            self.maybe_used_again(t)
            return t
        if kind in ("chunk", "split", "unbind", "slice"):
            return self.pair(shape, kind)[0]
        if kind == "window":
            base = self.input((*batch, n + 3))
            start = self.draw(st.integers(0, 3))
            return self.line(f"{base}[..., {start}:{start + n}]")
        if kind == "expand":
            base = self.input((*([1] * len(batch)), n))
            return self.line(f"{base}.expand({list(shape)})")
        if len(batch) == 0:
            return self.input(shape)
        base = self.input((*batch[:-1], n, batch[-1]))
        return self.line(f"{base}.transpose(-1, -2)")

    def pair(self, shape, kind=None):
        """Two tensors of `shape`, often views of one tensor (halves, windows, an expansion)."""
        kind = kind or self.weighted(inputs=8, intermediates=3, chunk=1, split=1, unbind=1, slice=1, window=1,
                                     expand=1, same=1)
        *batch, n = shape
        if kind == "inputs":
            return self.operand(shape), self.operand(shape)
        if kind == "intermediates":
            both = self.line(f"{self.input((*batch, 2 * n))} * 1.5")
            self.maybe_used_again(both)
            kind = "chunk"
        else:
            both = self.input((*batch, 2 * n)) if kind != "unbind" else self.input((*batch, 2, n))
        if kind == "chunk":
            a, b = self.line2(f"{both}.chunk(2, dim=-1)")
        elif kind == "split":
            how = self.pick(f"[{n}, {n}]", f"{n}")
            a, b = self.line2(f"{both}.split({how}, dim=-1)")
        elif kind == "unbind":
            a, b = self.line2(f"{both}.unbind(-2)")
        elif kind == "slice":
            a, b = self.line(f"{both}[..., :{n}]"), self.line(f"{both}[..., {n}:]")
        elif kind == "window":  # overlapping windows of one row
            base = self.input((*batch, n + 1))
            a, b = self.line(f"{base}[..., :{n}]"), self.line(f"{base}[..., 1:]")
        elif kind == "expand":
            a = self.operand(shape, allow_views=False)
            rows = "".join([":1, "] + [":, "] * (len(batch) - 1)) if batch else ""
            b = self.line(f"{a}[{rows}...].expand_as({a})") if batch else a
        else:
            a = self.operand(shape, allow_views=False)
            b = a
        return (a, b) if self.draw(st.booleans()) else (b, a)

    # ---- the formulas and their near-misses ----

    def eps(self):
        value = self.pick(*EPS_VALUES)
        form = self.weighted(literal=6, argument=3, tensor=1)
        if form == "literal":
            return repr(value)
        if form == "argument":  # a Python float argument: a constant, or a graph input under dynamic=True
            return self.input((), kind="scalar", value=value)
        return self.input((), kind="eps", value=value)

    def norm(self, x, hidden, dtype_name):
        w_shape = (1, hidden) if self.weighted(vector=7, row=1) == "row" else (hidden,)
        w = self.input(w_shape, kind="positive")
        w_dtype = self.pick(*[None] * 12, "float32", "bfloat16")
        if w_dtype is not None and w_dtype != dtype_name:
            w = self.line(f"{w}.to(torch.{w_dtype})")
        if self.draw(st.integers(0, 5)) == 0:
            w = self.line(f"1.0 + {w}")  # Gemma's (1 + weight): still a weight
        eps = self.eps()
        form = self.weighted(hf=4, hf_cast=2, F=3, F_none=1, near_dim=1, near_pow=1, near_eps_outside=1,
                             near_mean_dtype=1, near_keepdim=1)
        if form == "F":
            return self.line(f"F.rms_norm({x}, ({hidden},), {w}, {eps})")
        if form == "F_none":  # torch's own eps: the dtype's machine epsilon
            return self.line(f"F.rms_norm({x}, ({hidden},), {w})")
        xf = self.line(f"{x}.float()")
        if form == "near_eps_outside":
            inv = self.line(f"1.0 / (torch.sqrt({xf}.pow(2).mean(-1, keepdim=True)) + {eps})")
        else:
            dim, power, extra = -1, 2, ""
            if form == "near_dim":
                dim = self.pick(0, -2)
            elif form == "near_pow":
                power = self.pick(3, 4, 1)
            elif form == "near_mean_dtype":
                extra = ", dtype=torch.float64"
            if form == "near_keepdim":
                inv = self.line(f"torch.rsqrt({xf}.pow(2).mean(-1) + {eps}).unsqueeze(-1)")
            else:
                inv = self.line(f"torch.rsqrt({xf}.pow({power}).mean({dim}, keepdim=True{extra}) + {eps})")
        hat = self.line(f"{xf} * {inv}")
        self.maybe_used_again(hat)
        if form == "hf_cast":
            return self.line(f"({w} * {hat}).to({x}.dtype)")
        return self.line(f"{w} * {hat}.to({x}.dtype)")

    def residual(self, x, hidden, dtype_name):
        a, b = self.pair(tuple(self.shape_of[x])) if self.draw(st.booleans()) else (x, self.operand(self.shape_of[x]))
        form = self.pick(*["{a} + {b}"] * 4, "{b} + {a}", "torch.add({a}, {b})", "torch.add({a}, {b}, alpha={alpha})",
                         "{a} - {b}", "{a} + 2 * {b}", "add_")
        if form == "add_":  # written in place: into an intermediate (a graph input could be a leaf)
            a = self.line(f"{a} * 1.0")
            self.lines.append(f"    {a}.add_({b})")
            h = a
        else:
            h = self.line(form.format(a=a, b=b, alpha=self.pick(-0.5, 2.0, 1.0)))
        y = self.norm(h, hidden, dtype_name)
        if self.draw(st.booleans()):
            self.extra_outputs.append(h)  # the residual stream goes on
        return y

    def linear(self, x, hidden, dtype_name):
        n = self.pick(8, 24, 64)
        w = self.input((n, hidden))
        w = self.line(f"{w} * {1.0 / math.sqrt(hidden):.6g}")
        bias = self.weighted(none=2, vector=4, row=1, scalar=1)
        b = {"none": None, "vector": lambda: self.input((n,)), "row": lambda: self.input((1, n)),
             "scalar": lambda: self.input(())}[bias]
        b = b() if b else None
        two_d = len(self.shape_of[x]) == 2
        form = self.pick("F.linear", "F.linear", "matmul", "addmm" if two_d and bias == "vector" else "F.linear")
        if form == "F.linear":
            pre = self.line(f"F.linear({x}, {w}{', ' + b if b else ''})")
        elif form == "matmul":
            pre = self.line(f"{x} @ {w}.t()" + (f" + {b}" if b else ""))
        else:
            beta, alpha = self.pick(1.0, 0.5, 1), self.pick(1.0, 3, -1.0)
            pre = self.line(f"torch.addmm({b}, {x}, {w}.t(), beta={beta!r}, alpha={alpha!r})")
        self.maybe_used_again(pre)
        act = self.pick("F.relu", "F.gelu", "F.silu", "gelu_tanh", "F.relu", "F.gelu", "F.silu", "gelu_tanh",
                        "torch.tanh", "F.leaky_relu", "gelu_none")
        if act == "gelu_tanh":
            return self.line(f"F.gelu({pre}, approximate='tanh')"), n
        if act == "gelu_none":
            return self.line(f"F.gelu({pre}, approximate='none')"), n
        return self.line(f"{act}({pre})"), n

    def silu_mul(self, x, hidden):
        d = hidden // 2
        how = self.weighted(chunk=3, split=2, split_sizes=2, slices=2, unbind=1, near_other_dim=1, near_swapped=1,
                            near_gelu=1, near_two_tensors=1)
        if how == "near_two_tensors":
            a, b = x, self.operand(self.shape_of[x])
            return self.line(f"F.silu({a}) * {b}"), hidden
        if how == "near_other_dim" and len(self.shape_of[x]) >= 2 and self.shape_of[x][0] % 2 == 0:
            a, b = self.line2(f"{x}.chunk(2, dim=0)")
            return self.line(f"F.silu({a}) * {b}"), hidden
        if how == "split":
            a, b = self.line2(f"{x}.split({d}, dim=-1)")
        elif how == "split_sizes":
            a, b = self.line2(f"{x}.split([{d}, {d}], dim=-1)")
        elif how == "slices":
            a, b = self.line(f"{x}[..., :{d}]"), self.line(f"{x}[..., {d}:]")
        elif how == "unbind":
            v = self.line(f"{x}.unflatten(-1, (2, {d}))")
            a, b = self.line2(f"{v}.unbind(-2)")
        else:
            a, b = self.line2(f"{x}.chunk(2, dim=-1)")
        if how == "near_swapped":
            a, b = b, a
        act = "F.gelu" if how == "near_gelu" else "F.silu"
        order = self.pick("act(a) * b", "b * act(a)")
        expr = f"{act}({a}) * {b}" if order == "act(a) * b" else f"{b} * {act}({a})"
        return self.line(expr), d


@st.composite
def programs(draw, max_stages=3, symbolic=False):
    """A Program: stages of formulas and near-misses, as Python source; `symbolic`: symbolic sizes only."""
    dtype_name = draw(st.sampled_from(list(DTYPES)))
    training = draw(st.sampled_from([False, False, False, True, True]))
    dynamic = draw(st.sampled_from((["static", "static"] if not symbolic else []) + ["dynamic", "mark", "range"]))
    batch = draw(st.sampled_from([(1,), (3,), (5,), (8,), (2, 3), (1, 4)]))
    hidden = draw(st.sampled_from(HIDDEN))
    w = _Writer(draw, training)
    w.shape_of = collections.defaultdict(lambda: None)
    main = w.operand((*batch, hidden))
    w.shape_of[main] = (*batch, hidden)
    current = main
    for _ in range(draw(st.integers(1, max_stages))):
        stage = draw(st.sampled_from(["linear", "norm", "residual", "residual", "silu_mul"]))
        if stage == "silu_mul" and hidden % 2:
            stage = "norm"
        if stage == "linear":
            current, hidden = w.linear(current, hidden, dtype_name)
        elif stage == "norm":
            current = w.norm(current, hidden, dtype_name)
        elif stage == "residual":
            current = w.residual(current, hidden, dtype_name)
        else:
            current, hidden = w.silu_mul(current, hidden)
        w.shape_of[current] = (*batch, hidden)
    names = [i.name for i in w.inputs]
    outputs = [current] + [o for o in dict.fromkeys(w.extra_outputs) if o != current]
    source = "\n".join([f"def program({', '.join(names)}):"] + w.lines + [f"    return ({', '.join(outputs)},)"])
    return Program(source, w.inputs, DTYPES[dtype_name], dynamic, training)


# ---- running a program ----------------------------------------------------------------------------

def _inputs(program: Program, seed: int):
    g = torch.Generator().manual_seed(seed)
    values = []
    for spec in program.inputs:
        if spec.kind == "scalar":
            values.append(spec.value)
            continue
        if spec.kind == "eps":
            values.append(torch.tensor(spec.value, dtype=torch.float64))
            continue
        t = torch.randn(spec.shape, generator=g, dtype=torch.float64)
        if spec.kind == "positive":
            t = 0.75 + 0.5 * torch.rand(spec.shape, generator=g, dtype=torch.float64)
        values.append(t.to(program.dtype).requires_grad_(spec.grad))
    return values


def _run(fn, program, seed, upcast=False, given=None):
    """(outputs, gradients of the inputs that need them, the inputs after the call) of one call; `upcast`:
    on the same input values in float64; `given`: on these inputs instead of the seed's."""
    args = _inputs(program, seed) if given is None else given
    if upcast:
        args = [a.detach().double().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                for a in args]
    if program.dynamic in ("mark", "range"):  # the first dimension of the first matrix input (a sequence length)
        for a in args:
            if isinstance(a, torch.Tensor) and a.dim() >= 2:
                if program.dynamic == "range" and a.shape[0] >= 2:  # a bounded range, as mark_dynamic(min=, max=)
                    torch._dynamo.mark_dynamic(a, 0, min=2, max=max(64, a.shape[0]))
                else:
                    torch._dynamo.maybe_mark_dynamic(a, 0)
                break
    outputs = fn(*args)
    grads = []
    if program.training and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        g = torch.Generator().manual_seed(seed + 1)
        differentiable = [o for o in outputs if o.requires_grad]
        if differentiable:
            loss = sum((o.double() * torch.rand(o.shape, generator=g, dtype=torch.float64)).sum() for o in differentiable)
            loss.backward()
        grads = [a.grad for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    after = [a.detach() for a in args if isinstance(a, torch.Tensor)]
    return [o.detach() for o in outputs], grads, after


def _exact(program, seed):
    """The program in float64 on the same input values (its casts to float64 too), or None where that does
    not run: the exact result from which eager's rounding and the compiled code's are both measured, for
    programs whose conditioning amplifies rounding (a norm over pow(3), whose mean can come near -eps)."""
    source = program.source.replace(".float()", ".double()")
    for name in ("float32", "bfloat16", "float16"):
        source = source.replace(f"torch.{name}", "torch.float64")
    namespace = {"torch": torch, "F": F}
    exec(compile(source, "<program>", "exec"), namespace)  # noqa: S102 - the fuzzer's own source
    try:
        return _run(namespace["program"], program, seed, upcast=True)
    except (RuntimeError, ValueError, TypeError, IndexError):
        return None


FRAGILE_TRIALS = 8


def _fragile(fn, program, seed):
    """Per output and gradient, the elements whose finiteness in eager changes when the floating inputs move
    by one ulp (each scaled by 1 + eps * u, u uniform in [-1, 1], over FRAGILE_TRIALS draws): a quantity
    within rounding of a singularity (rsqrt of a mean near -eps, as a norm over pow(1) or pow(3) has), where
    one rounding more or less upstream, as a rewrite may make, decides NaN or a number. Those elements
    cannot judge the pass; every other element still must agree."""
    base = _run(fn, program, seed)
    masks = [[torch.zeros(t.shape, dtype=torch.bool) if t is not None else None for t in part] for part in base[:2]]
    g = torch.Generator().manual_seed(seed + 7)
    eps = torch.finfo(program.dtype).eps
    for _ in range(FRAGILE_TRIALS):
        args = []
        for a in _inputs(program, seed):
            if isinstance(a, torch.Tensor) and a.is_floating_point() and a.dim() > 0:
                u = torch.rand(a.shape, generator=g, dtype=torch.float64) * 2 - 1
                a = (a.detach().double() * (1 + eps * u)).to(a.dtype).requires_grad_(a.requires_grad)
            args.append(a)
        try:
            moved = _run(fn, program, seed, given=args)
        except (RuntimeError, ValueError, TypeError, IndexError):
            continue
        for part, (ref, now) in enumerate(zip(base[:2], moved[:2])):
            for i, (r, m) in enumerate(zip(ref, now)):
                if r is not None and m is not None and r.shape == m.shape:
                    masks[part][i] |= torch.isfinite(r) != torch.isfinite(m)
    return masks


class Disagreement(AssertionError):
    pass


def _max_error(x, y, mask):
    return (x - y)[mask].abs().max().item() if mask.any() else 0.0


def _precision(program):
    """The dtype whose tolerance (TOL) a program is judged by: the least precise one it computes in. That is
    its own dtype, but float32 in a float64 program whose norms cast to float32 (`.float()`): from there on
    eager, Inductor and the pass all compute in float32, each summing in its own order."""
    if program.dtype == torch.float64 and ".float()" in program.source:
        return torch.float32
    return program.dtype


def _layout(t):
    """The strides that decide which views of `t` work: those of its dimensions longer than one."""
    return tuple((n, s) for n, s in zip(t.shape, t.stride()) if n > 1)


def _compare(what, got, expected, reference, dtype, exact=None, fragile=None, layout=False):
    """got (compiled with the pass) must be as close to eager as the stated tolerance, or as Inductor's own
    code without the pass (`reference`) is, or (given the float64 result `exact`) as close to the exact
    result as twice eager's own error; elements marked in `fragile` (_fragile) are left out. With `layout`,
    its strides must be eager's or Inductor's own (a caller's .view() of the result depends on them)."""
    exact = exact if exact is not None else [None] * len(got)
    fragile = fragile if fragile is not None else [None] * len(got)
    for i, (g, e, r, x, f) in enumerate(zip(got, expected, reference, exact, fragile)):
        if (g is None) != (e is None):
            raise Disagreement(f"{what} {i}: {'no gradient' if g is None else 'a gradient'} where eager has "
                               f"{'none' if e is None else 'one'}")
        if g is None:
            continue
        if g.shape != e.shape or g.dtype != e.dtype:
            raise Disagreement(f"{what} {i}: shape/dtype {tuple(g.shape)} {g.dtype}, eager {tuple(e.shape)} {e.dtype}")
        if layout and _layout(g) not in (_layout(e), _layout(r)):
            raise Disagreement(f"{what} {i}: strides {g.stride()}, eager {e.stride()}, Inductor without the pass "
                               f"{r.stride()}")
        g64, e64, r64 = g.double(), e.double(), r.double()
        judged = torch.ones(e.shape, dtype=torch.bool) if f is None else ~f
        finite = torch.isfinite(e64) & judged
        if not torch.equal(finite, torch.isfinite(g64) & judged):
            raise Disagreement(f"{what} {i}: non-finite values differ from eager")
        if not finite.any():
            continue
        scale = 1.0 + e64[finite].abs().max().item()
        err = (g64 - e64)[finite].abs().max().item()
        both = finite & torch.isfinite(r64)  # NaN where eager has NaN too (rsqrt of a negative mean)
        ref_err = _max_error(r64, e64, both)
        if x is not None and err > max(TOL[dtype] * scale, 2 * ref_err):
            x64 = x.double()
            known = finite & torch.isfinite(x64)
            if _max_error(g64, x64, known) <= 2 * _max_error(e64, x64, known) + TOL[dtype] * scale:
                continue
        if err > max(TOL[dtype] * scale, 2 * ref_err):
            raise Disagreement(f"{what} {i}: max |compiled with the pass - eager| = {err:.3g} (allowed "
                               f"{max(TOL[dtype] * scale, 2 * ref_err):.3g}; Inductor without the pass: {ref_err:.3g})")


@dataclasses.dataclass
class Tally:
    graphs: int = 0
    skipped_eager_error: int = 0
    skipped_inductor_error: int = 0
    rewrites: Dict[str, int] = dataclasses.field(default_factory=lambda: {p: 0 for p in ops.compile.PATTERNS})
    graphs_rewritten: Dict[str, int] = dataclasses.field(default_factory=lambda: {p: 0 for p in ops.compile.PATTERNS})

    # Per shape mode (static, dynamic, mark, range): {"graphs": n, "graphs rewritten per pattern": {pattern: n}}.
    modes: Dict[str, dict] = dataclasses.field(default_factory=dict)

    def add(self, counts, mode="static"):
        self.graphs += 1
        tally = self.modes.setdefault(mode, {"graphs": 0, "graphs rewritten per pattern":
                                             {p: 0 for p in ops.compile.PATTERNS}})
        tally["graphs"] += 1
        for name, n in counts.items():
            self.rewrites[name] += n
            self.graphs_rewritten[name] += bool(n)
            tally["graphs rewritten per pattern"][name] += bool(n)

    def summary(self):
        return {"graphs": self.graphs, "graphs rewritten per pattern": self.graphs_rewritten,
                "rewrites per pattern": self.rewrites, "per shape mode": self.modes,
                "skipped (eager raised)": self.skipped_eager_error,
                "skipped (Inductor without the pass raised)": self.skipped_inductor_error}


def check(program: Program, tally: Optional[Tally] = None, seed: int = 0) -> Optional[Dict[str, int]]:
    """Runs `program` eager, compiled without and with the pass; raises Disagreement if they differ.
    Returns the pass's rewrite counts (None if eager or Inductor alone could not run the program)."""
    namespace = {"torch": torch, "F": F}
    exec(compile(program.source, "<program>", "exec"), namespace)  # noqa: S102 - the fuzzer's own source
    fn = namespace["program"]
    try:
        eager = _run(fn, program, seed)
    except (RuntimeError, ValueError, TypeError, IndexError):
        if tally:
            tally.skipped_eager_error += 1
        return None
    dynamic = {"static": False, "dynamic": True, "mark": None, "range": None}[program.dynamic]

    def stock():
        """Inductor without the pass; None if it cannot compile the program (which says nothing of the pass)."""
        torch._dynamo.reset()
        try:
            return _run(torch.compile(fn, dynamic=dynamic, fullgraph=True), program, seed)
        except Exception:  # noqa: BLE001
            return None
        finally:
            torch._dynamo.reset()

    torch._dynamo.reset()
    backend = ops.compile.backend(ops.compile.PATTERNS)
    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        try:
            fused = _run(torch.compile(fn, backend=backend, dynamic=dynamic, fullgraph=True), program, seed)
        except Exception as e:  # noqa: BLE001
            if stock() is None:
                if tally:
                    tally.skipped_inductor_error += 1
                return None
            raise Disagreement(f"compiled with the pass raised where Inductor alone did not: {type(e).__name__}: "
                               f"{str(e)[:2000]}\n{program}") from e
    torch._dynamo.reset()

    def compare(reference, exact=None, fragile=None):
        for what, i in (("output", 0), ("gradient", 1), ("input after the call", 2)):
            _compare(what, fused[i], eager[i], reference[i], _precision(program), None if exact is None else exact[i],
                     None if fragile is None or i == 2 else fragile[i], layout=i == 0)

    try:
        # A graph the pass left alone is the graph Inductor compiles without it: eager is the reference.
        # A rewritten graph (or one that differs from eager) is also compared with Inductor's own code.
        if any(backend.counts.values()):
            raise Disagreement("rewritten")
        compare(eager)
    except Disagreement:
        reference = stock()
        try:
            compare(reference if reference is not None else eager)
        except Disagreement:
            # Rounding that the program's conditioning amplifies: measured from the float64 result, and
            # without the elements whose finiteness one ulp of input decides.
            try:
                compare(reference if reference is not None else eager, _exact(program, seed))
            except Disagreement:
                try:
                    compare(reference if reference is not None else eager, _exact(program, seed),
                            _fragile(fn, program, seed))
                except Disagreement as e:
                    raise Disagreement(f"{e}\nrewrites: {backend.counts}\n{program}") from None
    if program.dynamic != "static":
        _check_static_twin(fn, program, seed, backend.counts)
    if tally:
        tally.add(backend.counts, program.dynamic)
    return dict(backend.counts)


def _check_static_twin(fn, program, seed, counts):
    """A symbolic program is rewritten wherever the same program at concrete sizes is: per pattern, at least
    the static twin's rewrites."""
    torch._dynamo.reset()
    twin = ops.compile.backend(ops.compile.PATTERNS)
    static = dataclasses.replace(program, dynamic="static")
    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        try:
            _run(torch.compile(fn, backend=twin, dynamic=False, fullgraph=True), static, seed)
        except Exception:  # noqa: BLE001 - the symbolic program ran: its twin's failure is checked as a static program
            return
        finally:
            torch._dynamo.reset()

    got, expected = counts, twin.counts
    fewer = {name: (got[name], expected[name]) for name in expected if got[name] < expected[name]}
    if fewer:
        raise Disagreement(f"rewritten less than its static twin (symbolic, static): {fewer}\n{program}")


def _write_json(path, obj):
    """Writes obj to path through a temporary file in the same folder: a cut write leaves the last one."""
    import json
    import tempfile

    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".compile_fuzz.", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def _source_files():
    """The files of the pass (every module of it and every ops module they import: ops.compile._source_files())
    and this file."""
    return ops.compile._source_files() + (os.path.abspath(__file__),)


def _source_digest():
    """SHA-256 of _source_files(): a resumed run must test the same code."""
    import hashlib

    digest = hashlib.sha256()
    for path in _source_files():
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def _total(chunks, args, seconds):
    results = [c.get("result") for c in chunks]
    done = sum(c.get("graphs", 0) for c in chunks if c.get("result") == "agreed")
    result = ("disagreement" if "disagreement" in results or "no report" in results else
              "agreed" if done >= args.graphs else "interrupted")
    total = {"result": result, "seconds": seconds, "torch": torch.__version__, "source sha256": _source_digest(),
             "graphs target": args.graphs, "first seed": args.seed or 0, "chunk": args.chunk,
             "symbolic only": args.symbolic,
             "chunks": sorted(chunks, key=lambda c: c["seed"])}
    for key in ("graphs", "skipped (eager raised)", "skipped (Inductor without the pass raised)"):
        total[key] = sum(c.get(key, 0) for c in chunks)
    for key in ("graphs rewritten per pattern", "rewrites per pattern"):
        total[key] = {name: sum(c.get(key, {}).get(name, 0) for c in chunks) for name in ops.compile.PATTERNS}
    modes = sorted({m for c in chunks for m in c.get("per shape mode", {})})
    total["per shape mode"] = {
        m: {"graphs": sum(c.get("per shape mode", {}).get(m, {}).get("graphs", 0) for c in chunks),
            "graphs rewritten per pattern": {
                name: sum(c.get("per shape mode", {}).get(m, {}).get("graphs rewritten per pattern", {}).get(name, 0)
                          for c in chunks) for name in ops.compile.PATTERNS}}
        for m in modes}
    return total


def _jobs(args):
    """Runs chunks of args.chunk graphs, chunk i with seed seed + i, args.jobs processes at a time, until
    args.graphs graphs agreed or one disagrees; the summed tally goes to args.out after every chunk. With
    args.resume, the chunks args.out records as agreed are kept and the others run again (a chunk's
    programs follow from its seed alone). Returns the exit status (1 if a graph disagreed)."""
    import json
    import subprocess
    import tempfile

    seed = args.seed or 0
    chunks, seconds = {}, 0
    if args.resume and args.out and os.path.exists(args.out):
        with open(args.out) as f:
            old = json.load(f)
        recorded = (old.get("first seed"), old.get("chunk"), old.get("torch"), old.get("symbolic only", False))
        if recorded != (seed, args.chunk, torch.__version__, args.symbolic):
            sys.exit(f"compile_fuzz: --resume: {args.out} records (first seed, chunk, torch, symbolic only) "
                     f"{recorded}; this run has {(seed, args.chunk, torch.__version__, args.symbolic)}")
        if old.get("source sha256", _source_digest()) != _source_digest():
            sys.exit(f"compile_fuzz: --resume: {args.out} was run with another ops/compile.py, another module of "
                     "the pass or tests/compile_fuzz.py (source sha256); resume from that code (git worktree at its "
                     "commit)")
        chunks = {c["seed"]: c for c in old.get("chunks", []) if c.get("result") == "agreed"}
        seconds = old.get("seconds", 0)
    t0 = time.time() - seconds

    def agreed():
        return sum(c["graphs"] for c in chunks.values() if c.get("result") == "agreed")

    running = {}  # seed -> (process, report path)
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        try:
            while True:
                while not failed and len(running) < args.jobs and agreed() + args.chunk * len(running) < args.graphs:
                    s = next(s for s in itertools.count(seed) if s not in chunks and s not in running)
                    out = os.path.join(tmp, f"seed{s}.json")
                    running[s] = (subprocess.Popen([sys.executable, os.path.abspath(__file__), "--seed", str(s),
                                                    "--graphs", str(args.chunk), "--out", out,
                                                    *(["--symbolic"] if args.symbolic else [])]), out)
                if not running:
                    break
                pid, _ = os.wait()
                s = next(s for s, (p, _) in running.items() if p.pid == pid)
                p, out = running.pop(s)
                p.returncode = 0  # reaped by os.wait
                try:
                    with open(out) as f:
                        chunks[s] = json.load(f)
                except (OSError, ValueError):
                    chunks[s] = {"seed": s, "result": "no report"}
                if chunks[s]["result"] != "agreed" and not failed:  # stop the others: they report their graphs
                    failed = True
                    for q, _ in running.values():
                        q.send_signal(signal.SIGINT)
                print(f"[{time.time() - t0:.0f} s] seed {s}: {chunks[s]['result']}, {chunks[s].get('graphs', 0)} "
                      f"graphs; {agreed()} of {args.graphs} agreed", flush=True)
                if args.out:
                    _write_json(args.out, _total(list(chunks.values()), args, round(time.time() - t0)))
        except KeyboardInterrupt:  # each running chunk reports the graphs it ran
            for p, _ in running.values():
                p.send_signal(signal.SIGINT)
            for s, (p, out) in running.items():
                p.wait()
                try:
                    with open(out) as f:
                        chunks[s] = json.load(f)
                except (OSError, ValueError):
                    pass
    total = _total(list(chunks.values()), args, round(time.time() - t0))
    print(f"{total['result']} in {total['seconds']} s: {total['graphs']} graphs, rewritten per pattern "
          f"{total['graphs rewritten per pattern']}; per shape mode {total['per shape mode']}")
    if args.out:
        _write_json(args.out, total)
    return {"agreed": 0, "interrupted": 130}.get(total["result"], 1)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: derandomized)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="processes running chunks of --chunk graphs, seeds seed, seed + 1, ... (default 1)")
    parser.add_argument("--chunk", type=int, default=250, help="graphs per process with --jobs (default 250)")
    parser.add_argument("--resume", action="store_true",
                        help="with --jobs: keep the chunks --out records as agreed, run the rest")
    parser.add_argument("--symbolic", action="store_true",
                        help="symbolic programs only (dynamic=True, mark_dynamic with and without a range), each "
                             "also run as its static twin")
    parser.add_argument("--show", action="store_true", help="print every program")
    parser.add_argument("--out", help="write the tally (JSON) here, also after a disagreement")
    args = parser.parse_args(argv)
    if args.graphs < 1 or args.jobs < 1 or args.chunk < 1:
        parser.error("--graphs, --jobs and --chunk must be at least 1")
    if args.resume and not (args.out and args.jobs > 1):
        parser.error("--resume needs --jobs (2 or more) and --out")
    if args.jobs > 1:
        sys.exit(_jobs(args))
    tally = Tally()
    t0 = time.time()

    @settings(max_examples=args.graphs, deadline=None, database=None, derandomize=args.seed is None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink], print_blob=True)
    @given(programs(symbolic=args.symbolic))
    def run(program):
        if args.show:
            print(program, "\n", flush=True)
        check(program, tally)
        if tally.graphs and tally.graphs % 100 == 0:
            print(f"[{time.time() - t0:.0f} s] {tally.summary()}", flush=True)

    if args.seed is not None:
        run = __import__("hypothesis").seed(args.seed)(run)
    torch._inductor.config.compile_threads = 1
    result = "disagreement"
    try:
        run()
        result = "agreed"
    except KeyboardInterrupt:  # SIGINT: the graphs run so far, all agreeing
        result = "interrupted"
    finally:
        summary = {"result": result, "seconds": round(time.time() - t0), "torch": torch.__version__,
                   "seed": args.seed, "symbolic only": args.symbolic, **tally.summary()}
        print(f"{result} in {summary['seconds']} s: {tally.summary()}")
        if args.out:
            _write_json(args.out, summary)
    if result == "interrupted":
        sys.exit(130)


if __name__ == "__main__":
    # SIGINT or SIGTERM stop a run with its report, also in the background (where a shell ignores SIGINT).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    main()
