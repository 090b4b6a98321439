"""Which modules ``ops.nn.convert`` may replace one for one, the reasons it leaves the others alone
(listed in its report), and what a replacement keeps of the module it replaces.
"""

import numbers
import sys
from typing import Optional

import torch
from torch._subclasses.fake_tensor import FakeTensor as _FakeTensor

from . import _hf_classes, _library, recipes as _recipes

HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks",
              "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")

DTENSOR_PARAMS = ("its parameters are DTensors (parallelize_module or fully_shard ran): run ops.nn.convert before "
                  "parallelizing")
COMPILED_IN_PLACE = "is compiled in place (module.compile()); convert before compiling"

HF_CONV1D = ("transformers.pytorch_utils", "Conv1D")
CONV1D = ("transformers' Conv1D (GPT-2 family): a linear layer whose weight is stored (in, out), not an "
          "nn.Linear; swapping it would change the state_dict")


def copy_instance_attributes(source: torch.nn.Module, target: torch.nn.Module) -> None:
    """Instance attributes of `source` that `target` lacks (flags such as transformers'
    ``_is_hf_initialized``, ``qconfig``): code may read them. Not those `target`'s class computes
    (a norm's ``variance_epsilon`` is RMSNorm's eps): a copy would go stale."""
    for name, value in vars(source).items():
        if (name not in vars(target) and name != "_compiled_call_impl"
                and not isinstance(getattr(type(target), name, None), property)):
            vars(target)[name] = value


def norm_list(module: torch.nn.Module) -> Optional[_hf_classes.ClassList]:
    """The transformers RMSNorm list naming the module's class, if any."""
    key = _hf_classes.class_key(module)
    return next((c for c in (_hf_classes.RMS_NORM_LLAMA, _hf_classes.RMS_NORM_CAST) if key in c), None)


def is_rms_norm(module: torch.nn.Module) -> bool:
    """torch.nn.RMSNorm itself (a subclass may compute something else), or a listed transformers RMSNorm
    that still runs its list's formula, with a 1-D weight Parameter and a float ``variance_epsilon``."""
    if type(module) is torch.nn.RMSNorm:
        return True
    classes = norm_list(module)
    if classes is None or _hf_classes.formula_changed(type(module), classes) is not None:
        return False
    weight = module._parameters.get("weight")
    return (isinstance(weight, torch.nn.Parameter) and not isinstance(weight, torch.nn.UninitializedParameter)
            and weight.dim() == 1 and isinstance(getattr(module, "variance_epsilon", None), numbers.Real))


def _has_dtensor_parameters(module: torch.nn.Module) -> bool:
    dtensor = sys.modules.get("torch.distributed.tensor")  # not imported: no DTensor exists
    return dtensor is not None and any(isinstance(p, dtensor.DTensor) for p in module._parameters.values())


def why_hooked(module: torch.nn.Module) -> Optional[str]:
    """The hooks a module has, as a reason to leave it alone, or None."""
    hooks = [name for name in HOOK_DICTS if getattr(module, name, None)]
    return f"has hooks ({', '.join(hooks)})" if hooks else None


def why_not_plain(module: torch.nn.Module) -> Optional[str]:
    """None for a module convert may replace: no hooks, only its own ``weight``/``bias`` Parameters (a
    pruned or old-style weight-normed module computes its weight in a forward pre-hook from other
    parameters, which a replacement would lose) and no child modules. Otherwise the reason it is left
    alone."""
    if _has_dtensor_parameters(module):
        return DTENSOR_PARAMS
    if (why := why_hooked(module)) is not None:
        return why
    if "forward" in vars(module):
        return "has a forward of its own (set on the instance)"
    if getattr(module, "_compiled_call_impl", None) is not None:  # module.compile(): runs that code instead
        return COMPILED_IN_PLACE
    extra = sorted(set(module._parameters) - {"weight", "bias"}) + sorted(module._buffers)
    if extra:
        return f"has other parameters or buffers ({', '.join(extra)})"
    if module._modules:  # the replacement would drop them (and their state_dict entries)
        return f"has child modules ({', '.join(module._modules)})"
    if "weight" not in module._parameters:
        return "its weight is not a Parameter"
    for pname in ("weight", "bias"):  # a subclass may compute F.linear (or the norm) its own way
        param = module._parameters.get(pname)
        if not (_recipes._plain_tensor(param) or type(param) is _FakeTensor):  # fake ones only propagate shapes
            return f"its {pname} is a tensor subclass ({type(param).__name__})"
    weight = module._parameters["weight"]
    if weight is not None and weight.dtype not in _library.GEMM_DTYPES:
        return f"its weight's dtype {weight.dtype} is not one the ops take"
    return None
