"""Models compiled with the ops' graph pass against the same models compiled without it.

    python -m benchmarks.compile_models [--tokens 16,128,512] [--rounds 3] [--patterns rules|all]
                                        [--shapes dynamic|static] [--models ...] [--out DIR]

Each model is compiled twice: Inductor alone, and Inductor with ``ops.compile.backend()`` (``--patterns
rules``: the default rules of the device) or ``ops.compile.backend(ops.compile.PATTERNS)`` (``all``: every
pattern); with ``dynamic=True`` (``--shapes dynamic``: the token count symbolic, as serving engines compile;
one graph per side for all token counts, checked) or ``dynamic=False`` (``static``: a graph per token count).
Both are called at every token count; a token count's times are interleaved (benchmarks.common.cpu_compare)
and the ratio is without / with (above 1: the pass is faster). Models: a tiny Llama (2 layers, hidden 128),
a small one (2 layers, hidden 1024, intermediate 2816), a Phi-3 of that size (its gate and up projections
one GEMM, whose halves make silu_and_mul) and all-MiniLM-L6-v2 (real weights). Where the pass rewrites nothing, both sides compile the same
graph: their ratio shows the machine's noise.
"""

import argparse
import os
import sys

import torch

import ops
from benchmarks.common import (BUSY, NOISE, RESULTS, add_patterns_argument, chosen_patterns, cpu_compare, int_list,
                               machine_facts, markdown_table, write_report)


def _llama(hidden, intermediate, heads, vocab):
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                                      num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=heads // 2,
                                      head_dim=hidden // heads)
    return transformers.LlamaForCausalLM(config).eval(), vocab


def tiny_llama():
    return _llama(128, 256, 4, 128)


def small_llama():
    return _llama(1024, 2816, 8, 1024)


def small_phi3():
    import transformers

    torch.manual_seed(0)
    config = transformers.Phi3Config(vocab_size=1024, hidden_size=1024, intermediate_size=2816, num_hidden_layers=2,
                                     num_attention_heads=8, num_key_value_heads=4, pad_token_id=0)
    return transformers.Phi3ForCausalLM(config).eval(), 1024


def minilm():
    from benchmarks.models import load_minilm

    return load_minilm()[1].eval(), 30000


MODELS = {"tiny llama": tiny_llama, "small llama": small_llama, "small phi3": small_phi3, "MiniLM": minilm}


def measure(name, make, tokens, rounds, patterns, dynamic=True):
    from torch._dynamo.utils import counters

    model, vocab = make()
    torch._dynamo.reset()
    counters.clear()
    backend = ops.compile.backend(patterns)
    without = torch.compile(model, dynamic=dynamic)
    with_pass = torch.compile(model, backend=backend, dynamic=dynamic)
    rows = []
    # Compiled here, not served from Inductor's cache: the pass's counts are this run's rewrites.
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        for n in tokens:
            ids = torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(n))
            torch.testing.assert_close(with_pass(input_ids=ids)[0], without(input_ids=ids)[0], atol=1e-4, rtol=1e-4)
            (t_without, t_with), spread, wait = cpu_compare([lambda: without(input_ids=ids),
                                                             lambda: with_pass(input_ids=ids)], rounds=rounds)
            rows.append({"model": name, "tokens": n, "without_us": t_without * 1e6, "with_us": t_with * 1e6,
                         "without_over_with": t_without / t_with, "spread": spread, "cpu_wait": wait,
                         "noisy": spread > NOISE or (wait is not None and wait > BUSY)})
            print(rows[-1], flush=True)
    graphs, expected = counters["stats"]["unique_graphs"], 2 if dynamic else 2 * len(tokens)
    if graphs != expected:  # dynamic: one graph per compiled model for all token counts
        raise RuntimeError(f"benchmarks.compile_models: {name} compiled {graphs} graphs, expected {expected}")
    return rows, {k: v for k, v in backend.counts.items() if v}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int_list, default=[16, 128, 512], help="token counts (comma-separated)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; a time is its fastest round")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {list(MODELS)}")
    add_patterns_argument(parser)
    parser.add_argument("--shapes", choices=("dynamic", "static"), default="dynamic",
                        help="compile with dynamic=True (one graph) or dynamic=False (a graph per token count)")
    parser.add_argument("--out", default=os.path.join(RESULTS, "local"))
    args = parser.parse_args(argv)
    names = args.models.split(",")
    unknown = [n for n in names if n not in MODELS]
    patterns = chosen_patterns(parser, args.patterns)
    if unknown or args.rounds < 1 or any(n < 2 for n in args.tokens):
        parser.error(f"expected models of {list(MODELS)}, --rounds >= 1 and token counts >= 2 (1 specializes), "
                     f"got {names}, {args.rounds}, {args.tokens}")
    results, rewrites, table = [], {}, []
    for name in names:
        rows, rewrites[name] = measure(name, MODELS[name], args.tokens, args.rounds, patterns,
                                       dynamic=args.shapes == "dynamic")
        results += rows
        table += [[name, r["tokens"], f"{r['without_us']:.0f}", f"{r['with_us']:.0f}", f"{r['without_over_with']:.2f}",
                   f"{r['spread']:.0%}", "NOISY" if r["noisy"] else ""] for r in rows]
    text = markdown_table(["model", "tokens", "without the pass us", "with the pass us", "without / with", "spread",
                           "noise"], table)
    per_graph = "" if args.shapes == "dynamic" else ", summed over the token counts' graphs"
    text += f"\n\nRewrites per model (patterns: {args.patterns}{per_graph}): " + repr(rewrites) + "\n"
    print(text)
    suffix = "" if args.shapes == "dynamic" else "_static"
    write_report(args.out, f"compile_models_{args.patterns.replace(',', '+')}{suffix}",
                 {"benchmark": "compile_models", "machine": machine_facts("cpu"), "patterns": args.patterns,
                  "shapes": args.shapes, "tokens": args.tokens, "rewrites": rewrites, "results": results},
                 f"Models compiled with dynamic={args.shapes == 'dynamic'}, with and without the ops' graph pass, "
                 "on CPU", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
