"""Clear errors for jagged nested tensors (``torch.nested.nested_tensor(..., layout=torch.jagged)``).

Strided nested tensors dispatch to the NestedTensor keys, where csrc/layout_errors.cpp names the argument
and what to do. Jagged ones are a Python tensor subclass instead: they never reach that kernel, and their
``__torch_dispatch__`` raises a bare ``NotImplementedError: ops.linear.default`` for an op it does not
know. A torch_dispatch rule per op (``torch.library.register_torch_dispatch``) gives them the C++ kernel's
message, at no cost to any other call. (rms_norm also needs a check in its Python wrapper: the subclass's
``__torch_function__`` recognises any function named "rms_norm" as torch's and fails before dispatch.)
"""

import torch

CATALOGUE = ("cutlass_gemm", "linear", "rms_norm", "fused_add_rms_norm", "silu_and_mul", "grouped_gemm", "scaled_gemm",
             "scaled_grouped_gemm", "quantize_fp8", "rms_norm_fp8", "fused_add_rms_norm_fp8", "silu_and_mul_fp8")


def message(op: str, name: str) -> str:
    """The error for argument `name` of `op` (e.g. "cutlass_gemm.out") being a nested tensor: the words of
    csrc/layout_errors.cpp (non_strided_kind). TorchScript compiles it (rms_norm's wrapper calls it)."""
    return (op + ": expected " + name + " to be a dense (strided) tensor, got a nested tensor; pass its "
            "components (.unbind()) or a padded tensor (.to_padded_tensor(0))")


def _refuse(mode_or_subclass, func, types, args=(), kwargs=None):
    bound = dict(zip((a.name for a in func._schema.arguments), args))
    bound.update(kwargs or {})
    op = func._schema.name.split("::")[-1] + (f".{func._overloadname}" if func._overloadname != "default" else "")
    for argument in func._schema.arguments:
        value = bound.get(argument.name)
        if isinstance(value, torch.Tensor) and value.is_nested:
            raise RuntimeError(message(op, argument.name))
    raise RuntimeError(f"{op}: expected dense (strided) tensors; got {', '.join(t.__name__ for t in types)}")


def register() -> None:
    """Registers the rule for every overload of the catalogue's ops (where torch has jagged tensors)."""
    try:
        from torch.nested._internal.nested_tensor import NestedTensor
    except ImportError:  # a torch without jagged nested tensors: nothing to do
        return
    for name in CATALOGUE:
        packet = getattr(torch.ops.ops, name)
        for overload in packet.overloads():
            torch.library.register_torch_dispatch(getattr(packet, overload), NestedTensor, _refuse)
