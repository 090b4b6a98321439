"""nn modules over the ops, and ``convert(model)`` to put them into an existing model.

* ``Linear``: a drop-in ``torch.nn.Linear`` (same parameters and ``state_dict`` keys; it is a subclass)
  whose forward is ``ops.linear``, with an optional fused activation.
* ``RMSNorm``: a drop-in ``torch.nn.RMSNorm`` (1-D normalized shape) whose forward is ``ops.rms_norm``.
* ``convert(model)``: swaps matching modules in place, sharing their parameters, and fuses a Linear with
  the activation module that follows it where the model's structure makes that safe (see convert).
"""

import ast
import builtins
import collections
import copy
import dataclasses
import functools
import inspect
import numbers
import textwrap
import threading
import types
import weakref
from typing import List, Optional, Tuple

import torch
import torch.fx

from . import fused, linear as _linear

__all__ = ["Linear", "RMSNorm", "convert", "ConversionReport"]

_NOT_GLOBAL = object()  # a name that is local, or not defined anywhere

# torch.fx's Tracer.trace patches torch.nn.Module.__call__ / __getattr__ on the class for the duration of a
# trace: two traces at once restore them out of order (leaving a dead tracer's wrapper installed for the
# whole process). convert's traces take turns; other threads must not run module code meanwhile (convert).
_TRACE_LOCK = threading.Lock()


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` computing ``activation(x @ weight.T + bias)`` with ``ops.linear``.

    Args: as ``torch.nn.Linear``, plus ``activation``: "none", "relu", "gelu", "gelu_tanh" or "silu".
    Parameters and ``state_dict`` keys (``weight`` (out, in), ``bias`` (out,)) are nn.Linear's. Under
    ``torch.autocast`` it runs in the autocast dtype, as nn.Linear does. Real floating dtypes only
    (float16, bfloat16, float32, float64) and dense tensors (no complex, sparse or nested inputs, which
    torch.nn.Linear takes): ``ops.linear`` raises for those.
    """

    __constants__ = torch.nn.Linear.__constants__ + ["activation"]

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 activation: str = "none"):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        if activation not in _linear.ACTIVATIONS:
            raise ValueError(f"ops.nn.Linear: activation must be one of {_linear.ACTIVATIONS}, got {activation!r}")
        self.activation = activation

    def forward(self, input: torch.Tensor) -> torch.Tensor:
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
        _copy_instance_attributes(module, new)
        return new


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
    if weight is None:
        return fused.rms_norm(x, torch.ones(x.shape[-1:], dtype=x.dtype, device=x.device), eps)
    if weight.dtype == x.dtype:
        return fused.rms_norm(x, weight, eps)
    if promote_weight_dtype:  # Hugging Face Llama: weight * x_hat rounded to x's dtype
        return weight * fused.rms_norm(x, torch.ones(x.shape[-1:], dtype=x.dtype, device=x.device), eps)
    # Mixed dtypes otherwise: computed in the wider one (the weight is not rounded), output in x's.
    wide = torch.promote_types(x.dtype, weight.dtype)
    return fused.rms_norm(x.to(wide), weight.to(wide), eps).to(x.dtype)


class RMSNorm(torch.nn.RMSNorm):
    """``torch.nn.RMSNorm`` over the last dimension with ``ops.rms_norm``: y = x / sqrt(mean(x^2) + eps) * weight
    (Zhang and Sennrich 2019), statistics in float32 for half types. A subclass of torch.nn.RMSNorm.

    Args:
        normalized_shape: the hidden size (an int, or a 1-element shape).
        eps: as torch.nn.RMSNorm; None means the float32 machine epsilon (float64's for float64 input),
            which is what torch.nn.RMSNorm computes with.
        elementwise_affine: learnable ``weight`` (hidden,), initialised to ones; without it, ones are used.

    Input (*, hidden), output of the input's shape and dtype: a weight of another dtype is cast to the
    input's, as torch.nn.RMSNorm's output also has the input's dtype. Converted from a Hugging Face
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
        self.promote_weight_dtype = False

    __jit_unused_properties__ = ["variance_epsilon"]

    @property
    def variance_epsilon(self) -> Optional[float]:
        """``eps`` under the name Hugging Face norms give it: code that reads or sets a converted norm's
        ``variance_epsilon`` keeps working (and a new value is used)."""
        return self.eps

    @variance_epsilon.setter
    def variance_epsilon(self, value: Optional[float]) -> None:
        self.eps = value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _rms_norm_module_forward(x, self.weight, self.eps, self.normalized_shape[0], self.promote_weight_dtype)

    @classmethod
    def from_module(cls, module: torch.nn.Module) -> "RMSNorm":
        """From ``torch.nn.RMSNorm`` or a Hugging Face RMSNorm whose formula ``_hf_rms_norm_formula``
        recognizes, sharing its weight (no copy) and keeping its other instance attributes."""
        weight = getattr(module, "weight", None)
        hidden = getattr(module, "normalized_shape", None) or (weight.shape[0],)
        eps = getattr(module, "eps", getattr(module, "variance_epsilon", None))
        new = cls(hidden, eps=eps, elementwise_affine=False)
        new.elementwise_affine = weight is not None
        new.register_parameter("weight", weight)
        new.promote_weight_dtype = _hf_rms_norm_formula(module) == "llama"
        new.train(module.training)
        _copy_instance_attributes(module, new)
        return new


def _copy_instance_attributes(source: torch.nn.Module, target: torch.nn.Module) -> None:
    """Instance attributes of `source` that `target` lacks (flags such as transformers'
    ``_is_hf_initialized``, ``qconfig``): code may read them. Not those `target`'s class computes
    (a norm's ``variance_epsilon`` is RMSNorm's eps): a copy would go stale."""
    for name, value in vars(source).items():
        if (name not in vars(target) and name != "_compiled_call_impl"
                and not isinstance(getattr(type(target), name, None), property)):
            vars(target)[name] = value


def _hf_forward_signature(forward: str) -> str:
    return f"def forward(self, hidden_states):\n{forward}"


# Hugging Face RMSNorm forwards (transformers 4.x-5.x; ~150 classes share them), by what they compute
# with a weight of another dtype than the input: "llama" returns weight * x_hat rounded to the input's
# dtype (promoted output dtype); "cast" rounds weight * x_hat to the input's dtype.
_HF_RMS_NORM_BODY = """
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return {}
"""
_HF_RMS_NORM_FORMULAS = {
    "self.weight * hidden_states.to(input_dtype)": "llama",
    "(self.weight * hidden_states).to(input_dtype)": "cast",
    "(self.weight.to(torch.float32) * hidden_states).to(input_dtype)": "cast",
}


def _normalized_forward(function: ast.FunctionDef) -> Optional[str]:
    """ast.dump of a forward(self, x) body with its two parameters renamed to self and hidden_states."""
    args = function.args
    if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs or len(args.args) != 2 or function.decorator_list:
        return None
    renames = {args.args[0].arg: "self", args.args[1].arg: "hidden_states"}

    class _Rename(ast.NodeTransformer):
        def visit_Name(self, node):
            return ast.copy_location(ast.Name(id=renames.get(node.id, node.id), ctx=node.ctx), node)

    body = [_Rename().visit(copy.deepcopy(statement)) for statement in function.body]  # the parse is shared
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]  # a docstring
    return "\n".join(ast.dump(statement) for statement in body)


_HF_RMS_NORM_DUMPS = {
    _normalized_forward(ast.parse(_hf_forward_signature(_HF_RMS_NORM_BODY.format(ret))).body[0]): kind
    for ret, kind in _HF_RMS_NORM_FORMULAS.items()
}


def _cached_per_function(fn):
    """lru_cache keyed by a forward function object, not by its class: a class whose forward is replaced
    later (monkey-patching libraries do that) gets its new forward parsed, never the old one's verdict.
    Unhashable callables are not cached."""
    cached = functools.lru_cache(maxsize=None)(fn)

    @functools.wraps(fn)
    def wrapper(forward):
        try:
            return cached(forward)
        except TypeError:
            return fn(forward)

    return wrapper


@_cached_per_function
def _parsed_forward(forward) -> Optional[ast.FunctionDef]:
    """The parsed source of a forward function (callers must not modify it), or None when it has no
    source or is not a plain function definition."""
    code = getattr(forward, "__code__", None)  # the code that runs (getsource would follow __wrapped__)
    if code is None:
        return None
    try:
        function = ast.parse(textwrap.dedent(inspect.getsource(code))).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    return function if isinstance(function, ast.FunctionDef) else None


@_cached_per_function
def _hf_forward_formula(forward) -> Optional[str]:
    function = _parsed_forward(forward)
    return None if function is None else _HF_RMS_NORM_DUMPS.get(_normalized_forward(function))


def _hf_rms_norm_formula(module: torch.nn.Module) -> Optional[str]:
    """"llama" or "cast" for a transformers RMSNorm whose forward is one of the known formulas (checked
    from its source: the class name alone says nothing of Gemma's 1 + weight or other variants), else
    None."""
    cls = type(module)
    if "forward" in vars(module) or not cls.__module__.startswith("transformers."):
        return None
    return _hf_forward_formula(cls.forward)


def _activation_name(module: torch.nn.Module) -> Optional[str]:
    """The ops.linear activation a module computes, or None: exact torch.nn ReLU, GELU and SiLU classes
    (a subclass may compute something else) and transformers' activation classes (matched by module
    path and name, so transformers need not be installed)."""
    cls = type(module)
    if "forward" in vars(module):
        return None
    forward = getattr(cls, "forward", None)  # the class's own, not one patched onto the class
    if getattr(forward, "__qualname__", None) != f"{cls.__name__}.forward" or forward.__module__ != cls.__module__:
        return None
    if cls is torch.nn.ReLU:
        return "relu"
    if cls is torch.nn.GELU:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(module.approximate)
    if cls is torch.nn.SiLU:
        return "silu"
    if not cls.__module__.startswith("transformers."):
        return None
    if cls.__name__ == "GELUActivation" and getattr(module, "act", None) in (None, torch.nn.functional.gelu):
        return "gelu"
    if cls.__name__ in ("GELUTanh", "PytorchGELUTanh", "GELUPytorchTanh"):
        act = getattr(module, "act", None)  # F.gelu(approximate="tanh"), unless built with the Python formula
        if (isinstance(act, functools.partial) and act.func is torch.nn.functional.gelu and not act.args
                and act.keywords == {"approximate": "tanh"}):
            return "gelu_tanh"
        return None
    # NewGELUActivation computes the tanh formula op by op, rounding in the tensor's dtype: fused, half
    # precision results would differ by far more than a rounding. Not fused.
    if cls.__name__ == "SiLUActivation":
        return "silu"
    return None


def _is_rms_norm(module: torch.nn.Module) -> bool:
    """torch.nn.RMSNorm itself (a subclass may compute something else) over one dimension, or a
    transformers RMSNorm with a 1-D weight, a ``variance_epsilon`` and a forward of a known formula
    (Gemma's, which scales by 1 + weight, is not one)."""
    if type(module) is torch.nn.RMSNorm:
        return len(module.normalized_shape) == 1
    weight = getattr(module, "weight", None)
    return (isinstance(weight, torch.nn.Parameter) and not isinstance(weight, torch.nn.UninitializedParameter)
            and weight.dim() == 1 and hasattr(module, "variance_epsilon") and _hf_rms_norm_formula(module) is not None)


# Per-module hook registries of torch.nn.Module (global hooks apply to every module alike).
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks",
               "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")


def _why_not_plain(module: torch.nn.Module) -> Optional[str]:
    """None for a module convert may replace: no hooks, only its own ``weight``/``bias`` Parameters (a
    pruned or old-style weight-normed module computes its weight in a forward pre-hook from other
    parameters, which a replacement would lose) and no child modules. Otherwise the reason it is left
    alone."""
    hooks = [name for name in _HOOK_DICTS if getattr(module, name, None)]
    if hooks:
        return f"has hooks ({', '.join(hooks)})"
    if "forward" in vars(module):
        return "has a forward of its own (set on the instance)"
    if getattr(module, "_compiled_call_impl", None) is not None:  # module.compile(): runs that code instead
        return "is compiled in place (module.compile()); convert before compiling"
    extra = sorted(set(module._parameters) - {"weight", "bias"}) + sorted(module._buffers)
    if extra:
        return f"has other parameters or buffers ({', '.join(extra)})"
    if module._modules:  # the replacement would drop them (and their state_dict entries)
        return f"has child modules ({', '.join(module._modules)})"
    if "weight" not in module._parameters:
        return "its weight is not a Parameter"
    weight = module._parameters["weight"]
    if weight is not None and weight.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        return f"its weight's dtype {weight.dtype} is not one the ops take"
    return None


# What a straight-line forward may use besides its child modules: allow-lists (anything else, a helper
# function, a method of some object, getattr, operator.*, a grad-mode switch, an attribute of self other
# than the training flag, makes the parent unfusable). In-place tensor methods are not listed.
_ALLOWED_FUNCTIONS = {
    "torch": {"cat", "concat", "concatenate", "stack", "matmul", "mm", "bmm", "einsum", "add", "sub", "mul", "div",
              "neg", "pow", "sqrt", "rsqrt", "exp", "log", "tanh", "sigmoid", "relu", "erf", "sin", "cos", "abs",
              "square", "clamp", "maximum", "minimum", "where", "mean", "sum", "amax", "amin", "cumsum", "softmax",
              "log_softmax", "transpose", "permute", "reshape", "flatten", "squeeze", "unsqueeze", "chunk", "split",
              "narrow", "tril", "triu", "outer", "zeros_like", "ones_like", "full_like", "layer_norm", "rms_norm",
              "baddbmm", "addmm"},
    "torch.nn.functional": {"relu", "gelu", "silu", "sigmoid", "tanh", "softmax", "log_softmax", "dropout", "glu",
                            "mish", "hardswish", "leaky_relu", "elu", "softplus", "layer_norm", "rms_norm",
                            "group_norm", "normalize", "linear", "pad", "embedding", "scaled_dot_product_attention"},
    "math": {"sqrt", "log", "exp", "floor", "ceil"},
}
_ALLOWED_BUILTINS = {"len", "int", "float", "min", "max", "abs"}  # not tuple/list: containers hide uses
_TENSOR_METHODS = {
    "view", "view_as", "reshape", "reshape_as", "transpose", "permute", "contiguous", "size", "dim", "numel", "chunk",
    "split", "flatten", "unflatten", "unsqueeze", "squeeze", "expand", "expand_as", "float", "half", "bfloat16",
    "double", "to", "type_as", "mean", "sum", "pow", "sqrt", "rsqrt", "exp", "log", "tanh", "sigmoid", "relu",
    "softmax", "log_softmax", "matmul", "mul", "add", "sub", "div", "neg", "abs", "square", "sin", "cos", "clamp",
    "masked_fill", "narrow", "select", "t", "repeat", "repeat_interleave", "gather", "index_select", "amax", "amin",
    "max", "min", "norm", "tril", "triu", "cumsum", "new_zeros", "new_ones", "new_full"}
_TENSOR_ATTRIBUTES = {"shape", "dtype", "device", "T", "mT", "ndim"}


def _plain_module_class(cls: type) -> bool:
    """No attribute lookup or call machinery of its own: ``self.act`` is the child named act, and calling
    the module runs forward as nn.Module does."""
    return (cls.__getattr__ is torch.nn.Module.__getattr__ and cls.__getattribute__ is object.__getattribute__
            and cls.__call__ is torch.nn.Module.__call__ and cls._call_impl is torch.nn.Module._call_impl)


def _straight_line_forward(module: torch.nn.Module) -> bool:
    """Whether ``module.forward`` is straight-line code whose torch.fx trace is what every call runs.

    Checked from the source of the class's own forward (not one set on the instance; no decorators),
    against allow-lists rather than known dangers: statements are assignments to local names and a
    return; expressions are locals, constants, arithmetic, comparisons, tuples and lists, subscripts of
    traced values, and calls to child modules (``self.<child>(...)``), to listed pure functions of
    torch, torch.nn.functional and math (resolved through the forward's globals, so a rebound ``F`` or
    ``min`` does not pass), to listed builtins and to listed non-mutating tensor methods of traced
    values. ``self`` appears only as ``self.<child>(...)`` and ``self.training``. Everything else - a
    branch, loop, comprehension or lambda (a trace records one path), a helper function, ``super()``,
    ``getattr``, ``operator.*``, a grad-mode switch, an expression statement (a side effect), reading
    another attribute of self (a module handed on, a property, an object whose operators keep what they
    see) - makes it not straight-line. A class with its own ``__getattr__``/``__getattribute__``/
    ``__call__`` is refused as well."""
    forward = getattr(type(module), "forward", None)
    if "forward" in vars(module) or not _plain_module_class(type(module)) or not hasattr(forward, "__globals__"):
        return False
    function = _parsed_forward(forward)
    if function is None or function.decorator_list:
        return False
    children = set(module._modules)
    args = function.args
    positional = args.posonlyargs + args.args
    if not positional or args.vararg or args.kwarg:
        return False
    me = positional[0].arg  # "self", whatever it is called
    params = {a.arg for a in positional[1:] + args.kwonlyargs}
    local_names = set(params)
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            local_names.add(node.id)
    if me in local_names:
        return False  # self rebound

    def global_value(name):
        """The object a global name refers to in forward's module (or the builtin), or a sentinel (also
        for a closure's variable: not what the globals hold)."""
        if name in local_names or name == me or name in forward.__code__.co_freevars:
            return _NOT_GLOBAL
        if name in forward.__globals__:
            return forward.__globals__[name]
        return getattr(builtins, name, _NOT_GLOBAL)

    def resolve(node):
        """The object a dotted global name (F.gelu, torch.nn.functional.gelu, math.pi) refers to, or
        _NOT_GLOBAL."""
        if isinstance(node, ast.Name):
            return global_value(node.id)
        if isinstance(node, ast.Attribute):
            base = resolve(node.value)
            if base is _NOT_GLOBAL or not isinstance(base, types.ModuleType):
                return _NOT_GLOBAL
            return getattr(base, node.attr, _NOT_GLOBAL)
        return _NOT_GLOBAL

    def allowed_function(func):
        if isinstance(func, ast.Name):
            return func.id in _ALLOWED_BUILTINS and global_value(func.id) is getattr(builtins, func.id)
        if not isinstance(func, ast.Attribute):
            return False
        namespace = resolve(func.value)
        return (isinstance(namespace, types.ModuleType) and func.attr in _ALLOWED_FUNCTIONS.get(namespace.__name__, ())
                and getattr(namespace, func.attr, None) is not None)

    def constant_value(node):
        """A module-level constant: a global number/string/dtype (GLOBAL_SCALE, torch.float32, math.pi)."""
        value = resolve(node)
        return value is not _NOT_GLOBAL and (value is None or isinstance(value, (bool, int, float, str, torch.dtype)))

    # Values the trace follows (fx proxies): the arguments, and locals computed only from traced values,
    # calls and constants. A method may be called or a subscript taken only on those.
    traced = set(params)

    def is_traced(value):
        """Whether a value is an fx proxy in the trace: computed from the arguments, a call or arithmetic.
        A tuple, list or constant is a real Python object: indexing it chooses in Python, unrecorded."""
        while isinstance(value, (ast.Attribute, ast.Subscript)):
            value = value.value
        if isinstance(value, ast.Name):
            return value.id in traced
        if isinstance(value, ast.Call):
            return True  # builtins that build containers (tuple, list) are not allowed
        if isinstance(value, ast.BinOp):
            operands = [value.left, value.right]
        elif isinstance(value, ast.UnaryOp):
            operands = [value.operand]
        elif isinstance(value, ast.Compare):
            operands = [value.left, *value.comparators]
        else:
            return False
        # (h,) + (a,) is a Python tuple; h * 2.0 a traced value
        return (all(isinstance(o, ast.Constant) or is_traced(o) for o in operands)
                and not all(isinstance(o, ast.Constant) for o in operands))

    def targets(statement):
        """What an assignment statement binds (a tuple or list target unpacked)."""
        if isinstance(statement, ast.AnnAssign):
            return [statement.target]
        return [t for target in statement.targets
                for t in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target])]

    bound = collections.defaultdict(list)  # local name -> the values bound to it
    for statement in function.body:
        for t in (targets(statement) if isinstance(statement, (ast.Assign, ast.AnnAssign)) else []):
            if isinstance(t, ast.Name):
                bound[t.id].append(statement.value)
    changed = True
    while changed:  # to a fixed point: a local is traced if every value bound to it is
        changed = False
        for name, values in bound.items():
            if name not in traced and all(v is not None and is_traced(v) for v in values):
                traced.add(name)
                changed = True

    def ok(node) -> bool:
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.Name):
            return node.id in local_names or constant_value(node)
        if isinstance(node, (ast.Tuple, ast.List)):
            return isinstance(node.ctx, ast.Load) and all(ok(e) for e in node.elts)
        if isinstance(node, ast.BinOp):
            return ok(node.left) and ok(node.right)
        if isinstance(node, ast.UnaryOp):
            return ok(node.operand)
        if isinstance(node, ast.Compare):  # not `is`/`in`: identity and membership are decided in Python
            return (all(isinstance(op, (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in node.ops)
                    and ok(node.left) and all(ok(c) for c in node.comparators))
        if isinstance(node, ast.Slice):
            return all(part is None or ok(part) for part in (node.lower, node.upper, node.step))
        if isinstance(node, ast.Subscript):  # (a, b)[flag], {...}[self.mode], GLOBAL[i]: chosen in Python
            return is_traced(node.value) and ok(node.value) and ok(node.slice)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == me:
                return node.attr == "training"
            if node.attr in _TENSOR_ATTRIBUTES and is_traced(node.value):
                return ok(node.value)
            return constant_value(node)
        if isinstance(node, ast.Call):
            if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
                return False
            if any(k.arg in ("out", "inplace") for k in node.keywords):
                return False  # writes into an existing tensor
            if not all(ok(a) for a in node.args) or not all(ok(k.value) for k in node.keywords):
                return False
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == me:
                return func.attr in children  # self.<child>(...)
            if allowed_function(func):
                return True
            # A tensor method of a traced value: x.view(...), self.fc(x).transpose(1, 2).
            return (isinstance(func, ast.Attribute) and func.attr in _TENSOR_METHODS and is_traced(func.value)
                    and ok(func.value))
        return False  # a lambda, comprehension, conditional expression, walrus, f-string, await, ...

    for i, statement in enumerate(function.body):
        if isinstance(statement, ast.Expr) and i == 0 and isinstance(statement.value, ast.Constant):
            continue  # the docstring
        if isinstance(statement, (ast.Assign, ast.AnnAssign)):
            if (statement.value is None or not all(isinstance(t, ast.Name) for t in targets(statement))
                    or not ok(statement.value)):
                return False
        elif isinstance(statement, ast.Return):
            if statement.value is not None and not ok(statement.value):
                return False
        elif not isinstance(statement, ast.Pass):
            # a branch, a loop, a with block, an expression statement (a side effect), an augmented
            # assignment (in place on a tensor: on the Linear's input, which a fused Linear keeps for
            # backward), ...
            return False
    return True


@dataclasses.dataclass
class ConversionReport:
    """What ``convert`` replaced: module names (as in ``named_modules``)."""

    linear: List[str] = dataclasses.field(default_factory=list)
    rms_norm: List[str] = dataclasses.field(default_factory=list)
    fused: List[Tuple[str, str, str]] = dataclasses.field(default_factory=list)  # (linear, activation module, act)
    skipped: List[Tuple[str, str]] = dataclasses.field(default_factory=list)  # (module, why it was left alone)

    def __str__(self):
        lines = [f"ops.nn.convert: {len(self.linear)} Linear, {len(self.rms_norm)} RMSNorm, "
                 f"{len(self.fused)} Linear+activation fused, {len(self.skipped)} left alone"]
        lines += [f"  fused {lin} + {act_mod} -> activation={act!r}" for lin, act_mod, act in self.fused]
        lines += [f"  left {name} alone: {why}" for name, why in self.skipped]
        return "\n".join(lines)


def _fusable_pairs(parent: torch.nn.Module, shared: frozenset) -> List[Tuple[str, str, str]]:
    """(linear child, activation child, act) pairs of `parent` where the activation module is the only
    user of the linear's output: in an nn.Sequential, consecutive children; elsewhere, found by tracing
    parent's forward with torch.fx (a parent that does not trace is left unfused). `shared`: ids of
    modules reachable under several names in the whole model, never fused: an alias in parent (or a
    module also inside a container child) is called under either name while a trace names it by one,
    and fusing a module in one parent but not in another would split it into two modules."""
    children = dict(parent._modules)  # every name, aliases included (named_children drops repeats)
    unique = {name for name, m in children.items() if m is not None and id(m) not in shared}
    pairs = []
    if type(parent) is torch.nn.Sequential:  # a subclass may override forward
        if "forward" in vars(parent):
            return pairs
        names = list(children)
        for a, b in zip(names, names[1:]):
            act = _activation_name(children[b]) if b in unique else None
            if a in unique and type(children[a]) is torch.nn.Linear and act:
                pairs.append((a, b, act))
        return pairs
    if not any(type(c) is torch.nn.Linear for c in children.values()) or not _straight_line_forward(parent):
        return pairs

    class _Leaves(torch.fx.Tracer):
        def is_leaf_module(self, m, qualname):
            return True  # every child is one node

    try:
        # No torch.random.fork_rng: it would rewind the process-wide generator under other threads' draws,
        # and the trace draws nothing (children are leaves; _straight_line_forward admits no random function).
        with _TRACE_LOCK:
            graph = _Leaves().trace(parent)
    except Exception:  # noqa: BLE001 - any tracing failure means: unknown structure, do not fuse
        return pairs
    called, read = {}, set()
    for node in graph.nodes:
        if node.op == "call_module":
            called.setdefault(node.target, []).append(node)
        elif node.op == "get_attr":  # a module (or its weight) used as a value: handed to other code
            read.add(node.target.split(".")[0])
    for node in graph.nodes:
        if (node.op != "call_module" or node.target not in unique or node.target in read
                or type(children.get(node.target)) is not torch.nn.Linear):
            continue
        if len(called[node.target]) != 1 or len(node.users) != 1:
            continue  # a linear called twice, or whose output is used elsewhere too
        user = next(iter(node.users))
        if (user.op != "call_module" or user.target not in unique or user.target in read
                or len(called.get(user.target, [])) != 1):
            continue
        act = _activation_name(children.get(user.target))
        if act and len(user.args) == 1 and not user.kwargs:
            pairs.append((node.target, user.target, act))
    return pairs


# Attributes through which a module's code can reach any submodule (or any attribute, by a computed name).
_WALKS_SUBMODULES = frozenset({"_modules", "modules", "named_modules", "children", "named_children",
                               "get_submodule", "apply", "__dict__", "__getattr__", "__getattribute__"})
# Builtins that only iterate, index or count what they are given.
_ITERATING_BUILTINS = frozenset({"enumerate", "zip", "reversed", "iter", "list", "tuple", "len"})
_PLAIN_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)


def _function_named(function, name: str):
    """What `name` refers to inside `function`: its closure's variable of that name, else its module's
    global (None when neither holds it, e.g. a name imported inside the function)."""
    code, closure = function.__code__, getattr(function, "__closure__", None) or ()
    if name in code.co_freevars and len(closure) == len(code.co_freevars):
        try:
            return closure[code.co_freevars.index(name)].cell_contents
        except ValueError:  # an empty cell
            return None
    return getattr(function, "__globals__", {}).get(name)


@_cached_per_function
def _parsed_with_parents(function) -> Optional[Tuple[ast.AST, dict]]:
    """_parsed_forward(function) with its map of AST node to parent node (cached per function object)."""
    parsed = _parsed_forward(function)
    if parsed is None:
        return None
    return parsed, {child: node for node in ast.walk(parsed) for child in ast.iter_child_nodes(node)}


def _forward_functions(cls: type) -> Optional[Tuple[Tuple[ast.AST, dict], ...]]:
    """The parsed code a module of class `cls` runs when called: its forward and, transitively, the
    methods that code names on self (``self.feed_forward_chunk``, called or handed on) or on super(), the
    function a decorator wraps (``__wrapped__``, as functools.wraps sets it: transformers' forwards are
    decorated) and the functions of its class's own module that it hands self to (``helper(self, x)``;
    found in its closure or module globals; a library's helpers, such as the hooks transformers installs
    to capture outputs, are not read), each with its map of AST node to parent node. None when one of
    them has no source to read."""
    # Not cached per class: a forward or method replaced later (monkey-patching) is read again; the parses
    # are cached per function object (_parsed_with_parents).
    functions, seen, todo = [], set(), [getattr(cls, "forward", None)]
    while todo:
        function = todo.pop()
        code = getattr(function, "__code__", None)
        if code is None or code in seen:
            if code is None and function is not None and not isinstance(function, (property, type)):
                return None  # e.g. a C function: nothing to read
            continue
        seen.add(code)
        entry = _parsed_with_parents(function)
        if entry is None:
            return None
        parsed = entry[0]
        functions.append(entry)
        if getattr(function, "__wrapped__", None) is not None:
            todo.append(function.__wrapped__)
        this = parsed.args.args[0].arg if parsed.args.args else None
        for node in ast.walk(parsed):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and this is not None and any(
                    isinstance(arg, ast.Name) and arg.id == this for arg in node.args + [k.value for k in node.keywords]):
                helper = _function_named(function, node.func.id)
                if isinstance(helper, types.FunctionType) and helper.__module__ == cls.__module__:
                    todo.append(helper)
            if not isinstance(node, ast.Attribute):
                continue
            member = getattr(cls, node.attr, None)
            if isinstance(node.value, ast.Name) and node.value.id == this and callable(member) \
                    and not isinstance(member, type):
                todo.append(member)
            elif isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) \
                    and node.value.func.id == "super":
                todo += [getattr(base, node.attr) for base in cls.__mro__[1:] if node.attr in vars(base)][:1]
    return tuple(functions)


def _why_reached_from(ancestor: torch.nn.Module, path: List[str], fused_names: frozenset,
                      numbered: bool) -> Optional[str]:
    """Why the forward of `ancestor` may reach a fused Linear or its activation module other than through
    the module at `path` below it (their parent, whose forward was analysed): it names one of them
    (``self.block.fc1(x)`` would get activated values), takes the parent apart (``self.mlp[0]`` of an
    nn.Sequential, iteration), hands an intermediate module to other code, walks its submodules, or has
    no source to check. None if it only calls the parent (or members of intermediate modules).

    From the source of forward and the functions it uses (_forward_functions), by attribute name: names
    are all a static reading has, so an unrelated attribute of the same name also prevents the fusion
    (safe); a lookup by a computed name (``getattr(self, name)``, ``vars(self)``, ``__dict__``) is taken
    to reach anything. Code outside the model's forwards (a probe calling ``model.mlp[0]``) and functions
    that cannot be resolved statically (imported inside a function, looked up at run time) are not seen:
    see convert."""
    if type(ancestor) in _PLAIN_CONTAINERS and "forward" not in vars(ancestor):
        return None  # Sequential's forward calls whole children in order; ModuleList/ModuleDict have none
    if "forward" in vars(ancestor):
        return "it has a forward set on the instance"
    if type(ancestor).forward is torch.nn.Module.forward:
        return None  # never called
    functions = _forward_functions(type(ancestor))
    if functions is None:
        return f"{type(ancestor).__name__} has no source to check"
    named = [p for p in path if not p.isdigit()]
    # Children without names of their own (an nn.Sequential's "0", "1") are reached by taking their
    # parent apart: then the parent's attribute name (or, if the parent is itself an element of a
    # container, the container's) may only be called, or have a member read.
    whole = next((p for p in reversed(path) if not p.isdigit()), None) if numbered else None
    for function, parents in functions:
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "vars") \
                    and node.args:
                # getattr(self, name) with a computed name may return any child (getattr(self.config, name)
                # reads an attribute of a named member, whose use is checked where it is visited).
                name = node.args[1] if node.func.id == "getattr" and len(node.args) > 1 else None
                if node.func.id == "vars" or (name is not None and not isinstance(name, ast.Constant)
                                              and not isinstance(node.args[0], ast.Attribute)):
                    return f"it looks up attributes by computed names ({ast.unparse(node)})"
                if isinstance(name, ast.Constant) and name.value in fused_names | set(named):
                    return f"it looks up {name.value!r} with getattr"
            if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
                continue  # assignments (``self.mlp = ...``) hand nothing out
            if node.attr in _WALKS_SUBMODULES:
                return f"it walks its submodules ({ast.unparse(node)})"
            if node.attr in fused_names:
                return f"it uses {ast.unparse(node)} directly"
            if node.attr not in named:
                continue
            parent = parents.get(node)
            if isinstance(parent, ast.Call) and parent.func is node:
                continue  # called
            if isinstance(parent, ast.Attribute) and parent.value is node:
                continue  # a member read: the member's own name is checked where it is visited
            if node.attr != whole:
                # An intermediate module (e.g. a ModuleList of blocks): iterating or indexing it yields
                # blocks, whose use of the fused modules' names is checked above.
                if isinstance(parent, ast.Subscript) and parent.value is node:
                    continue
                if isinstance(parent, (ast.For, ast.comprehension)) and parent.iter is node:
                    continue
                if isinstance(parent, ast.Call) and node in parent.args and isinstance(parent.func, ast.Name) \
                        and parent.func.id in _ITERATING_BUILTINS:
                    continue
            return f"it uses {ast.unparse(node)} other than by calling it"
    return None


def _held_outside_submodules(modules: dict) -> dict:
    """id of every module that a module of the model (``modules``: named_modules as a dict) holds other
    than as a registered submodule -> "holder.attribute": set with ``object.__setattr__``, in a plain
    list, tuple, set or dict, as a bound method or a weakref. Code holding such a reference can call a
    module under a name no reading of the forwards knows."""
    held = {}
    for holder_name, holder in modules.items():
        for attr, value in vars(holder).items():
            if attr == "_modules":
                continue
            for item in (value.values() if isinstance(value, dict) else
                         value if isinstance(value, (list, tuple, set, frozenset)) else (value,)):
                if isinstance(item, weakref.ref):
                    item = item()
                if isinstance(item, types.MethodType):
                    item = item.__self__  # a bound method's module
                if isinstance(item, torch.nn.Module):
                    held.setdefault(id(item), f"{holder_name or '(model)'}.{attr}")
    return held


def _why_reached_from_above(modules: dict, parent_name: str, names, held: dict) -> Optional[str]:
    """Why the children `names` (a fused Linear and its activation module) of the module named
    `parent_name` may be called other than through it: _why_reached_from for every ancestor (``modules``:
    the model's named_modules as a dict, the model itself under ""), or a reference to one of them, to
    the parent or to an ancestor held outside the registered submodules (``held``:
    _held_outside_submodules)."""
    parts = parent_name.split(".") if parent_name else []
    prefix = f"{parent_name}." if parent_name else ""
    for name in [prefix + n for n in names] + [".".join(parts[:depth]) for depth in range(len(parts), -1, -1)]:
        if id(modules[name]) in held:
            return f"{held[id(modules[name])]} refers to {name or '(model)'} outside the registered submodules"
    fused_names = frozenset(n for n in names if not n.isdigit())
    numbered = len(fused_names) < len(names)
    for depth in range(len(parts)):
        ancestor_name = ".".join(parts[:depth])
        why = _why_reached_from(modules[ancestor_name], parts[depth:], fused_names, numbered)
        if why:
            return f"{ancestor_name or '(model)'}: {why}"
    return None


def convert(model: torch.nn.Module, fuse_activations: bool = True) -> ConversionReport:
    """Swap ``torch.nn.Linear`` for ``ops.nn.Linear`` and RMSNorm modules (``torch.nn.RMSNorm``, Hugging
    Face Llama-style ``*RMSNorm``) for ``ops.nn.RMSNorm`` in ``model``, in place, sharing parameters (the
    state_dict is unchanged). With ``fuse_activations``, a Linear whose output feeds only an activation
    module (ReLU, GELU, GELU-tanh, SiLU) becomes one fused ``ops.nn.Linear(activation=...)`` and the
    activation module becomes ``nn.Identity``.

    Only exact classes are replaced (a subclass may compute something else). A module with hooks, or
    with parameters or buffers besides ``weight`` and ``bias`` (pruning, old-style weight norm), is left
    alone and listed in ``report.skipped``; so is one with a ``forward`` set on the instance, an
    ``nn.RMSNorm`` over several dimensions and an uninitialized ``nn.LazyLinear``. Fusion
    happens in a plain ``nn.Sequential`` (consecutive children) or in a module whose ``forward`` is
    straight-line code made only of allowed parts (child module calls, locals, arithmetic, listed pure
    torch / functional functions and tensor methods; no branches, loops, side effects, helper calls or
    other attributes of self: checked from its source before anything runs, see
    ``_straight_line_forward``) where a torch.fx trace shows the activation is the Linear output's only
    user and neither module is used as a value; never for a Linear or activation reachable under two names in its parent
    (an alias is called under either name, a trace names it by one) or under two names in the model (a
    module shared by several parents), nor while global module hooks are registered. A module shared
    by several parents is replaced by one shared module. ``model`` itself is not replaced (a bare
    Linear or RMSNorm is reported in ``skipped``: wrap it, or use ``Linear.from_linear``). A fused Linear
    computes activation(linear) wherever it is called from, so the forwards of the modules above the
    pair's parent (and the functions they use: _forward_functions) are read from source too: a pair is
    not fused where that code names the Linear or its activation module, takes the parent apart (indexes
    or iterates an ``nn.Sequential``), walks submodules, looks up attributes by computed names, or cannot
    be read (``_why_reached_from``), nor where a module holds the pair, its parent or an ancestor outside
    its registered submodules (``_held_outside_submodules``). Code outside the
    model's forwards that calls such a Linear directly (probes, feature extraction, slices of an
    ``nn.Sequential`` such as ``classifier[:-1]``) needs ``fuse_activations=False``. A fused Linear
    recomputes its pre-activation in backward from its input, weight and bias: modifying one of them in
    place between forward and backward raises autograd's in-place error where the unfused pair may not
    (it keeps the pre-activation instead).

    Numerics: half-precision results may differ from the original's in the last bit, as any two GEMM
    implementations do. On CUDA a fused half-precision Linear applies the activation to the float32
    accumulator and rounds once, where the original rounds the pre-activation first: where the
    activation shrinks its input (GELU, SiLU for negative pre-activations) results can differ by a few
    units in the last place, the fused one being the more accurate. A module compiled in place
    (``module.compile()``) is left alone: convert before compiling. Transformers' Python-formula GELUs
    (NewGELUActivation, GELUTanh(use_gelu_tanh_python=True)) round op by op and are not fused; a converted Hugging Face Llama-style norm rounds once (x * rsqrt(...) * weight in
    float32) where the original rounds x_hat to the input's dtype before the weight multiply. For float64
    input, a converted Hugging Face norm computes in float64 where the original computes in float32
    (more accurate; they differ by ~1e-7 relative).

    Threads: the torch.fx traces patch ``torch.nn.Module.__call__`` and ``__getattr__`` process-wide while
    they run. Concurrent ``convert`` calls take turns (a lock), but other threads must not run module code
    during a ``convert`` with ``fuse_activations`` (their module calls would go through the tracer).

    Returns:
        A ConversionReport naming every replaced, fused and skipped module (printable).

    Raises:
        TypeError: ``model`` is not a ``torch.nn.Module``.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"ops.nn.convert: expected model to be a torch.nn.Module, got {type(model).__name__}")
    report = ConversionReport()
    replaced = {}  # (id(original), activation) -> its replacement: a module shared by parents stays shared
    # Global module hooks see every Linear's output: fusing would show them activated values.
    global_hooks = any(getattr(torch.nn.modules.module, name, None) for name in (
        "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
        "_global_backward_pre_hooks"))
    fuse_activations = fuse_activations and not global_hooks
    names_of = collections.Counter(id(m) for _, m in model.named_modules(remove_duplicate=False))
    shared = frozenset(i for i, n in names_of.items() if n > 1)
    if type(model) is torch.nn.Linear or _is_rms_norm(model):
        report.skipped.append(("(model)", "convert replaces submodules in place, not the model it is given: "
                                          "wrap it (torch.nn.Sequential(model)) or use ops.nn.Linear.from_linear "
                                          "/ ops.nn.RMSNorm.from_module"))
    modules = dict(model.named_modules())
    held = _held_outside_submodules(modules) if fuse_activations else {}
    for parent_name, parent in list(modules.items()):
        prefix = f"{parent_name}." if parent_name else ""
        # Why each Linear or RMSNorm child must be left alone (None: it may be replaced).
        why_not = {name: _why_not_plain(child) for name, child in parent._modules.items()
                   if type(child) is torch.nn.Linear or (child is not None and _is_rms_norm(child))}
        for name, child in parent._modules.items():
            if type(child) is torch.nn.LazyLinear:  # a LazyLinear turns into an nn.Linear at its first call
                report.skipped.append((prefix + name, "an uninitialized LazyLinear: run one forward first (it then "
                                                      "becomes an nn.Linear), then convert"))
            elif type(child) is torch.nn.RMSNorm and len(child.normalized_shape) != 1:
                report.skipped.append((prefix + name, f"normalizes over {len(child.normalized_shape)} dimensions; "
                                                      "ops.rms_norm normalizes over the last one"))
        fused_with = {}
        for lin, act_mod, act in (_fusable_pairs(parent, shared) if fuse_activations else []):
            hooks = [h for h in _HOOK_DICTS if getattr(parent._modules[act_mod], h, None)]
            if hooks:  # the hooks would see the Identity's output
                report.skipped.append((prefix + act_mod, f"has hooks ({', '.join(hooks)}): not fused into "
                                                         f"{prefix + lin}"))
            # Code above the parent could call the Linear alone and get activated values.
            elif reached := _why_reached_from_above(modules, parent_name, (lin, act_mod), held):
                report.skipped.append((prefix + act_mod, f"not fused into {prefix + lin}: {reached}"))
            elif why_not[lin] is None:
                fused_with[lin] = (act_mod, act)
        for name, child in list(parent._modules.items()):
            if name not in why_not:
                continue
            why = why_not[name]
            if why is not None:
                report.skipped.append((prefix + name, why))
                continue
            if type(child) is torch.nn.Linear:
                act_mod, act = fused_with.get(name, (None, "none"))
                key = (id(child), act)
                if key not in replaced:
                    replaced[key] = Linear.from_linear(child, activation=act)
                setattr(parent, name, replaced[key])
                report.linear.append(prefix + name)
                if act_mod is not None:
                    setattr(parent, act_mod, torch.nn.Identity().train(parent._modules[act_mod].training))
                    report.fused.append((prefix + name, prefix + act_mod, act))
            else:
                key = (id(child), "rms_norm")
                if key not in replaced:
                    replaced[key] = RMSNorm.from_module(child)
                setattr(parent, name, replaced[key])
                report.rms_norm.append(prefix + name)
    return report
