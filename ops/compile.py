"""A torch.compile graph pass that rewrites known formulas into the ops, in any model's graph.

    model = torch.compile(model, backend=ops.compile.backend(ops.compile.PATTERNS))
    # or in your own Inductor configuration (one pass object, before Inductor's own joint-graph patterns):
    torch._inductor.config.joint_custom_pre_pass = ops.compile.FusionPass(ops.compile.PATTERNS)

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

By default a rewrite is made only on a device type, and over the sizes, where models compiled with it
were measured at least as fast as compiled without it: ``RULES``, empty for CPU and CUDA (docs/fusion.md
gives the measurements). ``FusionPass(patterns=...)`` applies an explicit set of pattern names on every device.
``counts`` tells how many rewrites each pattern made (a graph served from Inductor's cache is not
rewritten again).

The formulas, their replacements and the table of traced patterns are in ops/_compile_patterns.py; what
a match must satisfy to be rewritten is in ops/_compile_checks.py.
"""

import dataclasses
import os
import warnings
from typing import Dict, Iterable, Optional

import torch

from . import _compile_checks as _checks, _compile_patterns as _patterns

__all__ = ["PATTERNS", "RULES", "Rule", "FusionPass", "backend"]

PATTERNS = ("fused_add_rms_norm", "rms_norm", "silu_and_mul", "linear_act")  # in the order they are applied
if set(PATTERNS) != set(_patterns.NAMES):
    raise ImportError(f"ops.compile: PATTERNS {PATTERNS} are not the patterns of ops._compile_patterns.ROWS "
                      f"{_patterns.NAMES}")

# The files of the pass: its modules and every ops module they import (tests/test_compile_pass.py checks
# the list against their imports). FusionPass.uuid(), part of Inductor's FX graph cache key, and the
# fuzzer's resume digest (tests/compile_fuzz.py) hash them all.
_SOURCES = ("compile", "_compile_patterns", "_compile_checks", "_library", "_source_digest", "linear", "fused",
           "_nested", "_overlap")


def _source_files():
    """The paths of _SOURCES."""
    folder = os.path.dirname(os.path.abspath(__file__))
    return tuple(os.path.join(folder, name + ".py") for name in _SOURCES)


@dataclasses.dataclass(frozen=True)
class Rule:
    """Rewrite an input whose last dimension is at least ``min_last`` and which has at most ``max_numel``
    elements (None: no bound). A symbolic size is judged over its range (``mark_dynamic``'s min and max,
    what the graph implies) where the range decides; where part of the range is in and part out, at its
    size hint, the size the graph is compiled at, as Inductor makes its own size-dependent choices."""

    min_last: int
    max_numel: Optional[int] = None

    def covers(self, value: torch.Tensor) -> bool:
        last = value.shape[-1] if value.dim() else 0
        return _checks.decide(last >= self.min_last) and (self.max_numel is None
                                                          or _checks.decide(value.numel() <= self.max_numel))


# The patterns the default pass applies per device type, over the shapes at which a model compiled with
# them ran at least as fast as compiled without them (python -m benchmarks.compile_models --shapes static;
# docs/fusion.md). CPU, benchmarks/results/2026-12-06-cpu: Llamas of hidden 128 and 1024 at 16-512 tokens,
# the norms 0.90-1.00x, silu_and_mul (a Phi-3) 0.92-1.01x, although each op alone beats the formula compiled
# alone (benchmarks.compile_rules): none. CUDA: not measured against Inductor, none.
RULES: Dict[str, Dict[str, Rule]] = {
    "cpu": {},
    "cuda": {},
}


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
        passes = [_patterns.passes(kind) for kind in kinds]
        remove_noop_ops(graph)  # the joint graph still has aliases here; the patterns were traced without
        _patterns.constant_sizes(graph)
        _patterns.sizes_from_inputs(graph)
        _patterns.unshare_symbolic_sizes(graph)
        _checks.ENABLED.fn = self.enabled
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
            _checks.ENABLED.fn = None
        graph.eliminate_dead_code()

    def uuid(self):
        from torch._inductor.custom_graph_pass import get_hash_for_files

        rules = sorted((device, sorted(names.items())) for device, names in RULES.items())
        return get_hash_for_files(_source_files(), repr((sorted(self.patterns or ()), self.patterns is None, rules)))


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
