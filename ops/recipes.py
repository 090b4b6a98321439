"""Block recipes: for blocks whose whole forward is known, by class, an exact fused forward.

A recipe replaces one block's ``forward`` (on the instance, as Liger-Kernel's module patches do) and
nothing else: the block keeps its submodules, parameters and ``state_dict`` keys, and each submodule
called on its own computes what it did. The fused forward reads the submodules' weights, so it checks
at every call that they are still what the recipe was written for (exact Linear classes without hooks,
a known activation, no global module hooks, plain tensors); otherwise it runs the class's own forward.
The classes are listed by name (``ops._hf_classes``: every transformers class whose own forward is the
reference class's); tests/test_models.py runs each against its stock output and gradients.

* ``dense_act`` (BertIntermediate's forward): ``intermediate_act_fn(dense(x))`` becomes one
  ``ops.linear(x, W, b, activation)``: on CUDA, for float16 and bfloat16, a CUTLASS GEMM with the bias and
  activation in its epilogue (not run on a GPU).
* ``gated_mlp`` (LlamaMLP's forward: Llama, Qwen, Mistral, Gemma, ...): ``down(act(gate(x)) * up(x))``.
  With SiLU, the gate and up GEMMs write the two halves of one (..., 2 * intermediate) tensor (no
  concatenation copy for bias-free projections) that ``ops.silu_and_mul`` reads; with another activation
  (Gemma's GELU-tanh), the gate GEMM runs ``ops.linear`` with that activation (on CUDA in its epilogue).
  Under torch.compile it runs the class's
  forward, whose activation and product Inductor fuses into one kernel itself (Dynamo does not take the
  strided out tensors the half-writes use).
* ``gate_up_mlp`` (Phi3MLP's forward: Phi-3, GLM, ...): ``gate, up = gate_up_proj(x).chunk(2)``;
  ``down(up * act(gate))`` with SiLU is ``down(ops.silu_and_mul(gate_up_proj(x)))``.
"""

import copy
import functools
from typing import Callable, Dict, Optional

import torch

from . import _hf_classes, fused, gemm
from .linear import ACTIVATIONS, linear

__all__ = ["RECIPES", "activation_of", "apply"]

# The Linear classes that compute F.linear(x, weight, bias) (ops.nn.Linear with activation "none"), by
# (module, qualname) as _hf_classes lists classes: ops.nn, which defines ops.nn.Linear, imports this module.
_PLAIN_LINEAR = (("torch.nn.modules.linear", "Linear"), ("ops.nn", "Linear"))


def activation_of(module) -> Optional[str]:
    """The ``ops.linear`` activation an activation module computes, or None: exact torch.nn ReLU, GELU
    and SiLU classes and transformers' classes that call the ATen function (NewGELUActivation and the
    Python-formula GELUs round op by op, so they are not listed)."""
    key = _hf_classes.class_key(module) if isinstance(module, torch.nn.Module) else None
    if key is None or _has_hooks(module):
        return None
    cls = type(module)
    if cls is torch.nn.ReLU:
        return "relu"
    if cls is torch.nn.GELU:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(module.approximate)
    if cls is torch.nn.SiLU:
        return "silu"
    if key == ("transformers.activations", "SiLUActivation"):
        return "silu"
    act = vars(module).get("act")
    if key == ("transformers.activations", "GELUActivation") and act is torch.nn.functional.gelu:
        return "gelu"
    if (key == ("transformers.activations", "GELUTanh") and isinstance(act, functools.partial)
            and act.func is torch.nn.functional.gelu and not act.args and act.keywords == {"approximate": "tanh"}):
        return "gelu_tanh"
    return None


_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks")


def _has_hooks(module) -> bool:
    return any(getattr(module, name, None) for name in _HOOKS)


def _global_hooks() -> bool:
    return any(getattr(torch.nn.modules.module, name, None) for name in _GLOBAL_HOOKS)


def _plain_linear(module) -> bool:
    """A Linear whose call is F.linear(x, weight, bias): an exact listed class, no activation, no hooks,
    no parameters, buffers or children besides weight and bias (pruning and weight norm add some)."""
    return ((type(module).__module__, type(module).__qualname__) in _PLAIN_LINEAR
            and getattr(module, "activation", "none") == "none"
            and not _has_hooks(module) and "forward" not in vars(module) and not module._modules
            and not module._buffers and set(module._parameters) <= {"weight", "bias"})


def _plain_tensor(t) -> bool:
    return t is None or type(t) in (torch.Tensor, torch.nn.Parameter)


def _linears_ready(block, names, x) -> bool:
    """Whether the fused forward may read these Linear children's weights in place of calling them."""
    if _global_hooks() or not _plain_tensor(x):
        return False
    for name in names:
        child = block._modules.get(name)
        if not _plain_linear(child) or not (_plain_tensor(child.weight) and _plain_tensor(child.bias)):
            return False
        if child.weight.dtype != x.dtype or child.weight.dtype not in gemm._GEMM_DTYPES or \
                (child.bias is not None and child.bias.dtype != x.dtype):
            return False  # F.linear would raise or promote; the class's forward says what happens
    return True


class _GateUp(torch.autograd.Function):
    """[x W_g^T + b_g, x W_u^T + b_u] as one (M, 2 * d) tensor: two GEMMs write its halves (a half with a
    bias is ``ops.linear``'s, copied: the bias added before the one rounding, as F.linear adds it)."""

    @staticmethod
    def forward(ctx, x, w_gate, b_gate, w_up, b_up):
        d = w_gate.shape[0]
        out = x.new_empty(x.shape[0], 2 * d)
        for half, w, b in ((out[:, :d], w_gate, b_gate), (out[:, d:], w_up, b_up)):
            if b is None:
                gemm.cutlass_gemm(x, w.t(), out=half)
            else:
                half.copy_(linear(x, w, b))
        ctx.save_for_backward(x, w_gate, w_up)
        ctx.biases = (b_gate is not None, b_up is not None)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, w_gate, w_up = ctx.saved_tensors
        d = w_gate.shape[0]
        g_gate, g_up = grad[:, :d], grad[:, d:]
        dx = dw_gate = dw_up = db_gate = db_up = None
        if ctx.needs_input_grad[0]:
            dx = gemm.cutlass_gemm(g_gate, w_gate) + gemm.cutlass_gemm(g_up, w_up)
        if ctx.needs_input_grad[1]:
            dw_gate = gemm.cutlass_gemm(g_gate.t(), x)
        if ctx.needs_input_grad[3]:
            dw_up = gemm.cutlass_gemm(g_up.t(), x)
        if ctx.biases[0] and ctx.needs_input_grad[2]:
            db_gate = g_gate.sum(0)
        if ctx.biases[1] and ctx.needs_input_grad[4]:
            db_up = g_up.sum(0)
        return dx, dw_gate, db_gate, dw_up, db_up


def _gate_up(x, gate, up):
    x2d = x.reshape(-1, x.shape[-1])
    out = _GateUp.apply(x2d, gate.weight, gate.bias, up.weight, up.bias)
    return out.view(*x.shape[:-1], out.shape[-1])


def _dense_act_forward(self, hidden_states):
    act = activation_of(self.intermediate_act_fn)
    if act is None or not _linears_ready(self, ("dense",), hidden_states):
        return type(self).forward(self, hidden_states)
    return linear(hidden_states, self.dense.weight, self.dense.bias, act)


def _transformed(*tensors) -> bool:
    """torch.func transforms (grad, vmap, jvp, ...) or forward-mode dual tensors: _GateUp, written for
    reverse-mode autograd, steps aside."""
    return torch._C._are_functorch_transforms_active() or any(
        t is not None and torch.autograd.forward_ad.unpack_dual(t).tangent is not None for t in tensors)


def _autocast(x) -> bool:
    """Whether autocast is on for x's device type (torch.is_autocast_enabled raises for a device type
    autocast does not know, such as meta)."""
    device_type = x.device.type
    return torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)


def _gated_mlp_forward(self, x):
    act = activation_of(self.act_fn)
    if (act is None or torch.compiler.is_compiling() or torch.jit.is_tracing()  # _GateUp: a Python op a trace cannot save
            or not _linears_ready(self, ("gate_proj", "up_proj", "down_proj"), x)
            or _autocast(x)  # the half-writes' out tensors have x's dtype
            or _transformed(x, self.gate_proj.weight, self.gate_proj.bias, self.up_proj.weight, self.up_proj.bias)):
        return type(self).forward(self, x)
    if act == "silu":
        h = fused.silu_and_mul(_gate_up(x, self.gate_proj, self.up_proj))
    else:
        h = linear(x, self.gate_proj.weight, self.gate_proj.bias, act) * self.up_proj(x)
    return self.down_proj(h)


def _gate_up_mlp_forward(self, hidden_states):
    if (activation_of(self.activation_fn) != "silu"
            or not _linears_ready(self, ("gate_up_proj", "down_proj"), hidden_states)):
        return type(self).forward(self, hidden_states)
    return self.down_proj(fused.silu_and_mul(self.gate_up_proj(hidden_states)))


class Recipe:
    """A fused forward for the listed block classes, and what a block must hold for it to apply."""

    def __init__(self, name: str, forward: Callable, classes: _hf_classes.ClassList, linears, activation: str, acts):
        self.name, self.forward, self.classes = name, forward, classes
        self.linears, self.activation, self.acts = linears, activation, acts

    def why_not(self, block) -> Optional[str]:
        """None if the recipe applies to this block now, else the reason."""
        changed = _hf_classes.formula_changed(type(block), self.classes)
        if changed is not None:
            return changed
        for name in self.linears:
            part = block._modules.get(name)
            if not _plain_linear(part):
                return (f"{name} is not a plain Linear ({type(part).__name__}; the recipe fuses an nn.Linear or "
                        "ops.nn.Linear without hooks, extra parameters or an activation)")
        act = activation_of(block._modules.get(self.activation))
        if act not in self.acts:
            return f"its {self.activation} is not one of the activations the recipe knows ({', '.join(self.acts)})"
        return None


_FUSED_ACTIVATIONS = tuple(a for a in ACTIVATIONS if a != "none")  # the ones an activation module computes

RECIPES: Dict[str, Recipe] = {r.name: r for r in (
    Recipe("dense_act", _dense_act_forward, _hf_classes.DENSE_ACT, ("dense",), "intermediate_act_fn",
           _FUSED_ACTIVATIONS),
    Recipe("gated_mlp", _gated_mlp_forward, _hf_classes.GATED_MLP, ("gate_proj", "up_proj", "down_proj"), "act_fn",
           _FUSED_ACTIVATIONS),
    Recipe("gate_up_mlp", _gate_up_mlp_forward, _hf_classes.GATE_UP_MLP, ("gate_up_proj", "down_proj"),
           "activation_fn", ("silu",)),
)}


def recipe_for(block) -> Optional[Recipe]:
    """The recipe listing the block's class, if the block runs its class's forward (also when bound on the
    instance) or a recipe's (convert ran before)."""
    key = _hf_classes.class_key(block, accept=tuple(r.forward for r in RECIPES.values()))
    return next((r for r in RECIPES.values() if key in r.classes), None)


def _without_recipe(block):
    """What torch.jit.script compiles for a block with a recipe (its ``__prepare_scriptable__``): a shallow
    copy running the class's forward, which computes the same (TorchScript compiles no partial)."""
    copy_ = copy.copy(block)
    copy_.__dict__ = {k: v for k, v in vars(block).items() if k not in ("forward", "__prepare_scriptable__")}
    return copy_


def apply(block, recipe: Recipe) -> None:
    """Set ``block.forward`` to ``functools.partial(recipe.forward, block)``: a partial of a module-level
    function pickles by the function's name and the block, so ``torch.save`` / ``pickle`` and
    ``copy.deepcopy`` bring the block back with its recipe (a bound method of a function the class does
    not have would not unpickle). torch.jit.script compiles the class's forward instead."""
    block.forward = functools.partial(recipe.forward, block)
    block.__prepare_scriptable__ = functools.partial(_without_recipe, block)
