"""torch.distributed with the ops: a two-process DistributedDataParallel run (gloo on CPU; NCCL where
two GPUs exist) of each registered op's model gives the gradients of a single-process run."""


import pytest
import torch
import torch.multiprocessing as mp

import ddp_worker
from op_registry import OP_IDS, OPS

pytestmark = pytest.mark.slow

BACKENDS = ["gloo"] + (["nccl"] if torch.cuda.device_count() >= 2 else [])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("index", range(len(OPS)), ids=OP_IDS)
def test_ddp_two_processes_match_single_process(index, backend, tmp_path):
    OPS[index].skip("autograd")  # DDP averages gradients
    world_size = 2
    mp.spawn(ddp_worker.run, args=(world_size, str(tmp_path / "init"), backend, index, str(tmp_path)),
             nprocs=world_size, join=True)
    ddp_grads = torch.load(tmp_path / "ddp_grads.pt")

    spec = OPS[index]
    model = spec.module()
    x = spec.module_input(8 * world_size)
    # The same objective in one process: the mean over ranks of each shard's mean loss.
    loss = sum(model(x[r * 8:(r + 1) * 8]).square().mean() for r in range(world_size)) / world_size
    loss.backward()
    for got, expected in zip(ddp_grads, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    assert any(g.abs().sum() > 0 for g in ddp_grads)  # a real gradient, not zeros on both sides
