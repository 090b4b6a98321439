"""FP8 models against their dequantized float reference: tiny transformers models (random weights, nothing
downloaded), dense and mixture-of-experts, each converted with ``ops.nn.convert(model, fp8=recipe)`` and
compared with the same float model holding the dequantized FP8 weights (so that only the activations' dynamic
quantization and the FP8 GEMMs differ): logits cosine, the share of positions whose top-1 token agrees, and
how many greedy ``generate()`` continuations are equal. The MoE rows also give the experts' weight bytes
against bfloat16, how often a token's routed experts change, and generate() with every MoE layer routed as the
reference routes; the dense twins (TWINS: the same model with dense MLPs) compare the MoE path with the dense one
on the same architecture.

Two initializations: transformers' own (normal, std 0.02), under which the blocks add little to the residual
stream (at hidden 128, Qwen3-MoE's and OLMoE's experts about 0.0013 rms, 1/25 of their attention's part), and
"unit" (std hidden^-1/2: each Linear keeps its input's scale), under which every block, the experts included,
adds a part of the order of the residual stream itself, as in trained models.

    python -m benchmarks.fp8_models [--prompts 64] [--new-tokens 6] [--init transformers unit] [--out DIR]
    python -m benchmarks.fp8_models --experts [--out DIR]   # each FP8 experts module alone
"""

import argparse
import copy
import os
import warnings

import torch
import torch.nn.functional as F

import ops
from benchmarks.common import RESULTS, machine_facts, markdown_table, write_report

VOCAB = 96
COMMON = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32)
DENSE = {"Llama": {}, "Qwen3": {}, "Qwen2": {}, "Olmo": {}, "Phi3": dict(pad_token_id=0)}
# Expert widths of whole 128-blocks; GPT-OSS with hidden 144 (its real 2880 is no whole number of 128-blocks
# either): blockwise quantizes its experts rowwise.
MOE = {
    "Qwen3Moe": dict(moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2),
    "Mixtral": dict(intermediate_size=128, num_local_experts=4, num_experts_per_tok=2),
    "Olmoe": dict(intermediate_size=128, num_experts=8, num_experts_per_tok=2),
    "DeepseekV3": dict(moe_intermediate_size=128, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                       first_k_dense_replace=1, n_group=2, topk_group=1, q_lora_rank=32, kv_lora_rank=32, head_dim=16,
                       qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=32, num_key_value_heads=4),
    "GptOss": dict(hidden_size=144, intermediate_size=128, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                   layer_types=["sliding_attention", "full_attention"]),
}


# The dense twin of an MoE family in transformers: the same attention, norms and dense layers, each MoE block a
# dense MLP of COMMON's width (256: the routed experts' active width). OLMoE and GPT-OSS have none.
TWINS = {"Qwen3Moe": ("Qwen3Moe", dict(mlp_only_layers=[0, 1])), "Mixtral": ("Mistral", {}),
         "DeepseekV3": ("DeepseekV3", dict(first_k_dense_replace=2))}
INITS = ("transformers", "unit")


def tiny(family, dtype=torch.float32, init="transformers", twin=False):
    """A tiny `<family>ForCausalLM` of seed 0 (experts on transformers' "eager" loop), or None where the
    installed transformers has no such family. ``init``: "transformers" (its initializer_range, 0.02) or "unit"
    (hidden_size^-1/2). ``twin``: the MoE family's dense twin (TWINS) instead."""
    import transformers

    name, extra = TWINS[family] if twin else (family, {})
    if not hasattr(transformers, f"{name}ForCausalLM"):
        return None
    kwargs = {**COMMON, **DENSE.get(name, {}), **MOE.get(name, {}), **extra}
    if init == "unit":
        kwargs["initializer_range"] = kwargs["hidden_size"] ** -0.5
    elif init != "transformers":
        raise ValueError(f"tiny: init must be one of {INITS}, got {init!r}")
    config = getattr(transformers, f"{name}Config")(**kwargs)
    torch.manual_seed(0)
    model = getattr(transformers, f"{name}ForCausalLM")(config).to(dtype).eval()
    if name in MOE and not twin:
        model.set_experts_implementation("eager")
    return model


def _expand_scale(scale, shape, blocks):
    """`scale` spread over a weight of `shape` (one matrix, or one per expert): 128x128 blocks (a partial last
    one cut), or equal parts of each dimension where the scale has more than one."""
    for d in range(scale.dim() - 2, scale.dim()):
        if scale.shape[d] == 1:
            continue
        if blocks:
            scale = scale.narrow(d, 0, -(-shape[d] // 128)).repeat_interleave(128, d).narrow(d, 0, shape[d])
        else:
            scale = scale.repeat_interleave(shape[d] // scale.shape[d], d)
    return scale


def dequantized(model, fp8_model):
    """A copy of the floating-point `model` holding `fp8_model`'s weights (the same model after
    ``ops.nn.convert(..., fp8=...)``) dequantized: its FP8 Linears' and FP8 experts' codes times their scales."""
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for name, module in fp8_model.named_modules():
            if isinstance(module, ops.nn.Fp8Linear):
                blocks = module.recipe == "blockwise"
                scale = module.weight_scale_inv if blocks else module.weight_scale
                values = module.weight.float() * _expand_scale(scale, module.weight.shape, blocks)
                reference.get_submodule(name).weight.copy_(values)
            elif ops.moe.is_experts(module) and ops.moe.is_fp8(module):
                for proj in ops.moe._projections(module):
                    codes, scale = getattr(module, proj), getattr(module, proj + "_scale_inv")
                    values = codes.float() * _expand_scale(scale, codes.shape, module.block_size is not None)
                    getattr(reference.get_submodule(name), proj).copy_(values)
    return reference


def converted(model, recipe):
    """A copy of ``model`` after ``ops.nn.convert(copy, fp8=recipe)``, and convert's report; convert's warnings
    about checkpoint formats (a save_pretrained of these models is not made) are not shown."""
    fp8_model = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="ops.nn.convert: ")
        report = ops.nn.convert(fp8_model, fp8=recipe)
    return fp8_model, report


def expert_bytes(model):
    """Bytes of the experts modules' parameters and buffers."""
    return sum(t.numel() * t.element_size() for name, m in model.named_modules() if ops.moe.is_experts(m)
               for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)])


def mlp_vs_attention(model, ids):
    """The rms of the decoder layers' MLP (or MoE block) outputs over that of their attention outputs, on ``ids``:
    how much the experts reach the residual stream beside attention."""
    parts = {"mlp": [], "self_attn": []}

    def keep(kind):
        return lambda module, args, out: parts[kind].append(out[0] if isinstance(out, tuple) else out)

    hooks = [m.register_forward_hook(keep(kind)) for name, m in model.named_modules() for kind in parts
             if name.endswith(f".{kind}")]
    with torch.no_grad():
        model(ids)
    for hook in hooks:
        hook.remove()

    def rms(ts):
        return torch.cat([t.flatten() for t in ts]).pow(2).mean().sqrt().item()

    return rms(parts["mlp"]) / rms(parts["self_attn"])


def _routing_of(args, kwargs):
    """What an experts module's call takes after the hidden states, (args, kwargs): the top-k indices first, then
    the routing weights (positional, or GPT-OSS's router_indices and routing_weights)."""
    return args[1:], {k: v for k, v in kwargs.items() if k != "hidden_states"}


def routing_changes(reference, fp8_model, ids):
    """The share of (token, MoE layer) pairs on ``ids`` whose routed experts differ between ``fp8_model`` and its
    float ``reference`` (each model on its own hidden states), or None for a model without experts."""
    names = [n for n, m in reference.named_modules() if ops.moe.is_experts(m)]
    if not names:
        return None
    chosen = {}

    def keep(key):
        def hook(module, args, kwargs, output):
            rest, given = _routing_of(args, kwargs)
            chosen[key] = (*rest, *given.values())[0].sort(-1).values
        return hook

    hooks = [model.get_submodule(n).register_forward_hook(keep((tag, n)), with_kwargs=True)
             for tag, model in (("fp8", fp8_model), ("float", reference)) for n in names]
    with torch.no_grad():
        fp8_model(ids)
        reference(ids)
    for hook in hooks:
        hook.remove()
    changed = [(chosen["fp8", n] != chosen["float", n]).any(-1) for n in names]
    return torch.cat(changed).float().mean().item()


def routed_as(reference, fp8_model):
    """Hooks under which ``fp8_model``'s MoE layers take the experts and weights that ``reference`` picks for the
    same tokens: each call of ``fp8_model`` first runs ``reference`` on its input (across generate()'s steps with a
    cache of its own). Returns the hooks' handles."""
    names = [n for n, m in reference.named_modules() if ops.moe.is_experts(m)]
    routes, caches = {}, {}

    def run_reference(module, args, kwargs):
        ref_kwargs = dict(kwargs)
        for key in ("cache", "past_key_values"):  # transformers 5.25 calls it cache, earlier releases the other
            if kwargs.get(key) is not None:
                if kwargs[key].get_seq_length() == 0:  # a new generate()
                    caches[key] = copy.deepcopy(kwargs[key])
                ref_kwargs[key] = caches[key]
        reference(*args, **ref_kwargs)

    def keep(name):
        def hook(module, args, kwargs, output):
            routes[name] = _routing_of(args, kwargs)
        return hook

    def pin(name):
        def hook(module, args, kwargs):
            rest, given = routes[name]
            return (*args[:1], *rest), {**kwargs, **given}
        return hook

    return ([fp8_model.register_forward_pre_hook(run_reference, with_kwargs=True)]
            + [reference.get_submodule(n).register_forward_hook(keep(n), with_kwargs=True) for n in names]
            + [fp8_model.get_submodule(n).register_forward_pre_hook(pin(n), with_kwargs=True) for n in names])


def fp8_mlp_only(reference, fp8_model):
    """A copy of ``reference`` with ``fp8_model``'s FP8 experts modules (an MoE model) or the FP8 Linears of its
    MLPs (a dense model): only the MLPs' GEMMs in FP8, the dense path's against the MoE path's."""
    moe = any(ops.moe.is_experts(m) for m in fp8_model.modules())
    hybrid = copy.deepcopy(reference)
    for name, module in fp8_model.named_modules():
        if (ops.moe.is_experts(module) and ops.moe.is_fp8(module) if moe
                else isinstance(module, ops.nn.Fp8Linear) and ".mlp." in name):
            hybrid.set_submodule(name, copy.deepcopy(module))
    return hybrid


def agreement(model, recipe, prompts=64, new_tokens=6):
    """One row: ``model`` converted with fp8=recipe against its dequantized reference; the reference with only its
    MLPs' (routed experts') GEMMs in FP8 against it; and (MoE) the converted model routed as the reference routes."""
    fp8_model, report = converted(model, recipe)
    reference = dequantized(model, fp8_model)
    mlp_only = fp8_mlp_only(reference, fp8_model)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (8, 16), generator=g)
    starts = torch.randint(0, VOCAB, (prompts, 1, 4), generator=g)
    moe = any(ops.moe.is_experts(m) for m in model.modules())
    same = same_mlp_only = same_routed_as_reference = 0
    with torch.no_grad():
        got, want = fp8_model(ids).logits, reference(ids).logits
        expected = [reference.generate(p, max_new_tokens=new_tokens, do_sample=False) for p in starts]
        for p, e in zip(starts, expected):
            same += torch.equal(fp8_model.generate(p, max_new_tokens=new_tokens, do_sample=False), e)
            same_mlp_only += torch.equal(mlp_only.generate(p, max_new_tokens=new_tokens, do_sample=False), e)
        if moe:
            hooks = routed_as(reference, fp8_model)
            try:
                for p, e in zip(starts, expected):
                    same_routed_as_reference += torch.equal(
                        fp8_model.generate(p, max_new_tokens=new_tokens, do_sample=False), e)
            finally:
                for hook in hooks:
                    hook.remove()
    bf16 = expert_bytes(copy.deepcopy(model).to(torch.bfloat16))
    return {"recipe": recipe, "mlp_vs_attention": mlp_vs_attention(reference, ids),
            "routing_changes": routing_changes(reference, fp8_model, ids),
            "cosine": F.cosine_similarity(got.flatten(), want.flatten(), dim=0).item(),
            "top1": (got.argmax(-1) == want.argmax(-1)).float().mean().item(), "same": int(same),
            "same_mlp_only": int(same_mlp_only),
            "same_routed_as_reference": int(same_routed_as_reference) if moe else None, "prompts": prompts,
            "fp8_linear": len(report.fp8), "fp8_experts": len(report.fp8_experts),
            "experts_rowwise": len(report.experts_rowwise),
            "expert_bytes_vs_bf16": expert_bytes(fp8_model) / bf16 if bf16 else None}


def experts_cosine(model, recipe):
    """Each FP8 experts module of ``model`` converted with fp8=recipe against the same module of its dequantized
    reference, on the inputs the reference's own forward hands it: [(module name, cosine of the outputs)]."""
    fp8_model, _ = converted(model, recipe)
    reference = dequantized(model, fp8_model)
    names = [n for n, m in fp8_model.named_modules() if ops.moe.is_experts(m) and ops.moe.is_fp8(m)]
    inputs = {}

    def keep(name):
        def hook(module, args, kwargs, output):
            inputs.setdefault(name, (args, kwargs))
        return hook

    hooks = [reference.get_submodule(n).register_forward_hook(keep(n), with_kwargs=True) for n in names]
    ids = torch.randint(0, VOCAB, (8, 16), generator=torch.Generator().manual_seed(0))
    out = []
    with torch.no_grad():
        reference(ids)
        for hook in hooks:
            hook.remove()
        for n in names:
            args, kwargs = inputs[n]
            got, want = fp8_model.get_submodule(n)(*args, **kwargs), reference.get_submodule(n)(*args, **kwargs)
            out.append((n, F.cosine_similarity(got.flatten(), want.flatten(), dim=0).item()))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=6)
    parser.add_argument("--init", nargs="+", choices=INITS, default=list(INITS),
                        help="the tiny models' initializations (module docstring)")
    parser.add_argument("--out", default=os.path.join(RESULTS, "local"))
    parser.add_argument("--experts", action="store_true",
                        help="only each FP8 experts module against its dequantized twin (fp8_experts.{json,md})")
    args = parser.parse_args(argv)
    if args.experts:
        rows = [{"family": family, "init": init, "recipe": recipe, "module": name, "cosine": cosine}
                for init in args.init for family in MOE if tiny(family) is not None
                for recipe in ("rowwise", "blockwise")
                for name, cosine in experts_cosine(tiny(family, init=init), recipe)]
        headers = ["model", "init", "recipe", "experts module", "output cosine"]
        table = [[r["family"], r["init"], r["recipe"], r["module"], f"{r['cosine']:.6f}"] for r in rows]
        write_report(args.out, "fp8_experts", {"machine": machine_facts(torch.device("cpu")), "rows": rows},
                     "FP8 experts modules against their dequantized float twins, on the reference's own inputs",
                     markdown_table(headers, table))
        print(markdown_table(headers, table))
        return
    rows, table = [], []
    for init in args.init:
        for kind, families in (("dense", DENSE), ("MoE", MOE), ("dense twin", TWINS)):
            for family in families:
                model = tiny(family, init=init, twin=kind == "dense twin")
                if model is None:
                    print(f"{family} ({kind}): not in this transformers release, skipped")
                    continue
                for recipe in ("rowwise", "blockwise"):
                    row = {"family": family, "kind": kind, "init": init,
                           **agreement(model, recipe, args.prompts, args.new_tokens)}
                    rows.append(row)
                    memory = "" if row["expert_bytes_vs_bf16"] is None else f"{row['expert_bytes_vs_bf16']:.3f}"
                    routing = "" if row["routing_changes"] is None else f"{row['routing_changes']:.1%}"
                    routed = "" if row["same_routed_as_reference"] is None else \
                        f"{row['same_routed_as_reference']}/{row['prompts']}"
                    twin = TWINS[family][0] if kind == "dense twin" else family
                    name = family if twin == family else f"{twin} (twin of {family})"
                    table.append([name, kind, recipe, init, f"{row['mlp_vs_attention']:.3f}", f"{row['cosine']:.6f}",
                                  f"{row['top1']:.4f}", routing, f"{row['same']}/{row['prompts']}", routed,
                                  f"{row['same_mlp_only']}/{row['prompts']}", memory])
                    print(" | ".join(table[-1]), flush=True)
    # Each kind summed; and the MoE models that have a dense twin, against their twins.
    groups = {"dense": lambda r: r["kind"] == "dense", "MoE": lambda r: r["kind"] == "MoE",
              "MoE with a twin": lambda r: r["kind"] == "MoE" and r["family"] in TWINS,
              "dense twin": lambda r: r["kind"] == "dense twin"}
    totals = {}
    for init in args.init:
        for group, member in groups.items():
            for recipe in ("rowwise", "blockwise"):
                part = [r for r in rows if r["init"] == init and r["recipe"] == recipe and member(r)]
                if part:
                    same, prompts = sum(r["same"] for r in part), sum(r["prompts"] for r in part)
                    mlp = sum(r["same_mlp_only"] for r in part)
                    totals[f"{init} {group} {recipe}"] = {"same": same, "same_mlp_only": mlp, "prompts": prompts,
                                                          "share": same / prompts, "share_mlp_only": mlp / prompts}
                    routed = ""
                    if part[0]["same_routed_as_reference"] is not None:
                        n = sum(r["same_routed_as_reference"] for r in part)
                        totals[f"{init} {group} {recipe}"]["same_routed_as_reference"] = n
                        routed = f"{n}/{prompts} ({n / prompts:.1%})"
                    table.append([f"all {group}", part[0]["kind"], recipe, init, "", "", "", "",
                                  f"{same}/{prompts} ({same / prompts:.1%})", routed,
                                  f"{mlp}/{prompts} ({mlp / prompts:.1%})", ""])
    headers = ["model", "kind", "recipe", "init", "MLP / attention rms", "logits cosine", "top-1 agreement",
               "routing changed", "equal generate()", "equal generate(), routed as the reference",
               "equal generate(), FP8 MLPs only", "expert bytes / bf16"]
    write_report(args.out, "fp8_models", {"machine": machine_facts(torch.device("cpu")), "rows": rows,
                                          "totals": totals, "new_tokens": args.new_tokens},
                 "FP8 models against their dequantized float reference", markdown_table(headers, table))
    print(markdown_table(headers, table[-len(totals):]))


if __name__ == "__main__":
    main()
