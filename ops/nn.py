"""nn modules over the ops, and ``convert(model)`` to put them into an existing model.

* ``Linear``: a drop-in ``torch.nn.Linear`` (same parameters and ``state_dict`` keys; it is a subclass)
  whose forward is ``ops.linear``, with an optional fused activation.
* ``RMSNorm``: a drop-in ``torch.nn.RMSNorm`` (1-D normalized shape) whose forward is ``ops.rms_norm``.
* ``Fp8Linear``: an inference Linear with FP8 weights (per output channel or per 128x128 block) and
  activations quantized per token or per 1x128 group at each call, on ``ops.scaled_gemm``.
* ``convert(model)``: swaps those modules one for one, in place, sharing their parameters, and runs the
  block recipes of ``ops.recipes`` on the blocks whose class it lists; ``convert(model, fp8=...)``
  quantizes the Linears instead, keeping output heads and MoE routers in high precision.

The module classes are defined here, so that pickles and TorchScript name them ``ops.nn.<class>``. Which
modules convert replaces and why it leaves others alone is in ops/_swap.py; the rules of
``convert(fp8=...)`` (roles kept in high precision, checkpoint format and keys) in ops/_fp8_convert.py.
"""

import dataclasses
import numbers
import warnings
from typing import List, Optional, Tuple

import torch
import torch.fx
import torch.nn.functional as F

from . import _fp8_convert, _hf_classes, _swap, fp8 as _fp8, fused, linear as _linear, moe as _moe
from . import recipes as _recipes

__all__ = ["Linear", "RMSNorm", "Fp8Linear", "convert", "ConversionReport"]


_DEFAULT_TORCH_FUNCTIONS = (torch.Tensor.__torch_function__.__func__, torch._C._disabled_torch_function_impl)


def _own_torch_function(t: torch.Tensor) -> bool:
    """Whether t's class overrides __torch_function__ (torch.overrides.has_torch_function would also answer
    yes for any active TorchFunctionMode, as export's tracing runs under). A plain tensor is answered by its
    class alone: torch 2.11's dynamo breaks the graph at a comparison of the functions."""
    cls = type(t)
    if cls is torch.Tensor or cls is torch.nn.Parameter:
        return False
    impl = cls.__torch_function__
    return getattr(impl, "__func__", impl) not in _DEFAULT_TORCH_FUNCTIONS


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` computing ``activation(x @ weight.T + bias)`` with ``ops.linear``.

    Args: as ``torch.nn.Linear``, plus ``activation``: "none", "relu", "gelu", "gelu_tanh" or "silu".
    Parameters and ``state_dict`` keys (``weight`` (out, in), ``bias`` (out,)) are nn.Linear's. Under
    ``torch.autocast`` it runs in the autocast dtype, as nn.Linear does. Real floating dtypes only
    (float16, bfloat16, float32, float64) and dense tensors (no complex, sparse or strided nested inputs,
    which torch.nn.Linear takes): ``ops.linear`` raises for those. A tensor subclass with its own
    ``__torch_function__`` (a jagged nested tensor, for one) is computed by ``F.linear`` and the activation.
    """

    __constants__ = torch.nn.Linear.__constants__ + ["activation"]

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 activation: str = "none"):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        if activation not in _linear.ACTIVATIONS:
            raise ValueError(f"ops.nn.Linear: activation must be one of {_linear.ACTIVATIONS}, got {activation!r}")
        self.activation = activation

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_scripting():
            if _own_torch_function(input):  # a tensor subclass that computes F.linear its own way
                return _linear.ACTIVATION_FUNCTIONS[self.activation](F.linear(input, self.weight, self.bias))
        return _linear.linear(input, self.weight, self.bias, self.activation)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", activation={self.activation!r}"

    @classmethod
    def from_linear(cls, module: torch.nn.Linear, activation: str = "none") -> "Linear":
        """An ops Linear sharing ``module``'s parameters (no copy)."""
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.in_features, new.out_features = module.in_features, module.out_features
        new.register_parameter("weight", module.weight)
        new.register_parameter("bias", module.bias)
        new.activation = activation
        new.train(module.training)
        _swap.copy_instance_attributes(module, new)
        return new


class Fp8Linear(torch.nn.Module):
    """An inference ``Linear``: ``activation(x @ W.T + bias)`` on ``ops.scaled_gemm`` with W in FP8.

    The weight is quantized once (``from_linear``): ``recipe="rowwise"`` keeps one float32 scale per
    output channel in ``weight_scale`` (N, 1) (FBGEMM's and transformers' ``FbgemmFp8Linear`` format),
    ``"blockwise"`` one per 128x128 block in ``weight_scale_inv`` (ceil(N/128), ceil(K/128)) (DeepSeek-V3's
    and transformers' fine-grained FP8 format; it multiplies the codes despite its name); the other
    attribute is None. Each call quantizes the input per token (rowwise) or per 1x128 group (blockwise)
    with ``ops.quantize_fp8`` and returns the input's dtype (bfloat16, float16 or float32). Buffers:
    ``weight`` (N, K) ``float8_e4m3fn``, the scale, ``bias`` (N,) or None (of ``dtype``: torch's default
    dtype where None, as ``nn.Linear``). ``module.to(dtype)``, ``.half()`` and the like cast the bias
    only: the codes and their scales keep their dtypes (a device move applies to all).
    ``load_state_dict`` takes its own state_dict (a blockwise one also with the scale under
    ``weight_scale``) or an ``nn.Linear``'s (a floating-point ``weight`` without a scale), which it
    quantizes as ``from_linear`` does. in_features and out_features must be multiples of 16.
    Not differentiable: call it under ``torch.no_grad()`` / ``torch.inference_mode()`` (an input that
    requires grad raises).
    """

    RECIPES = ("rowwise", "blockwise")
    SCALE_NAMES = {"rowwise": "weight_scale", "blockwise": "weight_scale_inv"}  # the scale's buffer, by recipe
    WEIGHT_GRANULARITY = {"rowwise": "row", "blockwise": "block"}  # ops.quantize_fp8's, by recipe

    def __init__(self, in_features: int, out_features: int, bias: bool = True, recipe: str = "rowwise",
                 activation: str = "none", device=None, dtype=None):
        super().__init__()
        if recipe not in self.RECIPES:
            raise ValueError(f"ops.nn.Fp8Linear: recipe must be one of {self.RECIPES}, got {recipe!r}")
        if activation not in _linear.ACTIVATIONS:
            raise ValueError(f"ops.nn.Fp8Linear: activation must be one of {_linear.ACTIVATIONS}, got {activation!r}")
        if in_features % 16 or out_features % 16:
            raise ValueError(f"ops.nn.Fp8Linear: in_features and out_features must be multiples of 16 (FP8 GEMM rows), "
                             f"got {in_features} and {out_features}")
        self.in_features, self.out_features, self.recipe, self.activation = in_features, out_features, recipe, activation
        scale_shape = _fp8._scale_shape((out_features, in_features), self.WEIGHT_GRANULARITY[recipe])
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.float8_e4m3fn, device=device))
        for recipe_of, name in self.SCALE_NAMES.items():
            self.register_buffer(name, torch.ones(scale_shape, device=device) if recipe_of == recipe else None)
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device) if bias else None)

    _QUANTIZED = ("weight", "weight_scale", "weight_scale_inv")

    def _apply(self, fn, recurse=True):
        # Module.to(dtype) casts every floating-point tensor, FP8 codes and float32 scales included (a
        # bfloat16 scale loses bits): those two keep their dtypes, and follow a device move.
        kept = {name: self._buffers[name] for name in self._QUANTIZED}
        super()._apply(fn, recurse)
        for name, old in kept.items():
            new = self._buffers[name]
            if old is not None and new is not None and new.dtype != old.dtype:
                self._buffers[name] = old.to(new.device)
        return self

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # A high-precision checkpoint (nn.Linear's keys): its weight quantized as from_linear does, instead of
        # its values copied into the FP8 codes.
        weight_key, scale_key = prefix + "weight", prefix + self.SCALE_NAMES[self.recipe]
        if self.recipe == "blockwise" and scale_key not in state_dict and prefix + "weight_scale" in state_dict:
            state_dict[scale_key] = state_dict.pop(prefix + "weight_scale")  # earlier releases' blockwise key
        weight = state_dict.get(weight_key)
        if isinstance(weight, torch.Tensor) and weight.dtype != self.weight.dtype:
            if weight.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
                error_msgs.append(f"ops.nn.Fp8Linear: {weight_key} is {weight.dtype}: expected the FP8 codes "
                                  f"({self.weight.dtype}) or a floating-point weight to quantize")
                return
            if scale_key in state_dict:
                error_msgs.append(f"ops.nn.Fp8Linear: {weight_key} is {weight.dtype} beside a {scale_key}: expected "
                                  f"the codes of that scale ({self.weight.dtype}), or a weight without one to quantize")
                return
            if weight.dim() == 2:  # else the size mismatch is reported below
                with torch.no_grad():
                    codes, scale = _fp8.quantize_fp8(weight, self.WEIGHT_GRANULARITY[self.recipe])
                state_dict[weight_key], state_dict[scale_key] = codes, scale
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    @classmethod
    def from_linear(cls, module: torch.nn.Linear, recipe: str = "rowwise", activation: str = "none") -> "Fp8Linear":
        """The Fp8Linear of ``module``'s weight, quantized now (the bias copied into the weight's dtype)."""
        new = cls(module.in_features, module.out_features, module.bias is not None, recipe, activation,
                  module.weight.device, module.weight.dtype)
        with torch.no_grad():
            codes, scale = _fp8.quantize_fp8(module.weight.detach(), cls.WEIGHT_GRANULARITY[recipe])
            new.weight.copy_(codes)
            getattr(new, cls.SCALE_NAMES[recipe]).copy_(scale)
            if module.bias is not None:
                new.bias.copy_(module.bias)
        new.train(module.training)
        return new

    @classmethod
    def from_fp8(cls, weight: torch.Tensor, weight_scale_inv: torch.Tensor, bias: Optional[torch.Tensor] = None,
                 activation: str = "none") -> "Fp8Linear":
        """A blockwise Fp8Linear over a checkpoint's FP8 weight (N, K) ``float8_e4m3fn`` and its float32
        ``weight_scale_inv`` (ceil(N/128), ceil(K/128)) (DeepSeek-V3's and transformers' fine-grained FP8
        format; the scale multiplies the codes despite its name), shared, not copied."""
        n, k = weight.shape if weight.dim() == 2 else (-1, -1)
        expected = _fp8._scale_shape((n, k), "block") if weight.dim() == 2 else "(ceil(N/128), ceil(K/128))"
        if weight.dim() != 2 or weight.dtype != torch.float8_e4m3fn or weight_scale_inv.dtype != torch.float32 or \
                tuple(weight_scale_inv.shape) != expected:
            raise ValueError(f"ops.nn.Fp8Linear.from_fp8: expected a float8_e4m3fn weight (N, K) and a float32 "
                             f"weight_scale_inv {expected}, got {weight.dtype} {list(weight.shape)} and "
                             f"{weight_scale_inv.dtype} {list(weight_scale_inv.shape)}")
        if bias is not None and (bias.shape != (n,) or not bias.is_floating_point() or bias.dtype.itemsize == 1):
            raise ValueError(f"ops.nn.Fp8Linear.from_fp8: expected a floating-point bias of shape ({n},) (N), got "
                             f"{bias.dtype} {list(bias.shape)}")
        new = cls(k, n, bias is not None, "blockwise", activation, device="meta")  # buffers replaced below
        new.weight, new.weight_scale_inv = weight.detach(), weight_scale_inv.detach()
        new.bias = None if bias is None else bias.detach()
        return new

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dim() == 0 or input.shape[-1] != self.in_features:
            raise RuntimeError(f"ops.nn.Fp8Linear: expected input with last dimension {self.in_features} "
                               f"(in_features), got shape {list(input.shape)}")
        if input.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            cast = ("; the caller cast its activations to this Linear's weight dtype, as T5-style blocks do "
                    "(Switch, NLLB-MoE): keep this Linear in high precision" if input.dtype == self.weight.dtype else "")
            raise RuntimeError(f"ops.nn.Fp8Linear: expected input of dtype torch.bfloat16, torch.float16 or "
                               f"torch.float32 (the output's), got {input.dtype}{cast}")
        if input.requires_grad and torch.is_grad_enabled():
            raise RuntimeError("ops.nn.Fp8Linear: inference only (FP8 operands have no gradient), and its input "
                               "requires grad: run the model under torch.no_grad() or torch.inference_mode()")
        x = input.unsqueeze(0) if input.dim() == 1 else input.flatten(0, -2)  # (rows, K), K = 0 too
        codes, scale = _fp8.quantize_fp8(x, "row" if self.recipe == "rowwise" else "group")
        bias = None if self.bias is None else self.bias.to(input.dtype)
        weight_scale: Optional[torch.Tensor] = self.weight_scale
        if weight_scale is None:
            weight_scale = self.weight_scale_inv
        assert weight_scale is not None
        y = _fp8.scaled_gemm(codes, self.weight.t(), scale, weight_scale.t(), bias, out_dtype=input.dtype,
                             activation=self.activation)
        return y.reshape(list(input.shape[:-1]) + [self.out_features])  # a list: TorchScript takes no *shape

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"recipe={self.recipe!r}, activation={self.activation!r}")


def _default_eps(dtype: torch.dtype) -> float:
    """The eps torch.nn.RMSNorm uses when given None: the machine epsilon of the type it computes in
    (float32 for half types, whatever its docs say), written out so TorchScript can compile it."""
    if dtype == torch.float64:
        return 2.220446049250313e-16
    return 1.1920928955078125e-07


@torch.fx.wrap  # one node in a torch.fx trace (its dtype branches would stop symbolic tracing)
def _rms_norm_module_forward(x: torch.Tensor, weight: Optional[torch.Tensor], eps: Optional[float], hidden: int,
                             promote_weight_dtype: bool) -> torch.Tensor:
    """RMSNorm.forward."""
    if x.dim() == 0 or x.shape[-1] != hidden:
        raise RuntimeError(f"ops.nn.RMSNorm: expected input with last dimension {hidden} (normalized_shape), "
                           f"got shape {list(x.shape)}")
    if eps is None:
        eps = _default_eps(x.dtype)
    if weight is not None and weight.dtype == x.dtype:  # Hugging Face Llama: x_hat rounded to x's dtype, times weight
        return fused.rms_norm(x, weight, eps, promote_weight_dtype)
    if weight is None or promote_weight_dtype:
        # x_hat with a weight of ones made like x: x's dtype and device, and a replicated DTensor when x is
        # a DTensor (DTensor ops take no plain tensor beside a DTensor).
        x_hat = fused.rms_norm(x, x.new_ones(x.shape[-1:]), eps)
        return x_hat if weight is None else weight * x_hat  # Hugging Face Llama: x_hat in x's dtype, times weight
    # Mixed dtypes otherwise, as torch's rms_norm: the statistics in x's compute type (float32 for half types),
    # times the weight in the promoted dtype (the weight is not rounded), output in x's.
    wide = torch.promote_types(x.dtype, weight.dtype)
    if wide == torch.float64 and x.dtype != torch.float64:
        x_hat = fused.rms_norm(x.float(), x.new_ones(x.shape[-1:], dtype=torch.float32), eps)
        return (x_hat.double() * weight).to(x.dtype)
    return fused.rms_norm(x.to(wide), weight.to(wide), eps).to(x.dtype)


class RMSNorm(torch.nn.RMSNorm):
    """``torch.nn.RMSNorm`` over the last dimension with ``ops.rms_norm``: y = x / sqrt(mean(x^2) + eps) * weight
    (Zhang and Sennrich 2019), statistics in float32 for half types. A subclass of torch.nn.RMSNorm.

    Args:
        normalized_shape: the hidden size (an int, or a 1-element shape).
        eps: as torch.nn.RMSNorm; None means the float32 machine epsilon (float64's for float64 input),
            which is what torch.nn.RMSNorm computes with.
        elementwise_affine: learnable ``weight`` (hidden,), initialised to ones; without it, ones are used.

    Input (*, hidden), output of the input's shape and dtype, as torch.nn.RMSNorm: with a weight of another
    dtype, the statistics in the input's compute type (float32 for half types), times the weight in their
    promoted dtype, rounded once to the input's dtype. Converted from a Hugging Face
    norm (``promote_weight_dtype``), it computes as those do instead: the normalized input, rounded to
    the input's dtype, times the weight, in their promoted dtype.

    Raises:
        ValueError: a normalized_shape of more than one dimension.
        RuntimeError: an input whose last dimension is not the hidden size.
    """

    def __init__(self, normalized_shape, eps: Optional[float] = None, elementwise_affine: bool = True,
                 device=None, dtype=None):
        shape = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) else tuple(normalized_shape)
        if len(shape) != 1:
            raise ValueError(f"ops.nn.RMSNorm normalizes the last dimension only; got normalized_shape {shape}")
        super().__init__(shape, eps=eps, elementwise_affine=elementwise_affine, device=device, dtype=dtype)
        if self.eps is not None:  # a numpy scalar is a tensor to Dynamo, and the op's eps a float
            self.eps = float(self.eps)
        self.promote_weight_dtype = False
        self.hf_formula: Optional[str] = None  # "llama" or "cast": converted from that list's class

    __jit_unused_properties__ = ["variance_epsilon"]

    @property
    def variance_epsilon(self) -> Optional[float]:
        """``eps`` under the name Hugging Face norms give it: code that reads or sets a converted norm's
        ``variance_epsilon`` keeps working (and a new value is used)."""
        return self.eps

    @variance_epsilon.setter
    def variance_epsilon(self, value: Optional[float]) -> None:
        self.eps = None if value is None else float(value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_scripting():
            if _own_torch_function(x):  # a tensor subclass with a __torch_function__ computes each step its own way
                return self._formula(x)
        return _rms_norm_module_forward(x, self.weight, self.eps, self.normalized_shape[0], self.promote_weight_dtype)

    @torch.jit.unused
    def _formula(self, x: torch.Tensor) -> torch.Tensor:
        """What the module this one stands for computes, step by step: torch.nn.RMSNorm's F.rms_norm, or the
        listed transformers class's forward (ops._hf_classes), whose formula convert checks."""
        formula = getattr(self, "hf_formula", None)  # absent in a module pickled before it existed
        if formula is None:
            return super().forward(x)
        input_dtype = x.dtype
        hidden_states = x.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.eps)
        if formula == "llama":
            return self.weight * hidden_states.to(input_dtype)
        return (self.weight * hidden_states).to(input_dtype)

    @classmethod
    def from_module(cls, module: torch.nn.Module) -> "RMSNorm":
        """From ``torch.nn.RMSNorm`` or a listed transformers RMSNorm (``ops._hf_classes``), sharing its
        weight (no copy) and keeping its other instance attributes."""
        weight = getattr(module, "weight", None)
        hidden = getattr(module, "normalized_shape", None) or (weight.shape[0],)
        eps = getattr(module, "eps", getattr(module, "variance_epsilon", None))
        new = cls(hidden, eps=eps, elementwise_affine=False)
        new.elementwise_affine = weight is not None
        new.register_parameter("weight", weight)
        key = _hf_classes.class_key(module)
        new.promote_weight_dtype = key in _hf_classes.RMS_NORM_LLAMA
        new.hf_formula = ("llama" if new.promote_weight_dtype else "cast" if key in _hf_classes.RMS_NORM_CAST
                          else None)
        new.train(module.training)
        _swap.copy_instance_attributes(module, new)
        return new


@dataclasses.dataclass
class ConversionReport:
    """What ``convert`` did: module names (as in ``named_modules``; the model itself is "(model)")."""

    linear: List[str] = dataclasses.field(default_factory=list)
    rms_norm: List[str] = dataclasses.field(default_factory=list)
    recipes: List[Tuple[str, str]] = dataclasses.field(default_factory=list)  # (block, recipe name)
    skipped: List[Tuple[str, str]] = dataclasses.field(default_factory=list)  # (module, why it was left alone)
    fp8: List[str] = dataclasses.field(default_factory=list)  # Fp8Linears: put in now, or already of the recipe
    # Linears convert(fp8=...) kept in high precision (as ops.nn.Linear), and why.
    kept_high_precision: List[Tuple[str, str]] = dataclasses.field(default_factory=list)
    experts: List[str] = dataclasses.field(default_factory=list)  # MoE experts run on ops (ops.moe): grouped or FP8
    fp8_experts: List[str] = dataclasses.field(default_factory=list)  # the experts among them with FP8 weights
    # FP8 experts convert(fp8="blockwise") quantized rowwise, and why.
    experts_rowwise: List[Tuple[str, str]] = dataclasses.field(default_factory=list)
    # The quant_method convert(fp8=...) wrote to a transformers model's config.quantization_config, or None.
    quantization_config: Optional[str] = None
    quantized: List[str] = dataclasses.field(default_factory=list, repr=False)  # the part of fp8 quantized now

    def __str__(self):
        lines = [f"ops.nn.convert: {len(self.linear)} Linear, {len(self.rms_norm)} RMSNorm, "
                 f"{len(self.recipes)} block recipes, {len(self.skipped)} left alone"
                 + (f", {len(self.fp8)} FP8 Linear" if self.fp8 else "")
                 + (f", {len(self.experts)} MoE experts" if self.experts else "")
                 + (f" ({len(self.fp8_experts)} FP8)" if self.fp8_experts else "")]
        lines += [f"  experts {name} on ops.grouped_gemm or ops.scaled_grouped_gemm" for name in self.experts]
        lines += [f"  FP8 {name}" for name in self.fp8]
        rowwise = dict(self.experts_rowwise)
        lines += [f"  FP8 experts {name}" + (f" rowwise: {rowwise[name]}" if name in rowwise else "")
                  for name in self.fp8_experts]
        if self.quantization_config:
            lines.append(f"  config.quantization_config: {self.quantization_config!r} (what save_pretrained writes)")
        lines += [f"  kept {name} in high precision: {why}" for name, why in self.kept_high_precision]
        lines += [f"  recipe {recipe} on {block}" for block, recipe in self.recipes]
        lines += [f"  left {name} alone: {why}" for name, why in self.skipped]
        return "\n".join(lines)


def convert(model: torch.nn.Module, recipes: bool = True, fp8: Optional[str] = None) -> ConversionReport:
    """Swap ``torch.nn.Linear`` for ``ops.nn.Linear`` and RMSNorm modules (``torch.nn.RMSNorm`` over one
    dimension, the transformers classes listed in ``ops._hf_classes``) for ``ops.nn.RMSNorm`` in
    ``model``, in place, sharing parameters (the state_dict is unchanged); then, with ``recipes``, give
    each block whose class a recipe lists (``ops.recipes``: BERT's intermediate block, Llama-style gated
    MLPs, Phi-3-style fused gate-up MLPs) that recipe's fused forward.

    A swap never changes what a module computes, and never merges two modules: every module, called on
    its own, gives what it gave (to the last bit for Linears on CPU, where both run ATen's linear).
    A recipe replaces its block's forward only and falls back to the class's forward whenever its
    submodules no longer are what it was written for. Only exact classes are swapped (a subclass may
    compute something else). Left alone, and listed in ``report.skipped``: subclasses of ``nn.Linear``,
    transformers' ``Conv1D`` (GPT-2's linear layers, weight stored transposed),
    modules with hooks, with parameters or buffers besides ``weight`` and ``bias`` (pruning, old-style
    weight norm), with child modules or a ``forward`` set on the instance, compiled in place
    (``module.compile()``: convert first), with DTensor parameters (convert before ``parallelize_module``
    / ``fully_shard``), of other dtypes, an ``nn.RMSNorm`` over several dimensions, an uninitialized
    ``nn.LazyLinear``, and listed transformers classes whose own forward, in the installed release, is
    not the formula ops fuses for them (``ops._hf_classes.formula_changed``). A module
    shared by several parents is replaced by one shared module. ``model`` itself is not replaced (a bare
    Linear or RMSNorm is reported: wrap it, or use ``Linear.from_linear``).

    Numerics: a converted transformers Llama-style norm rounds x_hat to the input's dtype before the weight
    multiply, as the original (``ops.rms_norm``'s ``round_before_weight``): equal to it bit for bit on CPU
    (on CUDA the row statistic is summed in another order; not run on a GPU); for float64 input it computes in
    float64 where the original computes in float32. A fused CUDA epilogue (float16, bfloat16; not run on a GPU)
    applies the activation to the float32 accumulator and rounds once, where the unfused block rounds the
    pre-activation first.

    FP8 (opt-in, inference): ``fp8="rowwise"`` or ``"blockwise"`` replaces each Linear (``nn.Linear``, or
    ``ops.nn.Linear``, whose maths is nn.Linear's) with an ``Fp8Linear`` of that recipe (its weight quantized
    now; the state_dict then holds FP8 codes and scales), except those below, which become (or stay)
    ``ops.nn.Linear`` and are listed in ``report.kept_high_precision`` with the reason:

    * output heads: the ``get_output_embeddings()`` of any module of the model, a Linear named ``lm_head``,
      and every Linear of a transformers task model outside its base model (the child its
      ``base_model_prefix`` names): BERT's and ViT's ``classifier``, Llama's ``score``, ``qa_outputs``;
    * MoE routers: in a module with a child holding experts (named ``experts``, or with a parameter of
      ``num_experts`` matrices), its child named ``router`` or ``gate`` (transformers' names for it in every
      MoE family), if a Linear, else every Linear inside it: HunYuan's ``gate.wg``, Gemma-4's ``router.proj``,
      DBRX's and JetMoe's ``router.layer``, Switch's, NLLB-MoE's and LongCat's ``router.classifier``;
    * Linears a transformers model lists in ``_keep_in_fp32_modules`` (T5's ``wo``: its block casts
      activations to that weight's dtype);
    * Linears whose features are not multiples of 16, or whose dtype is float64.

    FP8 Linears already of the recipe asked are listed in ``report.fp8`` and left as they are; FP8 Linears
    of the other recipe raise before anything changes (quantizing their codes again would round the
    weights twice). The block recipes then find FP8 Linears where they expect plain ones and leave those
    blocks alone. A model already in
    transformers' fine-grained FP8 format (its ``FP8Linear`` modules, 128x128 block scales: DeepSeek-V3,
    Qwen3 FP8 checkpoints) has those modules replaced by ``Fp8Linear.from_fp8`` sharing their weights,
    without ``fp8`` or with ``fp8="blockwise"`` (``"rowwise"`` raises); they are listed in ``report.fp8``.
    The state_dict keeps transformers' key
    names (``weight_scale_inv`` blockwise, ``weight_scale`` rowwise), and a transformers model without a
    ``config.quantization_config`` gets the one of that format (``report.quantization_config``: "fp8" or
    "fbgemm_fp8"), so that ``save_pretrained`` writes a checkpoint transformers' ``from_pretrained`` reads
    as FP8 (on CPU, "fp8" dequantizes and "fbgemm_fp8" refuses) rather than as float weights, but where
    convert warns (blockwise Linears with a partial last 128-block, FP8 experts whose scales transformers
    does not read). To load
    it into ops' modules: ``_from_config``, ``convert(model, fp8=...)``, then ``load_state_dict`` of the
    file: convert gives a transformers model a load_state_dict pre-hook that turns the keys
    ``save_pretrained`` writes and the model lacks (MoE experts one per expert, Mixtral's
    ``block_sparse_moe``) into the model's, with transformers' conversion mapping for the model.

    MoE experts (transformers' experts modules: Qwen3-MoE, Mixtral, OLMoE, DeepSeek-V3, GPT-OSS, ...) run
    on ``ops.grouped_gemm``: their config's experts implementation becomes "ops" (``ops.moe``), listed in
    ``report.experts``. The config is the model's, shared by all its experts: converting a submodule
    switches the experts outside it too (transformers dispatches on the config, not the module).
    transformers' FP8 experts (``FP8Experts``: float8_e4m3fn weights, 128x128 block scales or one per expert,
    dynamic activation scales) run on ``ops.scaled_grouped_gemm``; experts ops cannot run (FP4 weights, static
    activation scales, other blocks) are left alone, with their config, and listed in ``report.skipped``.
    With ``fp8``, floating-point experts are quantized in place (``ops.moe.quantize``: the class kept, the
    weights FP8 codes beside ``<name>_scale_inv``) and run on ``ops.scaled_grouped_gemm``; experts whose
    features are not multiples of 16, or of float64, stay in floating point (``report.kept_high_precision``). Blockwise
    quantizes experts whose input features are not whole 128-blocks (GPT-OSS: 2880) rowwise
    (``report.experts_rowwise``). ``report.fp8_experts`` lists the experts with FP8 weights. The routers stay
    in high precision (above).

    Returns:
        A ConversionReport naming every replaced module, every recipe applied and every candidate module it
        left alone.

    Raises:
        TypeError: ``model`` is not a ``torch.nn.Module``.
        ValueError: ``fp8`` is not None, "rowwise" or "blockwise", or the model holds FP8 Linears or FP8
            experts of the other recipe.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"ops.nn.convert: expected model to be a torch.nn.Module, got {type(model).__name__}")
    if fp8 is not None and fp8 not in Fp8Linear.RECIPES:
        raise ValueError(f"ops.nn.convert: fp8 must be None or one of {Fp8Linear.RECIPES}, got {fp8!r}")
    if fp8:
        _fp8_convert.check_recipes(model, fp8, Fp8Linear)
    roles = _fp8_convert.high_precision_roles(model) if fp8 else {}
    report = ConversionReport()
    replaced = {}  # id(original) -> its replacement: a module shared by parents stays shared
    if type(model) is torch.nn.Linear or _swap.is_rms_norm(model):
        report.skipped.append(("(model)", "convert replaces submodules in place, not the model it is given: "
                                          "wrap it (torch.nn.Sequential(model)) or use ops.nn.Linear.from_linear "
                                          "/ ops.nn.RMSNorm.from_module"))
    modules = dict(model.named_modules())
    for parent_name, parent in modules.items():
        prefix = f"{parent_name}." if parent_name else ""
        for name, child in list(parent._modules.items()):
            if type(child) is torch.nn.LazyLinear:  # a LazyLinear turns into an nn.Linear at its first call
                report.skipped.append((prefix + name, "an uninitialized LazyLinear: run one forward first (it then "
                                                      "becomes an nn.Linear), then convert"))
                continue
            if type(child) is torch.nn.RMSNorm and len(child.normalized_shape) != 1:
                report.skipped.append((prefix + name, f"normalizes over {len(child.normalized_shape)} dimensions; "
                                                      "ops.rms_norm normalizes over the last one"))
                continue
            if child is not None and _hf_classes.class_key(child) == _fp8_convert.HF_FP8_LINEAR:
                if id(child) not in replaced:
                    why = _fp8_convert.why_not_hf_fp8(child)
                    if why is not None:
                        report.skipped.append((prefix + name, why))
                        continue
                    replaced[id(child)] = Fp8Linear.from_fp8(child.weight, child.weight_scale_inv, child.bias)
                setattr(parent, name, replaced[id(child)])
                report.fp8.append(prefix + name)
                continue
            if child is not None and (type(child).__module__, type(child).__qualname__) == _swap.HF_CONV1D:
                report.skipped.append((prefix + name, _swap.CONV1D))
                continue
            if fp8 and isinstance(child, Fp8Linear):  # of the recipe asked (_fp8_convert.check_recipes)
                report.fp8.append(prefix + name)
                continue
            ops_linear = fp8 is not None and type(child) is Linear  # plain Linear maths (and its activation)
            is_linear = type(child) is torch.nn.Linear or ops_linear
            if not is_linear and isinstance(child, torch.nn.Linear) and not isinstance(child, Linear):
                report.skipped.append((prefix + name, f"a subclass of torch.nn.Linear ({type(child).__name__}): only "
                                                      "the exact class is swapped (a subclass may compute otherwise)"))
                continue
            norms = None if is_linear or child is None else _swap.norm_list(child)
            if norms is not None and (why := _hf_classes.formula_changed(type(child), norms)) is not None:
                report.skipped.append((prefix + name, why))
                continue
            if not is_linear and (child is None or not _swap.is_rms_norm(child)):
                continue
            if (why := _swap.why_not_plain(child)) is not None:
                report.skipped.append((prefix + name, why))
                continue
            quantize = False
            if is_linear and fp8:
                keep = _fp8_convert.why_kept_high_precision(child, roles)
                if keep is None:
                    quantize = True
                elif id(child) not in replaced:
                    report.kept_high_precision.append((prefix + name, keep))
            if id(child) not in replaced:
                replaced[id(child)] = (
                    Fp8Linear.from_linear(child, fp8, getattr(child, "activation", "none")) if quantize
                    else child if ops_linear else Linear.from_linear(child) if is_linear
                    else RMSNorm.from_module(child))
            setattr(parent, name, replaced[id(child)])
            if quantize:
                report.fp8.append(prefix + name)
                report.quantized.append(prefix + name)
            elif not ops_linear:
                (report.linear if is_linear else report.rms_norm).append(prefix + name)
    if recipes:
        for name, block in model.named_modules():
            recipe = _recipes.recipe_for(block)
            if recipe is None:
                continue
            why = recipe.why_not(block)
            if getattr(block, "_compiled_call_impl", None) is not None:
                why = _swap.COMPILED_IN_PLACE
            if why is not None:
                report.skipped.append((name, f"recipe {recipe.name} not applied: {why}"))
                continue
            _recipes.apply(block, recipe)
            report.recipes.append((name or "(model)", recipe.name))
    experts = [(name or "(model)", m, _moe.unsupported(m)) for name, m in model.named_modules() if _moe.is_experts(m)]
    # The experts dispatch on their config, which experts ops cannot run may share: such configs stay as they are.
    kept = [m.config for _, m, why in experts if why is not None]
    for name, module, why in experts:
        if why is not None:
            report.skipped.append((name, why))
        elif any(module.config is c for c in kept):
            report.skipped.append((name, "its config's experts implementation is also that of experts ops cannot "
                                         "run, left as it is"))
        else:
            _moe.register()
            module.config._experts_implementation = _moe.NAME
            report.experts.append(name)
            fp8_weights = _moe.is_fp8(module)  # transformers' FP8Experts, or quantized before
            if fp8 and not fp8_weights and (keep := _moe.why_not_fp8(module)) is not None:
                report.kept_high_precision.append((name, keep))
            elif fp8 and not fp8_weights:
                _moe.quantize(module, fp8)
                report.quantized.append(name)
            if _moe.is_fp8(module):
                _moe.keep_fp8_through_casts(module)
                report.fp8_experts.append(name)
                if fp8 == "blockwise" and _moe.held_recipe(module) == "rowwise":  # (check_recipes: K not whole)
                    report.experts_rowwise.append((name, "input features not whole 128-blocks (blockwise's K)"))
    if fp8:
        _fp8_convert.record_format(model, fp8, report, Fp8Linear)
        _fp8_convert.load_checkpoint_keys_from_now_on(model)
    parallelized = [name for name, why in report.skipped if why == _swap.DTENSOR_PARAMS]
    if parallelized:
        warnings.warn(f"ops.nn.convert left {len(parallelized)} modules alone ({', '.join(parallelized[:3])}"
                      f"{', ...' if len(parallelized) > 3 else ''}): {_swap.DTENSOR_PARAMS}", stacklevel=2)
    return report
