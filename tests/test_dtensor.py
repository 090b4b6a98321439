"""The ops under torch.distributed's DTensor (ops/_dtensor.py), in processes of their own on gloo over
loopback: a converted Llama-style decoder under tensor + sequence parallel on 2 and 4 ranks and FSDP2
training steps on 2 ranks equal one process; every op under fuzzed placements equals the op on the full
tensors; and single-process checks of what DTensor is told (placements, clear errors)."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

import dtensor_worker
import ops

pytestmark = pytest.mark.slow


TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (NCCL)")


@pytest.mark.parametrize("world_size,device", [(2, "cpu"), (4, "cpu"),
                                               pytest.param(2, "cuda", marks=[pytest.mark.cuda, TWO_GPUS])])
def test_tensor_parallel_decoder_equals_one_process(world_size, device, tmp_path):
    dtensor_worker.spawn("tp", world_size, tmp_path, device)
    got = torch.load(tmp_path / "tp.pt")
    model, ids = dtensor_worker.model_and_data()
    logits = model(ids)
    logits.square().mean().backward()
    torch.testing.assert_close(got["logits"], logits, atol=1e-5, rtol=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(got["grads"][name], p.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_fsdp2_training_steps_equal_one_process(tmp_path):
    dtensor_worker.spawn("fsdp", 2, tmp_path)
    got = torch.load(tmp_path / "fsdp.pt")
    model, ids = dtensor_worker.model_and_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):  # the mean over the two ranks' halves of the batch
        loss = sum(model(ids[r:r + 1]).square().mean() for r in range(2)) / 2
        loss.backward()
        opt.step()
        opt.zero_grad()
    for name, p in model.named_parameters():
        torch.testing.assert_close(got["params"][name], p.detach(), atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight:UserWarning")  # torch.nn.RMSNorm's
def test_sequence_parallel_norms_of_every_kind_equal_the_stock_modules(tmp_path):
    # No weight, and a weight of another dtype than the input (promoted as Hugging Face Llama does, or cast):
    # the converted norm's ones are a DTensor like its input, as the op needs.
    pytest.importorskip("transformers")
    dtensor_worker.spawn("sequence_parallel_norms", 2, tmp_path)
    got = torch.load(tmp_path / "sequence_parallel_norms.pt")
    for kind, (stock, x) in dtensor_worker.norm_kinds().items():
        expected, mine = stock(x), dtensor_worker.converted(stock)(x)
        assert got[kind, "stock"].dtype == got[kind, "ops"].dtype == expected.dtype, kind
        torch.testing.assert_close(got[kind, "stock"], expected, msg=kind)
        assert torch.equal(got[kind, "ops"], mine), kind  # rows are independent: the same values as one process
        tol = 1e-6 if x.dtype == torch.float32 else 1e-2
        torch.testing.assert_close(got[kind, "ops"], expected, atol=tol, rtol=tol, msg=kind)


@pytest.mark.parametrize("world_size", [2, 4])
def test_every_op_under_fuzzed_placements_equals_the_full_op(world_size, tmp_path):
    dtensor_worker.spawn("fuzz", world_size, tmp_path, 60.0)
    failures = torch.load(tmp_path / "fuzz.pt")["failures"]
    assert not failures, "\n".join(failures)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    """A one-rank mesh in this process: the placements DTensor chooses, without other processes."""
    from torch.distributed.device_mesh import init_device_mesh

    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path_factory.mktemp('pg') / 'init'}", rank=0,
                            world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def _on(mesh):
    """d(tensor, *placements): the tensor distributed over mesh with those placements."""
    return lambda t, *placements: distribute_tensor(t, mesh, list(placements))


def test_placements_the_rules_give(mesh):
    x, w, b = torch.randn(4, 6), torch.randn(8, 6), torch.randn(8)
    d = _on(mesh)
    # Colwise: out features sharded; row-wise without activation: a Partial sum, bias added once.
    assert ops.linear(d(x, Replicate()), d(w, Shard(0)), d(b, Shard(0)), "gelu").placements == (Shard(1),)
    out = ops.linear(d(x, Shard(1)), d(w, Shard(1)), d(b, Replicate()), "none")
    assert out.placements == (Partial(),)
    torch.testing.assert_close(out.full_tensor(), torch.nn.functional.linear(x, w, b))
    # An activation on a row-wise product: the inputs are gathered first, never activated per part.
    act = ops.linear(d(x, Shard(1)), d(w, Shard(1)), d(b, Replicate()), "relu")
    assert act.placements != (Partial(),)
    torch.testing.assert_close(act.full_tensor(), torch.relu(torch.nn.functional.linear(x, w, b)))
    assert ops.cutlass_gemm(d(x, Shard(1)), d(w.t().contiguous(), Shard(0))).placements == (Partial(),)
    assert ops.rms_norm(d(x, Shard(0)), d(w[0], Replicate())).placements == (Shard(0),)
    assert ops.silu_and_mul(d(torch.randn(4, 8), Shard(0))).placements == (Shard(0),)
    # Experts' weights sharded on N (column parallel) or on K with the tokens' features (row parallel), as
    # torch's rules for aten._grouped_mm.
    tokens, experts, offs = torch.randn(6, 8), torch.randn(3, 8, 4), torch.tensor([2, 2, 6], dtype=torch.int32)
    expected = ops.grouped_gemm(tokens, experts, offs)
    out = ops.grouped_gemm(d(tokens, Replicate()), d(experts, Shard(2)), d(offs, Replicate()))
    assert out.placements == (Shard(1),) and torch.equal(out.full_tensor(), expected)
    out = ops.grouped_gemm(d(tokens, Shard(1)), d(experts, Shard(1)), d(offs, Replicate()))
    assert out.placements == (Partial(),)
    torch.testing.assert_close(out.full_tensor(), expected)


def test_clear_errors(mesh):
    d = _on(mesh)
    x, r, w = torch.randn(4, 8), torch.randn(4, 8), torch.rand(8)
    with pytest.raises(RuntimeError, match=r"fused_add_rms_norm: input and residual are written in place"):
        ops.fused_add_rms_norm(d(x, Shard(1)), d(r, Shard(1)), d(w, Replicate()))
    with pytest.raises(RuntimeError, match=r"cutlass_gemm: the out variant does not take DTensors"):
        ops.cutlass_gemm(d(x, Replicate()), d(x.t().contiguous(), Replicate()), out=d(torch.empty(4, 4), Replicate()))
    codes, scale = (DTensor.from_local(t, mesh, [Replicate()]) for t in ops.quantize_fp8(torch.randn(16, 16), "tensor"))
    with pytest.raises(RuntimeError, match=r"scaled_gemm: the out variant does not take DTensors"):
        ops.scaled_gemm(codes, codes.t(), scale, scale, out=d(torch.empty(16, 16, dtype=torch.bfloat16), Replicate()))


def test_scaled_grouped_gemm_shards_experts_with_their_scales(mesh):
    # Expert parallel in 3D x 3D: each rank its experts' tokens, weights, scales and bias; anything else whole.
    # FP8 tensors cannot cross gloo: each is made from its local tensor (the whole one on this one-rank mesh).
    def d(t, placement):
        return DTensor.from_local(t, mesh, [placement])

    A, B = torch.randn(4, 3, 32).to(torch.float8_e4m3fn), torch.randn(4, 32, 16).to(torch.float8_e4m3fn)
    sa, sb, bias = torch.rand(4, 3) + 0.5, torch.rand(4, 16) + 0.5, torch.randn(4, 16)
    expected = ops.scaled_grouped_gemm(A, B, sa, sb, bias=bias, out_dtype=torch.float32)
    out = ops.scaled_grouped_gemm(d(A, Shard(0)), d(B, Shard(0)), d(sa, Shard(0)), d(sb, Shard(0)), bias=d(bias, Shard(0)),
                                  out_dtype=torch.float32)
    assert out.placements == (Shard(0),) and torch.equal(out.full_tensor(), expected)
    offs = torch.tensor([1, 3], dtype=torch.int32)
    tokens, experts = torch.randn(3, 32).to(torch.float8_e4m3fn), B[:2]
    out = ops.scaled_grouped_gemm(d(tokens, Replicate()), d(experts, Replicate()), d(sa[0], Replicate()),
                                  d(sb[:2], Replicate()), d(offs, Replicate()))
    assert out.placements == (Replicate(),)
    assert torch.equal(out.full_tensor(), ops.scaled_grouped_gemm(tokens, experts, sa[0], sb[:2], offs))
    with pytest.raises(RuntimeError, match=r"scaled_grouped_gemm: the out variant does not take DTensors"):
        ops.scaled_grouped_gemm(d(tokens, Replicate()), d(experts, Replicate()), d(sa[0], Replicate()),
                                d(sb[:2], Replicate()), d(offs, Replicate()), out=d(torch.empty(3, 16), Replicate()))


def test_convert_after_parallelize_says_it_must_run_first(mesh):
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    model = parallelize_module(torch.nn.Sequential(torch.nn.Linear(8, 8)), mesh, {"0": ColwiseParallel()})
    assert isinstance(model[0].weight, DTensor)
    with pytest.warns(UserWarning, match="run ops.nn.convert before parallelizing"):
        report = ops.nn.convert(model)
    assert report.linear == [] and "run ops.nn.convert before parallelizing" in dict(report.skipped)["0"]


def test_scaled_gemm_and_quantize_fp8_shards_carry_their_scales(mesh):
    # FP8 tensors cannot cross gloo ("Invalid scalar type"): DTensors from local tensors, each call on
    # placements a rule takes as they are (no redistribution), checked against the local op.
    def d(t, placement):
        return DTensor.from_local(t, mesh, [placement], run_check=False)

    x, w = torch.randn(8, 256), torch.randn(32, 256)
    xq, xs = ops.quantize_fp8(x, "row")
    wq, ws = ops.quantize_fp8(w, "row")
    local = ops.scaled_gemm(xq, wq.t(), xs, ws.t(), out_dtype=torch.float32)
    out = ops.scaled_gemm(d(xq, Shard(0)), d(wq.t(), Replicate()), d(xs, Shard(0)), d(ws.t(), Replicate()),
                          out_dtype=torch.float32)
    assert out.placements == (Shard(0),) and torch.equal(out.to_local(), local)
    out = ops.scaled_gemm(d(xq, Replicate()), d(wq.t(), Shard(1)), d(xs, Replicate()), d(ws.t(), Shard(1)),
                          out_dtype=torch.float32)
    assert out.placements == (Shard(1),) and torch.equal(out.to_local(), local)
    one = torch.tensor(1.0)
    out = ops.scaled_gemm(d(xq, Shard(1)), d(wq.t(), Shard(0)), d(one, Replicate()), d(one, Replicate()),
                          out_dtype=torch.float32)
    assert out.placements == (Partial(),)
    gq, gs = ops.quantize_fp8(x, "group")
    bq, bs = ops.quantize_fp8(w, "block")
    out = ops.scaled_gemm(d(gq, Shard(0)), d(bq.t(), Replicate()), d(gs, Shard(0)), d(bs.t(), Replicate()),
                          out_dtype=torch.float32)
    assert out.placements == (Shard(0),)
    codes, scale = ops.quantize_fp8(d(x, Shard(0)), "row")
    assert codes.placements == scale.placements == (Shard(0),)
    assert torch.equal(codes.to_local().view(torch.uint8), xq.view(torch.uint8)) and torch.equal(scale.to_local(), xs)


@pytest.mark.parametrize("n, k, splits", [(48, 256, ["M", "K"]), (64, 48, ["M", "N"]), (64, 256, ["M", "N", "K"])])
def test_scaled_gemm_splits_k_or_n_only_into_multiples_of_16(mesh, n, k, splits):
    # What the rule offers DTensor on a 2-rank mesh (a mesh object: no processes): N = 48 split in two is 24
    # per rank, which no FP8 kernel takes (K likewise).
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    from ops._dtensor import _scaled_gemm

    two = DeviceMesh("cpu", [0, 1], _init_backend=False)

    def spec(*shape):
        t = torch.empty(shape)
        return DTensorSpec(two, (Replicate(),), TensorMeta(t.shape, t.stride(), t.dtype))

    rules = _scaled_gemm(spec(32, k), spec(k, n), spec(32, 1), spec(1, n))
    offered = {"M": ([Shard(0)], [Shard(0), Replicate(), Shard(0), Replicate(), None]),
               "N": ([Shard(1)], [Replicate(), Shard(1), Replicate(), Shard(1), None]),
               "K": ([Partial()], [Shard(1), Shard(0), Replicate(), Replicate(), None])}
    assert [name for name, rule in offered.items() if rule in rules] == splits


@pytest.mark.parametrize("first", ["row", "group", "tensor", "block"])
def test_placements_follow_every_call_s_own_arguments(mesh, first):
    # DTensor caches placement decisions by the inputs' specs and the arguments it is told are static: a
    # granularity, activation or out_dtype of another call with the same inputs must not be reused.
    d = _on(mesh)
    x = d(torch.randn(4, 256), Shard(0))
    ops.quantize_fp8(x, first)
    for granularity, placement in [("tensor", Replicate()), ("block", Replicate()), ("row", Shard(0)),
                                   ("group", Shard(0))]:
        codes, scale = ops.quantize_fp8(x, granularity)
        expected = ops.quantize_fp8(x.full_tensor(), granularity)
        assert codes.placements == scale.placements == (placement,), (first, granularity)
        assert tuple(scale.shape) == tuple(expected[1].shape) and torch.equal(scale.full_tensor(), expected[1])
        codes, scale = torch.ops.ops.quantize_fp8(x, granularity=granularity)  # as keyword arguments too
        assert codes.placements == (placement,), (first, granularity, "kwargs")
    a, w = d(torch.randn(4, 6), Shard(1)), d(torch.randn(8, 6), Shard(1))
    assert ops.linear(a, w, None, "none").placements == (Partial(),)
    assert ops.linear(a, w, None, "relu").placements != (Partial(),)
    tokens, experts = d(torch.randn(6, 8), Replicate()), d(torch.randn(3, 8, 4), Shard(2))
    offs = d(torch.tensor([2, 2, 6], dtype=torch.int32), Replicate())
    assert ops.grouped_gemm(tokens, experts, offs).dtype == torch.float32
    tokens16, experts16 = d(torch.randn(6, 8).bfloat16(), Replicate()), d(torch.randn(3, 8, 4).bfloat16(), Shard(2))
    assert ops.grouped_gemm(tokens16, experts16, offs).dtype == torch.bfloat16
    out = ops.grouped_gemm(tokens16, experts16, offs, out_dtype=torch.float32)
    assert out.dtype == out.to_local().dtype == torch.float32

