"""Worker of tests/test_dtensor.py and tests/test_moe.py: one rank of a tensor parallel, FSDP2,
placement-fuzzing or expert-parallel run on gloo. Kept in its own module so that spawned processes can import it. Each case writes what rank 0
computed to out_dir; the test compares it with one process."""

import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import ops


class Attention(torch.nn.Module):
    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.head_dim, self.groups = dim // heads, heads // kv_heads
        self.q_proj = torch.nn.Linear(dim, dim, bias=False)
        self.k_proj = torch.nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v_proj = torch.nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o_proj = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        # Heads from the local widths (-1): under tensor parallel each rank holds its share of heads.
        q, k, v = (proj(x).view(b, t, -1, self.head_dim).transpose(1, 2) for proj in (self.q_proj, self.k_proj,
                                                                                      self.v_proj))
        k, v = k.repeat_interleave(self.groups, 1), v.repeat_interleave(self.groups, 1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(torch.nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_proj = torch.nn.Linear(dim, hidden, bias=False)
        self.up_proj = torch.nn.Linear(dim, hidden, bias=False)
        self.down_proj = torch.nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(torch.nn.Module):
    def __init__(self, dim, heads, kv_heads, hidden):
        super().__init__()
        self.input_norm, self.post_norm = torch.nn.RMSNorm(dim, eps=1e-5), torch.nn.RMSNorm(dim, eps=1e-5)
        self.attn, self.mlp = Attention(dim, heads, kv_heads), MLP(dim, hidden)

    def forward(self, x):
        h = x + self.attn(self.input_norm(x))
        return h + self.mlp(self.post_norm(h))


class Decoder(torch.nn.Module):
    """A Llama-style decoder (pre-norm, grouped-query attention, gated SiLU MLP), as torchtitan's."""

    def __init__(self, vocab=64, dim=32, heads=4, kv_heads=4, hidden=48, layers=2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.layers = torch.nn.ModuleList([Layer(dim, heads, kv_heads, hidden) for _ in range(layers)])
        self.norm = torch.nn.RMSNorm(dim, eps=1e-5)
        self.lm_head = torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, ids):
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        return self.lm_head(self.norm(h))


def model_and_data(seed=0):
    torch.manual_seed(seed)
    model = Decoder()
    ops.nn.convert(model)
    return model, torch.randint(0, 64, (2, 8))


def tensor_parallel(model, mesh):
    """torchtitan's plan: projections colwise/rowwise, norms and the residual stream sequence parallel."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    parallelize_module(model, mesh, {
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    })
    for layer in model.layers:
        parallelize_module(layer, mesh, {
            "input_norm": SequenceParallel(), "post_norm": SequenceParallel(),
            "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "attn.q_proj": ColwiseParallel(), "attn.k_proj": ColwiseParallel(), "attn.v_proj": ColwiseParallel(),
            "attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
        })
    return model


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def case_tp(rank, world_size, out_dir, device="cpu"):
    from torch.distributed.device_mesh import init_device_mesh

    model, ids = model_and_data()
    model, ids = model.to(device), ids.to(device)
    tensor_parallel(model, init_device_mesh(device, (world_size,)))
    logits = model(ids)
    logits.square().mean().backward()
    grads = {name: full(p.grad).cpu() for name, p in model.named_parameters()}
    if rank == 0:
        torch.save({"logits": full(logits).cpu(), "grads": grads}, os.path.join(out_dir, "tp.pt"))


def case_fsdp(rank, world_size, out_dir):
    from torch.distributed.fsdp import fully_shard

    model, ids = model_and_data()
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(3):  # every rank its own half of the batch: FSDP averages the gradients
        loss = model(ids[rank:rank + 1]).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    params = {name: full(p.detach()) for name, p in model.named_parameters()}
    if rank == 0:
        torch.save({"params": params}, os.path.join(out_dir, "fsdp.pt"))


def norm_kinds():
    """{kind: (stock norm, its input)}: one norm for each path of ops.nn.RMSNorm's forward (no weight, the
    input's dtype, a float32 weight with bfloat16 input promoted as Hugging Face Llama does, and cast as
    torch.nn.RMSNorm and Olmo2 do)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm

    torch.manual_seed(0)
    kinds = {"no_weight": (torch.nn.RMSNorm(16, eps=1e-5, elementwise_affine=False), torch.float32),
             "same_dtype": (torch.nn.RMSNorm(16, eps=1e-5), torch.float32),
             "llama_promoted": (LlamaRMSNorm(16, eps=1e-5), torch.bfloat16),
             "olmo2_cast": (Olmo2RMSNorm(16, eps=1e-5), torch.bfloat16),
             "torch_cast": (torch.nn.RMSNorm(16, eps=1e-5), torch.bfloat16)}
    out = {}
    for kind, (norm, dtype) in kinds.items():
        if norm.weight is not None:
            with torch.no_grad():
                norm.weight.uniform_(0.5, 1.5)
        out[kind] = (norm, torch.randn(2, 8, 16).to(dtype))
    return out


def converted(norm):
    import copy

    model = torch.nn.Sequential(copy.deepcopy(norm))
    assert ops.nn.convert(model).rms_norm == ["0"]
    return model[0]


def case_sequence_parallel_norms(rank, world_size, out_dir):
    """Each norm kind, stock and converted, under SequenceParallel (the input sharded on dimension 1)."""
    import warnings

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world_size,))
    got = {}
    for kind, (stock, x) in norm_kinds().items():
        local = x.chunk(world_size, dim=1)[rank]
        for name, norm in (("stock", stock), ("ops", converted(stock))):
            parallelize_module(norm, mesh, SequenceParallel())
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "Mismatch dtype between input and weight")  # torch.nn.RMSNorm's
                got[kind, name] = full(norm(local))
    if rank == 0:
        torch.save(got, os.path.join(out_dir, "sequence_parallel_norms.pt"))


def case_fuzz(rank, world_size, out_dir, seconds):
    import dtensor_fuzz

    failures = dtensor_fuzz.run(world_size, seconds)
    if rank == 0:
        torch.save({"failures": failures}, os.path.join(out_dir, "fuzz.pt"))


def case_expert_parallel(rank, world_size, out_dir):
    """A MoE layer's experts sharded over the ranks (expert parallelism, as transformers runs it): every rank
    holds E / world_size experts and all tokens, marks picks of other ranks' experts with the sentinel id
    E / world_size, runs ops.moe.experts_forward, and the outputs are summed across ranks. Saves the summed
    output, the input's gradient (summed) and each rank's expert gradients next to one process's."""
    import transformers
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    config = transformers.Qwen3MoeConfig(hidden_size=32, moe_intermediate_size=16, num_experts=8)
    torch.manual_seed(0)
    full_experts = Qwen3MoeExperts(config)
    for p in full_experts.parameters():
        torch.nn.init.normal_(p, std=0.2)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(12, 32, generator=g)
    weights, index = torch.rand(12, 8, generator=g).topk(2, dim=-1)
    grad = torch.randn(12, 32, generator=g)

    def run(experts, index):
        xl = x.clone().requires_grad_()
        out = ops.moe.experts_forward(experts, xl, index, weights)
        return out, xl

    expected, x_full = run(full_experts, index)
    expected_grads = torch.autograd.grad(expected, [x_full, *full_experts.parameters()], grad)

    local_count = config.num_experts // world_size
    first = rank * local_count
    local = Qwen3MoeExperts(config)
    with torch.no_grad():
        for p, full_p in zip(local.parameters(), full_experts.parameters()):
            p.data = full_p[first:first + local_count].clone()
    local.num_experts, local._is_expert_parallel = local_count, True
    mine = (index >= first) & (index < first + local_count)
    out, x_local = run(local, torch.where(mine, index - first, torch.full_like(index, local_count)))
    total = out.detach().clone()
    dist.all_reduce(total)
    grads = torch.autograd.grad(out, [x_local, *local.parameters()], grad)
    x_grad = grads[0].clone()
    dist.all_reduce(x_grad)
    result = {"out": total, "x_grad": x_grad, "expert_grads": [g.clone() for g in grads[1:]], "first": first,
              "count": local_count, "expected": expected.detach(), "expected_x_grad": expected_grads[0],
              "expected_expert_grads": list(expected_grads[1:])}
    torch.save(result, os.path.join(out_dir, f"expert_parallel_{rank}.pt"))


CASES = {"tp": case_tp, "fsdp": case_fsdp, "fuzz": case_fuzz, "sequence_parallel_norms": case_sequence_parallel_norms,
         "expert_parallel": case_expert_parallel}


def run(rank, world_size, init_file, case, out_dir, *extra):
    nccl = "cuda" in extra
    if nccl:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if nccl else "gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=120))
    try:
        CASES[case](rank, world_size, out_dir, *extra)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)  # as tests/ddp_worker.py: no interpreter teardown after the work is done


def spawn(case, world_size, tmp_path, *extra, timeout=300):
    """Runs `case` on world_size ranks; raises if a rank fails or the run outlives `timeout` seconds."""
    import torch.multiprocessing as mp

    context = mp.start_processes(run, args=(world_size, str(tmp_path / "init"), case, str(tmp_path), *extra),
                                 nprocs=world_size, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for p in context.processes:
                p.kill()
            raise TimeoutError(f"{case} on {world_size} ranks did not finish in {timeout} s")
