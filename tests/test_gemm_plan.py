"""The CUTLASS GEMM host path, checked without a GPU.

`ops._library.gemm_emulate` (the private op ops::_cutlass_gemm_emulate) runs the real C++ wrapper path (checks, planner, copies, zero padding, output
temporaries, copy-back) on CPU tensors, with the CUTLASS launch replaced by a replay of its launch
descriptor: a GEMM over exactly the memory the kernel would read and write (raw pointers, leading
dimensions, layouts). Temporaries are filled with NaN first, so an unwritten element or an unzeroed pad
shows up. If every descriptor computes the right GEMM here, a GPU run only has to confirm that each
instantiation computes the GEMM its descriptor says (tests/test_gemm_cuda.py).
"""

import itertools
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ops


DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
ALIGN = {torch.float16: 8, torch.bfloat16: 8, torch.float32: 4, torch.float64: 1}
HOPPER = dict(cc_major=9, cc_minor=0, arch_list="8.0;9.0a")
AMPERE = dict(cc_major=8, cc_minor=0, arch_list="8.0;9.0a")


def strided(rows, cols, dtype, layout, offset=0, pad=0, seed=0):
    """(rows x cols) view of a larger buffer: row-major, column-major or 'strided' (every other
    column), with `pad` extra elements per leading dimension and a storage offset."""
    g = torch.Generator().manual_seed(seed)
    if layout == "row":
        shape, strides = (rows, cols), (cols + pad, 1)
    elif layout == "col":
        shape, strides = (rows, cols), (1, rows + pad)
    else:  # strided
        shape, strides = (rows, cols), (2 * cols + pad, 2)
    size = offset + 1 + sum((s - 1) * st_ for s, st_ in zip(shape, strides)) if rows and cols else offset + 1
    base = torch.randn(size, generator=g, dtype=torch.float64).to(dtype)
    return base.as_strided(shape, strides, offset)


@pytest.fixture(autouse=True)
def sm80_kernels_on_hopper(monkeypatch):
    """These tests check the launch descriptor of every instantiation on the emulated targets, including
    the SM80 kernels on Hopper, which the library withholds there by default (the last tests here)."""
    monkeypatch.setenv("OPS_CUTLASS_SM80_ON_SM90", "1")


def emulate(A, B, out=None, allow_tf32=False, target=HOPPER):
    if out is None:
        out = torch.full((A.shape[0], B.shape[1]), float("nan"), dtype=A.dtype)
    plan = ops._library.gemm_emulate(A, B, out, target["cc_major"], target["cc_minor"], target["arch_list"],
                            allow_tf32, True)
    return out, plan


def family(kernel_id):
    """A kernel's family: its kernel_list.h id without the tile-config suffix (the configs of one family
    differ only in tile, cluster and schedule: tests/test_gemm_tactics.py covers that choice)."""
    return re.sub(r"_(coop256|coop256c12|coop256x128|ping|ping128|pingc2|streamk|swap|swap64x16|swap64x32|gemv)$", "", kernel_id)


# Kernel ids (kernel_list.h's identifiers, short) to the public names tactics and plans use.
KERNEL_NAME = {k["id"]: k["name"] for k in ops.kernels("cutlass_gemm")}


def tactic(kernel_id, *settings):
    """The tactic name of kernel `kernel_id` with scheduler settings ("dp", "splitk4", ...)."""
    return "/".join([KERNEL_NAME[kernel_id], *settings])


def reference_check(out, A, B):
    expected = A.double() @ B.double()
    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5, torch.float64: 1e-12}[A.dtype]
    scale = max(1.0, A.shape[1] ** 0.5)
    assert not torch.isnan(out).any(), "an output element was not written"
    torch.testing.assert_close(out.double() / scale, expected / scale, atol=tol, rtol=tol)


# ---- choices -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,name", [(torch.float16, "f16"), (torch.bfloat16, "bf16")])
@pytest.mark.parametrize("la,lb,suffix", [("row", "col", "rc"), ("row", "row", "rr"),
                                          ("col", "row", "cr"), ("col", "col", "cc")])
def test_half_types_on_hopper_use_sm90_in_place(dtype, name, la, lb, suffix):
    A = strided(64, 128, dtype, la)
    B = strided(128, 32, dtype, lb)
    out, plan = emulate(A, B)
    assert family(plan["kernel_id"]) == f"sm90_{name}_{suffix}"
    assert not plan["swap_ab"]
    assert plan["copied_elements"] == 0
    assert (plan["m"], plan["n"], plan["k"]) == (64, 32, 128)
    assert plan["a"]["ld"] == (128 if la == "row" else 64)
    assert plan["b"]["ld"] == (32 if lb == "row" else 128)
    reference_check(out, A, B)


def test_column_major_output_swaps_operands():
    A = strided(64, 96, torch.bfloat16, "row")
    B = strided(96, 40, torch.bfloat16, "col")
    out = torch.full((40, 64), float("nan"), dtype=torch.bfloat16).t()  # column-major (64 x 40)
    out, plan = emulate(A, B, out)
    # D^T (40 x 64) = B^T (40 x 96, row-major) @ A^T (96 x 64, column-major): still no copies.
    assert plan["swap_ab"] and plan["copied_elements"] == 0
    assert family(plan["kernel_id"]) == "sm90_bf16_rc"
    assert (plan["m"], plan["n"], plan["k"]) == (40, 64, 96)
    reference_check(out, A, B)


@pytest.mark.parametrize("allow_tf32,kernel", [(True, "sm90_tf32_rc"), (False, "sm80_3xtf32_rc")])
def test_float32_follows_tf32_setting_on_hopper(allow_tf32, kernel):
    A = strided(32, 64, torch.float32, "row")
    B = strided(64, 16, torch.float32, "col")
    out, plan = emulate(A, B, allow_tf32=allow_tf32)
    assert plan["kernel_id"] == kernel
    reference_check(out, A, B)


@pytest.mark.parametrize("target,dtype,allow_tf32,kernel", [
    (HOPPER, torch.float64, False, "sm80_f64_rc"),
    (AMPERE, torch.float16, False, "sm80_f16_rc"),
    (AMPERE, torch.bfloat16, False, "sm80_bf16_rc"),
    (AMPERE, torch.float32, True, "sm80_tf32_rc"),
    (AMPERE, torch.float32, False, "sm80_3xtf32_rc"),
    (AMPERE, torch.float64, False, "sm80_f64_rc"),
    (dict(cc_major=8, cc_minor=9, arch_list="8.0;9.0a"), torch.bfloat16, False, "sm80_bf16_rc"),  # Ada
    (dict(cc_major=8, cc_minor=6, arch_list="8.6"), torch.float16, False, "sm80_f16_rc"),
])
def test_kernel_family_by_arch(target, dtype, allow_tf32, kernel):
    A = strided(16, 32, dtype, "row")
    B = strided(32, 8, dtype, "col")
    out, plan = emulate(A, B, allow_tf32=allow_tf32, target=target)
    assert plan["kernel_id"] == kernel
    reference_check(out, A, B)


@pytest.mark.parametrize("target,dtype,pattern", [
    (dict(cc_major=7, cc_minor=5, arch_list="8.0;9.0a"), torch.float16, "compute capability 7.5"),
    (dict(cc_major=10, cc_minor=0, arch_list="8.0;9.0a"), torch.bfloat16, "compute capability 10.0"),
    # Hopper with a binary built without 9.0a: the SM90 kernels are not there.
    (dict(cc_major=9, cc_minor=0, arch_list="8.0"), torch.bfloat16, r"built for 8\.0"),
    # An 8.6 image does not run on an 8.0 device.
    (dict(cc_major=8, cc_minor=0, arch_list="8.6"), torch.float16, "compute capability 8.0"),
])
def test_no_kernel_for_device_is_a_clear_error(target, dtype, pattern):
    A = strided(16, 32, dtype, "row")
    B = strided(32, 8, dtype, "col")
    with pytest.raises(RuntimeError, match=f"cutlass_gemm: no CUTLASS kernel for .*{pattern}"):
        emulate(A, B, target=target)


def test_hopper_float32_accurate_with_sm80_only_in_90a_image():
    # 3xTF32 runs on Hopper from the sm_90a image (the SM80 kernel is built there too).
    A = strided(16, 32, torch.float32, "row")
    B = strided(32, 8, torch.float32, "col")
    _, plan = emulate(A, B, target=dict(cc_major=9, cc_minor=0, arch_list="9.0a"))
    assert plan["kernel_id"] == "sm80_3xtf32_rc"


def test_malformed_arch_list():
    A = strided(4, 8, torch.float32, "row")
    B = strided(8, 4, torch.float32, "row")
    with pytest.raises(ValueError, match="malformed CUDA arch list entry 'x.y'"):
        emulate(A, B, target=dict(cc_major=9, cc_minor=0, arch_list="8.0;x.y"))


@pytest.mark.parametrize("offset", [1, 2, 4])
def test_misaligned_pointer_is_copied(offset):
    # fp16: 16-byte alignment = 8 elements; an offset of 1..7 elements misaligns the base pointer.
    A = strided(64, 64, torch.float16, "row", offset=offset)
    B = strided(64, 64, torch.float16, "col")
    out, plan = emulate(A, B)
    assert plan["kernel_id"].startswith("sm90_f16")
    assert plan["a"]["source"] == "copy" or plan["swap_ab"]
    assert plan["b"]["source"] == "in_place" or plan["swap_ab"]
    reference_check(out, A, B)


def test_misaligned_leading_dimension_is_copied():
    A = strided(64, 64, torch.float16, "row", pad=3)  # lda = 67
    B = strided(64, 64, torch.float16, "row")
    out, plan = emulate(A, B)
    assert plan["a"]["source"] == "copy" and plan["a"]["ld"] % 8 == 0
    assert plan["b"]["source"] == "in_place"
    reference_check(out, A, B)


def test_unaligned_k_is_zero_padded():
    A = strided(33, 7, torch.float16, "row")
    B = strided(7, 16, torch.float16, "row")
    out, plan = emulate(A, B)
    # K = 7 is not a multiple of 8: both operands are copied with K padded to 8 (zeros).
    assert plan["k"] == 8
    assert plan["a"]["source"] == "copy" and plan["b"]["source"] == "copy"
    reference_check(out, A, B)


def test_unaligned_n_uses_swap_or_padding():
    A = strided(64, 32, torch.bfloat16, "row")
    B = strided(32, 5, torch.bfloat16, "row")
    out, plan = emulate(A, B)
    assert plan["n"] % 8 == 0
    reference_check(out, A, B)


def test_non_contiguous_output_goes_through_a_temporary():
    A = strided(16, 32, torch.float32, "row")
    B = strided(32, 8, torch.float32, "col")
    base = torch.full((16, 16), -5.0)
    out = base[:, ::2]
    out, plan = emulate(A, B, out)
    assert plan["d"]["source"] == "copy"
    assert torch.all(base[:, 1::2] == -5.0)
    reference_check(out, A, B)


def test_expanded_input_is_copied_not_read_with_zero_stride():
    A = strided(1, 32, torch.float32, "row").expand(16, 32)
    B = strided(32, 8, torch.float32, "col")
    out, plan = emulate(A, B)
    assert plan["a"]["source"] == "copy" or plan["swap_ab"] and plan["b"]["source"] == "copy"
    reference_check(out, A, B)


def test_huge_dimension_is_refused():
    # The planner must refuse sizes CUTLASS 2.x cannot index; a 1 x (2^31 + 8) row of one repeated element.
    base = torch.ones(8, dtype=torch.float32)
    A = base.as_strided((1, 2**31 + 8), (0, 0))
    B = base.as_strided((2**31 + 8, 1), (0, 0))
    with pytest.raises(RuntimeError, match=r"M, N and K must each be below 2\^31"):
        ops._library.gemm_emulate(A, B, torch.empty(1, 1), 9, 0, "9.0a", False, False)


@pytest.mark.parametrize("target", [AMPERE, HOPPER], ids=["ampere", "hopper"])
def test_sm80_kernels_are_not_planned_past_their_grid(target):
    # GemmIdentityThreadblockSwizzle<8> puts ceil(column tiles / 8) in gridDim.y (at most 65535): fp64's
    # 64-wide tiles cover N <= 65535 * 8 * 64; past that CUTLASS refuses the launch, so the plan swaps.
    limit = 65535 * 8 * 64
    A = torch.empty(2, 8, dtype=torch.float64, device="meta")
    for n, swapped in [(limit, False), (limit + 1, True)]:
        B = torch.empty(8, n, dtype=torch.float64, device="meta")
        plan = ops._library.gemm_plan_for_target(A, B, target["cc_major"], target["cc_minor"], target["arch_list"])
        assert family(plan["kernel_id"]).startswith("sm80_f64") and plan["swap_ab"] == swapped, (n, plan)
        assert -(-plan["n"] // 64) <= 65535 * 8


# ---- values over many shapes, layouts, offsets, dtypes ---------------------------------------------

LAYOUTS = ["row", "col", "strided"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("target", [HOPPER, AMPERE], ids=["sm90", "sm80"])
@pytest.mark.parametrize("la,lb,lc", list(itertools.product(LAYOUTS, LAYOUTS, ["row", "col", "strided"])))
def test_every_layout_combination(dtype, target, la, lb, lc):
    M, N, K = 24, 40, 16  # aligned extents: in-place wherever strides allow
    A = strided(M, K, dtype, la, seed=1)
    B = strided(K, N, dtype, lb, seed=2)
    out = strided(M, N, dtype, lc, seed=3).fill_(float("nan"))
    out, plan = emulate(A, B, out, target=target)
    if la != "strided" and lb != "strided" and lc != "strided":
        assert plan["copied_elements"] == 0, plan  # row/column-major everywhere: no copies
    reference_check(out, A, B)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dtype=st.sampled_from(DTYPES),
    m=st.integers(1, 40), n=st.integers(1, 40), k=st.integers(1, 40),
    la=st.sampled_from(LAYOUTS), lb=st.sampled_from(LAYOUTS), lc=st.sampled_from(LAYOUTS),
    oa=st.integers(0, 9), ob=st.integers(0, 9), oc=st.integers(0, 9),
    pa=st.integers(0, 9), pb=st.integers(0, 9), pc=st.integers(0, 9),
    sm90=st.booleans(), allow_tf32=st.booleans(),
)
def test_fuzz_plans_compute_the_gemm(dtype, m, n, k, la, lb, lc, oa, ob, oc, pa, pb, pc, sm90, allow_tf32):
    A = strided(m, k, dtype, la, offset=oa, pad=pa, seed=1)
    B = strided(k, n, dtype, lb, offset=ob, pad=pb, seed=2)
    out = strided(m, n, dtype, lc, offset=oc, pad=pc, seed=3).fill_(float("nan"))
    out, plan = emulate(A, B, out, allow_tf32=allow_tf32, target=HOPPER if sm90 else AMPERE)
    # What CUTLASS's can_implement demands: contiguous extents and leading dimensions aligned.
    align = ALIGN[dtype]
    contiguous = {"a": plan["k"] if plan["a"]["layout"] == "row" else plan["m"],
                  "b": plan["n"] if plan["b"]["layout"] == "row" else plan["k"],
                  "d": plan["n"]}
    for operand in ("a", "b", "d"):
        assert contiguous[operand] % align == 0, plan
        assert plan[operand]["ld"] % align == 0, plan
    reference_check(out, A, B)


# ---- ops.linear's fused-epilogue kernels (bias + activation) ---------------------------------------

ACTS = ["none", "relu", "gelu", "gelu_tanh", "silu"]


def linear_reference(x, w, b, act):
    import torch.nn.functional as F

    z = x.double() @ w.double().t() + (0 if b is None else b.double())
    return {"none": lambda v: v, "relu": F.relu, "gelu": F.gelu, "silu": F.silu,
            "gelu_tanh": lambda v: F.gelu(v, approximate="tanh")}[act](z)


@pytest.mark.parametrize("dtype,name", [(torch.float16, "f16"), (torch.bfloat16, "bf16")])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("target,sm", [(HOPPER, 90), (AMPERE, 80)], ids=["sm90", "sm80"])
def test_linear_epilogue_kernels(dtype, name, act, target, sm):
    x = strided(24, 64, dtype, "row")
    w = strided(40, 64, dtype, "row")  # nn.Linear weight (N, K): B = w.t() is column-major
    b = strided(1, 40, dtype, "row")[0]
    out = torch.full((24, 40), float("nan"), dtype=dtype)
    plan = ops._library.gemm_emulate(x, w.t(), out, target["cc_major"], target["cc_minor"],
                                     target["arch_list"], False, True, b, act)
    assert family(plan["kernel_id"]) == f"sm{sm}_{name}_rc_{act}"
    assert plan["copied_elements"] == 0 and not plan["swap_ab"]
    expected = linear_reference(x, w, b, act)
    torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("act", ACTS)
def test_linear_epilogue_never_swaps_and_pads_bias(act):
    # A column-major out would invite a swap, which would turn the per-column bias into a per-row one:
    # the planner must instead write through a temporary. N = 13 (not a multiple of 8) pads N and bias.
    x = strided(9, 24, torch.bfloat16, "row")
    w = strided(13, 24, torch.bfloat16, "row")
    b = strided(1, 13, torch.bfloat16, "row", offset=1)[0]  # misaligned bias
    out = torch.full((13, 9), float("nan"), dtype=torch.bfloat16).t()
    plan = ops._library.gemm_emulate(x, w.t(), out, 9, 0, "9.0a", False, True, b, act)
    assert not plan["swap_ab"] and plan["n"] == 16 and plan["d"]["source"] == "copy"
    torch.testing.assert_close(out.double(), linear_reference(x, w, b, act), atol=3e-2, rtol=2e-2)


def test_linear_epilogue_without_bias_and_empty_k():
    x = strided(8, 16, torch.float16, "row")
    w = strided(16, 16, torch.float16, "row")
    out = torch.full((8, 16), float("nan"), dtype=torch.float16)
    ops._library.gemm_emulate(x, w.t(), out, 9, 0, "9.0a", False, True, None, "relu")
    torch.testing.assert_close(out.double(), linear_reference(x, w, None, "relu"), atol=1e-2, rtol=1e-2)
    # K = 0: act(bias) in every row.
    b = torch.randn(16).half()
    out0 = torch.full((8, 16), float("nan"), dtype=torch.float16)
    ops._library.gemm_emulate(torch.empty(8, 0).half(), torch.empty(0, 16).half(), out0, 9, 0, "9.0a",
                              False, True, b, "silu")
    torch.testing.assert_close(out0.float(), torch.nn.functional.silu(b.float()).expand(8, 16), atol=1e-3, rtol=1e-3)


def test_plan_cache_keys_on_alignment_and_strides():
    # Plans are memoized per thread (cutlass_gemm/core/plan.cpp); a shape seen aligned, then misaligned, then
    # with other strides, must get a fresh plan each time, and the cached one again afterwards.
    base = torch.randn(64 * 48 + 8, dtype=torch.bfloat16)
    B = strided(48, 32, torch.bfloat16, "col", seed=3)
    aligned = base[:64 * 48].view(64, 48)
    misaligned = base[1:64 * 48 + 1].view(64, 48)          # 2-byte offset: must be copied
    transposed = base[:64 * 48].view(48, 64).t()           # column-major A: read in place
    for A, source, layout in [(aligned, "in_place", "row"), (misaligned, "copy", "row"),
                              (transposed, "in_place", "col"), (aligned, "in_place", "row")]:
        out, plan = emulate(A, B)
        assert (plan["a"]["source"], plan["a"]["layout"]) == (source, layout)
        reference_check(out, A, B)


# ---- SM80 kernels on Hopper: withheld by default ---------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("la,lb", [("row", "col"), ("col", "row"), ("strided", "row")])
def test_hopper_computes_fp32_accurate_and_fp64_with_aten_by_default(monkeypatch, dtype, la, lb):
    # The SM80 kernels gave wrong results on an H200 (benchmarks/results/2026-11-30-h200): unless
    # OPS_CUTLASS_SM80_ON_SM90=1, Hopper runs the GEMMs only they serve through ATen, and plan() says so.
    monkeypatch.delenv("OPS_CUTLASS_SM80_ON_SM90")
    A, B = strided(40, 24, dtype, la), strided(24, 56, dtype, lb, seed=1)
    out, plan = emulate(A, B)
    assert plan["kernel"] == "aten" and plan["tactic"] == {"name": "aten"} and plan["candidates"] == []
    assert plan["tactic_source"] == "fallback" and "OPS_CUTLASS_SM80_ON_SM90=1" in plan["fallback"]
    assert (plan["m"], plan["n"], plan["k"]) == (40, 56, 24)
    reference_check(out, A, B)
    out = torch.full((56, 40), float("nan"), dtype=dtype).t()  # a column-major out: written in place
    emulate(A, B, out)
    reference_check(out, A, B)


def test_only_the_sm80_kernels_are_withheld_on_hopper(monkeypatch):
    monkeypatch.delenv("OPS_CUTLASS_SM80_ON_SM90")
    A32, B32 = strided(16, 32, torch.float32, "row"), strided(32, 8, torch.float32, "col")
    assert emulate(A32, B32, allow_tf32=True)[1]["kernel_id"] == "sm90_tf32_rc"
    assert emulate(A32, B32, target=AMPERE)[1]["kernel_id"] == "sm80_3xtf32_rc"
    A16, B16 = strided(16, 32, torch.bfloat16, "row"), strided(32, 8, torch.bfloat16, "col")
    assert family(emulate(A16, B16)[1]["kernel_id"]) == "sm90_bf16_rc"
    # Devices with no kernel at all still get the clear error, not a fallback.
    with pytest.raises(RuntimeError, match="no CUTLASS kernel for .*compute capability 7.5"):
        emulate(A32, B32, target=dict(cc_major=7, cc_minor=5, arch_list="8.0;9.0a"))


def test_a_forced_tactic_does_not_stop_the_aten_fallback(monkeypatch):
    monkeypatch.delenv("OPS_CUTLASS_SM80_ON_SM90")
    A, B = strided(16, 32, torch.float64, "row"), strided(32, 8, torch.float64, "col")
    previous = ops.gemm.set_tactic(tactic("sm90_bf16_rc"))
    try:
        out, plan = emulate(A, B)
    finally:
        ops.gemm.set_tactic(previous)
    assert plan["kernel"] == "aten"
    reference_check(out, A, B)


def test_sm80_kernels_get_the_problem_of_their_launch_descriptor():
    # The kernel parameters each CUTLASS 2.x instantiation builds from a launch descriptor, computed on the
    # host: the problem and pointers must be the descriptor's. Through CUTLASS's 2.x GemmUniversalAdapter
    # they were transposed (m<->n, A<->B) for a row-major D: the H200 bug of 2026-11-30.
    if not ops.build_info.WITH_CUDA:
        pytest.skip("a CPU-only build has no CUTLASS kernels")
    import json
    report = json.loads(torch.ops.ops._cutlass_gemm_kernel_problems())
    expected = report["expected"]
    known = {k["name"]: k for k in report["kernels"] if k["known"]}
    assert set(known) == {k["name"] for k in ops._library.kernels("cutlass_gemm") if k["sm"] == 80}
    for name, problem in known.items():
        got = {key: problem[key] for key in ("m", "n", "k", "a", "b", "d")}
        assert got == expected, name

