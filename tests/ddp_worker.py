"""Worker of tests/test_distributed.py: one rank of a DistributedDataParallel run over a registered op's
model. Kept in its own module so that spawned processes can import it."""

import os

import torch
import torch.distributed as dist

import ops  # noqa: F401  (registers the ops in this process)
from op_registry import OPS


def run(rank, world_size, init_file, backend, op_index, out_dir):
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        spec = OPS[op_index]
        model = spec.module().to(device)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank] if backend == "nccl" else None)
        x = spec.module_input(8 * world_size)[rank * 8:(rank + 1) * 8].to(device)  # this rank's shard
        ddp(x).square().mean().backward()  # DDP averages the gradients over ranks
        if rank == 0:
            torch.save([p.grad.cpu() for p in model.parameters()], os.path.join(out_dir, "ddp_grads.pt"))
    finally:
        dist.destroy_process_group()
