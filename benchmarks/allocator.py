"""Allocator benchmark: ops' pluggable allocator against PyTorch's caching allocator and its
cudaMallocAsync backend, measured in the same run (each configuration in its own process, since an
allocator is chosen before CUDA starts).

    python -m benchmarks.allocator [--iters 2000] [--out DIR]

Per configuration: host time of one allocation + free for a mix of sizes (512 B .. 64 MiB, median and
p99, microseconds), and the step time (median, ms) and peak memory (MiB) of a small transformer
training step (4-layer encoder, d_model 512, batch 16 x 256 tokens, AdamW). Peak memory is the peak
reserved from the driver: torch.cuda.max_memory_reserved where PyTorch's caching allocator is in charge
(ops MemPool included: it holds the pool's segments, and the backward pass's, since a MemPool routes
the allocations of the thread that entered it and autograd's backward thread is another); for ops
global the pool's high-water mark (stats()["peak_bytes_reserved"]). (Reports older than 2026-11-30
gave ops global's peak bytes in use; those of 2026-11-30 gave ops MemPool's pool segments only.)
Needs an NVIDIA GPU; without one it says so and exits.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import torch

from benchmarks.common import RESULTS, machine_facts, mark_stopped, markdown_table, write_report

CONFIGS = {
    "torch caching": {"env": {}, "setup": ""},
    "torch cudaMallocAsync": {"env": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, "setup": ""},
    "ops global": {"env": {}, "setup": "ops.allocator.install()"},
    "ops MemPool": {"env": {}, "setup": "POOL = ops.allocator.pool(); CTX = torch.cuda.use_mem_pool(POOL); CTX.__enter__()"},
}

WORKER = r"""
import json, statistics, sys, time, torch, ops
{setup}
iters = {iters}
sizes = [512, 4096, 65536, 1 << 20, 16 << 20, 64 << 20]
for s in sizes:  # warm the pools
    del_me = torch.empty(s, dtype=torch.uint8, device="cuda"); del del_me
torch.cuda.synchronize()
lat = []
for i in range(iters):
    s = sizes[i % len(sizes)]
    t0 = time.perf_counter()
    x = torch.empty(s, dtype=torch.uint8, device="cuda")
    del x
    lat.append((time.perf_counter() - t0) * 1e6)
torch.cuda.synchronize()
lat.sort()

torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True, device="cuda")
model = torch.nn.TransformerEncoder(layer, 4)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(16, 256, 512, device="cuda")
if "{name}" == "ops global":
    ops.allocator.reset_peak()
else:
    torch.cuda.reset_peak_memory_stats()
steps = []
for i in range(13):
    torch.cuda.synchronize(); t0 = time.perf_counter()
    loss = model(x).square().mean(); loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize(); steps.append((time.perf_counter() - t0) * 1e3)
if "{name}" == "ops global":  # PyTorch keeps no statistics for a globally installed pluggable allocator
    peak = ops.allocator.stats()["peak_bytes_reserved"]
else:
    peak = torch.cuda.max_memory_reserved()
print("RESULT " + json.dumps({{"alloc_free_us_median": statistics.median(lat), "alloc_free_us_p99": lat[int(0.99 * len(lat))],
       "step_ms_median": statistics.median(steps[3:]), "peak_mib": peak / 2**20}}))
"""


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--out", default=os.path.join(RESULTS, "local"))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("No NVIDIA GPU here: the allocator benchmark measures GPU memory allocation and needs one "
              "(ops.allocator manages CUDA memory). Nothing to measure on CPU.")
        return 0
    rows, results = [], {}
    try:
        for name, config in CONFIGS.items():
            code = WORKER.format(setup=config["setup"], iters=args.iters, name=name)
            env = dict(os.environ, **config["env"])
            proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
            line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                print(f"{name}: failed\n{proc.stderr[-2000:]}")
                results[name] = {"error": proc.stderr[-2000:]}
                continue
            r = json.loads(line[len("RESULT "):])
            results[name] = r
            rows.append([name, f"{r['alloc_free_us_median']:.2f}", f"{r['alloc_free_us_p99']:.2f}",
                         f"{r['step_ms_median']:.2f}", f"{r['peak_mib']:.0f}"])
    except KeyboardInterrupt:  # Ctrl-C, or device_check.sh's time limit: report the configurations measured
        print(f"\ninterrupted: reporting the {len(results)} of {len(CONFIGS)} configurations measured so far",
              file=sys.stderr)
    headers = ["allocator", "alloc+free us (median)", "p99 us", "train step ms", "peak MiB"]
    table = markdown_table(headers, rows)
    print(table)
    payload = {"benchmark": "allocator", "machine": machine_facts("cuda"), "results": results,
               "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    title = f"Allocators on {payload['machine'].get('gpu')}" + mark_stopped(payload, len(results), len(CONFIGS))
    write_report(args.out, "allocator", payload, title, table)
    return 1 if any("error" in r for r in results.values()) or len(results) < len(CONFIGS) else 0


if __name__ == "__main__":
    sys.exit(main())
