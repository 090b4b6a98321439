"""ops.scaled_grouped_gemm: torch._scaled_grouped_mm's modes and scales (rowwise, blockwise 1x128 x 128x128) against
ops.scaled_gemm group by group (bit for bit on CPU) and the float64 product of the dequantized operands, the
edges of mixture-of-experts routing (experts with no token, one expert, 256 experts), transformers' fine-grained
FP8 layout of expert weights, errors on the offsets' values, the plan, and torch.compile with symbolic token
counts. The shared modes (errors, opcheck, fake kernel, export, vmap, TorchScript) run from tests/op_registry.py."""

import contextlib

import pytest
import torch

import ops
from fp8_support import E4, fp8, scales
from op_registry import Fp8MoE, scaled_grouped_reference

# One rounding of the output dtype: the float32 formula against the float64 product of the dequantized operands.
BOUND = {torch.float32: 2.0 ** -20, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -10}


def offsets(ends):
    return torch.tensor(ends, dtype=torch.int32)


def ends_of(sizes):
    return torch.tensor(sizes).cumsum(0).to(torch.int32)


def expand_blocks(s, rows, cols):
    return s.repeat_interleave(128, -2)[..., :rows, :].repeat_interleave(128, -1)[..., :cols]


def dequantized_product(A, B, scale_a, scale_b, offs, recipe):
    """2D x 3D in float64: each expert's rows of A (dequantized) times its dequantized B; zero past offs[-1]."""
    M, K, N = A.shape[0], A.shape[1], B.shape[2]
    out = torch.zeros(M, N, dtype=torch.float64)
    start = 0
    for g, end in enumerate(offs.tolist()):
        if recipe == "rowwise":
            a = A[start:end].double() * scale_a[start:end].double().unsqueeze(1)
            b = B[g].double() * scale_b[g].double().unsqueeze(0)
        else:
            a = A[start:end].double() * scale_a[start:end].double().repeat_interleave(128, 1)[:, :K]
            b = B[g].double() * expand_blocks(scale_b[g].double(), K, N)
        out[start:end] = a @ b
        start = end
    return out


def moe_case(tokens, experts, K, N, recipe, sizes=None, seed=0):
    """Tokens sorted by expert, experts' weights (G, N, K) passed transposed, scales of the recipe."""
    if sizes is None:  # each token's expert drawn uniformly
        g = torch.Generator().manual_seed(seed)
        choice = torch.randint(0, experts, (tokens,), generator=g)
        sizes = torch.bincount(choice, minlength=experts).tolist()
    A = fp8(tokens, K, seed=seed)
    B = fp8(experts, N, K, seed=seed + 1).transpose(1, 2)
    if recipe == "rowwise":
        sa, sb = scales(tokens, seed=seed), scales(experts, N, seed=seed + 1)
    else:
        sa, sb = scales(tokens, K // 128, seed=seed), scales(experts, K // 128, -(-N // 128), seed=seed + 1)
    return A, B, sa, sb, ends_of(sizes)


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_each_group_is_scaled_gemm_bit_for_bit(recipe, out_dtype):
    A, B, sa, sb, offs = moe_case(40, 5, 256, 48, recipe, sizes=[7, 0, 20, 1, 9])  # an empty expert, a tail of 3
    got = ops.scaled_grouped_gemm(A, B, sa, sb, offs, out_dtype=out_dtype)
    assert got.shape == (40, 48) and got.dtype == out_dtype
    start = 0
    for g, end in enumerate(offs.tolist()):
        a_scale = sa[start:end].unsqueeze(1) if recipe == "rowwise" else sa[start:end]
        b_scale = sb[g].unsqueeze(0) if recipe == "rowwise" else sb[g]
        expected = ops.scaled_gemm(A[start:end], B[g], a_scale, b_scale, out_dtype=out_dtype)
        assert torch.equal(got[start:end], expected), g
        start = end
    assert not got[start:].any()
    ref = dequantized_product(A, B, sa, sb, offs, recipe)
    assert (got.double() - ref).abs().max() <= BOUND[out_dtype] * ref.abs().max()


@pytest.mark.parametrize("experts, tokens", [(1, 33), (256, 300), (8, 0)], ids=["one expert", "256 experts", "no tokens"])
def test_routing_edges(experts, tokens):
    A, B, sa, sb, offs = moe_case(tokens, experts, 128, 32, "rowwise", seed=3)
    got = ops.scaled_grouped_gemm(A, B, sa, sb, offs)
    assert torch.equal(got, scaled_grouped_reference(A, B, sa, sb, offs))
    if experts == 256:
        assert (offs.diff(prepend=offs.new_zeros(1)) == 0).any()  # some experts got no token
    if tokens:
        ref = dequantized_product(A, B, sa, sb, offs, "rowwise")
        assert (got.double() - ref).abs().max() <= BOUND[torch.bfloat16] * ref.abs().max()
    else:
        assert got.shape == (0, 32)


def test_batched_blockwise_equals_scaled_gemm_per_batch_entry():
    A, B = fp8(3, 5, 256), fp8(3, 256, 160, seed=1)
    sa, sb = scales(3, 5, 2), scales(3, 2, 2, seed=1)
    bias = torch.randn(3, 160, dtype=torch.float32)
    got = ops.scaled_grouped_gemm(A, B, sa, sb, bias=bias, out_dtype=torch.float32)
    for g in range(3):
        assert torch.equal(got[g], ops.scaled_gemm(A[g], B[g], sa[g], sb[g], bias[g], torch.float32))


def test_fine_grained_fp8_expert_weights_as_transformers_stores_them():
    # FP8Experts' gate_up_proj (E, 2I, H) and gate_up_proj_scale_inv (E, 2I/128, H/128): B and scale_b are their
    # transposes, no copy.
    E, N, K, tokens = 4, 256, 384, 50
    w = torch.randn(E, N, K)
    codes, scale_inv = zip(*(ops.quantize_fp8(w[e], "block") for e in range(E)))
    weight, weight_scale_inv = torch.stack(codes), torch.stack(scale_inv)  # (E, N, K), (E, N/128, K/128)
    x = torch.randn(tokens, K)
    xq, xs = ops.quantize_fp8(x, "group")  # (tokens, K), (tokens, K/128)
    offs = ends_of([10, 0, 25, 15])
    got = ops.scaled_grouped_gemm(xq, weight.transpose(1, 2), xs, weight_scale_inv.transpose(1, 2), offs,
                                  out_dtype=torch.float32)
    ref = dequantized_product(xq, weight.transpose(1, 2), xs, weight_scale_inv.transpose(1, 2), offs, "blockwise")
    assert (got.double() - ref).abs().max() <= BOUND[torch.float32] * ref.abs().max()
    # Against the unquantized layer: FP8's own error (e4m3: 3 mantissa bits, each operand).
    exact = torch.cat([x[s:e].double() @ w[g].double().t() for g, (s, e) in
                       enumerate(zip([0] + offs[:-1].tolist(), offs.tolist()))])
    assert torch.nn.functional.cosine_similarity(got.double().flatten(), exact.flatten(), dim=0) > 0.998


def test_k_not_a_multiple_of_128_runs_rowwise_and_refuses_blockwise():
    # GPT-OSS's hidden size, 2880 = 22.5 blocks of 128.
    A, B = fp8(6, 2880), fp8(2, 2880, 32, seed=1)
    offs = offsets([2, 6])
    got = ops.scaled_grouped_gemm(A, B, scales(6), scales(2, 32, seed=1), offs)
    assert torch.equal(got, scaled_grouped_reference(A, B, scales(6), scales(2, 32, seed=1), offs))
    with pytest.raises(RuntimeError, match=r"scaled_grouped_gemm: the blockwise recipe takes K in whole 128-blocks, "
                                           r"got K = 2880 \(the rowwise recipe takes it\)"):
        ops.scaled_grouped_gemm(A, B, scales(6, 23), scales(2, 23, 1, seed=1), offs)


@pytest.mark.parametrize("ends, message", [
    ([4, 2, 6], r"expected offs to be non-negative and non-decreasing \(cumulative ends of the groups along M\), got "
                r"offs\[1\] = 2 after offs\[0\] = 4"),
    ([-1, 2, 6], r"expected offs to be non-negative .*got offs\[0\] = -1$"),
    ([2, 4, 7], r"offs's last end must be at most M = 6 \(in 2D x 3D\), got 7"),
])
def test_offsets_are_checked(ends, message):
    with pytest.raises(RuntimeError, match="scaled_grouped_gemm: " + message):
        ops.scaled_grouped_gemm(fp8(6, 32), fp8(3, 32, 16, seed=1), scales(6), scales(3, 16), offsets(ends))


def test_out_variant_and_plan():
    A, B, sa, sb, offs = moe_case(20, 3, 128, 32, "rowwise", sizes=[5, 5, 8])
    out = torch.full((20, 32), float("nan"), dtype=torch.float16)
    ops.scaled_grouped_gemm(A, B, sa, sb, offs, out=out)  # out_dtype None: out's
    assert torch.equal(out, ops.scaled_grouped_gemm(A, B, sa, sb, offs, out_dtype=torch.float16))
    plan = ops.fp8.grouped_plan(A, B, sa, sb, offs)
    assert plan["kind"] == "scaled_grouped" and plan["mode"] == "2D x 3D" and plan["recipe"] == "rowwise"
    assert plan["path"] == "formula" and plan["host_sync"] is False
    with pytest.raises(RuntimeError, match="scaled_grouped_gemm: expected out of shape"):
        ops.scaled_grouped_gemm(A, B, sa, sb, offs, out=torch.empty(20, 16, dtype=torch.float16))
    buffer = torch.empty(20 * 32)
    buffer[:20] = sa
    with pytest.raises(RuntimeError, match="scaled_grouped_gemm: out overlaps scale_a in memory"):
        ops.scaled_grouped_gemm(A, B, buffer[:20], sb, offs, out=buffer.view(20, 32))


def test_compiled_moe_layer_takes_every_token_count_in_one_graph():
    from torch._dynamo.utils import counters

    model = Fp8MoE().eval()
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, dynamic=True, fullgraph=True)
    with torch.no_grad():
        for tokens in (3, 17, 64):
            x = torch.randn(tokens, 16, generator=torch.Generator().manual_seed(tokens))
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1


def _relative_error(got, expected):
    got, expected = got.detach().double(), expected.detach().double()
    return float((got - expected).norm() / expected.norm())


def check_fp8_grouped_mm_trains_like_the_float_formula(routing, device, around=contextlib.nullcontext):
    # Forward and both gradients within FP8's rounding of the float64 formula: e4m3 rounds each operand by at
    # most 2^-4 relative (measured about 0.035 of the norm); an expert with no token gets a zero gradient.
    G, N, K = 4, 48, 64
    sizes = [6, 6, 6, 6] if routing == "balanced" else [19, 0, 1, 4]
    offs = ends_of(sizes)
    M = sum(sizes) + 3  # rows in no group: zero output and gradient
    g = torch.Generator().manual_seed(len(routing))
    x = torch.randn(M, K, generator=g).to(torch.bfloat16).requires_grad_()
    w = torch.randn(G, N, K, generator=g).to(torch.bfloat16).requires_grad_()
    grad = torch.randn(M, N, generator=g).to(torch.bfloat16)
    on = [t.detach().to(device).requires_grad_(t.requires_grad) for t in (x, w, offs, grad)]
    with around():
        y = ops.fp8_grouped_mm(*on[:3])
        gx, gw = torch.autograd.grad(y, on[:2], on[3])
    y, gx, gw = y.cpu(), gx.cpu(), gw.cpu()
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ends = [0] + offs.tolist()
    yr = torch.cat([xr[ends[e]:ends[e + 1]] @ wr[e].t() for e in range(G)] + [xr.new_zeros(M - ends[-1], N)])
    gxr, gwr = torch.autograd.grad(yr, (xr, wr), grad.double())
    assert y.dtype == gx.dtype == gw.dtype == torch.bfloat16
    for got, expected in ((y, yr), (gx, gxr), (gw, gwr)):
        assert _relative_error(got, expected) < 2.0 ** -4
    assert not y[ends[-1]:].any() and not gx[ends[-1]:].any()
    if routing == "skewed":
        assert not gw[1].any()


@pytest.mark.parametrize("routing", ["balanced", "skewed"])
def test_fp8_grouped_mm_trains_like_the_float_formula(routing):
    check_fp8_grouped_mm_trains_like_the_float_formula(routing, "cpu")


@pytest.mark.cuda
@pytest.mark.parametrize("routing", ["balanced", "skewed"])
def test_fp8_grouped_mm_trains_on_sm90_without_a_host_synchronization(routing):
    # bfloat16: forward and grad_x (2D x 3D) and grad_w (2D x 2D) on torch._scaled_grouped_mm or the SM90 kernels.
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("torch._scaled_grouped_mm's rowwise kernel: SM90")
    @contextlib.contextmanager
    def no_host_sync():
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")

    check_fp8_grouped_mm_trains_like_the_float_formula(routing, "cuda", no_host_sync)


@pytest.mark.parametrize("dynamic", [False, True])
def test_fp8_grouped_mm_compiles_an_experts_mlp(dynamic):
    # Two calls in one graph, as the experts' up and down projections; symbolic token counts with dynamic=True.
    G, N, K = 2, 32, 16

    def mlp(x, w_up, w_down, offs):
        return ops.fp8_grouped_mm(ops.fp8_grouped_mm(x, w_up, offs).relu(), w_down, offs)

    g = torch.Generator().manual_seed(3)
    w_up = torch.randn(G, N, K, generator=g, requires_grad=True)
    w_down = torch.randn(G, K, N, generator=g, requires_grad=True)
    compiled = torch.compile(mlp, fullgraph=True, dynamic=dynamic)
    for sizes in ([3, 5], [10, 0], [4, 12]):
        offs = ends_of(sizes)
        x = torch.randn(sum(sizes) + 1, K, generator=g, requires_grad=True)
        got, expected = compiled(x, w_up, w_down, offs), mlp(x, w_up, w_down, offs)
        torch.testing.assert_close(got, expected)
        grads = torch.autograd.grad(got.sum(), (x, w_up, w_down))
        for a, b in zip(grads, torch.autograd.grad(expected.sum(), (x, w_up, w_down))):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("x, w, offs, message", [
    (torch.randn(30, 64, dtype=torch.float64), torch.randn(2, 48, 64), ends_of([10, 20]), "x's dtype"),
    (torch.randn(30, 64), torch.randn(2, 48, 64, dtype=torch.float64), ends_of([10, 20]), "w's dtype"),
    (torch.randn(30, 64).to(E4), torch.randn(2, 48, 64), ends_of([10, 20]), "x's dtype"),
    (torch.randn(64), torch.randn(2, 48, 64), ends_of([10, 20]), r"x of shape \(M, K\)"),
    (torch.randn(2, 30, 64), torch.randn(2, 48, 64), ends_of([10, 20]), r"x of shape \(M, K\)"),
    (torch.randn(30, 64), torch.randn(48, 64), ends_of([30]), r"w of shape \(G, N, K\)"),
    (torch.randn(30, 32), torch.randn(2, 48, 64), ends_of([10, 20]), r"same K, got x of shape \(30, 32\) and w of "
                                                                     r"shape \(2, 48, 64\)"),
    (torch.randn(30, 64), torch.randn(2, 48, 64), torch.tensor([10, 20]), "offs of dtype torch.int32"),
    (torch.randn(30, 64), torch.randn(2, 48, 64), ends_of([10, 10, 20]), r"one end per expert, 2 \(w's G\), got 3"),
    (torch.randn(30, 40), torch.randn(2, 48, 40), ends_of([10, 20]), r"K and N to be multiples of 16 .* x of shape "
                                                                     r"\(30, 40\)"),
    (torch.randn(30, 64), torch.randn(2, 40, 64), ends_of([10, 20]), r"K and N to be multiples of 16"),
    (torch.randn(30, 64), torch.randn(2, 48, 64, device="meta"), ends_of([10, 20]), "w on x's device, cpu, got meta"),
    (torch.randn(30, 64), torch.randn(2, 48, 64), ends_of([10, 20]).to("meta"), "offs on x's device"),
    (torch.randn(30, 64), torch.randn(2, 48, 64), torch.tensor([20, 10], dtype=torch.int32),
     r"offs to be non-decreasing .* at most M = 30, got \[20, 10\]"),
    (torch.randn(30, 64), torch.randn(2, 48, 64), torch.tensor([10, 31], dtype=torch.int32), r"got \[10, 31\]"),
    (torch.randn(30, 64), torch.randn(2, 48, 64), torch.tensor([-1, 20], dtype=torch.int32), r"got \[-1, 20\]"),
])
def test_fp8_grouped_mm_names_the_argument_it_refuses(x, w, offs, message):
    # Checked before quantizing: the messages name fp8_grouped_mm's own arguments, in forward (a float64 w
    # would otherwise fail only in backward, as grad_w's out_dtype).
    with pytest.raises(RuntimeError, match="fp8_grouped_mm: expected " + ".*" + message):
        ops.fp8_grouped_mm(x, w, offs)


def test_fp8_grouped_mm_gradients_have_no_derivative_and_torch_func_takes_them():
    x, w, offs = torch.randn(8, 32, requires_grad=True), torch.randn(2, 16, 32, requires_grad=True), ends_of([4, 4])
    gx, = torch.autograd.grad(ops.fp8_grouped_mm(x, w, offs).square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):  # never a silent zero second derivative
        gx.square().sum().backward()
    grad = torch.func.grad(lambda x: ops.fp8_grouped_mm(x, w.detach(), offs).square().sum())(x.detach())
    torch.testing.assert_close(grad, gx.detach())


# ---- The SM90 FP8 grouped kernels' launch, replayed on CPU (_scaled_grouped_gemm_emulate) ----------------------

def emulate(A, B, sa, sb, offs=None, bias=None, out_dtype=None):
    """The CUDA path's launch as prepared there (scales laid out for the blockwise mainloop, offs read on the
    device), computed by the CPU replay of the kernels; their output poisoned with NaN first."""
    return torch.ops.ops._scaled_grouped_gemm_emulate(A, B, sa, sb, offs, bias, out_dtype)


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_kernels_launch_replays_to_the_formula(recipe, out_dtype):
    # An empty expert, one of a single token, and 3 rows past the last end (zeroed, not left unwritten).
    A, B, sa, sb, offs = moe_case(40, 5, 384, 272, recipe, sizes=[7, 0, 20, 1, 9])
    got = emulate(A, B, sa, sb, offs, out_dtype=out_dtype)
    assert got.dtype == out_dtype and not got.isnan().any()
    assert not got[37:].any()
    ref = dequantized_product(A, B, sa, sb, offs, recipe)
    # The mainloop promotes each 128-deep K block into float32 (the formula sums K in one product): float32's
    # rounding of 3 partial sums more, then the output's one rounding.
    assert (got.double() - ref).abs().max() <= (BOUND[out_dtype] + 2.0 ** -20) * ref.abs().max()


def test_the_kernels_launch_takes_k_in_part_blocks_and_3d_x_3d():
    # Rowwise at GPT-OSS's K = 2880 (22.5 blocks of 128: the last block's scale covers its 64 columns).
    A, B, sa, sb, offs = moe_case(24, 3, 2880, 64, "rowwise", sizes=[10, 6, 8])
    ref = dequantized_product(A, B, sa, sb, offs, "rowwise")
    got = emulate(A, B, sa, sb, offs, out_dtype=torch.float32)
    assert (got.double() - ref).abs().max() <= 2.0 ** -19 * ref.abs().max()
    # 3D x 3D: every group m x n x k, both recipes.
    A3, B3 = fp8(3, 5, 256), fp8(3, 48, 256, seed=1).transpose(1, 2)
    for sa3, sb3 in ((scales(3, 5), scales(3, 48, seed=1)), (scales(3, 5, 2), scales(3, 2, 1, seed=1))):
        got = emulate(A3, B3, sa3, sb3, out_dtype=torch.float32)
        expected = ops.scaled_grouped_gemm(A3, B3, sa3, sb3, out_dtype=torch.float32)
        assert (got - expected).abs().max() <= 2.0 ** -19 * expected.abs().max()


def test_the_kernels_clamp_offsets_they_read_on_the_device():
    # The CUDA path reads offs on the device only: a decreasing end makes an empty group, an end past M stops at
    # M, as the grouped kernels clamp them (grouped_args.h), never a read or write out of bounds.
    A, B, sa, sb, _ = moe_case(6, 3, 128, 16, "rowwise", sizes=[2, 2, 2])
    got = emulate(A, B, sa, sb, offsets([4, 2, 9]), out_dtype=torch.float32)
    expected = ops.scaled_grouped_gemm(A, B, sa, sb, offsets([4, 4, 6]), out_dtype=torch.float32)
    assert (got - expected).abs().max() <= 2.0 ** -20 * expected.abs().max()


def test_the_kernels_refuse_what_they_do_not_run():
    A, B, sa, sb, offs = moe_case(8, 2, 128, 16, "rowwise", sizes=[3, 5])
    refused = "_scaled_grouped_gemm_emulate: the SM90 FP8 grouped kernels do not take this problem: "
    with pytest.raises(RuntimeError, match=refused + "the FP8 grouped kernels take no bias"):
        emulate(A, B, sa, sb, offs, bias=torch.zeros(2, 16, dtype=torch.bfloat16))
    # 2D x 2D (the weight gradient's K-offsets) runs the formula.
    with pytest.raises(RuntimeError, match=refused + "the FP8 grouped kernels run 2D x 3D and 3D x 3D"):
        emulate(fp8(3, 48), fp8(48, 16, seed=1), scales(9), scales(48, seed=1), offsets([16, 16, 48]))


def test_the_kernels_are_listed_by_output_dtype_and_recipe():
    listed = [k for k in ops.kernels() if k["op"] == "scaled_grouped_gemm"]
    assert sorted((k["out_dtype"], k["recipes"][0]) for k in listed) == sorted(
        (dtype, recipe) for dtype in ("bfloat16", "float16", "float32")
        for recipe in ("rowwise", "blockwise 1x128 x 128x128"))
    assert all(k["candidate_only"] and k["modes"] == ["2D x 3D", "3D x 3D"] and k["name"].startswith("sm90_e4m3_")
               for k in listed)
    assert len({k["name"] for k in listed}) == 6


def sm90_kernels_built():
    """Whether this device runs the SM90 FP8 grouped kernels: sm_90a, a build with OPS_CANDIDATE_KERNELS=1 (and
    ops.gemm.set_candidate_kernels not off)."""
    return (torch.cuda.get_device_capability() == (9, 0) and ops.build_info.CANDIDATE_KERNELS
            and ops.gemm.candidate_kernels_enabled())


def torch_takes(recipe, out_dtype):
    """Whether torch._scaled_grouped_mm computes a 2D x 3D call without bias on this device."""
    return recipe == "rowwise" and out_dtype == torch.bfloat16 and torch.cuda.get_device_capability() == (9, 0)


# Several tiles per group, groups that end inside a tile, empty experts and a tail; K in part blocks (rowwise);
# decode's few tokens per expert.
GPU_CASES = [(1000, 8, 512, 384, [100, 0, 257, 143, 1, 299, 129, 61]), (300, 4, 2880, 256, None),
             (7, 16, 1024, 512, None)]


@pytest.mark.cuda
@pytest.mark.parametrize("case", GPU_CASES, ids=["large", "K 2880", "decode"])
@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_the_sm90_kernels_equal_their_cpu_replay(case, recipe, out_dtype):
    tokens, experts, K, N, sizes = case
    if recipe == "blockwise" and K % 128:
        pytest.skip("the blockwise recipe takes K in whole 128-blocks")
    A, B, sa, sb, offs = moe_case(tokens, experts, K, N, recipe, sizes=sizes)
    cuda = [t.cuda() for t in (A, B, sa, sb, offs)]
    plan = ops.fp8.grouped_plan(*cuda, out_dtype=out_dtype)
    if not sm90_kernels_built():
        assert plan["path"] == ("torch._scaled_grouped_mm" if torch_takes(recipe, out_dtype) else "formula"), plan
        pytest.skip(plan["reason"])
    assert plan["path"] == "cutlass" and plan["host_sync"] is False, plan
    got = ops.scaled_grouped_gemm(*cuda, out_dtype=out_dtype).cpu()
    expected = emulate(A, B, sa, sb, offs, out_dtype=out_dtype)  # the same K blocks, wgmma's order within each
    torch.testing.assert_close(got.float(), expected.float(), atol=1e-2 * expected.float().abs().max().item(),
                               rtol=1e-2)


@pytest.mark.cuda
def test_the_sm90_kernels_clamp_bad_offsets_and_capture_in_a_graph():
    if not sm90_kernels_built():
        pytest.skip("the SM90 FP8 grouped kernels run on sm_90a in a build with OPS_CANDIDATE_KERNELS=1")
    A, B, sa, sb, offs = moe_case(1000, 8, 512, 384, "blockwise", sizes=[100, 0, 257, 143, 1, 299, 129, 61])
    a, b, s_a, s_b = A.cuda(), B.cuda(), sa.cuda(), sb.cuda()
    for bad in ([5, 2, -1, 40, 1200, 0, 7, 9], [-5] * 8, [2000] * 8):
        got = ops.scaled_grouped_gemm(a, b, s_a, s_b, offsets(bad).cuda(), out_dtype=torch.float32).cpu()
        clamped = torch.cummax(offsets(bad).clamp(0, 1000), 0).values.to(torch.int32)
        expected = emulate(A, B, sa, sb, clamped, out_dtype=torch.float32)
        torch.testing.assert_close(got, expected, atol=1e-2 * expected.abs().max().item(), rtol=1e-2)
    o = offs.cuda()
    ops.scaled_grouped_gemm(a, b, s_a, s_b, o)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.scaled_grouped_gemm(a, b, s_a, s_b, o)
    o.copy_(offsets([0, 0, 600, 600, 601, 700, 1000, 1000]).cuda())  # new routing, same graph
    graph.replay()
    expected = emulate(A, B, sa, sb, o.cpu())
    torch.testing.assert_close(out.cpu().float(), expected.float(), atol=1e-2 * expected.float().abs().max().item(),
                               rtol=1e-2)


@pytest.mark.cuda
@pytest.mark.parametrize("candidate_kernels", [False], ids=["default-build"], indirect=True)  # conftest.py
def test_where_no_kernel_of_ops_takes_the_call_torch_computes_the_rowwise_recipe(candidate_kernels):
    if not torch_takes("rowwise", torch.bfloat16):
        pytest.skip("torch._scaled_grouped_mm's rowwise kernel: SM90")
    A, B, sa, sb, offs = moe_case(1000, 8, 512, 384, "rowwise", sizes=[100, 0, 257, 143, 1, 299, 129, 61])
    a, b, s_a, s_b, o = (t.cuda() for t in (A, B, sa, sb, offs))
    plan = ops.fp8.grouped_plan(a, b, s_a, s_b, o)
    assert plan["path"] == "torch._scaled_grouped_mm" and plan["host_sync"] is False, plan
    got = ops.scaled_grouped_gemm(a, b, s_a, s_b, o)  # 990 rows routed, 10 past the last end
    assert torch.equal(got[:990], torch._scaled_grouped_mm(a, b, s_a, s_b, o, out_dtype=torch.bfloat16)[:990])
    assert (got[990:] == 0).all()  # torch leaves them unwritten
    expected = dequantized_product(A, B, sa, sb, offs, "rowwise")
    torch.testing.assert_close(got.cpu().double(), expected, atol=1e-2 * expected.abs().max().item(), rtol=1e-2)
    # Rows past the last end are zero; bad offsets are clamped, as the kernels of ops clamp them.
    short = offsets([100, 100, 357, 500, 501, 800, 900, 960]).cuda()
    assert (ops.scaled_grouped_gemm(a, b, s_a, s_b, short)[960:] == 0).all()
    bad = offsets([5, 2, -1, 40, 1200, 0, 7, 9])
    clamped = torch.cummax(bad.clamp(0, 1000), 0).values.to(torch.int32)
    torch.testing.assert_close(ops.scaled_grouped_gemm(a, b, s_a, s_b, bad.cuda()),
                               ops.scaled_grouped_gemm(a, b, s_a, s_b, clamped.cuda()), atol=0, rtol=0)
    # A row-major B (G, K, N) is copied to the K-major layout torch takes; 3D x 3D; graph capture.
    torch.testing.assert_close(ops.scaled_grouped_gemm(a, b.contiguous(), s_a, s_b, o), got, atol=0, rtol=0)
    batched = ops.scaled_grouped_gemm(a[:8 * 64].view(8, 64, 512), b, s_a[:8 * 64].view(8, 64), s_b)
    assert ops.fp8.grouped_plan(a[:8 * 64].view(8, 64, 512), b, s_a[:8 * 64].view(8, 64), s_b)["path"] == \
        "torch._scaled_grouped_mm"
    torch.testing.assert_close(batched[1], ops.scaled_gemm(a[64:128], b[1], s_a[64:128, None], s_b[1][None],
                                                           out_dtype=torch.bfloat16), atol=1e-2, rtol=1e-2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.scaled_grouped_gemm(a, b, s_a, s_b, o)
    o.copy_(short)  # new routing, same graph
    graph.replay()
    torch.testing.assert_close(out, ops.scaled_grouped_gemm(a, b, s_a, s_b, short), atol=0, rtol=0)


# ---- 2D x 2D and 3D x 2D on torch._scaled_grouped_mm: each group moved to a 16-aligned start -------------------

RAGGED_ENDS = [[3, 3, 40, 41, 100, 144], [0] * 6, [160] * 6, [17, 2, -4, 300, 33, 150], [16, 32, 48, 64, 80, 96]]
RAGGED_IDS = ["ragged", "all empty", "one group", "bad", "aligned"]


def torch_operands(A, B, sa, sb, offs):
    """What the CUDA path gives torch._scaled_grouped_mm, checked against torch's device assertions: A row-major,
    B column-major (both K-major for FP8), the cut extent a multiple of 16, each group more than 0 wide and, but
    for the last, a multiple of 16 (GroupMMCommon.cuh prepare_grouped_gemm_data)."""
    a, b, s_a, s_b, ends, columns = torch.ops.ops._scaled_grouped_gemm_torch_operands(A, B, sa, sb, offs)
    assert a.stride(-1) == 1 and b.t().is_contiguous() and a.shape[-1] == b.shape[0] and b.shape[0] % 16 == 0
    sizes = torch.diff(ends, prepend=ends.new_zeros(1))
    assert ends.dtype == torch.int32 and (sizes > 0).all() and (sizes[:-1] % 16 == 0).all()
    return a, b, s_a, s_b, ends, columns


def check_moved(moved, original, clamped, ends, dim):
    """Each group's slices along `dim` at their new start, then zeros up to its new end."""
    start, new_start = 0, 0
    for end, new_end in zip(clamped.tolist(), ends.tolist()):
        size = end - start
        assert torch.equal(moved.narrow(dim, new_start, size).view(torch.uint8),
                           original.narrow(dim, start, size).view(torch.uint8))
        assert not moved.narrow(dim, new_start + size, new_end - new_start - size).view(torch.uint8).any()
        start, new_start = end, new_end


@pytest.mark.parametrize("ends", RAGGED_ENDS, ids=RAGGED_IDS)
def test_the_2d_x_2d_operands_given_to_torch_meet_its_device_assertions_and_compute_the_same(ends):
    M, K, N = 48, 160, 32
    A, B = fp8(K, M).t(), fp8(K, N, seed=1)  # A column-major: fp8_grouped_mm's weight gradient passes it so
    offs, G = offsets(ends), len(ends)
    sa, sb = scales(G * M, seed=2), scales(G * N, seed=3)
    a, b, s_a, s_b, padded, columns = torch_operands(A, B, sa, sb, offs)
    assert a.is_contiguous() and torch.equal(s_a, sa) and torch.equal(s_b, sb) and columns.numel() == 0
    clamped = torch.cummax(offs.clamp(0, K), 0).values.to(torch.int32)
    check_moved(a, A, clamped, padded, 1)
    check_moved(b, B, clamped, padded, 0)
    expected = ops.scaled_grouped_gemm(A, B, sa, sb, clamped, out_dtype=torch.float32)
    got = ops.scaled_grouped_gemm(a, b, s_a, s_b, padded, out_dtype=torch.float32)  # zeros added: float32's order
    torch.testing.assert_close(got, expected, rtol=0, atol=2.0 ** -16 * expected.abs().max().item())


@pytest.mark.parametrize("ends", RAGGED_ENDS, ids=RAGGED_IDS)
def test_the_3d_x_2d_operands_given_to_torch_meet_its_device_assertions_and_give_the_same_columns(ends):
    G, M, K, N = 6, 24, 64, 160
    A, B = fp8(G, M, K), fp8(N, K, seed=1).t()  # B column-major, as torch takes it
    offs = offsets(ends)
    sa, sb = scales(G, M, seed=2), scales(N, seed=3)
    a, b, s_a, s_b, padded, columns = torch_operands(A, B, sa, sb, offs)
    assert a is A or torch.equal(a.view(torch.uint8), A.view(torch.uint8))
    assert torch.equal(s_a, sa) and columns.shape == (N,)
    clamped = torch.cummax(offs.clamp(0, N), 0).values.to(torch.int32)
    check_moved(b, B, clamped, padded, 1)
    check_moved(s_b, sb, clamped, padded, 0)
    expected = ops.scaled_grouped_gemm(A, B, sa, sb, clamped, out_dtype=torch.float32)
    got = ops.scaled_grouped_gemm(a, b, s_a, s_b, padded, out_dtype=torch.float32).index_select(1, columns)
    got[:, clamped[-1]:] = 0  # as the CUDA path zeroes the columns past the last end
    torch.testing.assert_close(got, expected, rtol=0, atol=2.0 ** -16 * expected.abs().max().item())  # GEMM blocking


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["2D x 2D", "3D x 2D"])
def test_torch_computes_the_ragged_k_and_n_forms_for_any_offsets_without_a_host_synchronization(mode):
    if not torch_takes("rowwise", torch.bfloat16):
        pytest.skip("torch._scaled_grouped_mm's rowwise kernel: SM90")
    G, M, K, N = 8, 96, 1008, 128
    if mode == "2D x 2D":  # offs over K
        A, B, extent = fp8(K, M).t(), fp8(K, N, seed=1), K
        sa, sb = scales(G * M, seed=2), scales(G * N, seed=3)
    else:  # offs over N
        N = K
        A, B, extent = fp8(G, M, 256), fp8(N, 256, seed=1).t(), N
        sa, sb = scales(G, M, seed=2), scales(N, seed=3)
    cuda = [t.cuda() for t in (A, B, sa, sb)]
    for ends in ([100, 100, 357, 500, 501, 800, 900, 960], [5, 2, -1, 40, 1200, 0, 7, 9], [0] * 8):
        offs = offsets(ends)
        plan = ops.fp8.grouped_plan(*cuda, offs.cuda())
        assert plan["mode"] == mode and plan["path"] == "torch._scaled_grouped_mm", plan
        assert plan["host_sync"] is False
        got = ops.scaled_grouped_gemm(*cuda, offs.cuda()).cpu()
        clamped = torch.cummax(offs.clamp(0, extent), 0).values.to(torch.int32)
        expected = ops.scaled_grouped_gemm(A, B, sa, sb, clamped)
        torch.testing.assert_close(got.float(), expected.float(), atol=1e-2 * expected.float().abs().max().item(),
                                   rtol=1e-2)
        for cpu, gpu in zip(torch.ops.ops._scaled_grouped_gemm_torch_operands(A, B, sa, sb, offs),
                            torch.ops.ops._scaled_grouped_gemm_torch_operands(*cuda, offs.cuda())):
            bytes_of = (lambda t: t.view(torch.uint8) if t.dtype == E4 else t)
            assert torch.equal(bytes_of(cpu), bytes_of(gpu).cpu())
    o = offsets([100, 100, 357, 500, 501, 800, 900, 960]).cuda()
    # NaN scale_a of the empty group 1 leaves no NaN: the group has no product, as on CPU.
    nan_scales = cuda[2].clone()
    if mode == "2D x 2D":
        nan_scales[M:2 * M] = float("nan")
    else:
        nan_scales[1] = float("nan")
    assert not ops.scaled_grouped_gemm(cuda[0], cuda[1], nan_scales, cuda[3], o).isnan().any()
    ops.scaled_grouped_gemm(*cuda, o)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.scaled_grouped_gemm(*cuda, o)
    new = offsets([0, 16, 16, 700, 701, 702, 703, 1008])
    o.copy_(new)  # new groups, same graph
    graph.replay()
    torch.testing.assert_close(out, ops.scaled_grouped_gemm(*cuda, new.cuda()), atol=0, rtol=0)
