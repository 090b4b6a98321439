"""Streams, CUDA graphs and device guards for every registered op (tests/op_registry.py). GPU only.

An op must launch on the caller's current stream: inputs written on a side stream after a long sleep
are only ready there, so a kernel launched on any other stream would read them too early."""

import pytest
import torch

from op_registry import OP_IDS, OPS, flatten

pytestmark = pytest.mark.cuda
ops_params = pytest.mark.parametrize("spec", OPS, ids=OP_IDS)
SLEEP_CYCLES = 200_000_000  # ~0.1 s on a 2 GHz GPU: long enough for a wrong stream to win the race


def _cuda_args(spec):
    """The first CUDA sample, in float32 then bfloat16, whose call reads nothing on the host (spec.plan), and
    whether there is one (else the first float32 sample: the grouped GEMMs off their SM90 paths)."""
    candidates = [[a.cuda() if isinstance(a, torch.Tensor) else a for a in sample.args]
                  for dtype in (torch.float32, torch.bfloat16) for sample in spec.samples("cuda", dtype, False)]
    for args in candidates:
        if spec.plan is None or not spec.plan(*args)["host_sync"]:
            return args, True
    return candidates[0], False


def _fresh(a):
    """New values for a data argument (FP8 codes through float32); options and index arguments as they are."""
    if not isinstance(a, torch.Tensor) or not a.is_floating_point():
        return a
    if a.element_size() == 1:
        return (torch.randn(a.shape, device=a.device) * 3).to(a.dtype)
    return torch.randn_like(a)


@ops_params
def test_runs_on_current_stream(spec):
    args, sync_free = _cuda_args(spec)
    expected = spec.run(spec.call, args)  # outputs, then the arguments it writes (copies)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        staged = [torch.empty_like(a) if isinstance(a, torch.Tensor) else a for a in args]
        torch.cuda._sleep(SLEEP_CYCLES)
        for s, a in zip(staged, args):
            if isinstance(a, torch.Tensor):
                s.copy_(a)
        if sync_free:
            torch.cuda.set_sync_debug_mode("error")  # the op must not synchronise the host
        try:
            out = spec.run(spec.call, staged)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    spec.check(out, expected, exact=spec.exact)


@ops_params
def test_cuda_graph_capture_and_replay_with_new_inputs(spec):
    args, sync_free = _cuda_args(spec)
    if not sync_free:
        pytest.skip(f"{spec.name}: every sample's call reads offsets on the host here ({spec.plan(*args)['reason']})")
    static = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        for _ in range(3):
            spec.call(*static)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = spec.call(*static)
    captured = flatten(static_out) + [static[i] for i in spec.mutated]  # what a replay writes
    for trial in range(3):
        fresh = [_fresh(a) for a in args]
        for s, f in zip(static, fresh):
            if isinstance(s, torch.Tensor):
                s.copy_(f)
        graph.replay()
        torch.cuda.synchronize()
        spec.check(captured, spec.run(spec.call, fresh), exact=spec.exact)


def _eager_division():
    """Inductor's Triton kernels divide as eager does (IEEE; by default div.full, within 2 ulp), so that the FP8
    models' codes x / scale over 65536 rows are eager's (eager_numerics.division_rounding, torch 2.11 and on)."""
    import torch._inductor.config as config

    return config.patch({"eager_numerics.division_rounding": True})


@ops_params
def test_compile_reduce_overhead_large(spec):
    spec.skip("cuda_graph_module")
    torch._dynamo.reset()
    model = spec.module().cuda()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad(), _eager_division():
        for trial in range(3):
            x = spec.module_input(65536).cuda() * (trial + 1)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)


@ops_params
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_device_guard_second_gpu(spec):
    args = [a.to("cuda:1") if isinstance(a, torch.Tensor) else a for a in _cuda_args(spec)[0]]
    torch.cuda.set_device(0)
    out = spec.run(spec.call, args)
    assert all(o.device == torch.device("cuda:1") for o in out)
    spec.check(out, spec.reference(*args))
