"""ops.grouped_gemm: torch._grouped_mm's four modes against torch._grouped_mm itself (bit for bit on CPU) and a
float64 loop of torch.mm, every edge of the group offsets, errors the fake kernel repeats, the out variant,
autograd (gradcheck, any gradient layout, forward mode), opcheck, torch.compile, torch.export, TorchScript."""

import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st

import ops
from conftest import DEVICES
from op_registry import TinyMoE, grouped_reference as loop_reference

OPCHECK_UTILS = ("test_schema", "test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")


def randn(*shape, dtype=torch.float32, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)


def offsets(ends, device="cpu"):
    return torch.tensor(ends, dtype=torch.int32, device=device)


# (name, A shape, B shape, offs): every mode with empty groups, groups of one and uneven boundaries.
CASES = [
    ("2Dx3D", (13, 32), (4, 32, 24), [3, 3, 4, 13]),
    ("2Dx3D tail", (13, 32), (3, 32, 16), [0, 5, 9]),  # rows 9-12 in no group: zero
    ("2Dx2D", (8, 40), (40, 16), [16, 16, 17, 40]),
    ("3Dx3D", (3, 5, 16), (3, 16, 8), None),
    ("3Dx2D", (3, 8, 16), (16, 40), [8, 8, 32]),  # columns 32-39 in no group: zero
]


def make(case, dtype=torch.float32, device="cpu", b_transposed=False):
    _, a_shape, b_shape, ends = case
    A = randn(*a_shape, dtype=dtype, device=device)
    if b_transposed:  # weights stored (G, N, K), as nn.Linear's, passed transposed
        B = randn(*b_shape[:-2], b_shape[-1], b_shape[-2], dtype=dtype, seed=1, device=device).transpose(-2, -1)
    else:
        B = randn(*b_shape, dtype=dtype, seed=1, device=device)
    return A, B, None if ends is None else offsets(ends, device)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("b_transposed", [False, True], ids=["B", "B^T"])
def test_equals_torch_grouped_mm_on_cpu(case, dtype, b_transposed):
    A, B, offs = make(case, dtype, b_transposed=b_transposed)
    got = ops.grouped_gemm(A, B, offs)
    expected = torch._grouped_mm(A, B, offs)
    covered = loop_reference(torch.ones_like(A), torch.ones_like(B), offs) != 0  # torch leaves the rest unwritten
    assert got.dtype == dtype and got.shape == expected.shape
    assert torch.equal(got[covered], expected[covered])
    assert not got[~covered].any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_every_mode_against_a_float64_loop(device, case, dtype):
    A, B, offs = make(case, dtype, device)
    got = ops.grouped_gemm(A, B, offs)
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(got.double().cpu(), loop_reference(A.cpu(), B.cpu(), offs), atol=tol * 32,
                               rtol=tol)
    if dtype in (torch.float16, torch.bfloat16):
        wide = ops.grouped_gemm(A, B, offs, out_dtype=torch.float32)
        assert wide.dtype == torch.float32
        torch.testing.assert_close(wide.cpu(), loop_reference(A.cpu(), B.cpu(), offs).float(), atol=1e-4, rtol=1e-5)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.data())
def test_any_group_sizes(data):
    """Random group sizes (empty, one row, anything) and all four modes, against the float64 loop."""
    mode = data.draw(st.sampled_from(["2Dx3D", "2Dx2D", "3Dx3D", "3Dx2D"]))
    G = data.draw(st.integers(0 if mode != "3Dx2D" else 1, 5))
    sizes = data.draw(st.lists(st.integers(0, 7), min_size=G, max_size=G))
    tail = data.draw(st.integers(0, 3))
    ends = torch.tensor(sizes, dtype=torch.int64).cumsum(0).tolist()
    total = (ends[-1] if ends else 0) + tail
    m, k, n = data.draw(st.integers(0, 6)), data.draw(st.integers(0, 9)), data.draw(st.integers(1, 6))
    shapes = {"2Dx3D": ((total, k), (G, k, n)), "2Dx2D": ((m, total), (total, n)),
              "3Dx3D": ((G, m, k), (G, k, n)), "3Dx2D": ((G, m, k), (k, total))}[mode]
    A, B = randn(*shapes[0], dtype=torch.float64), randn(*shapes[1], dtype=torch.float64, seed=1)
    offs = None if mode == "3Dx3D" else offsets(ends)
    if mode == "3Dx3D":
        A, B = randn(G, m, k, dtype=torch.float64), randn(G, k, n, dtype=torch.float64, seed=1)
    torch.testing.assert_close(ops.grouped_gemm(A, B, offs), loop_reference(A, B, offs), atol=1e-12, rtol=1e-12)


def _bad(**changes):
    args = {"A": randn(10, 16), "B": randn(3, 16, 8), "offs": offsets([2, 2, 10])}
    args.update(changes)
    return args


BAD = [
    ("1-d A", _bad(A=randn(16)), r"grouped_gemm: expected A to be 2-D \(M, K\) or 3-D \(G, M, K\), got a 1-D tensor"),
    ("4-d B", _bad(B=randn(1, 3, 16, 8)), r"grouped_gemm: expected B to be 2-D \(K, N\) or 3-D \(G, K, N\), got a 4-D"),
    ("int A", _bad(A=torch.ones(10, 16, dtype=torch.int32)),
     r"grouped_gemm: expected A's dtype to be float16, bfloat16, float32 or float64, got torch.int32"),
    ("dtypes differ", _bad(B=randn(3, 16, 8, dtype=torch.float64)),
     r"grouped_gemm: A and B must have the same dtype, got A torch.float32 and B torch.float64"),
    ("K", _bad(B=randn(3, 12, 8)), r"grouped_gemm: A and B must agree on K \(A's last dimension, B's second to last\)"),
    ("G 3Dx3D", _bad(A=randn(2, 4, 16), offs=None), r"grouped_gemm: A \(G, M, K\) and B \(G, K, N\) must agree on G"),
    ("no offs", _bad(offs=None), r"grouped_gemm: offs is required when A or B is 2-D"),
    ("offs for 3Dx3D", _bad(A=randn(3, 4, 16)), r"grouped_gemm: offs must be None when A and B are both 3-D"),
    ("offs int64", _bad(offs=torch.tensor([2, 2, 10])),
     r"grouped_gemm: expected offs to be torch.int32 \(as torch._grouped_mm\), got torch.int64"),
    ("offs 2-d", _bad(offs=offsets([[2, 2, 10]])), r"grouped_gemm: expected offs to be 1-D \(G,\), got a 2-D"),
    ("offs count", _bad(offs=offsets([2, 10])),
     r"grouped_gemm: expected offs of G = 3 elements \(B's first dimension in 2D x 3D\), got 2"),
    ("offs count 3Dx2D", _bad(A=randn(2, 4, 16), B=randn(16, 8), offs=offsets([8])),
     r"grouped_gemm: expected offs of G = 2 elements \(A's first dimension in 3D x 2D\), got 1"),
    ("out_dtype", _bad(out_dtype=torch.float16),
     r"grouped_gemm: expected out_dtype to be torch.float32 \(A's dtype\), got torch.float16"),
    ("out_dtype half", _bad(A=randn(10, 16, dtype=torch.bfloat16), B=randn(3, 16, 8, dtype=torch.bfloat16),
                            out_dtype=torch.float16),
     r"grouped_gemm: expected out_dtype to be torch.bfloat16 \(A's dtype\) or torch.float32, got torch.float16"),
    ("out's dtype", _bad(out=randn(10, 8, dtype=torch.float64)),  # no out_dtype: out's decides, and is named
     r"grouped_gemm: expected out's dtype to be torch.float32 \(A's dtype\), got torch.float64"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_inputs_and_the_fake_kernel_says_the_same(case):
    _, args, pattern = case
    messages = []
    for device in ("cpu", "meta"):
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
        with pytest.raises(RuntimeError, match=pattern) as info:
            ops.grouped_gemm(**moved)
        messages.append(str(info.value).splitlines()[0])
    assert messages[0] == messages[1]


@pytest.mark.parametrize("ends, pattern", [
    ([2, 1, 10], r"grouped_gemm: expected offs to be non-negative and non-decreasing \(cumulative ends of the groups "
                 r"along M\), got offs\[1\] = 1 after offs\[0\] = 2"),
    ([-1, 2, 10], r"got offs\[0\] = -1$"),
    ([2, 4, 11], r"grouped_gemm: offs's last end must be at most M = 10 \(in 2D x 3D\), got 11"),
])
def test_bad_offset_values_are_errors_on_cpu(ends, pattern):
    A, B = randn(10, 16), randn(3, 16, 8)
    with pytest.raises(RuntimeError, match=pattern):
        ops.grouped_gemm(A, B, offsets(ends))
    with pytest.raises(RuntimeError, match=r"offs's last end must be at most K = 16 \(in 2D x 2D\), got 17"):
        ops.grouped_gemm(randn(4, 16), randn(16, 8), offsets([3, 17]))


def test_offsets_must_be_contiguous():
    for device in ("cpu", "meta"):
        with pytest.raises(RuntimeError, match=r"^grouped_gemm: offs must be a contiguous tensor"):
            ops.grouped_gemm(randn(10, 16).to(device), randn(3, 16, 8).to(device),
                             offsets([2, 0, 2, 0, 10, 0], device)[::2])


def test_devices_must_agree():
    with pytest.raises(RuntimeError, match=r"grouped_gemm: expected offs on cpu \(A's device\), got meta"):
        ops.grouped_gemm(randn(10, 16), randn(3, 16, 8), offsets([2, 2, 10], "meta"))


def test_out_variant():
    A, B, offs = make(CASES[0])
    expected = ops.grouped_gemm(A, B, offs, out_dtype=torch.float32)
    for out in (torch.empty(13, 24), torch.empty(24, 13).t(), torch.empty(13, 48)[:, ::2], torch.full((13, 24), 7.)):
        assert ops.grouped_gemm(A, B, offs, out=out) is out
        assert torch.equal(out, expected)
    tail = make(CASES[1])
    out = torch.full((13, 16), 7.0)
    ops.grouped_gemm(*tail, out=out)
    assert not out[9:].any()  # rows in no group are written with zeros, not left as they were
    with pytest.raises(RuntimeError, match=r"grouped_gemm: expected out of shape \[13, 24\] \(2D x 3D\), got \[13, 16\]"):
        ops.grouped_gemm(A, B, offs, out=torch.empty(13, 16))
    with pytest.raises(RuntimeError, match=r"grouped_gemm: expected out's dtype to be torch.float32 \(out_dtype\)"):
        ops.grouped_gemm(A, B, offs, out_dtype=torch.float32, out=torch.empty(13, 24, dtype=torch.float64))
    shared = torch.zeros(8, 8)
    with pytest.raises(RuntimeError, match="grouped_gemm: out overlaps A in memory"):
        ops.grouped_gemm(shared, randn(2, 8, 8), offsets([3, 8]), out=shared)
    with pytest.raises(RuntimeError, match="grouped_gemm: out has internally overlapping memory"):
        ops.grouped_gemm(A, B, offs, out=torch.zeros(1, 24).expand(13, 24))
    with pytest.raises(RuntimeError, match="grouped_gemm: the out= variant does not support automatic differentiation"):
        ops.grouped_gemm(A.requires_grad_(), B, offs, out=torch.empty(13, 24))


# Small enough for gradgradcheck's numerical second derivatives, the same edges as CASES.
SMALL = [
    ("2Dx3D", (7, 4), (4, 4, 3), [2, 2, 3, 7]),
    ("2Dx3D tail", (7, 4), (2, 4, 3), [0, 5]),
    ("2Dx2D", (3, 9), (9, 4), [4, 4, 5, 9]),
    ("3Dx3D", (2, 3, 4), (2, 4, 3), None),
    ("3Dx2D", (3, 3, 4), (4, 9), [3, 3, 7]),
]


@pytest.mark.parametrize("case", SMALL, ids=[c[0] for c in SMALL])
@pytest.mark.parametrize("b_transposed", [False, True], ids=["B", "B^T"])
def test_gradcheck(case, b_transposed):
    A, B, offs = make(case, torch.float64, b_transposed=b_transposed)
    A.requires_grad_(), B.requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: ops.grouped_gemm(a, b, offs), (A, B))
    assert torch.autograd.gradgradcheck(lambda a, b: ops.grouped_gemm(a, b, offs), (A, B))
    assert torch.autograd.gradcheck(lambda a, b: ops.grouped_gemm(a, b, offs), (A, B), check_forward_ad=True,
                                    check_backward_ad=False, check_undefined_grad=False)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("grad_layout", ["expanded", "transposed", "contiguous"])
def test_backward_with_any_gradient_layout(case, grad_layout):
    """torch._grouped_mm's own CPU backward fails on the expanded gradient of out.sum()."""
    A, B, offs = make(case, torch.float32)
    A.requires_grad_(), B.requires_grad_()
    out = ops.grouped_gemm(A, B, offs)
    grad = {"expanded": torch.ones(()).expand(out.shape),
            "transposed": randn(*reversed(out.shape), seed=5).permute(*reversed(range(out.dim()))),
            "contiguous": randn(*out.shape, seed=5)}[grad_layout]
    dA, dB = torch.autograd.grad(out, (A, B), grad)
    A64, B64 = A.detach().double().requires_grad_(), B.detach().double().requires_grad_()
    rA, rB = torch.autograd.grad(loop_reference(A64, B64, offs), (A64, B64), grad.double())
    torch.testing.assert_close(dA.double(), rA, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dB.double(), rB, atol=1e-4, rtol=1e-4)


def test_backward_equals_torch_grouped_mm_where_it_runs():
    A, B, offs = make(CASES[0], torch.bfloat16)
    grad = randn(13, 24, dtype=torch.bfloat16, seed=5)
    ours = torch.autograd.grad(ops.grouped_gemm(A.requires_grad_(), B.requires_grad_(), offs), (A, B), grad)
    theirs = torch.autograd.grad(torch._grouped_mm(A, B, offs), (A, B), grad)
    for x, y in zip(ours, theirs):
        torch.testing.assert_close(x, y, atol=0, rtol=0)


def test_gradients_of_float32_outputs_are_in_the_inputs_dtype():
    A, B, offs = make(CASES[0], torch.bfloat16)
    out = ops.grouped_gemm(A.requires_grad_(), B.requires_grad_(), offs, out_dtype=torch.float32)
    dA, dB = torch.autograd.grad(out.sum(), (A, B))
    assert dA.dtype == dB.dtype == torch.bfloat16
    A64, B64 = A.detach().double().requires_grad_(), B.detach().double().requires_grad_()
    rA, rB = torch.autograd.grad(loop_reference(A64, B64, offs).sum(), (A64, B64))
    torch.testing.assert_close(dA.double(), rA, atol=0.1, rtol=2e-2)
    torch.testing.assert_close(dB.double(), rB, atol=0.1, rtol=2e-2)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_opcheck(case):
    A, B, offs = make(case, torch.float32, b_transposed=True)
    torch.library.opcheck(torch.ops.ops.grouped_gemm.default, (A, B, offs), test_utils=OPCHECK_UTILS)
    torch.library.opcheck(torch.ops.ops.grouped_gemm.default, (A.requires_grad_(), B.requires_grad_(), offs),
                          {"out_dtype": torch.float32}, test_utils=OPCHECK_UTILS)
    out = torch.empty(ops.grouped_gemm(A, B, offs).shape)
    torch.library.opcheck(torch.ops.ops.grouped_gemm.out, (A.detach(), B.detach(), offs), {"out": out},
                          test_utils=OPCHECK_UTILS)


def test_a_moe_layer_compiles_without_graph_breaks_exports_and_scripts():
    model = TinyMoE()
    x = randn(11, 16)
    expected = model.reference(x).float()
    torch.testing.assert_close(model(x), expected)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for n in (3, 11, 20):
        xn = randn(n, 16, seed=n)
        torch.testing.assert_close(compiled(xn), model.reference(xn).float())
    tokens = torch.export.Dim("tokens", min=2)
    exported = torch.export.export(model, (x,), dynamic_shapes=({0: tokens},))
    assert any(n.target == torch.ops.ops.grouped_gemm.default for n in exported.graph.nodes)
    x9 = randn(9, 16, seed=9)
    torch.testing.assert_close(exported.module()(x9), model.reference(x9).float())
    scripted = torch.jit.script(model)
    torch.testing.assert_close(scripted(x9), model.reference(x9).float())


def test_a_moe_layer_trains_like_its_loop():
    model = TinyMoE()
    x = randn(12, 16)
    loss = model(x).square().sum()
    grads = torch.autograd.grad(loss, [model.gate_up, model.down])
    ref = torch.autograd.grad(model.reference(x).square().sum(), [model.gate_up, model.down])
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_agrees_with_torch_grouped_mm_on_the_gpu(case, dtype):
    A, B, offs = make(case, dtype, "cuda", b_transposed=True)
    got = ops.grouped_gemm(A, B, offs)
    if dtype == torch.bfloat16 and _torch_checks_group_sizes(A, B, case[0].split()[0]):
        # These groups (0, 1 of K; 0 of N) would stop torch's bfloat16 kernel with a device-side assert: its
        # float32 path computes them.
        expected = torch._grouped_mm(A.float(), B.float(), offs).to(dtype)
    else:
        expected = torch._grouped_mm(A, B, offs)
    covered = loop_reference(torch.ones_like(A), torch.ones_like(B), offs) != 0
    tol = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(got[covered].float(), expected[covered].float(), atol=tol * 8, rtol=tol)
    assert not got[~covered].any()


def test_plan_names_the_path():
    A, B, offs = make(CASES[0])
    assert ops.grouped.plan(A, B, offs) == {"kind": "grouped", "path": "loop", "kernel": None, "mode": "2D x 3D",
                                            "host_sync": False, "offsets": "checked on the host",
                                            "reason": "the CPU runs one ATen mm per group"}
    assert ops.grouped.plan(*make(CASES[3]))["mode"] == "3D x 3D"
    with pytest.raises(RuntimeError, match="grouped_gemm: offs is required"):
        ops.grouped.plan(A, B)


def torch_path(A, B, offs=None, out_dtype=None):
    """The CUDA kernel's torch._grouped_mm path (grouped_gemm.cpp grouped_gemm_torch) on CPU tensors."""
    return torch.ops.ops._grouped_gemm_torch_path(A, B, offs, out_dtype)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("b_transposed", [False, True], ids=["B", "B^T"])
def test_the_cuda_torch_path_equals_the_op_on_good_offsets(case, dtype, b_transposed):
    # The same ATen calls as on CUDA, so that its logic (layouts taken or copied, tails and empty K zeroed,
    # a contiguous result) is checked without a GPU.
    A, B, offs = make(case, dtype, b_transposed=b_transposed)
    if dtype == torch.bfloat16 and case[0] == "3Dx2D":  # torch's kernel checks N's group sizes: the loop's
        with pytest.raises(RuntimeError, match="torch._grouped_mm does not take this problem"):
            torch_path(A, B, offs)
        return
    got = torch_path(A, B, offs)
    assert got.is_contiguous() and not got.isnan().any()
    assert torch.equal(got, ops.grouped_gemm(A, B, offs))


def _torch_checks_group_sizes(a, b, mode):
    """Whether torch's bfloat16 grouped kernel (SM90/SM100) asserts on the device that the groups along the cut
    dimension are multiples of 16 bytes (ATen/native/cuda/GroupMMCommon.cuh; GroupMM.cu: row-major is
    stride(-1) == 1)."""
    a_row, b_row = a.stride(-1) == 1, b.stride(-1) == 1
    return {"2Dx3D": not a_row, "2Dx2D": a_row or not b_row, "3Dx2D": True, "3Dx3D": False}[mode]


# 16 rows: a column-major A is a layout torch takes as it is (its leading dimension 32 bytes).
LAYOUT_CASES = CASES + [("2Dx3D 16 rows", (16, 32), (3, 32, 16), [3, 3, 16])]


def make_layout(case, a_transposed, b_transposed):
    """bfloat16 operands of `case`, A column-major if `a_transposed`."""
    A, B, offs = make(case, torch.bfloat16, b_transposed=b_transposed)
    return (A.transpose(-2, -1).contiguous().transpose(-2, -1) if a_transposed else A), B, offs


@pytest.mark.parametrize("case", LAYOUT_CASES, ids=[c[0] for c in LAYOUT_CASES])
@pytest.mark.parametrize("a_transposed", [False, True], ids=["A", "A^T"])
@pytest.mark.parametrize("b_transposed", [False, True], ids=["B", "B^T"])
def test_the_cuda_torch_path_never_hands_torch_groups_it_checks_on_the_device(case, a_transposed, b_transposed):
    # The groups' sizes here (3 rows, 1 column of K, ...) are no multiples of 16 bytes: torch's bfloat16 kernel
    # would stop the process with a device-side assert if it checked them. torch._grouped_mm's CPU kernel is
    # replaced by one that records what it is given.
    A, B, offs = make_layout(case, a_transposed, b_transposed)
    mode, seen = case[0].split()[0], []

    def recording(a, b, offs=None, bias=None, out_dtype=None):
        seen.append((a.stride(), b.stride()))
        assert not _torch_checks_group_sizes(a, b, mode), (a.stride(), b.stride())
        return ops.grouped_gemm(a, b, offs)  # the loop on CPU

    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
            lib.impl("_grouped_mm", recording, "CPU")
        if mode == "3Dx2D":
            with pytest.raises(RuntimeError, match="torch._grouped_mm does not take this problem"):
                torch_path(A, B, offs)
            assert not seen
            return
        got = torch_path(A, B, offs)
    finally:
        lib._destroy()
    assert len(seen) == 1
    assert torch.equal(got, ops.grouped_gemm(A, B, offs))


@pytest.mark.cuda
@pytest.mark.parametrize("case", LAYOUT_CASES, ids=[c[0] for c in LAYOUT_CASES])
@pytest.mark.parametrize("a_transposed", [False, True], ids=["A", "A^T"])
@pytest.mark.parametrize("b_transposed", [False, True], ids=["B", "B^T"])
def test_bfloat16_groups_of_any_size_run_on_the_gpu(case, a_transposed, b_transposed):
    # Groups torch's bfloat16 kernel would refuse with a device-side assert (sizes no multiple of 8): every
    # path ops takes on the device computes them, and the CUDA context stays usable.
    A, B, offs = make_layout(case, a_transposed, b_transposed)
    expected = ops.grouped_gemm(A, B, offs)
    got = ops.grouped_gemm(A.cuda(), B.cuda(), None if offs is None else offs.cuda())
    torch.cuda.synchronize()
    torch.testing.assert_close(got.cpu(), expected, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("case", [c for c in CASES if c[3] is not None], ids=[c[0] for c in CASES if c[3] is not None])
def test_the_cuda_torch_path_clamps_bad_offsets(case):
    # Decreasing, negative and past-the-end ends: the groups of cummax(clamp(offs, 0, extent)), never a read
    # out of bounds (on CPU an out-of-bounds group would read past A or B: a wrong value or a crash).
    A, B, offs = make(case, torch.float32)
    extent = {"2Dx3D": A.shape[0], "2Dx2D": A.shape[1], "3Dx2D": B.shape[1]}[case[0].split()[0]]  # what offs cuts
    n = offs.numel()
    for bad in ([extent + 7] * n, [-3] * n, list(range(n, 0, -1)), [extent, -1] + [extent * 3] * (n - 2)):
        bad_offs = offsets(bad[:n])
        clamped = torch.cummax(bad_offs.clamp(0, extent), 0).values.to(torch.int32)
        got = torch_path(A, B, bad_offs)
        assert torch.equal(got, ops.grouped_gemm(A, B, clamped)), bad


def test_the_cuda_torch_path_leaves_problems_torch_does_not_take():
    A, B, offs = make(CASES[0], torch.float64)
    with pytest.raises(RuntimeError, match="torch._grouped_mm does not take this problem"):
        torch_path(A, B, offs)
    A, B, offs = make(CASES[0], torch.bfloat16)
    with pytest.raises(RuntimeError, match="torch._grouped_mm does not take this problem"):
        torch_path(A, B, offs, torch.float32)  # out_dtype other than A's: the loop's


def sm90_launch(A, B, offs=None, out_dtype=None):
    """The CUDA kernel's SM90 grouped-kernel launch (grouped_gemm_launch.cpp) replayed on CPU tensors."""
    return torch.ops.ops._grouped_gemm_emulate(A, B, offs, out_dtype)


def float_product(A, B, offs):
    """The product rounded once to A's dtype, as the replay computes it (summed in float64: a float32 sum in
    another order, such as a swapped group's B^T A^T, can round a tie the other way)."""
    return ops.grouped_gemm(A.double(), B.double(), offs).to(A.dtype)


# The kernels' modes; the CASES have at most 32 rows per group (the swapped kernels), these more.
KERNEL_CASES = [c for c in CASES if c[0] != "3Dx2D"] + [
    ("2Dx3D tall", (200, 32), (3, 32, 24), [50, 50, 180]),
    ("3Dx3D tall", (2, 40, 16), (2, 16, 8), None),
]


@pytest.mark.parametrize("case", KERNEL_CASES, ids=[c[0] for c in KERNEL_CASES])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["B", "B^T", "A^T"])
def test_the_sm90_launch_computes_every_group(case, dtype, layout):
    # The host side of the CUDA path and its device code's per-group arithmetic (grouped_args.h: shapes,
    # pointer offsets, clamped ends, the zero fill) on CPU memory; the output is NaN-poisoned first, so an
    # element the kernels would leave unwritten fails the comparison.
    A, B, offs = make(case, dtype, b_transposed=layout == "B^T")
    if layout == "A^T":  # RaggedK's A as the weight gradient passes it (x^T), other modes' A copied
        A = A.transpose(-2, -1).contiguous().transpose(-2, -1)
    assert torch.equal(sm90_launch(A, B, offs), float_product(A, B, offs))


@pytest.mark.parametrize("case", [c for c in KERNEL_CASES if c[3] is not None],
                         ids=[c[0] for c in KERNEL_CASES if c[3] is not None])
def test_the_sm90_launch_clamps_bad_offsets(case):
    A, B, offs = make(case, torch.bfloat16)
    extent = A.shape[0] if case[0].startswith("2Dx3D") else A.shape[1]
    n = offs.numel()
    for bad in ([extent + 7] * n, [-3] * n, list(range(n, 0, -1)), [extent, -1] + [extent * 3] * (n - 2)):
        bad_offs = offsets(bad[:n])
        clamped = torch.cummax(bad_offs.clamp(0, extent), 0).values.to(torch.int32)
        assert torch.equal(sm90_launch(A, B, bad_offs), float_product(A, B, clamped)), bad


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.data())
def test_the_sm90_launch_on_any_group_sizes_and_operand_layouts(data):
    """Random group sizes and operands TMA cannot read in place (misaligned, strided, expanded): copied."""
    mode = data.draw(st.sampled_from(["2Dx3D", "2Dx2D", "3Dx3D"]))
    G = data.draw(st.integers(1, 6))
    sizes = data.draw(st.lists(st.integers(0, 9), min_size=G, max_size=G))
    M, K, N = (data.draw(st.sampled_from([8, 16, 24])) for _ in range(3))
    ends = torch.tensor(sizes).cumsum(0).to(torch.int32)
    total = int(ends[-1]) + data.draw(st.integers(0 if ends[-1] > 0 else 1, 3))  # an empty problem is refused
    shapes = {"2Dx3D": ((total, K), (G, K, N)), "2Dx2D": ((M, total), (total, N)), "3Dx3D": ((G, M, K), (G, K, N))}
    a_shape, b_shape = shapes[mode]
    A, B = randn(*a_shape, dtype=torch.bfloat16), randn(*b_shape, dtype=torch.bfloat16, seed=1)
    how = data.draw(st.sampled_from(["dense", "misaligned", "strided", "expanded"]))
    if how == "misaligned":  # one element past a 16-byte boundary
        A = torch.empty(A.numel() + 1, dtype=A.dtype)[1:].view(A.shape).copy_(A)
    elif how == "strided":
        B = torch.cat([B, B], -1)[..., ::2]
    elif how == "expanded" and B.dim() == 3:  # every group the same weights: read in place (batch stride 0)
        B = B[:1].expand_as(B)
    offs = None if mode == "3Dx3D" else ends
    assert torch.equal(sm90_launch(A, B, offs), float_product(A, B, offs))


def test_the_sm90_launch_refuses_what_the_kernels_do_not_run():
    A, B, offs = make(CASES[0], torch.bfloat16)
    for args, why in [((A.float(), B.float(), offs), "take bfloat16 or float16"),
                      ((A, B, offs, torch.float32), "out_dtype = their dtype"),
                      ((*make(CASES[4], torch.bfloat16),), "3D x 2D is not among"),
                      ((A[:, :12], B[:, :12], offs), "K and N must be multiples of 16 bytes"),
                      ((A[:0], B, offsets([0, 0, 0, 0])), "an empty problem")]:
        with pytest.raises(RuntimeError, match=f"_grouped_gemm_emulate: the SM90 grouped kernels do not take this "
                                               f"problem: .*{why}"):
            sm90_launch(*args)


def sm90_kernels_built():
    """Whether this device runs the SM90 grouped kernels: sm_90a, a build with OPS_CANDIDATE_KERNELS=1 (and
    ops.gemm.set_candidate_kernels not off)."""
    return (torch.cuda.get_device_capability() == (9, 0) and ops.build_info.CANDIDATE_KERNELS
            and ops.gemm.candidate_kernels_enabled())


# Larger problems: several tiles per group, groups that end inside a tile, an empty group, a tail.
GPU_KERNEL_CASES = KERNEL_CASES + [
    ("2Dx3D large", (1000, 512), (8, 512, 384), [100, 100, 357, 500, 501, 800, 929, 990]),
    ("2Dx2D large", (264, 3000), (3000, 136), [0, 1000, 1000, 1999, 2900]),
    ("3Dx3D large", (4, 300, 256), (4, 256, 520), None),
]


@pytest.mark.cuda
@pytest.mark.parametrize("case", GPU_KERNEL_CASES, ids=[c[0] for c in GPU_KERNEL_CASES])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["B", "B^T", "A^T"])
def test_the_sm90_kernels_equal_their_cpu_replay(case, dtype, layout):
    A, B, offs = make(case, dtype, b_transposed=layout == "B^T")
    if layout == "A^T":
        A = A.transpose(-2, -1).contiguous().transpose(-2, -1)
    a, b, o = A.cuda(), B.cuda(), None if offs is None else offs.cuda()
    plan = ops.grouped.plan(a, b, o)
    if not sm90_kernels_built():
        assert plan["path"] != "cutlass", plan
        pytest.skip(plan["reason"])
    assert plan["path"] == "cutlass" and plan["host_sync"] is False, plan
    got = ops.grouped_gemm(a, b, o).cpu()
    expected = sm90_launch(A, B, offs)  # float32 accumulation in another order: a few units in the last place
    torch.testing.assert_close(got.float(), expected.float(), atol=2e-2 * expected.float().abs().max().item() / 64,
                               rtol=1e-2)


@pytest.mark.cuda
def test_the_sm90_kernels_clamp_bad_offsets_and_capture_in_a_graph():
    if not sm90_kernels_built():
        pytest.skip("the SM90 grouped kernels run on sm_90a in a build with OPS_CANDIDATE_KERNELS=1")
    A, B, _ = make(GPU_KERNEL_CASES[-3], torch.bfloat16, "cuda", b_transposed=True)
    for bad in ([5, 2, -1, 40, 1200, 0, 7, 9], [-5] * 8, [2000] * 8):
        got = ops.grouped_gemm(A, B, offsets(bad, "cuda")).cpu()
        clamped = torch.cummax(offsets(bad).clamp(0, A.shape[0]), 0).values.to(torch.int32)
        torch.testing.assert_close(got.float(), sm90_launch(A.cpu(), B.cpu(), clamped).float(), atol=0.5, rtol=1e-2)
    offs = offsets([100, 100, 357, 500, 501, 800, 929, 990], "cuda")
    ops.grouped_gemm(A, B, offs)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.grouped_gemm(A, B, offs)
    offs.copy_(offsets([0, 0, 600, 600, 601, 700, 1000, 1000], "cuda"))  # new routing, same graph
    graph.replay()
    torch.testing.assert_close(out.cpu().float(), sm90_launch(A.cpu(), B.cpu(), offs.cpu()).float(), atol=0.5,
                               rtol=1e-2)


@pytest.mark.cuda
def test_the_sm90_kernels_follow_a_forced_tactic():
    if not sm90_kernels_built():
        pytest.skip("the SM90 grouped kernels run on sm_90a in a build with OPS_CANDIDATE_KERNELS=1")
    A, B, offs = make(GPU_KERNEL_CASES[-3], torch.bfloat16, b_transposed=True)
    a, b, o = A.cuda(), B.cuda(), offs.cuda()
    plan = ops.grouped.plan(a, b, o)
    assert plan["tactic_source"] == "heuristic" and plan["kernel"] == plan["candidates"][0] and len(plan["candidates"]) == 2
    assert set(plan["candidates"]) <= {k["name"] for k in ops.kernels("grouped_gemm")}
    expected = sm90_launch(A, B, offs).float()
    try:
        for name in plan["candidates"]:  # unswapped (the heuristic's at 125 rows per group), then swapped
            ops.gemm.set_tactic(name)
            forced = ops.grouped.plan(a, b, o)
            assert forced["kernel"] == name and forced["tactic_source"] == "forced", forced
            torch.testing.assert_close(ops.grouped_gemm(a, b, o).cpu().float(), expected, atol=0.5, rtol=1e-2)
        ops.gemm.set_tactic("sm90_bf16_128x128x64_2x1x1_ttt_align8_warpspecialized_cooperative")
        with pytest.raises(RuntimeError, match="grouped_gemm: the forced tactic .* cannot run this call; its candidates"):
            ops.grouped_gemm(a, b, o)
    finally:
        ops.gemm.set_tactic(None)


@pytest.mark.cuda
def test_the_sm90_kernels_autotune_into_the_tuning_cache():
    if not sm90_kernels_built():
        pytest.skip("the SM90 grouped kernels run on sm_90a in a build with OPS_CANDIDATE_KERNELS=1")
    A, B, offs = make(GPU_KERNEL_CASES[-3], torch.bfloat16, b_transposed=True)
    a, b, o = A.cuda(), B.cuda(), offs.cuda()
    expected = sm90_launch(A, B, offs).float()
    ops.gemm.clear_tuning_cache()
    ops.gemm.set_autotune(True)
    try:
        plan = ops.grouped.plan(a, b, o)
        torch.testing.assert_close(ops.grouped_gemm(a, b, o).cpu().float(), expected, atol=0.5, rtol=1e-2)
        entry = next(e for e in ops.gemm.tuning_cache() if e["key"] == plan["tuning_key"])
        assert set(entry["timings_ms"]) == set(plan["candidates"]) and entry["best"] in plan["candidates"], entry
        tuned = ops.grouped.plan(a, b, o)
        assert tuned["tactic_source"] == "tuned" and tuned["kernel"] == entry["best"]
        torch.testing.assert_close(ops.grouped_gemm(a, b, o).cpu().float(), expected, atol=0.5, rtol=1e-2)
    finally:
        ops.gemm.set_autotune(False)
        ops.gemm.clear_tuning_cache()


@pytest.mark.cuda
def test_cuda_offsets_are_clamped_on_the_device_and_bfloat16_captures_in_a_graph(candidate_kernels):
    A, B, _ = make(CASES[0], torch.bfloat16, "cuda", b_transposed=True)
    plan = ops.grouped.plan(A, B, offsets([3, 3, 4, 13], "cuda"))
    assert plan["path"] == ("cutlass" if sm90_kernels_built() else "torch._grouped_mm"), plan
    assert plan["offsets"] == "clamped on the device"
    # Decreasing, negative and past-the-end offsets: the groups of the clamped, non-decreasing ends.
    got = ops.grouped_gemm(A, B, offsets([5, 2, -1, 40], "cuda"))
    expected = ops.grouped_gemm(A.cpu(), B.cpu(), offsets([5, 5, 5, 13]))
    torch.testing.assert_close(got.cpu().float(), expected.float(), atol=5e-2, rtol=1e-2)
    if torch.cuda.get_device_capability()[0] in (9, 10):
        assert plan["host_sync"] is False
        offs = offsets([3, 3, 4, 13], "cuda")
        ops.grouped_gemm(A, B, offs)  # warm-up outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ops.grouped_gemm(A, B, offs)
        offs.copy_(offsets([0, 6, 6, 10], "cuda"))  # new routing, same graph
        graph.replay()
        torch.testing.assert_close(out.cpu().float(), ops.grouped_gemm(A.cpu(), B.cpu(), offsets([0, 6, 6, 10])).float(),
                                   atol=5e-2, rtol=1e-2)


@pytest.mark.cuda
def test_cuda_float32_out_and_float64_take_the_loop():
    A, B, offs = make(CASES[0], torch.bfloat16, "cuda")
    assert ops.grouped.plan(A, B, offs, torch.float32)["path"] == "loop"
    A64, B64, offs = make(CASES[2], torch.float64, "cuda")
    plan = ops.grouped.plan(A64, B64, offs)
    assert plan.pop("reason")
    assert plan == {"kind": "grouped", "path": "loop", "kernel": None, "mode": "2D x 2D", "host_sync": True,
                    "offsets": "checked on the host"}
    torch.testing.assert_close(ops.grouped_gemm(A64, B64, offs).cpu(), loop_reference(A64.cpu(), B64.cpu(), offs.cpu()))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_weight_gradient_comes_in_the_weights_layout(case):
    # Experts' weights stored (G, N, K) and passed transposed: their gradient is contiguous in that layout, as
    # torch._grouped_mm's backward gives it (no copy where autograd accumulates it).
    A, B, offs = make(case, torch.float32, b_transposed=True)
    A.requires_grad_(), B.requires_grad_()
    out = ops.grouped_gemm(A, B, offs)
    grad = randn(*out.shape, seed=7)
    dA, dB = torch.autograd.grad(out, (A, B), grad)
    assert dB.stride() == B.stride() and dB.transpose(-2, -1).is_contiguous()
    A64, B64 = A.detach().double().requires_grad_(), B.detach().double().requires_grad_()
    rA, rB = torch.autograd.grad(loop_reference(A64, B64, offs), (A64, B64), grad.double())
    torch.testing.assert_close(dB.double(), rB, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dA.double(), rA, atol=1e-4, rtol=1e-4)
