"""Mixture-of-experts models on ``ops.grouped_gemm``: an experts implementation named "ops" for transformers'
experts interface (``transformers.integrations.moe``), which every transformers MoE model (Qwen3-MoE,
Mixtral, OLMoE, DeepSeek-V3, GPT-OSS, ...) calls for its experts.

    import ops                                 # registers "ops" once transformers' interface is imported
    model.set_experts_implementation("ops")    # or ops.nn.convert(model), which reports the experts

The implementation computes what transformers' "grouped_mm" one does (tokens sorted by expert, one grouped
GEMM up and one down, the routing weights, the tokens put back), on ``ops.grouped_gemm`` and, for the
default gate with SiLU, ``ops.silu_and_mul``; other gates, activations, biases, post-expert norms and
expert-parallel sentinels as the experts class defines them.
"""

import importlib.abc
import importlib.util
import sys

import torch

from . import fused as _fused
from .grouped import grouped_gemm
from .recipes import activation_of

__all__ = ["NAME", "experts_forward", "register"]

NAME = "ops"
FP8_EXPERTS = "FP8 experts (transformers' FP8Experts): ops has no FP8 grouped GEMM; left on transformers' implementation"
_MOE_MODULE = "transformers.integrations.moe"


def _default_gate(module) -> bool:
    """Whether the module gates with transformers' default (chunk into gate and up, act(gate) * up) and SiLU:
    then ``ops.silu_and_mul`` computes it. (By name: no import where torch.compile traces, which torch 2.11
    refuses.)"""
    gate = getattr(type(module), "_apply_gate", None)
    return (getattr(gate, "__module__", None) == _MOE_MODULE and getattr(gate, "__name__", None) == "_default_apply_gate"
            and activation_of(getattr(module, "act_fn", None)) == "silu")


def _grouped_linear(x, weight, offs, bias, bias_index, transposed):
    """x (S, in) times one weight per expert: (E, in, out) if `transposed`, else (E, out, in)."""
    out = grouped_gemm(x.to(weight.dtype), weight if transposed else weight.transpose(-2, -1), offs)
    return out if bias is None else out + bias[bias_index]


def experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts of a transformers MoE layer on ``ops.grouped_gemm``: hidden_states (T, H), the top-k
    experts of each token and their routing weights (T, k); returns (T, H)."""
    num_tokens, hidden = hidden_states.shape[0], hidden_states.shape[-1]
    k = top_k_index.shape[-1]
    expert_ids, order = torch.sort(top_k_index.reshape(-1))
    x = hidden_states[order // k]
    weights = top_k_weights.reshape(-1)[order]
    # Tokens per expert with a fixed number of bins (no data-dependent shape); ids past the last expert
    # (expert-parallel sentinels) fall in no bin and sort last: rows past offs[-1], which grouped_gemm
    # leaves zero. histc counts floats on CPU and MPS, ints on CUDA (deterministic algorithms).
    counts = torch.histc(expert_ids.float() if x.device.type in ("cpu", "mps") else expert_ids.int(),
                         bins=self.num_experts, min=0, max=self.num_experts - 1)
    offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
    sentinel = None
    if getattr(self, "_is_expert_parallel", False):
        sentinel = (expert_ids >= self.num_experts).unsqueeze(-1)
        expert_ids = expert_ids.clamp(max=self.num_experts - 1)  # in bounds for the bias gather
    has_bias, transposed = getattr(self, "has_bias", False), getattr(self, "is_transposed", False)
    if getattr(self, "has_gate", True):
        up, up_bias = self.gate_up_proj, getattr(self, "gate_up_proj_bias", None) if has_bias else None
    else:
        up, up_bias = self.up_proj, getattr(self, "up_proj_bias", None) if has_bias else None
    h = _grouped_linear(x, up, offs, up_bias, expert_ids, transposed)
    if sentinel is not None and up_bias is not None:
        h = h.masked_fill(sentinel, 0.0)
    if not getattr(self, "has_gate", True):
        h = self.act_fn(h)
    elif _default_gate(self):
        h = _fused.silu_and_mul(h)
    else:
        h = self._apply_gate(h)
    down_bias = getattr(self, "down_proj_bias", None) if has_bias else None
    h = _grouped_linear(h, self.down_proj, offs, down_bias, expert_ids, transposed)
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
    """Registers ``experts_forward`` as transformers' experts implementation "ops" (idempotent)."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(NAME, experts_forward)


def is_experts(module: torch.nn.Module) -> bool:
    """Whether `module` is a transformers experts module (its class dispatches through the experts
    interface, ``use_experts_implementation``)."""
    return (hasattr(module, "is_transposed") and hasattr(module, "has_gate") and hasattr(module, "down_proj")
            and hasattr(getattr(module, "config", None), "_experts_implementation"))


def has_fp8_weights(module: torch.nn.Module) -> bool:
    """Whether an experts module holds FP8 weights (transformers' FP8Experts: fine-grained FP8 checkpoints),
    which ``experts_forward`` (bf16/fp16/fp32 ``grouped_gemm``) does not take."""
    return any(p.dtype.is_floating_point and p.dtype.itemsize == 1 for p in module.parameters(recurse=False))


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Registers the implementation right after transformers' interface module is imported (a model class
    imports it), so ``import ops`` before transformers needs no ``register()`` call and ``import ops`` costs
    no transformers import."""

    def find_spec(self, name, path=None, target=None):
        if name != _MOE_MODULE:
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
    elif not any(isinstance(finder, _RegisterAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())
