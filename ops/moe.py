"""Mixture-of-experts models on ``ops.grouped_gemm``: an experts implementation named "ops" for transformers'
experts interface (``transformers.integrations.moe``), which the transformers MoE models built on it
(Qwen3-MoE, Mixtral, OLMoE, DeepSeek-V3, GPT-OSS, ...; not DBRX, JetMoe, Switch or NLLB-MoE) call for their
experts.

    import ops                                 # registers "ops" once transformers' interface is imported
    model.set_experts_implementation("ops")    # or ops.nn.convert(model), which reports the experts

The implementation computes what transformers' "grouped_mm" one does (tokens sorted by expert, one grouped
GEMM up and one down, the routing weights, the tokens put back), on ``ops.grouped_gemm`` and, for the
default gate with SiLU, ``ops.silu_and_mul``; other gates, activations, biases, post-expert norms and
expert-parallel sentinels as the experts class defines them. transformers' FP8 experts (``FP8Experts``, a
fine-grained FP8 checkpoint: float8_e4m3fn weights with 128x128 block scales or one scale per expert, dynamic
activation scales) run on ``ops.scaled_grouped_gemm``, the tokens quantized per 1x128 group (block scales)
or per row; "ops" is registered in transformers' FP8 experts interface as well.
"""

import functools
import importlib.abc
import importlib.util
import sys

import torch

from . import fp8 as _fp8, fused as _fused
from .grouped import grouped_gemm
from .recipes import activation_of

__all__ = ["NAME", "experts_forward", "quantize", "register"]

NAME = "ops"
_MOE_MODULE = "transformers.integrations.moe"
_FP8_MODULE = "transformers.integrations.finegrained_fp8"


def _default_gate(module) -> bool:
    """Whether the module gates with transformers' default (chunk into gate and up, act(gate) * up) and SiLU:
    then ``ops.silu_and_mul`` computes it. (By name: no import where torch.compile traces, which torch 2.11
    refuses.)"""
    gate = getattr(type(module), "_apply_gate", None)
    return (getattr(gate, "__module__", None) == _MOE_MODULE and getattr(gate, "__name__", None) == "_default_apply_gate"
            and activation_of(getattr(module, "act_fn", None)) == "silu")


def _grouped_linear(x, weight, offs, bias, bias_index, transposed, scale_inv=None, block_size=None):
    """x (S, in) times one weight per expert: (E, in, out) if `transposed`, else (E, out, in). FP8 weights run on
    scaled_grouped_gemm with their scales (layouts below), x quantized per 1x128 group (128x128 blocks) or
    per row (scales per part of the output features), the result in x's dtype."""
    b = weight if transposed else weight.transpose(1, 2)  # (E, K, N)
    if weight.dtype != torch.float8_e4m3fn:
        out = grouped_gemm(x.to(weight.dtype), b, offs)
    else:
        experts, k, n = b.shape
        scale = scale_inv.float()
        if block_size is None:
            codes, x_scale = _fp8.quantize_fp8(x, "row")
            x_scale = x_scale.reshape(-1)
            parts = scale.reshape(experts, -1)  # (E, S): S equal parts of the output features
            b_scale = parts if parts.shape[1] == n else parts.repeat_interleave(n // parts.shape[1], dim=1)
        else:
            codes, x_scale = _fp8.quantize_fp8(x, "group")
            # transformers allocates at least 2 block rows for gate_up_proj (min_sf_out): the first ceil(out/128).
            b_scale = (scale[:, :k // 128, :-(-n // 128)] if transposed
                       else scale[:, :-(-n // 128), :k // 128].transpose(1, 2))
        out = _fp8.scaled_grouped_gemm(codes, b, x_scale, b_scale, offs, out_dtype=x.dtype)
    return out if bias is None else out + bias[bias_index]


# The scales of FP8 experts' weights (E experts, N output and K input features; a weight (E, N, K), or
# (E, K, N) where the module stores it transposed); each multiplies the codes of its part of the weight:
#   128x128 blocks: (E, ceil(N/128), ceil(K/128)) (transformers' FP8Experts; at least 2 rows for gate_up_proj),
#                   (E, K/128, ceil(N/128)) transposed
#   rows:           (E, S, 1), S dividing N (S = N: per output feature; FP8Experts' block_size None: S = 1, or 2
#                   for gate_up_proj's halves), (E, 1, S) transposed


def _projections(module):
    return [n for n in ("gate_up_proj", "up_proj", "down_proj") if isinstance(getattr(module, n, None), torch.Tensor)]


def _out_in(weight, transposed):
    """(N, K) of one expert's weight."""
    return (weight.shape[2], weight.shape[1]) if transposed else (weight.shape[1], weight.shape[2])


def _sizes(module):
    """(N, K) of one expert's weight, per projection."""
    transposed = getattr(module, "is_transposed", False)
    return [_out_in(getattr(module, n), transposed) for n in _projections(module)]


def unsupported(module: torch.nn.Module):
    """Why ``experts_forward`` does not run an experts module, or None: its weights in floating point, or
    float8_e4m3fn (transformers' FP8Experts, or quantized by ``quantize``) with dynamic activation scales,
    features multiples of 16 and scales of a layout ``_grouped_linear`` takes (128x128 blocks, K in whole
    blocks, or equal parts of each expert's output features)."""
    names = _projections(module)
    weights = [getattr(module, n) for n in names]
    dtypes = {w.dtype for w in weights}
    if not any(d.is_floating_point and d.itemsize == 1 for d in dtypes) and all(d.is_floating_point for d in dtypes):
        return None
    if dtypes != {torch.float8_e4m3fn}:
        return f"experts' weights of {sorted(map(str, dtypes))}: ops runs floating-point and float8_e4m3fn ones"
    if getattr(module, "activation_scheme", "dynamic") != "dynamic":
        return "FP8 experts with static activation scales: ops quantizes activations dynamically"
    block = getattr(module, "block_size", None)
    if block is not None and tuple(block) != (128, 128):
        return f"FP8 experts with {tuple(block)} weight blocks: ops takes 128x128 blocks or one scale per expert"
    transposed = getattr(module, "is_transposed", False)
    sizes = _sizes(module)
    if any(n % 16 or k % 16 for n, k in sizes):
        return "FP8 experts whose features are not multiples of 16 (the FP8 grouped GEMM's K and N)"
    if block is not None and any(k % 128 for _, k in sizes):
        return "FP8 experts whose input features are not whole 128-blocks: ops's blockwise recipe needs them"
    scales = [getattr(module, n + "_scale_inv", None) for n in names]
    parts_dim = 1 if transposed else 2  # the dimension of size 1 in a rows layout

    def rows(w, s, n):
        return (isinstance(s, torch.Tensor) and s.dim() == 3 and s.shape[0] == w.shape[0]
                and s.shape[parts_dim] == 1 and n % s.shape[3 - parts_dim] == 0)

    if block is None and not all(rows(w, s, n) for w, s, (n, _) in zip(weights, scales, sizes)):
        return "FP8 experts whose scales are neither 128x128 blocks nor equal parts of each expert's rows"
    return None


def is_fp8(module: torch.nn.Module) -> bool:
    """Whether an experts module's weights are float8_e4m3fn."""
    return any(getattr(module, n).dtype == torch.float8_e4m3fn for n in _projections(module))


def why_not_fp8(module: torch.nn.Module):
    """Why ``quantize`` keeps a floating-point experts module's weights as they are, or None."""
    weights = [getattr(module, n) for n in _projections(module)]
    if any(n % 16 or k % 16 for n, k in _sizes(module)):
        return "experts whose features are not multiples of 16 (the FP8 grouped GEMM's K and N)"
    if any(w.dtype not in (torch.float32, torch.bfloat16, torch.float16) for w in weights):
        return f"experts of {weights[0].dtype}: no FP8 GEMM output dtype"
    return None


def quantize(module: torch.nn.Module, recipe: str) -> str:
    """Quantizes a floating-point experts module's weights to float8_e4m3fn in place (``why_not_fp8`` None), the
    module's class and layout kept: each weight becomes its codes (a parameter that does not require grad, stored
    K-major, the layout the FP8 grouped GEMM reads) beside ``<name>_scale_inv`` (float32: (E, ceil(N/128),
    ceil(K/128)) blocks or (E, N, 1) rows, transposed where the module's weights are), with ``block_size`` and
    ``activation_scheme`` "dynamic" as transformers' FP8Experts.
    "blockwise": 128x128 blocks where every input feature count is whole blocks, else (GPT-OSS's 2880) one
    scale per output feature, as "rowwise". Then ``module.to(dtype)`` and the like keep the codes and scales (a
    device move applies), and ``load_state_dict`` of floating-point weights without scales quantizes them.
    Returns the recipe applied.

    Raises:
        ValueError: ``recipe`` is not "rowwise" or "blockwise", or the module is not a floating-point experts module
            ``why_not_fp8`` accepts (FP8 weights already: quantizing their codes again would round them twice).
    """
    if recipe not in ("rowwise", "blockwise"):
        raise ValueError(f'ops.moe.quantize: recipe must be "rowwise" or "blockwise", got {recipe!r}')
    if not is_experts(module) or is_fp8(module) or (why := why_not_fp8(module)) is not None:
        why = ("not a transformers experts module" if not is_experts(module) else
               "its weights are FP8 already" if is_fp8(module) else why)
        raise ValueError(f"ops.moe.quantize: expected an experts module with floating-point weights, got "
                         f"{type(module).__name__}: {why}")
    transposed = getattr(module, "is_transposed", False)
    names = _projections(module)
    blockwise = recipe_for(module, recipe) == "blockwise"
    with torch.no_grad():
        for name in names:
            codes, scale = _quantized(getattr(module, name).detach(), name, transposed, blockwise)
            setattr(module, name, torch.nn.Parameter(codes, requires_grad=False))
            module.register_parameter(name + "_scale_inv", torch.nn.Parameter(scale, requires_grad=False))
    module.block_size = (128, 128) if blockwise else None
    module.activation_scheme = "dynamic"
    keep_fp8_through_casts(module)
    module.register_load_state_dict_pre_hook(_quantize_on_load)
    module.register_forward_pre_hook(_runs_on_ops)
    return "blockwise" if blockwise else "rowwise"


def _runs_on_ops(module, args):
    # The model's other experts implementations ("eager", "grouped_mm", ...) read the codes as weights and fail
    # in ATen's dtype checks: the error names the cause instead.
    implementation = getattr(module.config, "_experts_implementation", None)
    if implementation != NAME:
        raise RuntimeError(f"ops.moe: {type(module).__name__} holds FP8 codes (ops.moe.quantize), which only the "
                           f"experts implementation {NAME!r} runs, and the model's config names {implementation!r}: "
                           f"call model.set_experts_implementation({NAME!r})")


def recipe_for(module: torch.nn.Module, asked: str) -> str:
    """The recipe ``quantize(module, asked)`` applies: "blockwise" where asked and every input feature count is
    whole 128-blocks, else "rowwise"."""
    whole = all(k % 128 == 0 for _, k in _sizes(module))
    return "blockwise" if asked == "blockwise" and whole else "rowwise"


def held_recipe(module: torch.nn.Module) -> str:
    """The recipe of an FP8 experts module's weights: "blockwise" (128x128 blocks) or "rowwise" (scales per
    part of each expert's output features, transformers' per-expert ones included)."""
    return "rowwise" if getattr(module, "block_size", None) is None else "blockwise"


def scales_split_per_expert(module: torch.nn.Module) -> bool:
    """Whether an FP8 experts module's scales split at its fused gate/up boundary as its codes do (each expert's
    split is exact): the scale rows of gate_up_proj's output features halve there where it holds rows (an even
    count), or 128x128 blocks with each half whole blocks or the whole one block (FP8Experts stores its scale
    twice). Without gate_up_proj, or in floating point: True."""
    if getattr(module, "gate_up_proj", None) is None or not is_fp8(module):
        return True
    transposed = getattr(module, "is_transposed", False)
    n, _ = _out_in(module.gate_up_proj, transposed)
    rows = module.gate_up_proj_scale_inv.shape[2 if transposed else 1]
    if getattr(module, "block_size", None) is None:
        return rows % 2 == 0
    return n % 256 == 0 or (n <= 128 and rows == 2)


def _quantized(weight, name, transposed, blockwise):
    """(codes, scale) of one experts weight, in the module's layout (codes K-major)."""
    w = weight.transpose(1, 2) if transposed else weight  # (E, N, K)
    if blockwise:
        codes, scale = (torch.stack(t) for t in zip(*(_fp8.quantize_fp8(e, "block") for e in w)))
        if name == "gate_up_proj" and scale.shape[1] < 2 and not transposed:  # FP8Experts' min_sf_out
            scale = torch.cat([scale, scale], dim=1)
    else:
        codes, scale = _fp8.quantize_fp8(w, "row")
    if transposed:
        codes, scale = codes.transpose(1, 2), scale.transpose(1, 2).contiguous()
    return codes, scale


def _quantize_on_load(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
    # A floating-point checkpoint's weights (the model's before convert(fp8=...)) load quantized as ``quantize``
    # quantizes them, instead of their values copied into the codes. Codes load K-major, as ``quantize`` stores
    # them (a checkpoint holds transposed weights (E, K, N) N-major): load_state_dict(assign=True) keeps that.
    transposed = getattr(module, "is_transposed", False)
    for name in _projections(module):
        key, scale_key = prefix + name, prefix + name + "_scale_inv"
        weight = state_dict.get(key)
        if not isinstance(weight, torch.Tensor):
            continue
        if weight.dtype == torch.float8_e4m3fn:
            if transposed and weight.dim() == 3 and weight.stride(1) != 1:
                state_dict[key] = weight.transpose(1, 2).contiguous().transpose(1, 2)
            continue
        if weight.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64) or scale_key in state_dict:
            error_msgs.append(f"ops.moe: {key} is {weight.dtype}" + (f" beside a {scale_key}" if scale_key in state_dict
                              else "") + ": expected the FP8 codes (torch.float8_e4m3fn) of that scale, or a "
                              "floating-point weight without one to quantize")
            continue
        if weight.shape == getattr(module, name).shape:  # else load_state_dict reports the size mismatch
            with torch.no_grad():
                state_dict[key], state_dict[scale_key] = _quantized(weight, name, transposed,
                                                                    module.block_size is not None)


def _apply_keeping_fp8(module, fn, recurse=True):
    # Module.to(dtype) casts every floating-point tensor, FP8 codes and float32 scales included: those keep their
    # dtypes, and follow a device move.
    kept = {name: p.data for name, p in module._parameters.items()
            if p is not None and (p.dtype == torch.float8_e4m3fn or name.endswith("_scale_inv"))}
    type(module)._apply(module, fn, recurse)
    for name, old in kept.items():
        new = module._parameters[name]
        if new is not None and new.dtype != old.dtype:
            new.data = old.to(new.device)
    return module


def keep_fp8_through_casts(module: torch.nn.Module) -> None:
    """Gives an FP8 experts module (its class is the model's) an ``_apply`` that keeps its codes and scales."""
    if not isinstance(module.__dict__.get("_apply"), functools.partial):
        module.__dict__["_apply"] = functools.partial(_apply_keeping_fp8, module)


def experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts of a transformers MoE layer on ``ops.grouped_gemm`` (``ops.scaled_grouped_gemm`` for FP8
    weights): hidden_states (T, H), the top-k
    experts of each token and their routing weights (T, k); returns (T, H). A pick of an id outside
    [0, num_experts) contributes nothing: transformers' expert-parallel sentinel (num_experts), vLLM's -1."""
    if hidden_states.requires_grad and torch.is_grad_enabled() and is_fp8(self):
        raise RuntimeError("ops.moe: FP8 experts are inference only (FP8 operands have no gradient), and the hidden "
                           "states require grad: run the model under torch.no_grad() or torch.inference_mode()")
    if hidden_states.dtype not in (torch.float32, torch.bfloat16, torch.float16) and is_fp8(self):
        raise RuntimeError(f"ops.moe: FP8 experts compute in torch.float32, torch.bfloat16 or torch.float16 (the FP8 "
                           f"GEMM's output dtypes), got hidden states of {hidden_states.dtype}")
    num_tokens, hidden = hidden_states.shape[0], hidden_states.shape[-1]
    k, experts = top_k_index.shape[-1], self.num_experts
    ids = top_k_index.reshape(-1)
    ids = torch.where((ids >= 0) & (ids < experts), ids, experts)  # every other id sorts last as num_experts
    expert_ids, order = torch.sort(ids)
    x = hidden_states[order // k]
    weights = top_k_weights.reshape(-1)[order]
    # Each expert's end in the sorted ids (a fixed shape, no host synchronization); the picks of id num_experts
    # are the rows past offs[-1], which the grouped GEMMs leave zero.
    offs = torch.searchsorted(expert_ids, torch.arange(experts, device=ids.device, dtype=ids.dtype),
                              right=True).to(torch.int32)
    has_bias, transposed = getattr(self, "has_bias", False), getattr(self, "is_transposed", False)
    sentinel = None
    if has_bias:  # the bias lands on rows past offs[-1] too: zeroed after each projection
        sentinel = (expert_ids == experts).unsqueeze(-1)
        expert_ids = expert_ids.clamp(max=experts - 1)  # in bounds for the bias gather
    block = getattr(self, "block_size", None)
    up_name = "gate_up_proj" if getattr(self, "has_gate", True) else "up_proj"
    up, up_bias = getattr(self, up_name), getattr(self, up_name + "_bias", None) if has_bias else None
    h = _grouped_linear(x, up, offs, up_bias, expert_ids, transposed, getattr(self, up_name + "_scale_inv", None),
                        block)
    if sentinel is not None:
        h = h.masked_fill(sentinel, 0.0)
    if not getattr(self, "has_gate", True):
        h = self.act_fn(h)
    elif _default_gate(self):
        h = _fused.silu_and_mul(h)
    else:
        h = self._apply_gate(h)
    down_bias = getattr(self, "down_proj_bias", None) if has_bias else None
    h = _grouped_linear(h, self.down_proj, offs, down_bias, expert_ids, transposed,
                        getattr(self, "down_proj_scale_inv", None), block)
    if sentinel is not None:
        h = h.masked_fill(sentinel, 0.0)
    if getattr(self, "has_post_expert_norm", False):
        h = self.post_expert_norm(h)
    h = h * weights.unsqueeze(-1)
    # Back to token order, then the sum over each token's k experts (a reshape and sum: deterministic,
    # accumulated in one call rather than by index_add_ in the output's dtype).
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.shape[0], device=order.device)
    return h[inverse].view(num_tokens, k, hidden).sum(dim=1).to(hidden_states.dtype)


def register() -> None:
    """Registers ``experts_forward`` as transformers' experts implementation "ops" (idempotent), in its FP8
    experts interface too where that module is loaded (an FP8 model's classes load it)."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(NAME, experts_forward)
    fp8 = sys.modules.get(_FP8_MODULE)
    if fp8 is not None and hasattr(fp8, "FP8ExpertsInterface"):
        fp8.FP8ExpertsInterface.register(NAME, experts_forward)


def is_experts(module: torch.nn.Module) -> bool:
    """Whether `module` is a transformers experts module (its class dispatches through the experts
    interface, ``use_experts_implementation``)."""
    return (hasattr(module, "is_transposed") and hasattr(module, "has_gate") and hasattr(module, "down_proj")
            and hasattr(getattr(module, "config", None), "_experts_implementation"))


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Registers the implementation right after transformers' interface module is imported (a model class
    imports it), so ``import ops`` before transformers needs no ``register()`` call and ``import ops`` costs
    no transformers import."""

    def __init__(self, name=_MOE_MODULE):
        self.name = name

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)  # once; the search below must not find this finder again
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            try:
                register()
            except (ImportError, AttributeError):  # a transformers release without the experts interface
                pass

        spec.loader.exec_module = exec_then_register
        return spec


def _register_when_loaded():
    """``import ops`` registers the implementation where transformers' interface is already imported, else
    right after it is (importing it costs about 2 s, so it is not imported for that)."""
    if _MOE_MODULE in sys.modules:
        register()
    for module in (_MOE_MODULE, _FP8_MODULE):
        if module not in sys.modules and not any(isinstance(f, _RegisterAfterImport) and f.name == module
                                                 for f in sys.meta_path):
            sys.meta_path.insert(0, _RegisterAfterImport(module))
