"""The registry of ops that the shared mode tests (autograd, opcheck, TorchScript, torch.compile,
torch.export + AOTInductor, DDP) run over. Adding an op to every mode is one OpSpec here.

Each OpSpec gives sample inputs (covering transposed, sliced, expanded and offset tensors), a float64
reference, and a small nn.Module that uses the op in a model-like way (for script/compile/export/DDP).
"""

import dataclasses
from typing import Callable, List, Optional, Tuple

import torch

import ops


@dataclasses.dataclass
class Sample:
    args: tuple
    kwargs: dict = dataclasses.field(default_factory=dict)
    name: str = ""


@dataclasses.dataclass
class OpSpec:
    name: str                                   # torch.ops.ops.<name>
    overload: object                            # the OpOverload opcheck runs
    call: Callable                              # the Python API
    reference: Callable                         # float64 reference on the same args
    samples: Callable[[str, torch.dtype, bool], List[Sample]]  # (device, dtype, requires_grad)
    dtypes: Tuple[torch.dtype, ...]
    differentiable: bool
    module: Callable[[], torch.nn.Module]       # a small model using the op (float32)
    module_input: Callable[[int], torch.Tensor]  # an input of batch size n for that model
    out_overload: Optional[object] = None       # e.g. torch.ops.ops.cutlass_gemm.out
    out_samples: Optional[Callable[[str, torch.dtype], List[Sample]]] = None
    # Positions of integer index arguments (grouped_gemm's offs): kept as they are where the tests
    # perturb, convert, batch or differentiate the data arguments.
    index_args: Tuple[int, ...] = ()

    def data_positions(self, sample: "Sample") -> List[int]:
        """The positions of the sample's tensor arguments that carry data (not index_args)."""
        return [i for i, a in enumerate(sample.args) if isinstance(a, torch.Tensor) and i not in self.index_args]


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


def grouped_reference(A, B, offs=None):
    """grouped_gemm's definition (ops/grouped.py), group by group, in float64; zero past the last end."""
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


_input16 = lambda n: torch.randn(n, 16, generator=torch.Generator().manual_seed(n))  # noqa: E731

OPS = [
    OpSpec(
        name="cutlass_gemm",
        overload=torch.ops.ops.cutlass_gemm.default,
        call=ops.cutlass_gemm,
        reference=lambda A, B: torch.mm(A.double(), B.double()),
        samples=_gemm_samples,
        dtypes=(torch.float16, torch.bfloat16, torch.float32, torch.float64),
        differentiable=True,
        module=GemmMLP,
        module_input=_input16,
        out_overload=torch.ops.ops.cutlass_gemm.out,
        out_samples=_gemm_out_samples,
    ),
    OpSpec(
        name="linear",
        overload=torch.ops.ops.linear.default,
        call=ops.linear,
        reference=_linear_reference,
        samples=_linear_samples,
        dtypes=(torch.float16, torch.bfloat16, torch.float32, torch.float64),
        differentiable=True,
        module=LinearMLP,
        module_input=_input16,
    ),
    OpSpec(
        name="rms_norm",
        overload=torch.ops.ops.rms_norm.default,
        call=ops.rms_norm,
        reference=lambda x, w: torch.nn.functional.rms_norm(x.double(), (x.shape[-1],), w.double(), 1e-6),
        samples=_rms_norm_samples,
        dtypes=(torch.float16, torch.bfloat16, torch.float32, torch.float64),
        differentiable=True,
        module=RMSNormModel,
        module_input=_input16,
    ),
    OpSpec(
        name="silu_and_mul",
        overload=torch.ops.ops.silu_and_mul.default,
        call=ops.silu_and_mul,
        reference=_silu_and_mul_reference,
        samples=_silu_and_mul_samples,
        dtypes=(torch.float16, torch.bfloat16, torch.float32, torch.float64),
        differentiable=True,
        module=SwiGLUModel,
        module_input=_input16,
    ),
    OpSpec(
        name="grouped_gemm",
        overload=torch.ops.ops.grouped_gemm.default,
        call=ops.grouped_gemm,
        reference=grouped_reference,
        samples=_grouped_samples,
        dtypes=(torch.float16, torch.bfloat16, torch.float32, torch.float64),
        differentiable=True,
        module=TinyMoE,
        module_input=_input16,
        out_overload=torch.ops.ops.grouped_gemm.out,
        out_samples=_grouped_out_samples,
        index_args=(2,),
    ),
]

OP_IDS = [spec.name for spec in OPS]
