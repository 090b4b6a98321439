"""Models compiled with the ops' graph pass against the same models compiled without it, under symbolic sizes.

    python -m benchmarks.compile_models [--tokens 16,128,512] [--rounds 3] [--patterns rules|all] [--out DIR]

Each model is compiled twice with ``dynamic=True`` (the token count symbolic, as serving engines compile):
Inductor alone, and Inductor with ``ops.compile.backend()`` (``--patterns rules``: the default rules of the
device) or ``ops.compile.backend(ops.compile.PATTERNS)`` (``all``: every pattern). Both are
called at every token count; a token count's times are interleaved (benchmarks.common.cpu_compare) and the
ratio is without / with (above 1: the pass is faster). Each model compiles one graph for all token counts
(checked). Models: a tiny Llama (2 layers, hidden 128) and all-MiniLM-L6-v2 (real weights). Where the pass
rewrites nothing, both sides compile the same graph: their ratio shows the machine's noise.
"""

import argparse
import os
import sys

import torch

import ops
from benchmarks.common import BUSY, NOISE, RESULTS, cpu_compare, int_list, machine_facts, markdown_table, write_report


def tiny_llama():
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    return transformers.LlamaForCausalLM(config).eval(), 128


def minilm():
    from benchmarks.models import load_minilm

    return load_minilm()[1].eval(), 30000


MODELS = {"tiny llama": tiny_llama, "MiniLM": minilm}


def measure(name, make, tokens, rounds, patterns):
    from torch._dynamo.utils import counters

    model, vocab = make()
    torch._dynamo.reset()
    counters.clear()
    backend = ops.compile.backend(patterns)
    without = torch.compile(model, dynamic=True)
    with_pass = torch.compile(model, backend=backend, dynamic=True)
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
    graphs = counters["stats"]["unique_graphs"]
    if graphs != 2:  # one graph per compiled model for all token counts
        raise RuntimeError(f"benchmarks.compile_models: {name} compiled {graphs} graphs, expected 2 (one per side)")
    return rows, {k: v for k, v in backend.counts.items() if v}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int_list, default=[16, 128, 512], help="token counts (comma-separated)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; a time is its fastest round")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {list(MODELS)}")
    parser.add_argument("--patterns", choices=("rules", "all"), default="rules",
                        help="the pass's default rules, or every pattern")
    parser.add_argument("--out", default=os.path.join(RESULTS, "local"))
    args = parser.parse_args(argv)
    names = args.models.split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown or args.rounds < 1 or any(n < 2 for n in args.tokens):
        parser.error(f"expected models of {list(MODELS)}, --rounds >= 1 and token counts >= 2 (1 specializes), "
                     f"got {names}, {args.rounds}, {args.tokens}")
    results, rewrites, table = [], {}, []
    for name in names:
        rows, rewrites[name] = measure(name, MODELS[name], args.tokens, args.rounds,
                                       None if args.patterns == "rules" else ops.compile.PATTERNS)
        results += rows
        table += [[name, r["tokens"], f"{r['without_us']:.0f}", f"{r['with_us']:.0f}", f"{r['without_over_with']:.2f}",
                   f"{r['spread']:.0%}", "NOISY" if r["noisy"] else ""] for r in rows]
    text = markdown_table(["model", "tokens", "without the pass us", "with the pass us", "without / with", "spread",
                           "noise"], table)
    text += f"\n\nRewrites per model (patterns: {args.patterns}): " + repr(rewrites) + "\n"
    print(text)
    write_report(args.out, f"compile_models_{args.patterns}",
                 {"benchmark": "compile_models", "machine": machine_facts("cpu"), "patterns": args.patterns,
                  "tokens": args.tokens, "rewrites": rewrites, "results": results},
                 "Models compiled with dynamic=True, with and without the ops' graph pass, on CPU", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
