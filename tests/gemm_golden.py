"""The GEMM family's kernel names and the kernels its plans choose, for a fixed set of problems: what
tests/test_gemm_golden.py compares with tests/data/gemm_golden.json. ``python -m tests.gemm_golden --write``
rewrites the file; do that only for a change meant to rename or re-plan kernels, and say so in its commit."""
import argparse
import json
import os

import torch

import ops
import ops._library

PATH = os.path.join(os.path.dirname(__file__), "data", "gemm_golden.json")

# (cc_major, cc_minor, arch_list, candidate_kernels): Hopper with and without the candidate-only kernels, Ampere.
TARGETS = [(9, 0, "8.0;9.0a", False), (9, 0, "8.0;9.0a", True), (8, 0, "8.0", False)]
# (M, N, K): decode, prefill and square problems, ragged and unaligned extents.
SHAPES = [(1, 4096, 4096), (8, 4096, 4096), (16, 11008, 4096), (64, 64, 64), (100, 300, 200),
          (128, 4096, 14336), (1024, 1024, 1024), (4096, 4096, 4096), (8192, 8192, 8192), (7, 13, 5),
          (2048, 384, 1536), (33, 4096, 128)]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
EPILOGUES = ["plain", "relu", "gelu", "silu"]


def _operands(m, n, k, dtype, layouts):
    a = torch.empty(m, k, dtype=dtype) if layouts[0] == "t" else torch.empty(k, m, dtype=dtype).t()
    b = torch.empty(k, n, dtype=dtype) if layouts[1] == "t" else torch.empty(n, k, dtype=dtype).t()
    return a, b


def dense_plans():
    plans = {}
    for cc_major, cc_minor, arch_list, candidates in TARGETS:
        for m, n, k in SHAPES:
            for dtype in DTYPES:
                for layouts in ("tt", "tn", "nt"):
                    for epilogue in EPILOGUES if layouts == "tn" else ["plain"]:
                        for tf32 in ([False, True] if dtype == torch.float32 else [False]):
                            a, b = _operands(m, n, k, dtype, layouts)
                            key = (f"sm{cc_major}{cc_minor}{'+candidates' if candidates else ''} {m}x{n}x{k} "
                                   f"{str(dtype)[6:]}{'/tf32' if tf32 else ''} {layouts} {epilogue}")
                            try:
                                p = ops._library.gemm_plan_for_target(a, b, cc_major, cc_minor, arch_list,
                                                                      allow_tf32=tf32, epilogue=epilogue,
                                                                      candidate_kernels=candidates)
                            except RuntimeError as e:
                                plans[key] = {"error": str(e).split("\n")[0]}
                                continue
                            plans[key] = {"kernel": p.get("kernel"), "tactic": p.get("tactic", {}).get("name"),
                                          "swap_ab": p.get("swap_ab"), "candidates": p.get("candidates"),
                                          "aten_fallback": p.get("aten_fallback")}
    return plans


def scaled_candidates():
    """The two kernels (unswapped, swapped) an SM90 FP8 call chooses between, per output dtype, recipe,
    activation and accumulation: read from the forced-tactic error, which lists them."""
    out = {}
    f8 = torch.float8_e4m3fn
    a = torch.zeros(64, 256).to(f8)
    b = torch.zeros(128, 256).to(f8).t()
    recipes = {"tensorwise": (torch.ones(()), torch.ones(())),
               "rowwise": (torch.ones(64, 1), torch.ones(1, 128)),
               "blockwise_1x128_128x128": (torch.ones(64, 2), torch.ones(2, 1)),
               "blockwise_1x128_1x128": (torch.ones(64, 2), torch.ones(2, 128))}
    previous = ops.gemm.get_tactic()
    ops.gemm.set_tactic("none-of-them")
    try:
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for recipe, (sa, sb) in recipes.items():
                for act in ("none", "relu", "gelu", "gelu_tanh", "silu"):
                    for fast in (False, True):
                        if fast and recipe.startswith("blockwise"):
                            continue
                        key = f"{str(dtype)[6:]} {recipe} {act}{' fast' if fast else ''}"
                        try:
                            torch.ops.ops._scaled_gemm_emulate(a, b, sa, sb, None, dtype, act, fast)
                        except RuntimeError as e:
                            text = str(e)
                            out[key] = json.loads(text[text.index("["):text.index("]") + 1])
    finally:
        ops.gemm.set_tactic(previous)
    return out


def kernels():
    return sorted(({k: v for k, v in e.items() if k != "built"} for e in ops.kernels()), key=lambda e: e["name"])


def golden():
    return {"kernels": kernels(), "dense_plans": dense_plans(), "scaled_candidates": scaled_candidates()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help=f"rewrite {PATH}")
    args = parser.parse_args()
    data = golden()
    if args.write:
        with open(PATH, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
    print(f"{len(data['kernels'])} kernels, {len(data['dense_plans'])} dense plans, "
          f"{len(data['scaled_candidates'])} FP8 candidate pairs")
