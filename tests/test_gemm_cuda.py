"""ops.cutlass_gemm on a GPU: every dtype x layout with M != N != K, misaligned and padded cases, out
variants, and float32 precision against torch.mm under the same setting. Skipped without a GPU; run by
benchmarks/device_check.sh on the device machine.

Errors are normwise, ||C - C_ref||_F / ||C_ref||_F, against the float64 product of the very same
(already rounded) inputs, so only the kernel's own arithmetic is measured:
  float16   fp32 accumulation, output rounded to 11 significant bits: <= 2^-11 = 4.9e-4  -> 1e-3
  bfloat16  output rounded to 8 significant bits: <= 2^-8 = 3.9e-3                       -> 8e-3
  tf32      inputs rounded to 11 significant bits, errors of random sign add in quadrature
            (~ sqrt(2) * 2^-11 per product term, normwise about 7e-4)                    -> 4e-3
  float32   3xTF32 / fp32: ~sqrt(K) * 2^-24 -> at most 2x torch.mm's error + 1e-6 (and < 1e-5)
  float64   ~sqrt(K) * 2^-53                                                             -> 1e-12
"""

import itertools

import pytest
import torch

import ops
from test_gemm_plan import KERNEL_NAME
from test_linear import reference as linear_reference

pytestmark = pytest.mark.cuda

TOL = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float64: 1e-12}
LAYOUTS = ["row", "col", "strided"]


def normwise_error(c, ref):
    return ((c.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def make(rows, cols, dtype, layout, offset=0, gen=None):
    gen = gen or torch.Generator(device="cuda").manual_seed(rows * 7919 + cols * 31 + offset)
    if layout == "row":
        base = torch.randn(rows * cols + offset, device="cuda", dtype=dtype, generator=gen)
        return base[offset:].view(rows, cols)
    if layout == "col":
        base = torch.randn(rows * cols + offset, device="cuda", dtype=dtype, generator=gen)
        return base[offset:].view(cols, rows).t()
    base = torch.randn(rows * 2 * cols + offset, device="cuda", dtype=dtype, generator=gen)
    return base[offset:].view(rows, 2 * cols)[:, ::2]


@pytest.fixture(params=["highest", "high"], ids=["fp32", "tf32"])
def fp32_precision(request):
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(request.param)
    yield request.param
    torch.set_float32_matmul_precision(saved)


def check(dtype, A, B, C):
    ref = torch.mm(A.double(), B.double())
    assert not torch.isnan(C).any()
    err = normwise_error(C, ref)
    if dtype == torch.float32:
        err_torch = normwise_error(torch.mm(A, B), ref)
        if torch.get_float32_matmul_precision() == "highest":
            assert err <= 2 * err_torch + 1e-6 and err < 1e-5, (err, err_torch)
        else:
            assert err <= max(4e-3, 2 * err_torch), (err, err_torch)
    else:
        assert err <= TOL[dtype], err


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("la,lb", list(itertools.product(LAYOUTS, LAYOUTS)))
@pytest.mark.parametrize("M,N,K", [(300, 520, 264), (1, 1024, 512), (77, 45, 133)])
def test_dtype_layout(dtype, la, lb, M, N, K):
    A, B = make(M, K, dtype, la), make(K, N, dtype, lb)
    check(dtype, A, B, ops.cutlass_gemm(A, B))


@pytest.mark.parametrize("la,lb", list(itertools.product(LAYOUTS, LAYOUTS)))
@pytest.mark.parametrize("M,N,K", [(300, 520, 264), (3, 40, 1000)])
def test_float32_layouts(fp32_precision, la, lb, M, N, K):
    A, B = make(M, K, torch.float32, la), make(K, N, torch.float32, lb)
    check(torch.float32, A, B, ops.cutlass_gemm(A, B))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("out_layout", LAYOUTS)
def test_out_layouts(dtype, out_layout):
    M, N, K = 136, 264, 72
    A, B = make(M, K, dtype, "row"), make(K, N, dtype, "col")
    out = make(M, N, dtype, out_layout).fill_(float("nan"))
    assert ops.cutlass_gemm(A, B, out=out) is out
    check(dtype, A, B, out)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("la,lb", [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")])
def test_nothing_is_written_outside_out(fp32_precision, dtype, la, lb):
    # out sits between NaN guard regions of one buffer: every element of out written, no guard element
    # touched. (Through CUTLASS's 2.x GemmUniversalAdapter the SM80 kernels computed the transposed
    # problem: half of out unwritten and rows written past its end, on an H200 on 2026-11-30.)
    M, N, K = 136, 264, 72
    A, B = make(M, K, dtype, la), make(K, N, dtype, lb)
    guard = 4096
    buffer = torch.full((guard + M * N + guard,), float("nan"), device="cuda", dtype=dtype)
    out = buffer[guard:guard + M * N].view(M, N)
    ops.cutlass_gemm(A, B, out=out)
    torch.cuda.synchronize()
    assert torch.isnan(buffer[:guard]).all() and torch.isnan(buffer[guard + M * N:]).all()
    check(dtype, A, B, out)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("offset", [1, 2, 3, 5])
def test_misaligned_pointers(dtype, offset):
    M, N, K = 96, 80, 64
    A = make(M, K, dtype, "row", offset=offset)
    B = make(K, N, dtype, "col", offset=offset + 1)
    out = torch.full((M + 1, N), float("nan"), device="cuda", dtype=dtype)[1:]  # misaligned out
    ops.cutlass_gemm(A, B, out=out)
    check(dtype, A, B, out)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("M,N,K", [(33, 5, 7), (5, 33, 9), (1, 1, 1), (17, 1, 31), (1, 3, 4096)])
def test_unaligned_extents(dtype, M, N, K):
    A, B = make(M, K, dtype, "row"), make(K, N, dtype, "row")
    check(dtype, A, B, ops.cutlass_gemm(A, B))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_empty(dtype):
    A = torch.randn(8, 0, device="cuda", dtype=dtype)
    B = torch.randn(0, 16, device="cuda", dtype=dtype)
    assert torch.equal(ops.cutlass_gemm(A, B), torch.zeros(8, 16, device="cuda", dtype=dtype))
    assert ops.cutlass_gemm(torch.randn(0, 4, device="cuda", dtype=dtype),
                            torch.randn(4, 3, device="cuda", dtype=dtype)).shape == (0, 3)


@pytest.mark.parametrize("size", [1024, 4096])
def test_large_square_bf16(size):
    A, B = make(size, size, torch.bfloat16, "row"), make(size, size, torch.bfloat16, "col")
    check(torch.bfloat16, A, B, ops.cutlass_gemm(A, B))


def test_repeated_calls_are_deterministic():
    A, B = make(512, 384, torch.bfloat16, "row"), make(384, 640, torch.bfloat16, "col")
    first = ops.cutlass_gemm(A, B)
    for _ in range(3):
        assert torch.equal(ops.cutlass_gemm(A, B), first)


def test_cpu_and_cuda_mixed_is_an_error():
    with pytest.raises(RuntimeError, match="cutlass_gemm: A and B must be on the same device"):
        ops.cutlass_gemm(torch.randn(4, 4, device="cuda"), torch.randn(4, 4))


def test_opcheck_cuda():
    A, B = make(64, 32, torch.bfloat16, "row"), make(32, 48, torch.bfloat16, "col")
    torch.library.opcheck(torch.ops.ops.cutlass_gemm.default, (A, B))
    torch.library.opcheck(torch.ops.ops.cutlass_gemm.out, (A, B),
                          {"out": torch.empty(48, 64, device="cuda", dtype=torch.bfloat16).t()})


# ---- tactics: every instantiation and scheduler setting, autotuning ------------------------------

TACTIC_SHAPES = [  # (M, N, K, B layout): decode, odd sizes, short K, several waves, square
    (1, 4096, 4096, "col"), (77, 300, 1000, "col"), (260, 136, 64, "row"), (16, 1536, 384, "col"),
    (2048, 2048, 256, "row"), (4096, 512, 1024, "col"),
    # Four waves of tiles or more on 132 SMs (1024 128x128 tiles): every swizzle x raster order
    (4096, 4096, 64, "row"), (4096, 4104, 64, "col"),
]


@pytest.fixture
def restore_tactic_settings():
    yield
    ops.gemm.set_tactic(None)
    ops.gemm.set_autotune(False)
    ops.gemm.clear_tuning_cache()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M,N,K,lb", TACTIC_SHAPES)
def test_every_tactic(restore_tactic_settings, dtype, M, N, K, lb):
    # Each candidate (config x data-parallel / split-K / stream-K / swizzle) forced in turn, into a
    # NaN-poisoned out: every output element written, the right product, the same plan otherwise.
    A, B = make(M, K, dtype, "row"), make(K, N, dtype, lb)
    plan = ops.gemm.plan(A, B)
    assert plan["tactic"]["name"] in plan["candidates"]
    for name in plan["candidates"]:
        ops.gemm.set_tactic(name)
        out = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
        ops.cutlass_gemm(A, B, out=out)
        torch.cuda.synchronize()
        check(dtype, A, B, out)


@pytest.mark.parametrize("M", [1, 16, 300])
@pytest.mark.parametrize("activation", ["none", "silu", "gelu"])
def test_linear_every_tactic(restore_tactic_settings, M, activation):
    x = torch.randn(M, 2048, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16) / 2048 ** 0.5
    bias = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    ref = linear_reference(x, weight, bias, activation)  # float64, from torch's F.linear and activations
    cc = torch.cuda.get_device_capability()
    names = ops._library.gemm_plan_for_target(
        x, weight.t(), *cc, ops.build_info.CUDA_ARCH_LIST,
        sm_count=torch.cuda.get_device_properties(0).multi_processor_count, epilogue=activation)["candidates"]
    if cc == (9, 0):
        assert any(n.endswith("/streamk") for n in names)
    for name in names:
        ops.gemm.set_tactic(name)
        y = ops.linear(x, weight, bias, activation)
        assert normwise_error(y, ref) < 8e-3, name


def simt_gemv_available():
    return (torch.cuda.get_device_capability() == (9, 0) and "9.0a" in ops.build_info.CUDA_ARCH_LIST
            and ops.build_info.CANDIDATE_KERNELS)


def assert_elementwise(out, ref, dtype):
    # Exact inputs, fp32 accumulation: the output's rounding (half an ulp, 2^-9 relative for bf16, 2^-12
    # for fp16) dominates; allow twice that of the largest entry, for every element.
    assert not torch.isnan(out).any()
    bound = (2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11) * ref.abs().max().item()
    worst = (out.double() - ref).abs().max().item()
    assert worst <= bound, (worst, bound)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_simt_gemv_every_row_count(restore_tactic_settings, dtype):
    # The SIMT GEMV candidate (simt_gemv.cuh) forced for every M it takes (each row-count variant, and
    # the rows it rounds up past), N not a multiple of a block's 16 columns or of a warp's 4, K not a
    # multiple of a warp's 256-element step: every output written (NaN-poisoned), every element right.
    if not simt_gemv_available():
        pytest.skip("the SIMT GEMV kernels are candidate-only: built for sm_90a with OPS_CANDIDATE_KERNELS=1")
    name = KERNEL_NAME[f"sm90_{'f16' if dtype == torch.float16 else 'bf16'}_rc_gemv"]
    for M in range(1, 17):
        for N, K in [(1000, 4104), (40, 264), (8, 8)]:  # N = 44 the planner swaps (fewer elements copied)
            A, B = make(M, K, dtype, "row"), make(K, N, dtype, "col")
            assert name in ops.gemm.plan(A, B)["candidates"], (M, N, K)
            ops.gemm.set_tactic(name)
            out = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
            ops.cutlass_gemm(A, B, out=out)
            torch.cuda.synchronize()
            assert_elementwise(out, torch.mm(A.double(), B.double()), dtype)
            ops.gemm.set_tactic(None)


@pytest.mark.parametrize("activation", ["none", "relu", "gelu", "gelu_tanh", "silu"])
def test_simt_gemv_linear_epilogues(restore_tactic_settings, activation):
    if not simt_gemv_available():
        pytest.skip("the SIMT GEMV kernels are candidate-only: built for sm_90a with OPS_CANDIDATE_KERNELS=1")
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.randn(5, 2056, device="cuda", dtype=dtype)
        weight = (torch.randn(1004, 2056, device="cuda") / 2056 ** 0.5).to(dtype)
        bias = torch.randn(1004, device="cuda", dtype=dtype)
        ops.gemm.set_tactic(KERNEL_NAME[f"sm90_{'f16' if dtype == torch.float16 else 'bf16'}_rc_{activation}_gemv"])
        for b in (bias, None):
            y = ops.linear(x, weight, b, activation)
            ref = ops.linear(x.double().cpu(), weight.double().cpu(), None if b is None else b.double().cpu(),
                             activation).cuda()
            assert_elementwise(y, ref, dtype)
        ops.gemm.set_tactic(None)


def tunable_operands(M, K, N):
    """bf16 A (M, K) row-major and B (K, N) column-major, with autotuning on and an empty cache; skips
    on GPUs where the GEMM has a single candidate (nothing to tune)."""
    A, B = make(M, K, torch.bfloat16, "row"), make(K, N, torch.bfloat16, "col")
    if len(ops.gemm.plan(A, B)["candidates"]) < 2:
        pytest.skip("one candidate on this GPU (Hopper has several): nothing to tune")
    ops.gemm.clear_tuning_cache()
    ops.gemm.set_autotune(True)
    return A, B


def test_autotune_caches_one_choice_per_shape(restore_tactic_settings):
    A, B = tunable_operands(64, 4096, 2048)
    check(torch.bfloat16, A, B, ops.cutlass_gemm(A, B))  # tunes (every candidate writes the result)
    cache = ops.gemm.tuning_cache()
    assert len(cache) == 1
    entry = cache[0]
    assert "m=64 n=2048 k=4096" in entry["key"]
    assert set(entry["timings_ms"]) == set(ops.gemm.plan(A, B)["candidates"])
    valid = {k: v for k, v in entry["timings_ms"].items() if v is not None}
    assert entry["best"] == min(valid, key=valid.get)
    for _ in range(3):  # served from the cache: no new entry, same (deterministic) result
        check(torch.bfloat16, A, B, ops.cutlass_gemm(A, B))
    assert len(ops.gemm.tuning_cache()) == 1
    ops.cutlass_gemm(make(128, 4096, torch.bfloat16, "row"), B)
    assert len(ops.gemm.tuning_cache()) == 2


def test_autotune_never_inside_graph_capture(restore_tactic_settings):
    A, B = tunable_operands(32, 1024, 1536)
    static_a = A.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside capture on another shape only
        ops.cutlass_gemm(make(8, 64, torch.bfloat16, "row"), make(64, 8, torch.bfloat16, "row"))
    torch.cuda.current_stream().wait_stream(side)
    tuned_before = len(ops.gemm.tuning_cache())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = ops.cutlass_gemm(static_a, B)
    assert len(ops.gemm.tuning_cache()) == tuned_before  # nothing timed during capture
    fresh = torch.randn_like(A)
    static_a.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    check(torch.bfloat16, fresh, B, static_out)
    ops.cutlass_gemm(A, B)  # eager, after capture: tuned now
    assert len(ops.gemm.tuning_cache()) == tuned_before + 1


def test_saved_tuning_is_used_without_autotuning_and_in_graph_capture(restore_tactic_settings, tmp_path):
    A, B = tunable_operands(48, 2048, 1024)
    ops.cutlass_gemm(A, B)  # tunes
    assert ops.gemm.save_tuning_cache(tmp_path / "tuning.json") == 1
    saved = ops.gemm.tuning_cache()
    assert saved[0]["key"] == ops.gemm.plan(A, B)["tuning_key"]
    assert saved[0]["key"].startswith(torch.cuda.get_device_name())
    ops.gemm.clear_tuning_cache()
    ops.gemm.set_autotune(False)
    assert ops.gemm.load_tuning_cache(tmp_path / "tuning.json") == 1
    ops.gemm.set_autotune(True)  # a loaded choice is not timed again
    static_a = A.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = ops.cutlass_gemm(static_a, B)
    fresh = torch.randn_like(A)
    static_a.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    check(torch.bfloat16, fresh, B, static_out)
    check(torch.bfloat16, A, B, ops.cutlass_gemm(A, B))
    assert ops.gemm.tuning_cache() == saved


def test_plan_reports_the_device():
    A, B = make(1, 4096, torch.bfloat16, "row"), make(4096, 4096, torch.bfloat16, "col")
    plan = ops.gemm.plan(A, B)
    expected = ops._library.gemm_plan_for_target(
        A, B, *torch.cuda.get_device_capability(), ops.build_info.CUDA_ARCH_LIST,
        sm_count=torch.cuda.get_device_properties(0).multi_processor_count)
    # The same plan; the tuning key names the GPU model where the emulation says "emulated".
    key, expected_key = plan.pop("tuning_key"), expected.pop("tuning_key")
    assert key == expected_key.replace("emulated", torch.cuda.get_device_name(), 1)
    assert plan == expected
