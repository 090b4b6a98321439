"""The registry of public ops that the shared mode tests (values, errors, autograd, opcheck, TorchScript,
torch.compile, torch.export + AOTInductor, vmap, DDP, streams) run over. Adding an op to every mode is one OpSpec
here; tests/test_modes.py fails while a public op of torch.ops.ops has none.

Each OpSpec gives sample inputs (covering transposed, sliced, expanded and offset tensors), a reference (what
the op promises on the same arguments), its bad inputs with their errors, and a small nn.Module that uses the
op in a model-like way (for script/compile/export/DDP). A mode that cannot apply to an op is named in its
`skips`, with the reason.
"""

import dataclasses
import math
from typing import Callable, Dict, List, Optional, Tuple

import pytest
import torch
import torch.nn.functional as F

import ops
from fp8_support import E4, E5, FP8_MAX, OPCHECK_UTILS, aten_emulated_scaled_mm, quantize_reference
from ops.linear import ACTIVATION_FUNCTIONS


@dataclasses.dataclass
class Sample:
    args: tuple
    kwargs: dict = dataclasses.field(default_factory=dict)
    name: str = ""


@dataclasses.dataclass
class BadInput:
    """A call that must raise `error` whose first line matches `pattern` (naming the op and the argument); the
    tensors of args and kwargs are made on the CPU and moved to the device under test (meta: the fake kernel)."""
    name: str
    args: tuple
    kwargs: dict
    error: type
    pattern: str


def flatten(out) -> List[torch.Tensor]:
    """An op's return value as a list of tensors (None: none; tuples flattened)."""
    if out is None:
        return []
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in flatten(o)]


def copy_keeping_strides(t: torch.Tensor) -> torch.Tensor:
    """A copy of t with t's strides (a sliced tensor stays sliced), in memory of its own."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)


def bits(t: torch.Tensor) -> torch.Tensor:
    """t's values as integers of its width (FP8 codes as uint8), for bit-for-bit comparison."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


# Result tolerances against a float64 reference: the dtype's output rounding plus the accumulation's slack.
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5, torch.float64: 1e-10}


def close_in_dtype(got: List[torch.Tensor], expected: List[torch.Tensor]):
    """Each result within TOL of its dtype (relative and absolute) of the reference."""
    for g, e in zip(got, expected):
        tol = TOL[g.dtype]
        torch.testing.assert_close(g.double().cpu(), e.double().cpu(), rtol=tol, atol=tol, equal_nan=True)


def expand_scale(scale: torch.Tensor, shape) -> torch.Tensor:
    """A scale of any granularity (tensor, row, 1x128 group, 128x128 block) expanded to the codes' shape."""
    s = scale.reshape(()) if scale.numel() == 1 and scale.dim() != len(shape) else scale
    if s.dim() == 0:
        return s.expand(shape)
    for d, n in enumerate(shape):
        if s.shape[d] not in (1, n):  # one scale per 128 elements of this dimension
            s = s.repeat_interleave(128, d).narrow(d, 0, n)
    return s.expand(shape)


def close_codes(got: List[torch.Tensor], expected: List[torch.Tensor]):
    """(codes, scale[, written tensor]) results: the dequantized codes within one FP8 step of the reference's (its
    input an ulp away, as a CUDA norm's, moves the scale and the codes by less than that), the written tensor by
    close_in_dtype."""
    (codes, scale), (want_codes, want_scale) = got[:2], expected[:2]
    assert (codes.dtype, codes.shape, scale.shape) == (want_codes.dtype, want_codes.shape, want_scale.shape)
    mantissa, spacing = {E4: (3, 2.0 ** -9), E5: (2, 2.0 ** -16)}[codes.dtype]
    value = codes.cpu().float() * expand_scale(scale.cpu(), codes.shape)
    want = want_codes.cpu().float() * expand_scale(want_scale.cpu(), codes.shape)
    top = float(want_scale.abs().max()) if want_scale.numel() else 0.0
    torch.testing.assert_close(value, want, rtol=2.0 ** -mantissa + 2.0 ** -7, atol=2 * top * spacing, equal_nan=True)
    close_in_dtype(got[2:], expected[2:])


def close_scaled_gemm(got: List[torch.Tensor], expected: List[torch.Tensor]):
    """The GPU paths' bound against the float32 formula (tests/test_fp8_numerics.py): |y - y_ref| <= e max |y_ref|,
    e = 2^-20, 2^-7, 2^-10 for float32, bfloat16, float16 out; float32 out on CUDA 2^-8 (FP8 tensor cores keep
    about 14 bits of each partial sum: 2^-12 of |a| @ |b|, which is at most 5.1 max |y| in the samples)."""
    (y,), (want,) = got, expected
    assert (y.dtype, y.shape) == (want.dtype, want.shape)
    e = {torch.float32: 2.0 ** -8 if y.is_cuda else 2.0 ** -20, torch.bfloat16: 2.0 ** -7,
         torch.float16: 2.0 ** -10}[y.dtype]
    if want.numel():
        y, want = y.double().cpu(), want.double().cpu()
        assert (y - want).abs().max() <= e * want.abs().max(), (y - want).abs().max()


@dataclasses.dataclass
class OpSpec:
    name: str                                   # torch.ops.ops.<name>
    overload: object                            # the OpOverload opcheck runs
    call: Callable                              # the Python API
    # What the op promises on the same arguments: its results (outputs, then the arguments it writes, as
    # OpSpec.run returns them). float64 for the differentiable ops; the exact formula where `exact`.
    reference: Callable
    samples: Callable[[str, torch.dtype, bool], List[Sample]]  # (device, dtype, requires_grad)
    dtypes: Tuple[torch.dtype, ...]
    module: Callable[[], torch.nn.Module]       # a small model using the op (float32)
    module_input: Callable[[int], torch.Tensor]  # an input of batch size n for that model
    errors: List[BadInput] = dataclasses.field(default_factory=list)
    out_overload: Optional[object] = None       # e.g. torch.ops.ops.cutlass_gemm.out
    out_samples: Optional[Callable[[str, torch.dtype], List[Sample]]] = None
    # Positions of integer index arguments (grouped_gemm's offs): kept as they are where the tests
    # perturb, convert, batch or differentiate the data arguments.
    index_args: Tuple[int, ...] = ()
    mutated: Tuple[int, ...] = ()               # positions of the arguments the op writes in place
    exact: bool = False                         # the reference gives the op's CPU results bit for bit
    close: Callable[[list, list], None] = close_in_dtype  # results against the reference where not exact
    grad_error: Optional[str] = None            # what a non-differentiable op says to an input requiring grad
    opcheck_utils: Optional[Tuple[str, ...]] = None  # opcheck's tests (None: all), the others named in skips
    skips: Dict[str, str] = dataclasses.field(default_factory=dict)  # mode -> why it does not apply
    # The path a CUDA call on these positional arguments takes (ops.grouped.plan, ops.fp8.grouped_plan): its
    # "host_sync" says whether it reads offsets on the host, so that it cannot be captured. None: never.
    plan: Optional[Callable[..., dict]] = None

    @property
    def differentiable(self) -> bool:
        return "autograd" not in self.skips

    def skip(self, mode: str):
        """pytest.skip with the spec's reason where `mode` does not apply to this op."""
        if mode in self.skips:
            pytest.skip(self.skips[mode])

    def data_positions(self, sample: "Sample") -> List[int]:
        """The positions of the sample's tensor arguments that carry data (not index_args)."""
        return [i for i, a in enumerate(sample.args) if isinstance(a, torch.Tensor) and i not in self.index_args]

    def run(self, fn: Callable, args, kwargs=None) -> List[torch.Tensor]:
        """fn(*args, **kwargs) with the arguments the op writes replaced by copies: its outputs, then those copies
        as written. The sample's own tensors stay as they were."""
        args = [copy_keeping_strides(a) if i in self.mutated else a for i, a in enumerate(args)]
        return flatten(fn(*args, **(kwargs or {}))) + [args[i] for i in self.mutated]

    def check(self, got, expected, exact: bool = False):
        """Asserts results (a return value or OpSpec.run's list) against expected ones: bit for bit if exact,
        else within self.close."""
        got, expected = flatten(got), flatten(expected)
        assert len(got) == len(expected), (len(got), len(expected))
        if exact:
            for g, e in zip(got, expected):
                assert (g.dtype, g.shape) == (e.dtype, e.shape), ((g.dtype, g.shape), (e.dtype, e.shape))
                assert torch.equal(bits(g.cpu()), bits(e.cpu())), (g, e)
        else:
            self.close(got, expected)


def _randn(*shape, dtype, device, requires_grad=False, seed=0):
    g = torch.Generator().manual_seed(seed + 1000 * len(shape) + sum(shape))
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype=dtype, device=device) \
        .requires_grad_(requires_grad)


def _makers(device, dtype, requires_grad):
    """t(x): x as a leaf that requires grad (if asked); r(*shape, seed): a seeded N(0, 1) tensor."""
    def t(x):
        return x.detach().requires_grad_(requires_grad) if requires_grad else x

    def r(*shape, seed=0):
        return _randn(*shape, dtype=dtype, device=device, seed=seed)

    return t, r


def _gemm_samples(device, dtype, requires_grad):
    t, r = _makers(device, dtype, requires_grad)
    return [
        Sample((t(r(5, 7)), t(r(7, 3, seed=1))), name="row-row"),
        Sample((t(r(7, 5).t()), t(r(3, 7, seed=1).t())), name="transposed"),
        Sample((t(r(6, 14)[:, ::2]), t(r(10, 3, seed=1)[2:9])), name="sliced"),
        Sample((t(r(1, 7).expand(4, 7)), t(r(7, 1, seed=1).expand(7, 6))), name="expanded"),
        Sample((t(r(40)[3:38].view(5, 7)), t(r(7, 4, seed=1))), name="offset"),
        Sample((t(r(0, 4)), t(r(4, 3, seed=1))), name="empty-m"),
        Sample((t(r(3, 0)), t(r(0, 2, seed=1))), name="empty-k"),
    ]


def _gemm_out_samples(device, dtype):
    _, r = _makers(device, dtype, False)
    return [
        Sample((r(5, 7), r(7, 3, seed=1)), {"out": torch.empty(5, 3, dtype=dtype, device=device)}, "row"),
        Sample((r(5, 7), r(7, 3, seed=1)), {"out": torch.empty(3, 5, dtype=dtype, device=device).t()}, "col"),
        Sample((r(5, 7), r(7, 3, seed=1)), {"out": torch.empty(5, 6, dtype=dtype, device=device)[:, ::2]},
               "strided"),
    ]


class GemmMLP(torch.nn.Module):
    """x -> relu(x @ W1^T) @ W2^T through ops.cutlass_gemm (weights used as transposed views)."""

    def __init__(self, d_in=16, d_hidden=32, d_out=8):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w1 = torch.nn.Parameter(torch.randn(d_hidden, d_in, generator=g) / d_in ** 0.5)
        self.w2 = torch.nn.Parameter(torch.randn(d_out, d_hidden, generator=g) / d_hidden ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(torch.ops.ops.cutlass_gemm(x, self.w1.t()))
        return torch.ops.ops.cutlass_gemm(h, self.w2.t())


def _rms_norm_samples(device, dtype, requires_grad):
    t, r = _makers(device, dtype, requires_grad)
    return [
        Sample((t(r(5, 16)), t(r(16, seed=1))), name="contiguous"),
        Sample((t(r(3, 4, 13)), t(r(13, seed=1))), name="3d-odd-hidden"),
        Sample((t(r(16, 5).t()), t(r(16, seed=1))), name="transposed"),
        Sample((t(r(6, 40)[:, ::2]), t(r(20, seed=1))), name="sliced"),
        Sample((t(r(1, 24).expand(4, 24)), t(r(24, seed=1))), name="expanded"),
        Sample((t(r(60)[3:51].view(3, 16)), t(r(16, seed=1))), name="offset"),
        Sample((t(r(0, 16)), t(r(16, seed=1))), name="empty-rows"),
    ]


def _silu_and_mul_samples(device, dtype, requires_grad):
    t, r = _makers(device, dtype, requires_grad)
    return [
        Sample((t(r(5, 32)),), name="contiguous"),
        Sample((t(r(2, 3, 14)),), name="3d-odd-half"),
        Sample((t(r(14, 5).t()),), name="transposed"),
        Sample((t(r(6, 40)[:, ::2]),), name="sliced"),
        Sample((t(r(1, 24).expand(4, 24)),), name="expanded"),
        Sample((t(r(60)[3:51].view(3, 16)),), name="offset"),
        Sample((t(r(0, 16)),), name="empty-rows"),
    ]


class RMSNormModel(torch.nn.Module):
    """x -> rms_norm(x, w) * 2 + x."""

    def __init__(self, hidden=16):
        super().__init__()
        self.w = torch.nn.Parameter(1 + 0.1 * torch.randn(hidden, generator=torch.Generator().manual_seed(0)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.ops.rms_norm(x, self.w, 1e-6) * 2 + x


class SwiGLUModel(torch.nn.Module):
    """x -> silu_and_mul(x @ W): a gated MLP's activation on a fused gate_up projection."""

    def __init__(self, d_in=16, d=8):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(d_in, 2 * d, generator=g) / d_in ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.ops.silu_and_mul(torch.matmul(x, self.w))


def _silu_and_mul_reference(x):
    a, b = x.double().chunk(2, dim=-1)
    return torch.nn.functional.silu(a) * b


def _linear_samples(device, dtype, requires_grad):
    t, r = _makers(device, dtype, requires_grad)
    return [
        Sample((t(r(5, 16)), t(r(8, 16, seed=1)), t(r(8, seed=2)), "none"), name="bias"),
        Sample((t(r(2, 3, 16)), t(r(8, 16, seed=1)), None, "relu"), name="3d-relu-no-bias"),
        Sample((t(r(5, 16)), t(r(8, 16, seed=1)), t(r(8, seed=2)), "gelu"), name="gelu"),
        Sample((t(r(16, 5).t()), t(r(16, 8, seed=1).t()), t(r(8, seed=2)), "gelu_tanh"), name="transposed"),
        Sample((t(r(5, 40)[:, ::2]), t(r(7, 20, seed=1)), t(r(14, seed=2)[::2]), "silu"), name="sliced"),
        Sample((t(r(1, 16).expand(4, 16)), t(r(8, 16, seed=1)), None, "none"), name="expanded"),
        Sample((t(r(0, 16)), t(r(8, 16, seed=1)), t(r(8, seed=2)), "silu"), name="empty-rows"),
    ]


def _linear_reference(x, w, b, activation):
    import torch.nn.functional as F

    z = F.linear(x.double(), w.double(), None if b is None else b.double())
    return {"none": lambda v: v, "relu": F.relu, "gelu": F.gelu, "silu": F.silu,
            "gelu_tanh": lambda v: F.gelu(v, approximate="tanh")}[activation](z)


class LinearMLP(torch.nn.Module):
    """x -> linear(gelu) -> linear: a transformer MLP through ops.linear."""

    def __init__(self, d_in=16, d_hidden=32, d_out=8):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w1 = torch.nn.Parameter(torch.randn(d_hidden, d_in, generator=g) / d_in ** 0.5)
        self.b1 = torch.nn.Parameter(torch.randn(d_hidden, generator=g) * 0.1)
        self.w2 = torch.nn.Parameter(torch.randn(d_out, d_hidden, generator=g) / d_hidden ** 0.5)
        self.b2 = torch.nn.Parameter(torch.randn(d_out, generator=g) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.ops.ops.linear(x, self.w1, self.b1, "gelu")
        return torch.ops.ops.linear(h, self.w2, self.b2, "none")


def _offsets(ends, device):
    return torch.tensor(ends, dtype=torch.int32, device=device)


def _grouped_samples(device, dtype, requires_grad):
    t, r = _makers(device, dtype, requires_grad)
    return [
        Sample((t(r(7, 4)), t(r(3, 4, 5, seed=1)), _offsets([2, 2, 7], device)), name="2Dx3D"),
        Sample((t(r(7, 4)), t(r(3, 5, 4, seed=1).transpose(1, 2)), _offsets([0, 3, 5], device)), name="2Dx3D-Bt-tail"),
        Sample((t(r(3, 9)), t(r(9, 4, seed=1)), _offsets([4, 4, 9], device)), name="2Dx2D"),
        Sample((t(r(2, 3, 8)[..., ::2]), t(r(2, 4, 3, seed=1))), name="3Dx3D-sliced"),
        Sample((t(r(3, 3, 4)), t(r(9, 4, seed=1).t()), _offsets([3, 3, 7], device)), name="3Dx2D-tail"),
        Sample((t(r(1, 4).expand(6, 4)), t(r(2, 4, 3, seed=1)), _offsets([1, 6], device)), name="expanded"),
        Sample((t(r(0, 4)), t(r(2, 4, 3, seed=1)), _offsets([0, 0], device)), name="empty-m"),
    ]


def _grouped_out_samples(device, dtype):
    _, r = _makers(device, dtype, False)
    A, B, offs = r(7, 4), r(3, 4, 5, seed=1), _offsets([2, 2, 7], device)
    return [
        Sample((A, B, offs), {"out": torch.empty(7, 5, dtype=dtype, device=device)}, "row"),
        Sample((A, B, offs), {"out": torch.empty(5, 7, dtype=dtype, device=device).t()}, "col"),
        Sample((A, B, offs), {"out": torch.empty(7, 10, dtype=dtype, device=device)[:, ::2]}, "strided"),
    ]


def grouped_reference(A, B, offs=None, out=None):
    """grouped_gemm's definition (ops/grouped.py), group by group, in float64; zero past the last end (out: not
    written)."""
    A, B = A.double(), B.double()
    if A.dim() == 3 and B.dim() == 3:
        return torch.einsum("gmk,gkn->gmn", A, B)
    ends = [0] + [int(e) for e in offs]
    if A.dim() == 2 and B.dim() == 3:
        parts = [A[ends[g]:ends[g + 1]] @ B[g] for g in range(B.shape[0])]
        return torch.cat(parts + [A.new_zeros(A.shape[0] - ends[-1], B.shape[2])])
    if A.dim() == 2:
        return torch.stack([A[:, ends[g]:ends[g + 1]] @ B[ends[g]:ends[g + 1]] for g in range(len(ends) - 1)]) \
            if len(ends) > 1 else A.new_zeros(0, A.shape[0], B.shape[1])
    parts = [A[g] @ B[:, ends[g]:ends[g + 1]] for g in range(A.shape[0])]
    return torch.cat(parts + [A.new_zeros(A.shape[1], B.shape[1] - ends[-1])], dim=1)


class TinyMoE(torch.nn.Module):
    """Top-1 routing, tokens sorted by expert, a gated MLP per expert on ops.grouped_gemm + silu_and_mul."""

    def __init__(self, hidden=16, width=8, experts=4):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.register_buffer("router", torch.randn(hidden, experts, generator=g))  # argmax: no gradient
        self.gate_up = torch.nn.Parameter(torch.randn(experts, 2 * width, hidden, generator=g) / hidden ** 0.5)
        self.down = torch.nn.Parameter(torch.randn(experts, hidden, width, generator=g) / width ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        expert = (x @ self.router).argmax(-1)
        order = torch.argsort(expert, stable=True)
        counts = (expert.unsqueeze(1) == torch.arange(self.router.shape[1], device=x.device)).sum(0)
        offs = counts.cumsum(0).to(torch.int32)
        h = torch.ops.ops.silu_and_mul(torch.ops.ops.grouped_gemm(x[order], self.gate_up.transpose(1, 2), offs, None))
        y = torch.ops.ops.grouped_gemm(h, self.down.transpose(1, 2), offs, None)
        return torch.empty_like(y).index_copy(0, order, y)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The same layer as a loop over experts in float64."""
        x = x.double()
        expert = (x @ self.router.double()).argmax(-1)
        out = torch.zeros_like(x)
        for e in range(self.router.shape[1]):
            rows = expert == e
            a, b = (x[rows] @ self.gate_up[e].double().t()).chunk(2, -1)
            out[rows] = (torch.nn.functional.silu(a) * b) @ self.down[e].double().t()
        return out


# ---- FP8 and in-place ops -------------------------------------------------------------------------------
# Not differentiable: their samples ignore requires_grad. Their arguments are positional (options included), so
# that every mode (vmap's in_dims too) passes them alike.

_SCALED_OUT = (torch.bfloat16, torch.float16, torch.float32)
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _fp8(*shape, dtype=E4, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed + 1000 * len(shape) + sum(shape))
    return (torch.randn(*shape, generator=g) * 3).to(dtype).to(device)


def _scale(*shape, seed=0, device="cpu"):
    """Seeded float32 scales in [0.5, 1.5) of a shape (() for one)."""
    g = torch.Generator().manual_seed(100 + seed)
    return (torch.rand(math.prod(shape), generator=g) + 0.5).reshape(shape).to(device)


def _scaled_gemm_samples(device, dtype, requires_grad):
    out = dtype if dtype in _SCALED_OUT else torch.float32  # float64 (no FP8 GEMM output): float32
    _, r = _makers(device, out, False)

    def q(*shape, seed=0, dtype=E4):
        return _fp8(*shape, dtype=dtype, seed=seed, device=device)

    def s(*shape, seed=0):
        return _scale(*shape, seed=seed, device=device)

    return [
        Sample((q(5, 32), q(16, 32, seed=1).t(), s(seed=1), s(seed=2), None, out, "none"), name="tensorwise"),
        Sample((q(5, 32), q(32, 16, seed=1), s(5, 1, seed=1), s(1, 16, seed=2), r(16, seed=2), out, "silu"),
               name="rowwise-bias-silu"),
        Sample((q(3, 160), q(160, 32, seed=1, dtype=E5), s(3, 2, seed=1), s(2, 1, seed=2), None, out, "gelu"),
               name="block128-e5m2"),
        Sample((q(6, 320)[::2, :160], q(160, 32, seed=1), s(3, 2, seed=1), s(2, 32, seed=2), r(32, seed=2), out, "relu"),
               name="block1x128-sliced-bias"),
        Sample((q(1, 32, dtype=E5).expand(4, 32), q(16, 32, seed=1).t(), s(4, 1, seed=1), s(1, 16, seed=2), None, out,
                "gelu_tanh"), name="expanded-e5m2"),
        Sample((q(200)[8:168].view(5, 32), q(32, 16, seed=1), s(seed=1), s(seed=2), None, out, "none"), name="offset"),
        Sample((q(0, 32), q(32, 16, seed=1), s(seed=1), s(seed=2), None, out, "none"), name="empty-m"),
        Sample((q(3, 0), q(0, 16, seed=1), s(seed=1), s(seed=2), r(16, seed=2), out, "relu"), name="empty-k"),
    ]


def _scaled_gemm_out_samples(device, dtype):
    out = dtype if dtype in _SCALED_OUT else torch.float32
    args = (_fp8(6, 32, device=device), _fp8(32, 16, seed=1, device=device), _scale(6, 1, seed=1, device=device),
            _scale(1, 16, seed=2, device=device), None, None, "gelu")  # out_dtype None: out's
    return [
        Sample(args, {"out": torch.empty(6, 16, dtype=out, device=device)}, "row"),
        Sample(args, {"out": torch.empty(16, 6, dtype=out, device=device).t()}, "col"),
        Sample(args, {"out": torch.empty(6, 32, dtype=out, device=device)[:, ::2]}, "strided"),
    ]


def scaled_gemm_reference(A, B, scale_a, scale_b, bias=None, out_dtype=None, activation="none", use_fast_accum=False,
                          out=None):
    """torch._scaled_mm's emulated CPU path (oneDNN off) for the recipes torch runs there, else the formula that
    path computes: float32 dequantization of row-major copies, the product, the bias; then the activation in
    float32 and one rounding to out_dtype (None: out's dtype, else bfloat16; out is not written) (docs/numerics.md)."""
    device = A.device
    A, B, scale_a, scale_b = A.cpu(), B.cpu(), scale_a.cpu().contiguous(), scale_b.cpu().contiguous()  # torch's rule
    bias = None if bias is None else bias.cpu().float()
    out_dtype = out_dtype or (torch.bfloat16 if out is None else out.dtype)
    (M, K), N = A.shape, B.shape[1]
    recipe = ops.fp8.recipe_of(M, K, N, scale_a.shape, scale_b.shape)
    z = None
    if recipe in ("tensorwise", "rowwise"):
        try:
            with aten_emulated_scaled_mm():
                z = torch._scaled_mm(A, B, scale_a, scale_b, bias=bias, out_dtype=torch.float32)
        except RuntimeError as e:  # torch 2.11's CPU kernel: "only supports per-tensor scaling"
            if "only supports per-tensor scaling" not in str(e):
                raise
    if z is None:
        if recipe in ("tensorwise", "rowwise"):
            fa, fb = scale_a.reshape(-1, 1) if recipe == "rowwise" else scale_a.reshape(1, 1), scale_b.reshape(1, -1)
        else:
            fa, fb = expand_scale(scale_a, (M, K)), expand_scale(scale_b, (K, N))
        z = (A.float().contiguous() * fa) @ (B.float().contiguous() * fb)
        z = z if bias is None else z + bias
    return ACTIVATION_FUNCTIONS[activation](z).to(out_dtype).to(device)


def _scaled_grouped_samples(device, dtype, requires_grad):
    out = dtype if dtype in _SCALED_OUT else torch.float32  # float64 (no FP8 GEMM output): float32
    _, r = _makers(device, out, False)

    def q(*shape, seed=0):
        return _fp8(*shape, seed=seed, device=device)

    def s(*shape, seed=0):
        return _scale(*shape, seed=seed, device=device)

    return [
        Sample((q(7, 32), q(3, 16, 32, seed=1).transpose(1, 2), s(7, seed=1), s(3, 16, seed=2),
                _offsets([2, 2, 7], device), None, out), name="2Dx3D-rowwise-Wt"),
        Sample((q(6, 256), q(2, 256, 32, seed=1), s(6, 2, seed=1), s(2, 2, 1, seed=2), _offsets([0, 4], device),
                r(2, 32, seed=2), out), name="2Dx3D-blockwise-bias-tail"),
        Sample((q(2, 3, 64)[..., ::2], q(2, 32, 16, seed=1), s(2, 3, seed=1), s(2, 16, seed=2), None, None, out),
               name="3Dx3D-rowwise-sliced"),
        Sample((q(2, 3, 128), q(2, 128, 16, seed=1), s(2, 3, 1, seed=1), s(2, 1, 1, seed=2), None, r(2, 16, seed=2),
                out), name="3Dx3D-blockwise-bias"),
        Sample((q(3, 4, 32), q(32, 48, seed=1), s(3, 4, seed=1), s(48, seed=2), _offsets([16, 16, 32], device),
                r(48, seed=2), out), name="3Dx2D-rowwise-bias-tail"),
        Sample((q(3, 48), q(48, 16, seed=1), s(9, seed=1), s(48, seed=2), _offsets([16, 16, 48], device), None, out),
               name="2Dx2D-rowwise-empty-group"),
        Sample((q(0, 32), q(2, 32, 16, seed=1), s(0, seed=1), s(2, 16, seed=2), _offsets([0, 0], device), None, out),
               name="empty-m"),
    ]


def _scaled_grouped_out_samples(device, dtype):
    out = dtype if dtype in _SCALED_OUT else torch.float32
    args = (_fp8(7, 32, device=device), _fp8(3, 32, 16, seed=1, device=device), _scale(7, seed=1, device=device),
            _scale(3, 16, seed=2, device=device), _offsets([2, 2, 7], device), None, None)  # out_dtype None: out's
    return [
        Sample(args, {"out": torch.empty(7, 16, dtype=out, device=device)}, "row"),
        Sample(args, {"out": torch.empty(16, 7, dtype=out, device=device).t()}, "col"),
        Sample(args, {"out": torch.empty(7, 32, dtype=out, device=device)[:, ::2]}, "strided"),
    ]


def scaled_grouped_reference(A, B, scale_a, scale_b, offs=None, bias=None, out_dtype=None, out=None):
    """scaled_grouped_gemm's definition (ops/fp8.py), group by group: scaled_gemm_reference's formula (float32
    dequantization of row-major copies, the product, the bias, one rounding); zero past the last end."""
    device = A.device
    A, B, scale_a, scale_b = A.cpu(), B.cpu(), scale_a.cpu(), scale_b.cpu()
    bias = None if bias is None else bias.cpu().float()
    out_dtype = out_dtype or (torch.bfloat16 if out is None else out.dtype)
    M, N = A.shape[-2], B.shape[-1]

    def formula(a, b, sa, sb, bias_g):
        if sa.dim() == 1:  # rowwise
            fa, fb = sa.reshape(-1, 1), sb.reshape(1, -1)
        else:
            fa, fb = expand_scale(sa, a.shape), expand_scale(sb, b.shape)
        z = (a.float().contiguous() * fa) @ (b.float().contiguous() * fb)
        return (z if bias_g is None else z + bias_g).to(out_dtype)

    ends = [0] + ([] if offs is None else [int(e) for e in offs])
    pick = (lambda g: None) if bias is None else (lambda g: bias[g])
    if A.dim() == 3 and B.dim() == 3:
        y = torch.stack([formula(A[g], B[g], scale_a[g], scale_b[g], pick(g)) for g in range(A.shape[0])]) \
            if A.shape[0] else torch.zeros(0, M, N, dtype=out_dtype)
    elif A.dim() == 2 and B.dim() == 3:
        parts = [formula(A[ends[g]:ends[g + 1]], B[g], scale_a[ends[g]:ends[g + 1]], scale_b[g], pick(g))
                 for g in range(B.shape[0])]
        y = torch.cat(parts + [torch.zeros(M - ends[-1], N, dtype=out_dtype)])
    elif A.dim() == 2:
        y = torch.stack([formula(A[:, ends[g]:ends[g + 1]], B[ends[g]:ends[g + 1]], scale_a[g * M:(g + 1) * M],
                                 scale_b[g * N:(g + 1) * N], pick(g)) for g in range(len(ends) - 1)])
    else:
        cols = (lambda g: None) if bias is None else (lambda g: bias[ends[g]:ends[g + 1]])
        parts = [formula(A[g], B[:, ends[g]:ends[g + 1]], scale_a[g], scale_b[ends[g]:ends[g + 1]], cols(g))
                 for g in range(A.shape[0])]
        y = torch.cat(parts + [torch.zeros(M, N - ends[-1], dtype=out_dtype)], dim=1)
    return y.to(device)


def quantize_fp8_reference(input, granularity="row", dtype=None, scale=None, pow2_scale=False):
    """quantize_fp8's formula (fp8_support.quantize_reference: group by group); a given scale divides as it is."""
    dtype = E4 if dtype is None else dtype
    x = input.cpu()
    if scale is None:
        codes, s = quantize_reference(x, granularity, dtype, pow2_scale)
    else:
        top, s = FP8_MAX[dtype], scale.cpu().clone()
        codes = (x.float() / expand_scale(s, x.shape)).clamp(-top, top).to(dtype)
    return codes.to(input.device), s.to(input.device)


def _silu_and_mul_exact(x):
    """silu_and_mul's CPU result bit for bit (tests/test_fused.py): F.silu(a) * b, in float32 for half types."""
    d = x.shape[-1] // 2
    y = x if x.dtype in (torch.float32, torch.float64) else x.float()
    return (F.silu(y[..., :d]) * y[..., d:]).to(x.dtype)


def _norm(x, w, eps):
    return F.rms_norm(x, (x.shape[-1],), w, eps)  # ops.rms_norm's CPU result bit for bit (docs/numerics.md)


def rms_norm_fp8_reference(input, weight, eps=1e-6, granularity="row", dtype=None, scale=None, pow2_scale=False):
    codes, s = quantize_fp8_reference(_norm(input.cpu(), weight.cpu(), eps), granularity, dtype, scale, pow2_scale)
    return codes.to(input.device), s.to(input.device)


def fused_add_rms_norm_fp8_reference(input, residual, weight, eps=1e-6, granularity="row", dtype=None, scale=None,
                                     pow2_scale=False):
    """(codes, scale) of rms_norm_fp8 of residual + input (rounded to their dtype), then that sum (the residual as
    written)."""
    summed = residual.cpu() + input.cpu()
    codes, s = quantize_fp8_reference(_norm(summed, weight.cpu(), eps), granularity, dtype, scale, pow2_scale)
    return [t.to(input.device) for t in (codes, s, summed)]


def silu_and_mul_fp8_reference(input, granularity="row", dtype=None, scale=None, pow2_scale=False):
    codes, s = quantize_fp8_reference(_silu_and_mul_exact(input.cpu()), granularity, dtype, scale, pow2_scale)
    return codes.to(input.device), s.to(input.device)


def fused_add_rms_norm_reference(input, residual, weight, eps=1e-6):
    """[input as written, residual as written]: rms_norm of residual + input (rounded to their dtype), that sum."""
    summed = residual.cpu() + input.cpu()
    return [_norm(summed, weight.cpu(), eps).to(input.device), summed.to(input.device)]


def _quantize_samples(device, dtype, requires_grad):
    _, r = _makers(device, dtype, False)
    given = lambda *shape: _scale(*shape, seed=3, device=device)  # noqa: E731
    return [
        Sample((r(3, 300), "row", None, None, False), name="row"),
        Sample((r(2, 3, 300), "group", E5, None, True), name="3d-group-e5m2-pow2"),
        Sample((r(200, 5).t(), "tensor", None, None, False), name="tensor-transposed"),
        Sample((r(200, 5).t(), "row", None, None, False), name="row-transposed"),
        Sample((r(130, 300), "block", None, None, True), name="block-pow2"),
        Sample((r(32, 6, 4).transpose(0, 2), "group", None, None, False), name="3d-transposed"),
        Sample((r(6, 40)[:, ::2], "row", None, given(6, 1), False), name="sliced-static"),
        Sample((r(1, 24).expand(4, 24), "group", None, None, False), name="expanded"),
        Sample((r(60)[3:51].view(3, 16), "tensor", None, given(), False), name="offset-static"),
        Sample((r(0, 16), "row", None, None, False), name="empty-rows"),
    ]


def _rms_norm_fp8_samples(device, dtype, requires_grad):
    _, r = _makers(device, dtype, False)
    given = _scale(seed=3, device=device)
    return [
        Sample((r(5, 16), r(16, seed=1), 1e-6, "row", None, None, False), name="row"),
        Sample((r(3, 4, 200), r(200, seed=1), 1e-5, "group", E5, None, True), name="3d-group-e5m2-pow2"),
        Sample((r(4, 32), r(32, seed=1), 1e-6, "tensor", None, given, False), name="static"),
        Sample((r(16, 5).t(), r(16, seed=1), 1e-6, "tensor", None, None, False), name="transposed"),
        Sample((r(6, 40)[:, ::2], r(20, seed=1), 1e-6, "row", None, None, False), name="sliced"),
        Sample((r(1, 24).expand(4, 24), r(24, seed=1), 1e-6, "group", None, None, False), name="expanded"),
        Sample((r(0, 16), r(16, seed=1), 1e-6, "row", None, None, False), name="empty-rows"),
    ]


def _fused_add_rms_norm_fp8_samples(device, dtype, requires_grad):
    _, r = _makers(device, dtype, False)
    given = _scale(seed=3, device=device)
    return [
        Sample((r(5, 16), r(5, 16, seed=2), r(16, seed=1), 1e-6, "row", None, None, False), name="row"),
        Sample((r(3, 4, 200), r(3, 4, 200, seed=2), r(200, seed=1), 1e-5, "group", E5, None, True),
               name="3d-group-e5m2-pow2"),
        Sample((r(4, 32), r(4, 32, seed=2), r(32, seed=1), 1e-6, "tensor", None, given, False), name="static"),
        Sample((r(16, 5).t(), r(16, 5, seed=2).t(), r(16, seed=1), 1e-6, "row", None, None, False),
               name="transposed"),
        Sample((r(6, 40)[:, ::2], r(6, 40, seed=2)[:, 1::2], r(20, seed=1), 1e-6, "group", None, None, False),
               name="sliced"),
        Sample((r(1, 24).expand(4, 24), r(4, 24, seed=2), r(24, seed=1), 1e-6, "tensor", None, None, False),
               name="input-expanded"),
        Sample((r(0, 16), r(0, 16, seed=2), r(16, seed=1), 1e-6, "row", None, None, False), name="empty-rows"),
    ]


def _silu_and_mul_fp8_samples(device, dtype, requires_grad):
    _, r = _makers(device, dtype, False)
    return [
        Sample((r(5, 32), "row", None, None, False), name="row"),
        Sample((r(2, 3, 300), "group", E5, None, True), name="3d-group-e5m2-pow2"),
        Sample((r(14, 5).t(), "tensor", None, None, False), name="transposed"),
        Sample((r(6, 40)[:, ::2], "row", None, None, False), name="sliced"),
        Sample((r(1, 24).expand(4, 24), "group", None, None, False), name="expanded"),
        Sample((r(3, 16), "tensor", None, _scale(seed=3, device=device), False), name="static"),
        Sample((r(0, 16), "row", None, None, False), name="empty-rows"),
    ]


def _fused_add_rms_norm_samples(device, dtype, requires_grad):
    _, r = _makers(device, dtype, False)
    return [
        Sample((r(5, 16), r(5, 16, seed=2), r(16, seed=1), 1e-6), name="contiguous"),
        Sample((r(3, 4, 13), r(3, 4, 13, seed=2), r(13, seed=1), 1e-5), name="3d-odd-hidden"),
        Sample((r(16, 5).t(), r(16, 5, seed=2).t(), r(16, seed=1), 1e-6), name="transposed"),
        Sample((r(6, 40)[:, ::2], r(6, 40, seed=2)[:, 1::2], r(20, seed=1), 1e-6), name="sliced"),
        Sample((r(4, 24), r(4, 24, seed=2), r(1, seed=1).expand(24), 1e-6), name="expanded-weight"),
        Sample((r(60)[3:51].view(3, 16), r(60, seed=2)[5:53].view(3, 16), r(16, seed=1), 1e-6), name="offset"),
        Sample((r(0, 16), r(0, 16, seed=2), r(16, seed=1), 1e-6), name="empty-rows"),
    ]


class Fp8Projection(torch.nn.Module):
    """x -> gelu(x W^T + b) in FP8: W quantized once per output channel, x per row at each call (in torch ops: the
    model's only op of the library is scaled_gemm, which test_export.py's run without the library names)."""

    def __init__(self, d_in=16, d_out=16):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        w = torch.randn(d_out, d_in, generator=g)
        w_scale = w.abs().amax(1, keepdim=True) / 448
        self.register_buffer("w", (w / w_scale).to(E4))
        self.register_buffer("w_scale", w_scale.t().contiguous())  # (1, N)
        self.register_buffer("b", torch.randn(d_out, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_scale = x.abs().amax(1, keepdim=True).clamp(min=1e-12) / 448
        xq = (x / x_scale).to(torch.float8_e4m3fn)
        return torch.ops.ops.scaled_gemm(xq, self.w.t(), x_scale, self.w_scale, self.b, torch.float32, "gelu", False)


class Fp8MoE(torch.nn.Module):
    """Top-1 routing, tokens sorted by expert, a gated MLP per expert in FP8 on ops.scaled_grouped_gemm: expert
    weights quantized once per output channel, activations per row at each call."""

    def __init__(self, hidden=16, width=16, experts=4):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.register_buffer("router", torch.randn(hidden, experts, generator=g))
        for name, shape in (("gate_up", (experts, 2 * width, hidden)), ("down", (experts, hidden, width))):
            w = torch.randn(*shape, generator=g) / shape[-1] ** 0.5
            scale = w.abs().amax(-1) / 448  # (E, N)
            self.register_buffer(name, (w / scale.unsqueeze(-1)).to(E4))
            self.register_buffer(name + "_scale", scale)

    @staticmethod
    def _rows(x: torch.Tensor):
        scale = x.abs().amax(1).clamp(min=1e-12) / 448
        return (x / scale.unsqueeze(1)).to(torch.float8_e4m3fn), scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        expert = (x @ self.router).argmax(-1)
        order = torch.argsort(expert, stable=True)
        counts = (expert.unsqueeze(1) == torch.arange(self.router.shape[1], device=x.device)).sum(0)
        offs = counts.cumsum(0).to(torch.int32)
        xq, xs = self._rows(x[order])
        h = torch.ops.ops.scaled_grouped_gemm(xq, self.gate_up.transpose(1, 2), xs, self.gate_up_scale, offs, None,
                                              torch.float32)
        hq, hs = self._rows(torch.ops.ops.silu_and_mul(h))
        y = torch.ops.ops.scaled_grouped_gemm(hq, self.down.transpose(1, 2), hs, self.down_scale, offs, None,
                                              torch.float32)
        return torch.empty_like(y).index_copy(0, order, y)


class FakeQuantize(torch.nn.Module):
    """x -> x through FP8 and back: 1x128-group codes with power-of-two scales, dequantized."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        codes, scale = torch.ops.ops.quantize_fp8(x, "group", None, None, True)
        return codes.float() * scale.repeat_interleave(128, -1)[..., :x.shape[-1]]


class _Weighted(torch.nn.Module):
    """A norm weight as a buffer: the FP8 and in-place ops take no weight that requires grad."""

    def __init__(self, hidden=16):
        super().__init__()
        self.register_buffer("w", 1 + 0.1 * torch.randn(hidden, generator=torch.Generator().manual_seed(0)))


class RMSNormFp8Model(_Weighted):
    """x -> rms_norm_fp8(x, w), dequantized: the FP8 input of a projection after a norm."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        codes, scale = torch.ops.ops.rms_norm_fp8(x, self.w, 1e-6, "row", None, None, False)
        return codes.float() * scale


class AddRMSNormFp8Model(_Weighted):
    """A pre-norm step feeding an FP8 projection: residual += x, codes of its norm; dequantized + residual."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x * 0.5
        codes, scale = torch.ops.ops.fused_add_rms_norm_fp8(x, residual, self.w, 1e-6, "row", None, None, False)
        return codes.float() * scale + residual


class SwiGLUFp8Model(torch.nn.Module):
    """x -> silu_and_mul_fp8(x), dequantized: a gated MLP's activation as the down projection's FP8 input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        codes, scale = torch.ops.ops.silu_and_mul_fp8(x, "row", None, None, False)
        return codes.float() * scale


class AddRMSNormModel(_Weighted):
    """A decoder layer's pre-norm step in place: residual += h, h = rms_norm(residual); returns h + residual."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, residual = x * 2, x.clone()
        torch.ops.ops.fused_add_rms_norm(hidden, residual, self.w, 1e-6)
        return hidden + residual


# ---- bad inputs -----------------------------------------------------------------------------------------

def scaled_gemm_args(**change):
    """Keyword arguments of a valid scaled_gemm call (tensorwise, 4 x 32 x 16) with `change` applied."""
    args = dict(A=_fp8(4, 32), B=_fp8(32, 16, seed=1), scale_a=torch.tensor(1.0), scale_b=torch.tensor(1.0),
                bias=None, out_dtype=None, activation="none")
    args.update(change)
    return args


def _bad(name, args, error, pattern, kwargs=None):
    return BadInput(name, args, kwargs or {}, error, pattern)


def _bad_scaled(name, kwargs, error, pattern):
    return BadInput(name, (), kwargs, error, pattern)


_x, _w = torch.randn(4, 32, generator=torch.Generator().manual_seed(5)), torch.ones(32)

SCALED_GEMM_ERRORS = [
    _bad_scaled("A float32", scaled_gemm_args(A=torch.randn(4, 32)), RuntimeError,
                r"scaled_gemm: expected A and B to be torch.float8_e4m3fn or torch.float8_e5m2, got A torch.float32 "
                r"and B torch.float8_e4m3fn"),
    _bad_scaled("both e5m2", scaled_gemm_args(A=_fp8(4, 32, dtype=E5), B=_fp8(32, 16, dtype=E5)), RuntimeError,
                r"scaled_gemm: A and B cannot both be torch.float8_e5m2"),
    _bad_scaled("1-d A", scaled_gemm_args(A=_fp8(32)), RuntimeError, r"scaled_gemm: expected A to be a 2-D matrix \(M, K\)"),
    _bad_scaled("K mismatch", scaled_gemm_args(B=_fp8(48, 16)), RuntimeError,
                r"scaled_gemm: A \(M, K\) and B \(K, N\) must agree on K"),
    _bad_scaled("K % 16", scaled_gemm_args(A=_fp8(4, 24), B=_fp8(24, 16)), RuntimeError,
                r"scaled_gemm: expected K and N to be multiples of 16 .*got K = 24 and N = 16"),
    _bad_scaled("N % 16", scaled_gemm_args(B=_fp8(32, 8)), RuntimeError, r"scaled_gemm: .*got K = 32 and N = 8"),
    _bad_scaled("scale dtype", scaled_gemm_args(scale_a=torch.tensor(1.0, dtype=torch.float64)), RuntimeError,
                r"scaled_gemm: expected scale_a and scale_b to be torch.float32, got torch.float64 and torch.float32"),
    _bad_scaled("tensorwise x rowwise", scaled_gemm_args(scale_b=torch.ones(1, 16)), RuntimeError,
                r"scaled_gemm: scale_a of shape \[\] and scale_b of shape \[1, 16\] are no recipe for A \(M, K\) = "
                r"\(4, 32\)"),
    _bad_scaled("rowwise transposed", scaled_gemm_args(scale_a=torch.ones(1, 4), scale_b=torch.ones(16, 1)), RuntimeError,
                r"scaled_gemm: .*expected tensorwise: one element each; rowwise: \(M, 1\) = \(4, 1\) and \(1, N\) = "
                r"\(1, 16\)"),
    _bad_scaled("out_dtype", scaled_gemm_args(out_dtype=torch.float64), RuntimeError,
                r"scaled_gemm: expected out_dtype to be torch.bfloat16, torch.float16 or torch.float32, got "
                r"torch.float64"),
    _bad_scaled("bias shape", scaled_gemm_args(bias=torch.ones(8, dtype=torch.bfloat16)), RuntimeError,
                r"scaled_gemm: expected bias of shape \(N,\) = \(16,\), got \[8\]"),
    _bad_scaled("bias dtype", scaled_gemm_args(bias=torch.ones(16)), RuntimeError,
                r"scaled_gemm: expected bias's dtype to be torch.bfloat16 \(out_dtype\), got torch.float32"),
    _bad_scaled("out's dtype", scaled_gemm_args(out=torch.empty(4, 16, dtype=torch.float64)), RuntimeError,  # out decides
                r"scaled_gemm: expected out's dtype to be torch.bfloat16, torch.float16 or torch.float32, got "
                r"torch.float64"),
    _bad_scaled("bias dtype with out", scaled_gemm_args(bias=torch.ones(16), out=torch.empty(4, 16, dtype=torch.float16)),
                RuntimeError, r"scaled_gemm: expected bias's dtype to be torch.float16 \(out's dtype\), got "
                              r"torch.float32"),
    _bad_scaled("activation", scaled_gemm_args(activation="tanh"), ValueError,
                r'scaled_gemm: expected activation to be one of "none", "relu", "gelu", "gelu_tanh", "silu", got "tanh"'),
]

QUANTIZE_FP8_ERRORS = [
    _bad("integer", (torch.ones(4, 8, dtype=torch.int32),), RuntimeError,
         r"quantize_fp8: expected input's dtype to be float16, bfloat16, float32 or float64, got torch.int32"),
    _bad("0-d", (torch.tensor(1.0),), RuntimeError, r"quantize_fp8: expected input of shape \(\.\.\., K\), got a 0-D"),
    _bad("granularity", (torch.ones(4, 8), "channel"), ValueError,
         r'quantize_fp8: expected granularity to be one of "tensor", "row", "group" \(1x128\), "block" \(128x128\), '
         r'got "channel"'),
    _bad("block of 3-d", (torch.ones(2, 4, 8), "block"), RuntimeError,
         r'quantize_fp8: granularity "block" \(128x128\) takes a 2-D'),
    _bad("dtype", (torch.ones(4, 8),), RuntimeError,
         r"quantize_fp8: expected dtype to be torch.float8_e4m3fn or torch.float8_e5m2, got torch.bfloat16",
         {"dtype": torch.bfloat16}),
    _bad("scale shape", (torch.ones(4, 8), "row"), RuntimeError,
         r'quantize_fp8: expected scale of shape \[4, 1\] for granularity "row" and input of shape \[4, 8\], got \[4\]',
         {"scale": torch.ones(4)}),
    _bad("scale and pow2", (torch.ones(4, 8), "tensor"), RuntimeError, r"quantize_fp8: pow2_scale rounds computed scales",
         {"scale": torch.tensor(1.0), "pow2_scale": True}),
]

FP8_NORM_ERRORS = {
    "rms_norm_fp8": [
        _bad("weight shape", (_x, torch.ones(16)), RuntimeError,
             r"rms_norm_fp8: expected weight of shape \(hidden,\) = \(32,\)"),
        _bad("granularity", (_x, _w, 1e-6, "channel"), ValueError,
             r'rms_norm_fp8: expected granularity to be one of "tensor"'),
    ],
    "fused_add_rms_norm_fp8": [
        _bad("residual shape", (_x, torch.randn(4, 16), _w), RuntimeError,
             r"fused_add_rms_norm_fp8: expected residual of input's shape \[4, 32\], got \[4, 16\]"),
        _bad("granularity", (_x, torch.randn(4, 32), _w, 1e-6, "channel"), ValueError,
             r'fused_add_rms_norm_fp8: expected granularity to be one of "tensor"'),
    ],
    "silu_and_mul_fp8": [
        _bad("odd", (torch.randn(4, 31),), RuntimeError, r"silu_and_mul_fp8: expected input's last dimension to be even"),
        _bad("block of 3-d", (torch.randn(2, 4, 32), "block"), RuntimeError,
             r'silu_and_mul_fp8: granularity "block" \(128x128\) takes a 2-D matrix, got input of shape \[2, 4, 32\] '
             r"\(silu\(gate\) \* up: \[2, 4, 16\]\)"),
        _bad("scale shape", (torch.randn(4, 32), "row"), RuntimeError,
             r'silu_and_mul_fp8: expected scale of shape \[4, 1\] for granularity "row" and input of shape \[4, 32\] '
             r"\(silu\(gate\) \* up: \[4, 16\]\), got \[4\]", {"scale": torch.ones(4)}),
    ],
}

def scaled_grouped_args(**change):
    """Positional arguments of a valid scaled_grouped_gemm call (2D x 3D rowwise, 7 x 32 x 16, 3 experts) with
    `change` applied."""
    args = dict(A=_fp8(7, 32), B=_fp8(3, 32, 16, seed=1), scale_a=torch.ones(7), scale_b=torch.ones(3, 16),
                offs=torch.tensor([2, 2, 7], dtype=torch.int32), bias=None, out_dtype=None)
    args.update(change)
    return tuple(args.values())


SCALED_GROUPED_GEMM_ERRORS = [
    _bad("A bfloat16", scaled_grouped_args(A=torch.randn(7, 32, dtype=torch.bfloat16)), RuntimeError,
         r"scaled_grouped_gemm: expected A and B to be torch.float8_e4m3fn \(as torch._scaled_grouped_mm\), got A "
         r"torch.bfloat16 and B torch.float8_e4m3fn"),
    _bad("e5m2", scaled_grouped_args(B=_fp8(3, 32, 16, dtype=E5)), RuntimeError,
         r"scaled_grouped_gemm: expected A and B to be torch.float8_e4m3fn"),
    _bad("offs missing", scaled_grouped_args(offs=None), RuntimeError, r"scaled_grouped_gemm: offs is required"),
    _bad("offs dtype", scaled_grouped_args(offs=torch.tensor([2, 2, 7])), RuntimeError,
         r"scaled_grouped_gemm: expected offs to be torch.int32"),
    _bad("scale_b per tensor", scaled_grouped_args(scale_b=torch.ones(3)), RuntimeError,
         r"scaled_grouped_gemm: scale_a of shape \[7\] and scale_b of shape \[3\] are no recipe for A of shape "
         r"\[7, 32\] and B of shape \[3, 32, 16\] \(2D x 3D\); expected rowwise: \[7\] and \[3, 16\]; blockwise "
         r"1x128 x 128x128: \[7, 1\] and \[3, 1, 1\]"),
    _bad("blockwise K % 128", scaled_grouped_args(scale_a=torch.ones(7, 1), scale_b=torch.ones(3, 1, 1)),
         RuntimeError, r"scaled_grouped_gemm: the blockwise recipe takes K in whole 128-blocks, got K = 32"),
    _bad("blockwise 2D x 2D", scaled_grouped_args(A=_fp8(4, 256), B=_fp8(256, 16), scale_a=torch.ones(4, 2),
                                                 scale_b=torch.ones(2, 1), offs=torch.tensor([128, 256],
                                                                                             dtype=torch.int32)),
         RuntimeError, r"scaled_grouped_gemm: .*\(2D x 2D\); expected rowwise: \[8\] and \[32\] \(blockwise "
                       r"scales take 2D x 3D and 3D x 3D\)"),
    _bad("K % 16", scaled_grouped_args(A=_fp8(7, 24), B=_fp8(3, 24, 16)), RuntimeError,
         r"scaled_grouped_gemm: expected K and N to be multiples of 16 .*got K = 24 and N = 16"),
    _bad("scale dtype", scaled_grouped_args(scale_a=torch.ones(7, dtype=torch.float64)), RuntimeError,
         r"scaled_grouped_gemm: expected scale_a to be torch.float32, got torch.float64"),
    _bad("bias shape", scaled_grouped_args(bias=torch.ones(16, dtype=torch.bfloat16)), RuntimeError,
         r"scaled_grouped_gemm: expected bias of shape \[3, 16\] \(G, N\), got \[16\]"),
    _bad("bias dtype", scaled_grouped_args(bias=torch.ones(3, 16)), RuntimeError,
         r"scaled_grouped_gemm: expected bias's dtype to be torch.bfloat16 \(out_dtype\), got torch.float32"),
    _bad("out_dtype", scaled_grouped_args(out_dtype=torch.float64), RuntimeError,
         r"scaled_grouped_gemm: expected out_dtype to be torch.bfloat16, torch.float16 or torch.float32, got "
         r"torch.float64"),
]

ERRORS = {
    "cutlass_gemm": [
        _bad("K mismatch", (torch.randn(4, 8), torch.randn(7, 3)), RuntimeError,
             r"cutlass_gemm: A \(M, K\) and B \(K, N\) must agree on K, got A of shape \[4, 8\] and B of shape \[7, 3\]"),
        _bad("dtype mismatch", (torch.randn(4, 8), torch.randn(8, 3, dtype=torch.float64)), RuntimeError,
             r"cutlass_gemm: A and B must have the same dtype, got A torch.float32 and B torch.float64"),
    ],
    "linear": [
        _bad("activation", (torch.randn(4, 8), torch.randn(3, 8), None, "tanh"), ValueError,
             r'linear: expected activation to be one of "none", "relu", "gelu", "gelu_tanh", "silu", got "tanh"'),
        _bad("bias shape", (torch.randn(4, 8), torch.randn(3, 8), torch.randn(4)), RuntimeError,
             r"linear: expected bias of shape \(out_features,\) = \(3,\), got \[4\]"),
    ],
    "rms_norm": [
        _bad("weight shape", (torch.randn(4, 8), torch.randn(7)), RuntimeError,
             r"rms_norm: expected weight of shape \(hidden,\) = \(8,\)"),
        _bad("integer", (torch.ones(4, 8, dtype=torch.int32), torch.ones(8, dtype=torch.int32)), RuntimeError,
             r"rms_norm: expected input's dtype to be float16, bfloat16, float32 or float64"),
    ],
    "silu_and_mul": [
        _bad("odd", (torch.randn(4, 7),), RuntimeError, r"silu_and_mul: expected input's last dimension to be even"),
    ],
    "grouped_gemm": [
        _bad("offs dtype", (torch.randn(7, 4), torch.randn(3, 4, 5), torch.tensor([2, 2, 7])), RuntimeError,
             r"grouped_gemm: expected offs to be torch.int32 \(as torch._grouped_mm\), got torch.int64"),
        _bad("offs length", (torch.randn(7, 4), torch.randn(3, 4, 5), torch.tensor([2, 7], dtype=torch.int32)),
             RuntimeError, r"grouped_gemm: expected offs of G = 3 elements \(B's first dimension in 2D x 3D\), got 2"),
    ],
    "fused_add_rms_norm": [
        _bad("weight shape", (torch.randn(4, 8), torch.randn(4, 8), torch.randn(7)), RuntimeError,
             r"fused_add_rms_norm: expected weight of shape \(hidden,\) = \(8,\)"),
        _bad("residual dtype", (torch.randn(4, 8), torch.randn(4, 8, dtype=torch.float64), torch.randn(8)),
             RuntimeError, r"fused_add_rms_norm: expected residual's dtype to be torch.float32 \(input's dtype\), "
                           r"got torch.float64"),
    ],
    "scaled_gemm": SCALED_GEMM_ERRORS,
    "scaled_grouped_gemm": SCALED_GROUPED_GEMM_ERRORS,
    "quantize_fp8": QUANTIZE_FP8_ERRORS,
    **FP8_NORM_ERRORS,
}

_FP8_GRAD = r"not differentiable \(FP8 codes have no gradient\), but {arg} requires grad"
_FP8_NOT_DIFFERENTIABLE = {"autograd": "not differentiable (FP8 codes have no gradient): an argument that requires "
                                       "grad raises (test_modes.py::test_non_differentiable_ops_refuse_grad)"}
# The FP8 GEMMs: not differentiable, and opcheck's test_schema needs arithmetic FP8 lacks on CPU.
_FP8_OPERANDS_GRAD = r"not differentiable \(FP8 operands have no gradient\), but {arg} requires grad"
_FP8_OPERANDS_SKIPS = {
    "autograd": "not differentiable (FP8 operands have no gradient): an argument that requires grad raises "
                "(test_modes.py::test_non_differentiable_ops_refuse_grad)",
    "test_schema": "opcheck's test_schema compares tensors with arithmetic FP8 lacks on CPU (\"mul_cpu_reduced_float\" "
                   "not implemented for 'Float8_e4m3fn'); test_modes.py's opcheck test checks that no input is written"}
_input16 = lambda n: torch.randn(n, 16, generator=torch.Generator().manual_seed(n))  # noqa: E731

OPS = [
    OpSpec(
        name="cutlass_gemm",
        overload=torch.ops.ops.cutlass_gemm.default,
        call=ops.cutlass_gemm,
        reference=lambda A, B, out=None: torch.mm(A.double(), B.double()),
        samples=_gemm_samples,
        dtypes=_FLOATS,
        module=GemmMLP,
        module_input=_input16,
        errors=ERRORS["cutlass_gemm"],
        out_overload=torch.ops.ops.cutlass_gemm.out,
        out_samples=_gemm_out_samples,
    ),
    OpSpec(
        name="linear",
        overload=torch.ops.ops.linear.default,
        call=ops.linear,
        reference=_linear_reference,
        samples=_linear_samples,
        dtypes=_FLOATS,
        module=LinearMLP,
        module_input=_input16,
        errors=ERRORS["linear"],
    ),
    OpSpec(
        name="rms_norm",
        overload=torch.ops.ops.rms_norm.default,
        call=ops.rms_norm,
        reference=lambda x, w: torch.nn.functional.rms_norm(x.double(), (x.shape[-1],), w.double(), 1e-6),
        samples=_rms_norm_samples,
        dtypes=_FLOATS,
        module=RMSNormModel,
        module_input=_input16,
        errors=ERRORS["rms_norm"],
    ),
    OpSpec(
        name="silu_and_mul",
        overload=torch.ops.ops.silu_and_mul.default,
        call=ops.silu_and_mul,
        reference=_silu_and_mul_reference,
        samples=_silu_and_mul_samples,
        dtypes=_FLOATS,
        module=SwiGLUModel,
        module_input=_input16,
        errors=ERRORS["silu_and_mul"],
    ),
    OpSpec(
        name="grouped_gemm",
        overload=torch.ops.ops.grouped_gemm.default,
        call=ops.grouped_gemm,
        reference=grouped_reference,
        samples=_grouped_samples,
        dtypes=_FLOATS,
        module=TinyMoE,
        module_input=_input16,
        errors=ERRORS["grouped_gemm"],
        out_overload=torch.ops.ops.grouped_gemm.out,
        out_samples=_grouped_out_samples,
        index_args=(2,),
        plan=lambda A, B, offs=None: ops.grouped.plan(A, B, offs),
        skips={"cuda_graph_module": "the float32 model's grouped_gemm calls read offsets on the host (the loop "
                                    "path); test_grouped_gemm.py captures the bfloat16 SM90 path"},
    ),
    OpSpec(
        name="fused_add_rms_norm",
        overload=torch.ops.ops.fused_add_rms_norm.default,
        call=ops.fused_add_rms_norm,
        reference=fused_add_rms_norm_reference,
        samples=_fused_add_rms_norm_samples,
        dtypes=_FLOATS,
        module=AddRMSNormModel,
        module_input=_input16,
        errors=ERRORS["fused_add_rms_norm"],
        mutated=(0, 1),
        exact=True,
        grad_error=r"an in-place inference op, it does not support automatic differentiation, but {arg} requires grad",
        skips={"autograd": "an in-place inference op: an argument that requires grad raises "
                           "(ops.rms_norm(input + residual, weight) differentiates)"},
    ),
    OpSpec(
        name="scaled_gemm",
        overload=torch.ops.ops.scaled_gemm.default,
        call=ops.scaled_gemm,
        reference=scaled_gemm_reference,
        samples=_scaled_gemm_samples,
        dtypes=_SCALED_OUT,  # out_dtype
        module=Fp8Projection,
        module_input=_input16,
        errors=ERRORS["scaled_gemm"],
        out_overload=torch.ops.ops.scaled_gemm.out,
        out_samples=_scaled_gemm_out_samples,
        exact=True,
        close=close_scaled_gemm,
        grad_error=_FP8_OPERANDS_GRAD,
        opcheck_utils=OPCHECK_UTILS,
        skips=_FP8_OPERANDS_SKIPS,
    ),
    OpSpec(
        name="scaled_grouped_gemm",
        overload=torch.ops.ops.scaled_grouped_gemm.default,
        call=ops.scaled_grouped_gemm,
        reference=scaled_grouped_reference,
        samples=_scaled_grouped_samples,
        dtypes=_SCALED_OUT,  # out_dtype
        module=Fp8MoE,
        module_input=_input16,
        errors=ERRORS["scaled_grouped_gemm"],
        out_overload=torch.ops.ops.scaled_grouped_gemm.out,
        out_samples=_scaled_grouped_out_samples,
        index_args=(4,),
        exact=True,
        close=close_scaled_gemm,
        grad_error=_FP8_OPERANDS_GRAD,
        opcheck_utils=OPCHECK_UTILS,
        plan=ops.fp8.grouped_plan,
        skips={**_FP8_OPERANDS_SKIPS,
               "cuda_graph_module": "the model's float32-out calls read offsets on the host (the formula path); "
                                    "test_scaled_grouped_gemm.py captures the SM90 paths"},
    ),
    OpSpec(
        name="quantize_fp8",
        overload=torch.ops.ops.quantize_fp8.default,
        call=ops.quantize_fp8,
        reference=quantize_fp8_reference,
        samples=_quantize_samples,
        dtypes=_FLOATS,
        module=FakeQuantize,
        module_input=_input16,
        errors=ERRORS["quantize_fp8"],
        exact=True,
        close=close_codes,
        grad_error=_FP8_GRAD,
        skips=_FP8_NOT_DIFFERENTIABLE,
    ),
    OpSpec(
        name="rms_norm_fp8",
        overload=torch.ops.ops.rms_norm_fp8.default,
        call=ops.rms_norm_fp8,
        reference=rms_norm_fp8_reference,
        samples=_rms_norm_fp8_samples,
        dtypes=_FLOATS,
        module=RMSNormFp8Model,
        module_input=_input16,
        errors=ERRORS["rms_norm_fp8"],
        exact=True,
        close=close_codes,
        grad_error=_FP8_GRAD,
        skips=_FP8_NOT_DIFFERENTIABLE,
    ),
    OpSpec(
        name="fused_add_rms_norm_fp8",
        overload=torch.ops.ops.fused_add_rms_norm_fp8.default,
        call=ops.fused_add_rms_norm_fp8,
        reference=fused_add_rms_norm_fp8_reference,
        samples=_fused_add_rms_norm_fp8_samples,
        dtypes=_FLOATS,
        module=AddRMSNormFp8Model,
        module_input=_input16,
        errors=ERRORS["fused_add_rms_norm_fp8"],
        mutated=(1,),
        exact=True,
        close=close_codes,
        grad_error=_FP8_GRAD,
        skips=_FP8_NOT_DIFFERENTIABLE,
    ),
    OpSpec(
        name="silu_and_mul_fp8",
        overload=torch.ops.ops.silu_and_mul_fp8.default,
        call=ops.silu_and_mul_fp8,
        reference=silu_and_mul_fp8_reference,
        samples=_silu_and_mul_fp8_samples,
        dtypes=_FLOATS,
        module=SwiGLUFp8Model,
        module_input=_input16,
        errors=ERRORS["silu_and_mul_fp8"],
        exact=True,
        close=close_codes,
        grad_error=_FP8_GRAD,
        skips=_FP8_NOT_DIFFERENTIABLE,
    ),
]

OP_IDS = [spec.name for spec in OPS]
