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

import functools
import threading
from typing import Dict, Iterable, Optional

import torch
import torch.nn.functional as F

from . import _library  # noqa: F401  (loads the op library: the replacements call its ops)
from .gemm import _GEMM_DTYPES

__all__ = ["PATTERNS", "RULES", "FusionPass", "backend"]

PATTERNS = ("fused_add_rms_norm", "rms_norm", "silu_and_mul", "linear_act")  # in the order they are applied

# The patterns the default pass applies per device type, each from the smallest last dimension (the
# norms' hidden size, silu_and_mul's 2 * d) at which it was measured faster than the code Inductor
# generates for the same formula (python -m benchmarks.ops, "torch.compile" rows; docs/fusion.md). CPU,
# benchmarks/results/2026-12-01-cpu: rms_norm and fused_add_rms_norm 1.2-14x at hidden 512, 1024 and 4096
# (0.96-1.32x at 128: not applied); silu_and_mul 1.3-3.3x at 2 * d = 3584, 7168 and 28672; ops.linear,
# ATen's linear plus the activation on CPU, 0.95-1.31x: not applied. CUDA: not measured against Inductor, none.
RULES: Dict[str, Dict[str, int]] = {
    "cpu": {"rms_norm": 512, "fused_add_rms_norm": 512, "silu_and_mul": 3584},
    "cuda": {},
}

_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),
                "silu": F.silu}
_EPS = 2.0 ** -20  # the traced eps: a float32 value, so F.rms_norm's float32 rounding keeps it (the
#                     pattern matcher then treats it as the argument eps, whatever the model's value)


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _known(condition) -> bool:
    """Whether a condition on (possibly symbolic) sizes holds for every size the graph admits."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return bool(statically_known_true(condition))


def _consistent(match, names) -> Optional[torch.Tensor]:
    """The (fake) value of the match's first tensor if its tensors share a floating dtype the ops take
    and a device."""
    vals = [_val(match.kwargs[n]) for n in names if match.kwargs.get(n) is not None]
    if not vals or any(not isinstance(v, torch.Tensor) for v in vals):
        return None
    if vals[0].dtype not in _GEMM_DTYPES or any(v.dtype != vals[0].dtype or v.device != vals[0].device for v in vals):
        return None
    return vals[0]


# ---- the formulas (search functions) and their replacements -----------------------------------------

def _hf_norm(x, w, eps):  # Llama's: the weight multiply after rounding to the input's dtype
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _hf_norm_cast(x, w, eps):  # Olmo2's: one rounding at the end
    xf = x.float()
    return (w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


def _f_norm(x, w, eps):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


_NORMS = (_hf_norm, _hf_norm_cast, _f_norm)


def _rms_norm_replacement(x, w, eps):
    return torch.ops.ops.rms_norm(x, w, eps)


def _add_norm_search(norm):
    def search(x, residual, w, eps):
        r = x + residual
        return norm(r, w, eps), r
    return search


def _add_norm_replacement(x, residual, w, eps):
    from torch._higher_order_ops.auto_functionalize import auto_functionalized

    out = auto_functionalized(torch.ops.ops.fused_add_rms_norm.default, input=x, residual=residual, weight=w, eps=eps)
    return out[1], out[2]


def _halves_chunk(x):
    return x.chunk(2, dim=-1)


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
    return searches(_halves_chunk) + searches(_halves_slice)


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


_REGISTERED: Dict[str, object] = {}  # pattern name -> its PatternMatcherPass (filled once per process)
_REGISTER_LOCK = threading.Lock()
_ENABLED = threading.local()  # the pass being applied: its enabled-set function, read by the checks


def _allowed(name: str, value: Optional[torch.Tensor]) -> bool:
    enabled = getattr(_ENABLED, "fn", None)
    return value is not None and enabled is not None and enabled(name, value)


def _register_all():
    from torch._inductor import pattern_matcher as pm

    passes = {name: pm.PatternMatcherPass(pass_name=f"ops_{name}") for name in PATTERNS}

    def check(name, tensors, extra=lambda match: True):
        return lambda match: _allowed(name, _consistent(match, tensors)) and extra(match)

    def same(a, b):
        return _known(a == b)

    def norm_shapes(match):  # the ops' contract: weight (hidden,), no broadcasting
        x, w = _val(match.kwargs["x"]), _val(match.kwargs["w"])
        return x.dim() >= 1 and w.dim() == 1 and same(w.shape[0], x.shape[-1])

    def add_norm_shapes(match):
        x, residual = _val(match.kwargs["x"]), _val(match.kwargs["residual"])
        return (norm_shapes(match) and x.dim() == residual.dim()
                and all(same(a, b) for a, b in zip(x.shape, residual.shape)))

    def input_not_written_back(match):
        # The op writes the norm into its `input`: where that is a graph input the graph writes back to
        # (r.add_(x) in the model), Inductor's re-inplacing would leave the norm in the caller's tensor.
        return not any(user.target is torch.ops.aten.copy_.default for user in match.kwargs["x"].users)

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

    def even(match):
        return _val(match.kwargs["x"]).shape[-1] % 2 == 0

    def register(name, search, replace, examples, check_fn, training=True, scalars=None):
        kwargs = dict(extra_check=check_fn, scalar_workaround=scalars or {}, skip_duplicates=True)
        pm.register_replacement(search, replace, examples, _fwd_functional, passes[name], **kwargs)
        if training:
            grads = [[e.detach().requires_grad_(True) if isinstance(e, torch.Tensor) else e for e in examples]]
            if len(examples) > 1:  # an input that needs no gradient (the first layer's, a frozen one's)
                grads.append([examples[0].detach()] + grads[0][1:])
            for inputs in grads:
                pm.register_replacement(search, replace, inputs, pm.joint_fwd_bwd, passes[name], **kwargs)

    # A match is re-traced at the graph's own shapes and dtypes, so one example per graph structure is
    # enough: float32 (no casts; float64 alike) and bfloat16 (casts; float16 alike); linear's 3-D input
    # adds views around the GEMM.
    for dtype in (torch.float32, torch.bfloat16):
        x, w, eps = torch.randn(3, 8, dtype=dtype), torch.randn(8, dtype=dtype), _EPS
        for norm in _NORMS:
            def extra(match, cast=norm is not _f_norm):
                return (not cast or not_float64(match)) and eps_is_a_number(match) and norm_shapes(match)

            def add_extra(match, extra=extra):
                return extra(match) and add_norm_shapes(match) and input_not_written_back(match)
            register("rms_norm", norm, _rms_norm_replacement, [x, w, eps], check("rms_norm", ("x", "w"), extra),
                     scalars={"eps": _EPS})
            register("fused_add_rms_norm", _add_norm_search(norm), _add_norm_replacement,
                     [x, torch.randn(3, 8, dtype=dtype), w, eps],
                     check("fused_add_rms_norm", ("x", "residual", "w"), add_extra), training=False,
                     scalars={"eps": _EPS})
        for search in _silu_mul_searches():
            register("silu_and_mul", search, _silu_and_mul_replacement, [x], check("silu_and_mul", ("x",), even))
        for shape in ((3, 8), (2, 3, 8)):
            for act in _ACTIVATIONS:
                for bias in (True, False):
                    search, replace = _linear_act(act, bias)
                    args = [torch.randn(shape, dtype=dtype), torch.randn(4, 8, dtype=dtype)]
                    args += [torch.randn(4, dtype=dtype)] if bias else []
                    register("linear_act", search, replace, args,
                             check("linear_act", ("x", "w", "b")[:len(args)], linear_shapes))
    return passes


def _patterns():
    with _REGISTER_LOCK:
        if not _REGISTERED:
            from torch._subclasses.fake_tensor import unset_fake_temporarily
            # Traced with real CPU tensors, as Inductor's own patterns are; outside inference mode, in which
            # register_replacement skips the training patterns.
            with unset_fake_temporarily(), torch.device("cpu"), torch.inference_mode(False):
                _REGISTERED.update(_register_all())
        return _REGISTERED


try:
    from torch._inductor.custom_graph_pass import CustomGraphPass as _CustomGraphPass
except ImportError:  # pragma: no cover - torch without Inductor's custom pass API
    _CustomGraphPass = object


class FusionPass(_CustomGraphPass):
    """The ops' rewrite pass, for ``torch._inductor.config.joint_custom_pre_pass``.

    Args:
        patterns: None (the measured ``RULES`` per device type) or an iterable of names from ``PATTERNS``,
            applied on every device.

    ``counts``: {pattern name: rewrites made by this pass object so far}.
    """

    def __init__(self, patterns: Optional[Iterable[str]] = None):
        if patterns is not None:
            patterns = frozenset(patterns)
            unknown = sorted(patterns - set(PATTERNS))
            if unknown:
                raise ValueError(f"ops.compile.FusionPass: unknown patterns {unknown}; choose from {list(PATTERNS)}")
        self.patterns = patterns
        self.counts = {name: 0 for name in PATTERNS}

    def enabled(self, name: str, value: torch.Tensor) -> bool:
        """Whether to rewrite pattern `name` whose first input is `value` (a fake tensor)."""
        if self.patterns is not None:
            return name in self.patterns
        smallest = RULES.get(value.device.type, {}).get(name)
        last = value.shape[-1] if value.dim() else 0
        # A symbolic size is rewritten only if it is known to be large enough.
        return smallest is not None and _known(last >= smallest)

    def __call__(self, graph: torch.fx.Graph) -> None:
        from torch._inductor.fx_passes.post_grad import remove_noop_ops
        from torch._inductor.pattern_matcher import stable_topological_sort

        passes = _patterns()
        remove_noop_ops(graph)  # the joint graph still has aliases here; the patterns were traced without
        _ENABLED.fn = self.enabled
        try:
            for name in PATTERNS:
                rewrites = passes[name].apply(graph) or 0
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


class backend:
    """A torch.compile backend: Inductor with ``FusionPass(patterns)`` as its joint-graph pre-pass.

        compiled = torch.compile(model, backend=ops.compile.backend())

    ``counts`` reads the pass's rewrite counts; other keyword arguments are Inductor config options.
    """

    def __init__(self, patterns: Optional[Iterable[str]] = None, **inductor_options):
        self.fusion_pass = FusionPass(patterns)
        self.options = inductor_options

    @property
    def counts(self) -> Dict[str, int]:
        return self.fusion_pass.counts

    def __call__(self, gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs, config_patches={**self.options, "joint_custom_pre_pass": self.fusion_pass})
