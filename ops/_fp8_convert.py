"""The FP8 side of ``ops.nn.convert(model, fp8=...)``: which Linears it keeps in high precision and why
(output heads, MoE routers, ``_keep_in_fp32_modules``, shapes and dtypes the FP8 GEMM does not take),
which transformers FP8Linear modules ``ops.nn.Fp8Linear`` computes, the ``quantization_config`` a
converted transformers model's checkpoint needs, and the load_state_dict pre-hook that reads
``save_pretrained``'s keys into such a model. ``fp8_linear`` arguments are ``ops.nn.Fp8Linear``, which
imports this module.
"""

import copy
import re
import warnings
from typing import List, Optional

import torch

from . import _hf_classes, _swap, fp8 as _fp8, moe as _moe


HF_FP8_LINEAR = ("transformers.integrations.finegrained_fp8", "FP8Linear")


def why_unaligned(module) -> Optional[str]:
    """Why a Linear's features do not fit the FP8 GEMM (multiples of 16), or None."""
    if module.in_features % 16 or module.out_features % 16:
        return f"features {module.in_features} -> {module.out_features} are not multiples of 16"
    return None


def why_not_hf_fp8(module) -> Optional[str]:
    """None for a transformers FP8Linear that Fp8Linear computes (128x128 float32 block scales, dynamic
    activations), else why it is left alone."""
    if (why := _swap.why_hooked(module) or why_unaligned(module)) is not None:
        return why
    if tuple(module.block_size or ()) != (128, 128):
        return f"FP8 with block size {module.block_size}; ops.nn.Fp8Linear takes 128x128 blocks"
    if module.activation_scheme != "dynamic":
        return f"static activation scales ({module.activation_scheme}); ops.nn.Fp8Linear quantizes per 1x128 group"
    if module.weight.dtype != torch.float8_e4m3fn or module.weight_scale_inv.dtype != torch.float32:
        return f"weight {module.weight.dtype} with {module.weight_scale_inv.dtype} scales"
    return None


_OUTPUT_HEAD = "an output head (its errors reach the model's output undamped)"
_ROUTER = "an MoE router (its scores choose each token's experts, and FP8 errors change the choice)"
_ROUTER_NAMES = ("router", "gate")  # transformers' names for an MoE block's router, in every MoE family
_KEEP_IN_FP32 = ("listed in the model's _keep_in_fp32_modules (transformers keeps it in float32; its block casts "
                 "activations to its weight's dtype)")


def _holds_experts(name: str, module: torch.nn.Module) -> bool:
    """Whether a child holds its block's experts: named ``experts`` (transformers' name for them: Switch's and
    NLLB-MoE's ModuleDicts, DBRX's), or holding a weight per expert, a parameter of ``num_experts`` matrices
    (transformers' experts modules, JetMoe's ParallelExperts)."""
    if name == "experts" or _moe.is_experts(module):
        return True
    count = getattr(module, "num_experts", None)
    return isinstance(count, int) and any(p is not None and p.dim() >= 3 and p.shape[0] == count
                                          for p in module._parameters.values())


def _linears_in(module: torch.nn.Module) -> List[torch.nn.Module]:
    return [m for m in module.modules() if isinstance(m, torch.nn.Linear)]


def high_precision_roles(model: torch.nn.Module) -> dict:
    """id -> reason for the Linears convert(fp8=...) keeps in high precision by their role (output heads, MoE
    routers: convert's docstring says which)."""
    roles = {}
    for parent in model.modules():
        keep = getattr(parent, "_keep_in_fp32_modules", None)  # T5's ["wo"], matched as from_pretrained does
        if isinstance(keep, (list, tuple, set)) and keep:
            for name, module in parent.named_modules():
                if isinstance(module, torch.nn.Linear) and any(k in name.split(".") for k in keep):
                    roles[id(module)] = _KEEP_IN_FP32
    for parent in model.modules():
        children = parent._modules
        if any(child is not None and _holds_experts(name, child) for name, child in children.items()):
            for name in _ROUTER_NAMES:
                router = children.get(name)
                if router is not None and not _holds_experts(name, router):
                    roles.update((id(m), _ROUTER) for m in _linears_in(router))
    for parent in model.modules():
        heads = []
        get_output_embeddings = getattr(parent, "get_output_embeddings", None)
        if callable(get_output_embeddings):
            try:
                out = get_output_embeddings()
            except (AttributeError, NotImplementedError):  # a class without a head may raise either
                out = None
            if isinstance(out, torch.nn.Module):
                heads += _linears_in(out)
        prefix = getattr(parent, "base_model_prefix", None)
        base = parent._modules.get(prefix) if isinstance(prefix, str) and prefix else None
        if base is not None:  # a transformers task model: its head is what lies outside the base model
            inside = {id(m) for m in base.modules()}
            heads += [m for m in _linears_in(parent) if id(m) not in inside]
        for name, child in parent._modules.items():
            if name == "lm_head" and isinstance(child, torch.nn.Linear):
                heads.append(child)
        roles.update((id(m), _OUTPUT_HEAD) for m in heads)
    return roles


def why_kept_high_precision(module: torch.nn.Linear, roles: dict) -> Optional[str]:
    """Why convert(fp8=...) keeps a Linear in high precision, or None to quantize it."""
    if id(module) in roles:
        return roles[id(module)]
    if (why := why_unaligned(module)) is not None:
        return why
    if module.weight.dtype not in _fp8._OUT_DTYPES:
        return f"its dtype {module.weight.dtype} is no FP8 GEMM output dtype"
    return None


def record_format(model: torch.nn.Module, recipe: str, report, fp8_linear: type) -> None:
    """Gives a transformers model some of whose Linears convert(fp8=recipe) quantized (``report.quantized``)
    the config.quantization_config of its state_dict's format: transformers' fine-grained "fp8" (128x128
    weight_scale_inv) for blockwise, "fbgemm_fp8" (per-channel weight_scale) for rowwise, every module that
    keeps floating-point weights listed in modules_to_not_convert; report.quantization_config names it.
    save_pretrained writes it, so that from_pretrained runs the codes as FP8 or dequantizes them (or refuses
    where its kernels cannot run) instead of loading them as weights."""
    config = getattr(model, "config", None)
    if not type(config).__module__.startswith("transformers.") or not report.quantized:
        return
    import transformers

    method = "fp8" if recipe == "blockwise" else "fbgemm_fp8"
    current = getattr(config, "quantization_config", None)
    if current is not None:
        quant_method = current.get("quant_method") if isinstance(current, dict) else getattr(current, "quant_method", None)
        quant_method = str(getattr(quant_method, "value", quant_method))  # transformers' QuantizationMethod enum
        if quant_method != method:
            warnings.warn(f"ops.nn.convert: the model's config.quantization_config is {quant_method!r}, but fp8="
                          f"{recipe!r} stored scales in the {method!r} format: from_pretrained of a save_pretrained "
                          "checkpoint would misread them", stacklevel=3)
        return
    def tensors(m):
        return [t for t in [*m._parameters.values(), *m._buffers.values()] if t is not None]

    # Modules that keep floating-point weights; FP8 experts hold float32 scales and may hold float biases.
    kept = sorted(name for name, m in model.named_modules() if name and not isinstance(m, fp8_linear) and any(
        t.is_floating_point() and t.dim() >= 2 for t in tensors(m)) and not any(
        t.dtype == torch.float8_e4m3fn for t in tensors(m)))
    config_class = getattr(transformers, "FineGrainedFP8Config" if recipe == "blockwise" else "FbgemmFp8Config", None)
    if config_class is None:
        warnings.warn(f"ops.nn.convert: transformers {transformers.__version__} has no config for the {method!r} "
                      "format: a save_pretrained checkpoint would not say its weights are FP8", stacklevel=3)
        return
    extra = {"activation_scheme": "dynamic", "weight_block_size": (128, 128)} if recipe == "blockwise" else {}
    config.quantization_config = config_class(modules_to_not_convert=kept, **extra)
    report.quantization_config = method
    # Blockwise experts saved one per expert are transformers' fine-grained format; it has no rowwise experts.
    per_expert = save_scales_per_expert(model)
    unread = [name for name, m in model.named_modules() if _moe.is_experts(m) and _moe.is_fp8(m)
              and not (per_expert and _moe.held_recipe(m) == "blockwise")]
    if unread:
        written = ("their rowwise scales one per expert, which transformers' FP8 experts do not take (its "
                   "fine-grained format has 128x128 blocks; fbgemm_fp8 has no experts)" if per_expert else
                   "their scales as the model holds them, which transformers' from_pretrained does not read")
        warnings.warn(f"ops.nn.convert: {len(unread)} FP8 experts modules (e.g. {unread[0]}): save_pretrained "
                      f"writes {written}: load a save_pretrained checkpoint of this model with ops (convert, then "
                      "load_state_dict)", stacklevel=3)
    elif per_expert and getattr(model, "base_model", None) is model:
        # save_pretrained reverts the saved model's own mapping: a model holding this one has none of the scales'.
        warnings.warn(f"ops.nn.convert: {type(model).__name__} is a base model: its own save_pretrained writes the "
                      "FP8 experts' scales one per expert, in the format transformers reads; a model holding it "
                      "(e.g. a ...ForCausalLM) writes them fused, which transformers does not read: convert the "
                      "model you save", stacklevel=3)
    partial = [name for name, m in model.named_modules() if isinstance(m, fp8_linear) and m.recipe == "blockwise"
               and any(n > 128 and n % 128 for n in (m.in_features, m.out_features))]
    if partial:
        warnings.warn(f"ops.nn.convert: {len(partial)} blockwise FP8 Linears have a dimension of several "
                      f"128-blocks, the last partial (e.g. {partial[0]}): transformers' CPU dequantization "
                      "(Fp8Dequantize, 5.25) of a save_pretrained checkpoint takes a block as the weight's rows over "
                      "the scale's rows and loads their weights wrong (a grid that does not divide them raises); its "
                      "GPU kernels and ops' own load read them right", stacklevel=3)


def with_scale_converters(transforms, own_keys):
    """transformers' conversion mapping ``transforms`` with, for each converter of weights whose target the model
    holds a "_scale_inv" beside (FP8 experts hold their scales as parameters), a copy that converts those scales
    the same way, as transformers' quantizers extend it (HfQuantizer.update_weight_conversions)."""
    from transformers.core_model_loading import WeightConverter

    transforms = list(transforms)
    for converter in [t for t in transforms if isinstance(t, WeightConverter)]:
        sources, targets = list(converter.source_patterns), list(converter.target_patterns)
        if all(p.endswith(".weight") for p in sources) and any(
                key.endswith(targets[0] + "_scale_inv") for key in own_keys):
            transforms.append(converter.copy([p + "_scale_inv" for p in sources], [t + "_scale_inv" for t in targets],
                                             operations=list(converter.operations)))
    return transforms


def save_scales_per_expert(model: torch.nn.Module) -> bool:
    """Makes ``save_pretrained`` write the FP8 experts' scales as it writes their codes, one per expert and
    projection (transformers' fine-grained format: ``experts.0.gate_proj.weight_scale_inv``), by giving the model
    the conversion mapping save_pretrained reverts (``_weight_conversions``) with the scales' converters. Only
    where the mapping writes the experts one per expert, every experts module's scales split there exactly
    (``ops.moe.scales_split_per_expert``), and the installed transformers reverts that mapping. Returns whether it
    did."""
    state = model.__dict__
    if "_ops_base_conversions" in state:  # an earlier convert's extension: decided again from the mapping before it
        base = state.pop("_ops_base_conversions")
        state.pop("_weight_conversions", None)
        if base is not None:
            state["_weight_conversions"] = base
    experts = [m for m in model.modules() if _moe.is_experts(m) and _moe.is_fp8(m)]
    if not experts or not all(_moe.scales_split_per_expert(m) for m in experts):
        return False
    try:
        from transformers import core_model_loading
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import PrefixChange
    except ImportError:
        return False
    if not hasattr(core_model_loading, "revert_weight_conversion"):
        return False
    # The mapping from_pretrained recorded, else the one revert_weight_conversion builds for a model it did not load.
    base = state.get("_weight_conversions")
    transforms = list(base) if base is not None else [
        t for t in get_model_conversion_mapping(model, add_legacy=False) if not isinstance(t, PrefixChange)]
    extended = with_scale_converters(transforms, set(model.state_dict(keep_vars=True)))
    if len(extended) == len(transforms):  # no converter writes the experts one per expert (GPT-OSS's are fused)
        return False
    state["_ops_base_conversions"] = base
    state["_weight_conversions"] = extended
    return True


def checkpoint_keys_to_model_keys(module, state_dict, prefix, local_metadata, strict, missing_keys,
                                   unexpected_keys, error_msgs) -> None:
    """A load_state_dict pre-hook: the keys of a transformers model's state_dict that are not the model's own, as
    ``save_pretrained`` writes them (MoE experts one per expert: ``experts.0.gate_proj.weight``; Mixtral's
    ``block_sparse_moe``), become the model's through transformers' conversion mapping for the model, the one
    ``save_pretrained`` reverted and ``from_pretrained`` applies. Keys it cannot convert stay as they are (then
    reported unexpected), and a conversion that fails is a load error naming the keys."""
    own_tensors = {prefix + key: t for key, t in module.state_dict(keep_vars=True).items()}
    own = set(own_tensors)
    foreign = [key for key in state_dict if key.startswith(prefix) and key not in own]
    if not foreign:
        return
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, dot_natural_key, rename_source_key
    except ImportError:  # a transformers release without conversion mappings saves the model's own keys
        return
    transforms = with_scale_converters(get_model_conversion_mapping(module), own)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    by_pattern = {pattern: c for c in converters for pattern in c.source_patterns}
    renamed, pending = {}, {}  # pending: target key -> (its converter, the checkpoint keys it collects)
    indices = {}  # (target, source pattern) -> the expert index of each key it collects, in stacking order
    for key in sorted(foreign, key=dot_natural_key):  # experts in index order, as from_pretrained stacks them
        target, pattern = rename_source_key(key[len(prefix):], renamings, converters)
        if pattern is None:
            if prefix + target in own:
                renamed[key] = prefix + target
            continue
        converter, sources = pending.setdefault(target, (copy.deepcopy(by_pattern[pattern]), []))
        converter.add_tensor(target, key[len(prefix):], pattern, state_dict[key])
        sources.append(key)
        index = re.search(re.escape(pattern).replace(r"\*", r"(\d+)"), key[len(prefix):]) if "*" in pattern else None
        if index is not None:
            indices.setdefault((target, pattern), []).append(int(index.group(1)))
    for key, target in renamed.items():
        state_dict[target] = state_dict.pop(key)
    for (target, pattern), found in indices.items():
        # Stacking renumbers the experts: a checkpoint must hold each of 0..E-1 once, E the model's.
        own_tensor = own_tensors.get(prefix + target)
        experts = own_tensor.shape[0] if own_tensor is not None and own_tensor.dim() else len(found)
        if found != list(range(experts)):
            missing = sorted(set(range(experts)) - set(found))
            extra = sorted(set(found) - set(range(experts)))
            error_msgs.append(f"ops.nn: the checkpoint's keys {pattern!r} under {prefix or 'the model'} hold experts "
                              f"{_ranges(found)}; {prefix + target} stacks experts 0-{experts - 1}, each once"
                              + (f" (missing {_ranges(missing)})" if missing else "")
                              + (f" (not the model's: {_ranges(extra)})" if extra else ""))
            pending.pop(target, None)
    for target, (converter, sources) in pending.items():
        try:
            converted = converter.convert(target, model=module, config=getattr(module, "config", None))
        except Exception as e:  # transformers' converters raise what their tensor ops raise
            error_msgs.append(f"ops.nn: transformers' conversion of {sources[0]} and {len(sources) - 1} other "
                              f"checkpoint keys into {prefix + target} failed: {e}")
            continue
        converted = {prefix + k: v[0] if isinstance(v, list) else v for k, v in converted.items()}
        if all(k in own for k in converted):
            for key in sources:
                del state_dict[key]
            state_dict.update(converted)


def _ranges(indices) -> str:
    """"0-2, 4-8" of sorted distinct integers (a repeated one kept: "3, 3")."""
    parts, start = [], None
    for i, n in enumerate(indices):
        if start is None:
            start = n
        if i + 1 == len(indices) or indices[i + 1] != n + 1:
            parts.append(str(n) if start == n else f"{start}-{n}")
            start = None
    return ", ".join(parts)


def load_checkpoint_keys_from_now_on(model: torch.nn.Module) -> None:
    """Gives a transformers model the load_state_dict pre-hook ``checkpoint_keys_to_model_keys`` (once)."""
    if not type(getattr(model, "config", None)).__module__.startswith("transformers."):
        return
    if not any(getattr(h, "hook", h) is checkpoint_keys_to_model_keys
               for h in model._load_state_dict_pre_hooks.values()):
        model.register_load_state_dict_pre_hook(checkpoint_keys_to_model_keys)


def check_recipes(model: torch.nn.Module, recipe: str, fp8_linear: type) -> None:
    """Raises before convert(fp8=recipe) changes anything where the model holds FP8 Linears of another recipe:
    quantizing their codes again would round the weights twice."""
    for name, module in model.named_modules():
        if _moe.is_experts(module) and _moe.is_fp8(module):
            held, asked = _moe.held_recipe(module), _moe.recipe_for(module, recipe)
            if held != asked:
                raise ValueError(f"ops.nn.convert: fp8={recipe!r}, but {name or '(model)'} holds FP8 experts "
                                 f"({type(module).__name__}, {held}): quantizing their codes again would round the "
                                 f"weights twice. Pass fp8={held!r} to keep them, or convert a model holding the "
                                 f"high-precision weights")
            continue
        if isinstance(module, fp8_linear):
            held = module.recipe
        elif _hf_classes.class_key(module) == HF_FP8_LINEAR and why_not_hf_fp8(module) is None:
            held = "blockwise"  # convert gives it a blockwise Fp8Linear.from_fp8
        else:
            continue
        if held != recipe:
            raise ValueError(f"ops.nn.convert: fp8={recipe!r}, but {name or '(model)'} is already FP8 "
                             f"({type(module).__name__}, {held}): quantizing its codes again would round the weights "
                             f"twice. Pass fp8={held!r} to keep them, or convert a model holding the high-precision "
                             f"weights")
