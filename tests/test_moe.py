"""transformers' MoE models with their experts on ops.grouped_gemm (ops.moe, ops.nn.convert): tiny configs of
every MoE family the tests list, against the same model's "eager" experts in logits, gradients and
generated tokens, and the experts module alone against transformers' "grouped_mm" implementation."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import ops

from conftest import run_python
from fp8_support import E4

transformers = pytest.importorskip("transformers")
moe = pytest.importorskip("transformers.integrations.moe")

VOCAB = 96
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8)
FAMILIES = {
    "Qwen3Moe": dict(moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2),
    "Mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "Olmoe": dict(num_experts=8, num_experts_per_tok=2),
    # A dense first layer and a shared expert beside the routed ones; multi-head latent attention.
    "DeepseekV3": dict(moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                       first_k_dense_replace=1, n_group=2, topk_group=1, q_lora_rank=16, kv_lora_rank=16,
                       qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, num_key_value_heads=4),
    # Interleaved gate and up, a clamped gate of its own, biases, weights stored transposed.
    "GptOss": dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                   layer_types=["sliding_attention", "full_attention"]),
}


def tiny(family, dtype=torch.float32):
    if not hasattr(transformers, f"{family}ForCausalLM"):
        pytest.skip(f"transformers {transformers.__version__} has no {family}")
    config = getattr(transformers, f"{family}Config")(**{**COMMON, **FAMILIES[family]})
    torch.manual_seed(0)
    model = getattr(transformers, f"{family}ForCausalLM")(config).to(dtype).eval()
    model.set_experts_implementation("eager")
    return model


class CountOps(TorchDispatchMode):
    """Counts the calls of each ATen and library op below Python."""

    def __init__(self):
        super().__init__()
        self.counts = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def experts_names(model):
    return [name for name, m in model.named_modules() if type(m).__name__.endswith("Experts")]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_converted_moe_model_equals_eager_in_logits_gradients_and_tokens(family):
    model = tiny(family)
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    ref_logits = model(ids).logits
    ref_grads = torch.autograd.grad(model(ids).logits.square().mean(), list(model.parameters()), allow_unused=True)
    ref_tokens = model.generate(ids[:1, :4], max_new_tokens=6, do_sample=False)

    report = ops.nn.convert(model, recipes=False)
    assert report.experts == experts_names(model) and report.experts
    assert model.config._experts_implementation == "ops"
    with CountOps() as counted:
        logits = model(ids).logits
    torch.testing.assert_close(logits, ref_logits, atol=2e-6, rtol=1e-5)
    assert counted.counts.get("ops.grouped_gemm", 0) == 2 * len(report.experts)  # up and down, every layer
    # The default SiLU gate fused; GPT-OSS's own clamped gate as the class defines it.
    assert counted.counts.get("ops.silu_and_mul", 0) == (0 if family == "GptOss" else len(report.experts))
    grads = torch.autograd.grad(model(ids).logits.square().mean(), list(model.parameters()), allow_unused=True)
    for (name, _), g, r in zip(model.named_parameters(), grads, ref_grads):
        assert (g is None) == (r is None), name
        if g is not None:
            torch.testing.assert_close(g, r, atol=1e-6, rtol=1e-4, msg=name)
    assert torch.equal(model.generate(ids[:1, :4], max_new_tokens=6, do_sample=False), ref_tokens)


def test_set_experts_implementation_ops_after_register():
    model = tiny("Qwen3Moe")
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(2))
    ref = model(ids).logits
    ops.moe.register()
    model.set_experts_implementation("ops")
    with CountOps() as counted:
        got = model(ids).logits
    assert counted.counts.get("ops.grouped_gemm", 0) == 4
    torch.testing.assert_close(got, ref, atol=2e-6, rtol=1e-5)


def test_import_ops_before_transformers_registers_ops_once_a_model_imports_the_interface():
    # No register() call: a model class imports transformers' interface after ops, which registers right then;
    # `import ops` alone imports nothing of transformers.
    code = """
import sys, torch, ops
assert "transformers.integrations.moe" not in sys.modules
import transformers
config = transformers.Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
    num_attention_heads=4, num_key_value_heads=2, head_dim=8, moe_intermediate_size=16, num_experts=4,
    num_experts_per_tok=2)
model = transformers.Qwen3MoeForCausalLM(config).eval()
ids = torch.randint(0, 64, (1, 5))
ref = model(ids).logits
model.set_experts_implementation("ops")
torch.testing.assert_close(model(ids).logits, ref, atol=2e-6, rtol=1e-5)
from transformers.integrations.moe import ExpertsInterface
assert ExpertsInterface._global_mapping["ops"] is ops.moe.experts_forward
# transformers' FP8 experts interface too, whenever its module is loaded.
from transformers.integrations.finegrained_fp8 import FP8ExpertsInterface
assert FP8ExpertsInterface._global_mapping["ops"] is ops.moe.experts_forward
print("ok")
"""
    result = run_python(code)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_bfloat16_model_stays_close_to_eager():
    model = tiny("Mixtral", torch.bfloat16)
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(3))
    ref = model(ids).logits.float()
    ops.nn.convert(model, recipes=False)
    got = model(ids).logits.float()
    torch.testing.assert_close(got, ref, atol=3e-2, rtol=3e-2)


def experts_module(family="Qwen3Moe"):
    return next(m for m in tiny(family).modules() if ops.moe.is_experts(m))


def routing(tokens, experts, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(tokens, experts, generator=g)
    weights, index = scores.topk(k, dim=-1)
    return index, weights / weights.sum(-1, keepdim=True)


@pytest.mark.parametrize("family", ["Qwen3Moe", "GptOss"])
def test_experts_equal_transformers_grouped_mm_implementation(family):
    experts = experts_module(family)
    x = torch.randn(13, 32, generator=torch.Generator().manual_seed(4))
    index, weights = routing(13, experts.num_experts, 2)
    index[0] = index[0, 0]  # one token's two picks: the same expert twice is still two rows
    got = ops.moe.experts_forward(experts, x, index, weights)
    expected = moe.grouped_mm_experts_forward(experts, x, index, weights)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def test_expert_parallel_sentinels_give_zero_rows():
    # Under expert parallelism transformers marks the picks of experts on other ranks with ids past the last
    # local expert: they contribute nothing (grouped_gemm's rows past offs[-1] are zero).
    experts = experts_module()
    experts._is_expert_parallel = True
    x = torch.randn(10, 32, generator=torch.Generator().manual_seed(5))
    index, weights = routing(10, experts.num_experts, 2)
    kept = index < experts.num_experts // 2
    local = torch.where(kept, index, torch.full_like(index, experts.num_experts))  # sentinels
    got = ops.moe.experts_forward(experts, x, local, weights)
    experts._is_expert_parallel = False
    expected = ops.moe.experts_forward(experts, x, torch.where(kept, index, 0), weights * kept)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    got.sum().backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in experts.parameters())


@pytest.mark.parametrize("num_experts", [1, 4])
def test_picks_of_ids_outside_the_experts_contribute_nothing(num_experts):
    # -1 (vLLM's mark of an expert elsewhere) and num_experts, without expert parallelism too: the other tokens'
    # groups stay whole (a negative id sorted first would shift every group by a row), one expert included.
    config = transformers.Qwen3MoeConfig(**{**fp8_models.COMMON, **fp8_models.MOE["Qwen3Moe"],
                                            "num_experts": num_experts, "num_experts_per_tok": 1})
    torch.manual_seed(0)
    experts = transformers.Qwen3MoeForCausalLM(config).model.layers[0].mlp.experts
    x = torch.randn(10, 128, generator=torch.Generator().manual_seed(5))
    index, weights = routing(10, num_experts, 1)
    bad = torch.tensor([[-1], [num_experts], [-7], [num_experts + 3]])
    got = ops.moe.experts_forward(experts, x, torch.cat([bad, index[4:]]), weights)
    expected = ops.moe.experts_forward(experts, x, index, torch.cat([torch.zeros(4, 1), weights[4:]]))
    assert not got[:4].any()
    torch.testing.assert_close(got, expected)


def test_experts_compile_without_graph_breaks():
    experts = experts_module()
    x = torch.randn(11, 32, generator=torch.Generator().manual_seed(6))
    index, weights = routing(11, experts.num_experts, 2)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: ops.moe.experts_forward(experts, *a), fullgraph=True, dynamic=True)
    torch.testing.assert_close(compiled(x, index, weights), ops.moe.experts_forward(experts, x, index, weights))
    x7, (i7, w7) = torch.randn(7, 32), routing(7, experts.num_experts, 2, seed=1)
    torch.testing.assert_close(compiled(x7, i7, w7), ops.moe.experts_forward(experts, x7, i7, w7))


def test_dense_models_report_no_experts():
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON))
    assert ops.nn.convert(model).experts == []


def fp8_experts_model(block_size, seed=0):
    """(a tiny Qwen3-MoE whose experts are transformers' FP8Experts, its float reference with the experts'
    dequantized weights): hidden and expert width 128, 4 experts; the attention and routers stay float."""
    import copy

    fg = pytest.importorskip("transformers.integrations.finegrained_fp8")
    config = transformers.Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                         moe_intermediate_size=128, num_experts=4, num_experts_per_tok=2)
    torch.manual_seed(seed)
    reference = transformers.Qwen3MoeForCausalLM(config).eval()
    reference.set_experts_implementation("eager")
    model = fg.replace_with_fp8_linear(copy.deepcopy(reference), modules_to_not_convert=["lm_head", "q_proj", "k_proj", "v_proj", "o_proj", "gate"],
                                       quantization_config=transformers.FineGrainedFP8Config(weight_block_size=block_size),
                                       pre_quantized=True)
    with torch.no_grad():
        for name in experts_names(model):
            fp8, stock = model.get_submodule(name), reference.get_submodule(name)
            fp8.to_empty(device="cpu")
            for proj in ("gate_up_proj", "down_proj"):
                w = getattr(stock, proj)  # (E, N, K)
                if block_size is None:  # one scale per expert
                    scale = w.abs().amax((1, 2), keepdim=True) / 448
                    codes, expanded = (w / scale).to(E4), scale
                else:
                    codes, scale = zip(*(ops.quantize_fp8(w[e], "block") for e in range(w.shape[0])))
                    codes, scale = torch.stack(codes), torch.stack(scale)
                    expanded = scale.repeat_interleave(128, 1)[:, :w.shape[1]].repeat_interleave(128, 2)[..., :w.shape[2]]
                getattr(fp8, proj).copy_(codes)
                # Per expert, gate_up's scales have 2 rows (its halves): each the expert's one scale.
                getattr(fp8, proj + "_scale_inv").copy_(scale.expand_as(getattr(fp8, proj + "_scale_inv")))
                w.copy_(codes.float() * expanded)
    return model, reference


@pytest.mark.parametrize("block_size", [(128, 128), None], ids=["128x128 blocks", "per expert"])
def test_fp8_experts_run_on_scaled_grouped_gemm(block_size):
    # transformers' FP8Experts of a fine-grained FP8 checkpoint: convert switches them to "ops", registered in
    # transformers' FP8 experts interface; the codes and scales are the model's own (no float copy).
    model, reference = fp8_experts_model(block_size)
    names = experts_names(model)
    assert len(names) == 2 and all(type(model.get_submodule(n)).__name__ == "FP8Experts" for n in names)
    weights = [model.get_submodule(n).down_proj.data_ptr() for n in names]
    report = ops.nn.convert(model)
    assert report.experts == names and model.config._experts_implementation == ops.moe.NAME
    assert [model.get_submodule(n).down_proj.data_ptr() for n in names] == weights
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    with CountOps() as counts, torch.no_grad():
        got = model(ids).logits
    assert counts.counts.get("ops.scaled_grouped_gemm") == 2 * 2  # up and down, 2 layers
    with torch.no_grad():
        expected = reference(ids).logits
    # Against the dequantized float model, the tokens quantized per 1x128 group or per row: measured 0.999994.
    assert F.cosine_similarity(got.flatten(), expected.flatten(), dim=0) > 0.9999
    # Greedy generate() gives the reference's tokens (measured: 8 prompts of 8, both scale layouts).
    same = sum(torch.equal(model.generate(p, max_new_tokens=6, do_sample=False),
                           reference.generate(p, max_new_tokens=6, do_sample=False))
               for p in torch.randint(0, VOCAB, (8, 1, 4), generator=torch.Generator().manual_seed(1)))
    assert same >= 6, same


def test_experts_ops_cannot_run_are_left_to_transformers():
    model, _ = fp8_experts_model((128, 128))
    names = experts_names(model)
    model.get_submodule(names[0]).activation_scheme = "static"
    report = ops.nn.convert(model)
    assert report.experts == [] and model.config._experts_implementation != ops.moe.NAME
    assert dict(report.skipped)[names[0]] == "FP8 experts with static activation scales: ops quantizes activations " \
                                            "dynamically"
    assert "its config's experts implementation is also that of experts ops cannot run" in dict(report.skipped)[names[1]]


def test_import_ops_registers_the_implementation_where_transformers_interface_is_loaded():
    from conftest import run_python

    code = ("import transformers.integrations.moe as moe\nimport ops\n"
            "assert moe.ALL_EXPERTS_FUNCTIONS['ops'] is ops.moe.experts_forward\nprint('ok')")
    result = run_python(code, cwd=__import__("os").path.dirname(__import__("os").path.dirname(__file__)))
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


def test_expert_parallel_layer_on_two_gloo_ranks_equals_one_process(tmp_path):
    import dtensor_worker

    dtensor_worker.spawn("expert_parallel", 2, tmp_path)
    for rank in range(2):
        r = torch.load(tmp_path / f"expert_parallel_{rank}.pt")
        torch.testing.assert_close(r["out"], r["expected"], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(r["x_grad"], r["expected_x_grad"], atol=1e-6, rtol=1e-5)
        for got, full in zip(r["expert_grads"], r["expected_expert_grads"]):
            torch.testing.assert_close(got, full[r["first"]:r["first"] + r["count"]], atol=1e-6, rtol=1e-5)


fp8_models = pytest.importorskip("benchmarks.fp8_models")


def fp8_tiny(family):
    model = fp8_models.tiny(family)
    if model is None:
        pytest.skip(f"transformers {transformers.__version__} has no {family}")
    return model


def routers(model):
    """The routers of the model's MoE blocks: children named gate or router beside an experts module."""
    return [child for block in model.modules() if any(ops.moe.is_experts(c) for c in block.children())
            for name, child in block.named_children() if name in ("gate", "router")]


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
@pytest.mark.parametrize("family", list(fp8_models.MOE))
def test_convert_fp8_quantizes_the_experts_and_keeps_the_routers(family, recipe):
    import warnings

    model = fp8_tiny(family)
    fp8_model = __import__("copy").deepcopy(model)
    with warnings.catch_warnings(record=True):
        report = ops.nn.convert(fp8_model, fp8=recipe)
    names = experts_names(fp8_model)
    assert report.experts == names and report.fp8_experts == names and report.quantized[-len(names):] == names
    # GPT-OSS's input features (144 here, 2880 in the released model) are no whole 128-blocks: rowwise.
    assert [n for n, _ in report.experts_rowwise] == (names if recipe == "blockwise" and family == "GptOss" else [])
    assert routers(fp8_model) and all(p.dtype == torch.float32 for r in routers(fp8_model) for p in r.parameters())
    for name in names:
        experts = fp8_model.get_submodule(name)
        transposed = getattr(experts, "is_transposed", False)
        for proj in ops.moe._projections(experts):
            codes, scale = getattr(experts, proj), getattr(experts, proj + "_scale_inv")
            assert codes.dtype == E4 and not codes.requires_grad and scale.dtype == torch.float32
            assert codes.shape == getattr(model.get_submodule(name), proj).shape  # the module's own layout
            assert codes.stride(1 if transposed else 2) == 1  # K-major: the B operand the FP8 GEMM reads
    reference = fp8_models.dequantized(model, fp8_model)
    ids = torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(0))
    with CountOps() as counts, torch.no_grad():
        got = fp8_model(ids).logits
    assert counts.counts.get("ops.scaled_grouped_gemm") == 2 * len(names)
    with torch.no_grad():
        want = reference(ids).logits
    # Measured 0.995-0.9994 here, top-1 tokens 0.92-0.97 (benchmarks/results/2026-12-07-cpu/fp8_models.md).
    assert F.cosine_similarity(got.flatten(), want.flatten(), dim=0) > 0.99
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.85


def test_fp8_experts_hold_their_weights_in_about_half_the_bytes_of_bfloat16():
    model = fp8_tiny("Qwen3Moe")
    bf16 = fp8_models.expert_bytes(__import__("copy").deepcopy(model).to(torch.bfloat16))
    for recipe, measured in (("blockwise", 0.5002), ("rowwise", 0.5156)):
        fp8_model = __import__("copy").deepcopy(model)
        ops.nn.convert(fp8_model, fp8=recipe)
        ratio = fp8_models.expert_bytes(fp8_model) / bf16
        assert ratio < 0.55 and ratio == pytest.approx(measured, abs=1e-4), (recipe, ratio)


def fp8_converted(family, recipe):
    """A tiny model converted with fp8=recipe, its warnings (about the checkpoint format) left out."""
    import warnings

    model = fp8_tiny(family)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ops.nn.convert(model, fp8=recipe)
    return model


def assert_same_logits(model, other):
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, other(ids).logits)


@pytest.mark.parametrize("family", ["Qwen3Moe", "Mixtral", "Olmoe", "DeepseekV3"])
def test_save_pretrained_writes_blockwise_fp8_experts_in_the_format_transformers_reads(family, tmp_path):
    # One code tensor and one 128x128 weight_scale_inv per expert and projection, as DeepSeek-V3's checkpoints:
    # transformers' from_pretrained reads them (on CPU it dequantizes them) into the dequantized weights.
    import warnings

    safetensors = pytest.importorskip("safetensors.torch")
    model = fp8_tiny(family)
    fp8_model = __import__("copy").deepcopy(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ops.nn.convert(fp8_model, fp8="blockwise")
    assert not [w for w in caught if "experts" in str(w.message)]
    fp8_model.save_pretrained(tmp_path)
    saved = safetensors.load_file(tmp_path / "model.safetensors")
    scales = sorted(k for k in saved if ".experts.0." in k and k.endswith("weight_scale_inv"))
    assert len(scales) == 3 * len(experts_names(fp8_model)) and not [k for k in saved if k.endswith("proj_scale_inv")]
    assert all(saved[k].shape == (1, 1) and saved[k].dtype == torch.float32 for k in scales)  # 128 x 128: one block
    reference = fp8_models.dequantized(model, fp8_model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "requires a GPU: dequantizing"
        stock = type(model).from_pretrained(tmp_path, dtype=torch.float32).eval()
    want = reference.state_dict()
    for name in experts_names(fp8_model):
        for proj in ops.moe._projections(fp8_model.get_submodule(name)):
            assert torch.equal(stock.state_dict()[f"{name}.{proj}"], want[f"{name}.{proj}"])
    # ops reads the file back into FP8 experts bit for bit.
    again = fp8_converted(family, "blockwise")
    assert str(again.load_state_dict(saved)) == "<All keys matched successfully>"
    assert_same_logits(again, fp8_model)


def test_a_checkpoint_that_does_not_hold_each_expert_once_is_a_load_error(tmp_path):
    # Stacking the keys experts.{i}.* renumbers them: experts 0-2 and 4-8 of 8 would load as 0-7.
    safetensors = pytest.importorskip("safetensors.torch")
    model = fp8_converted("Qwen3Moe", "blockwise")
    model.save_pretrained(tmp_path)
    saved = safetensors.load_file(tmp_path / "model.safetensors")
    layer = "model.layers.0.mlp.experts"
    moved = {k.replace(f"{layer}.3.", f"{layer}.8.") if k.startswith(f"{layer}.3.") else k: v
             for k, v in saved.items()}
    with pytest.raises(RuntimeError, match=rf"ops.nn: the checkpoint's keys 'mlp.experts.\*.gate_proj.weight' under "
                                           rf"the model hold experts 0-2, 4-8; {layer}.gate_up_proj stacks experts "
                                           rf"0-7, each once \(missing 3\) \(not the model's: 8\)"):
        fp8_converted("Qwen3Moe", "blockwise").load_state_dict(moved)
    dropped = {k: v for k, v in saved.items() if not k.startswith(f"{layer}.3.")}
    with pytest.raises(RuntimeError, match=r"hold experts 0-2, 4-7; .* \(missing 3\)"):
        fp8_converted("Qwen3Moe", "blockwise").load_state_dict(dropped)


def test_save_pretrained_keeps_fused_scales_that_do_not_split_per_expert(tmp_path):
    # convert's scales always split at the gate/up boundary (blockwise needs the expert width, down_proj's K, in
    # whole blocks); one scale per expert and fused projection (transformers' FP8Experts without blocks) does not:
    # save_pretrained then writes them fused, and ops reads them back.
    from ops import _fp8_convert

    safetensors = pytest.importorskip("safetensors.torch")
    model = fp8_converted("Qwen3Moe", "rowwise")
    names = experts_names(model)
    assert all(ops.moe.scales_split_per_expert(model.get_submodule(n)) for n in names)
    assert _fp8_convert.save_scales_per_expert(model) and "_weight_conversions" in model.__dict__
    for name in names:
        experts = model.get_submodule(name)
        experts.gate_up_proj_scale_inv = torch.nn.Parameter(experts.gate_up_proj_scale_inv.amax(1, keepdim=True),
                                                            requires_grad=False)  # (E, 1, 1)
        assert not ops.moe.scales_split_per_expert(experts)
    assert not _fp8_convert.save_scales_per_expert(model) and "_weight_conversions" not in model.__dict__
    assert "_ops_base_conversions" not in model.__dict__
    model.save_pretrained(tmp_path)
    saved = safetensors.load_file(tmp_path / "model.safetensors")
    assert saved[f"{names[0]}.gate_up_proj_scale_inv"].shape == (8, 1, 1)
    assert any(".experts.0.gate_proj.weight" in k for k in saved)  # the codes still one per expert
    again = fp8_converted("Qwen3Moe", "rowwise")
    for name in names:
        experts = again.get_submodule(name)
        experts.gate_up_proj_scale_inv = torch.nn.Parameter(torch.empty(8, 1, 1), requires_grad=False)
    assert str(again.load_state_dict(saved)) == "<All keys matched successfully>"
    assert_same_logits(again, model)


def test_a_model_from_pretrained_keeps_its_conversion_mapping_extended_by_the_scales(tmp_path):
    # from_pretrained records the mapping it applied; convert extends that one (and only once) for save_pretrained.
    import warnings

    safetensors = pytest.importorskip("safetensors.torch")
    fp8_tiny("Qwen3Moe").save_pretrained(tmp_path / "float")
    model = type(fp8_tiny("Qwen3Moe")).from_pretrained(tmp_path / "float").eval()
    loaded = list(model._weight_conversions)
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ops.nn.convert(model, fp8="blockwise")
        assert not [w for w in caught if "experts" in str(w.message)]
        assert model._weight_conversions[:len(loaded)] == loaded and len(model._weight_conversions) > len(loaded)
    model.save_pretrained(tmp_path / "fp8")
    saved = safetensors.load_file(tmp_path / "fp8" / "model.safetensors")
    assert sorted(k.removesuffix("_scale_inv") for k in saved if ".experts." in k and k.endswith("_scale_inv")) == \
        sorted(k for k in saved if ".experts." in k and k.endswith(".weight"))


def test_converting_a_base_model_warns_that_only_its_own_save_pretrained_splits_the_scales():
    model = fp8_tiny("Qwen3Moe")
    with pytest.warns(UserWarning, match=r"Qwen3MoeModel is a base model: its own save_pretrained writes the FP8 "
                                         r"experts' scales one per expert.*convert the model you save"):
        ops.nn.convert(model.model, fp8="blockwise")


def test_fp8_experts_keep_codes_and_scales_through_dtype_casts():
    model = fp8_tiny("Qwen3Moe")
    ops.nn.convert(model, fp8="blockwise")
    experts = [model.get_submodule(n) for n in experts_names(model)]
    kept = [(e.gate_up_proj.detach().clone(), e.gate_up_proj_scale_inv.detach().clone()) for e in experts]
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids).logits
        model.to(torch.bfloat16)
        model.half().float()
        for e, (codes, scale) in zip(experts, kept):
            assert e.gate_up_proj.dtype == E4 and torch.equal(e.gate_up_proj.view(torch.uint8), codes.view(torch.uint8))
            assert e.gate_up_proj_scale_inv.dtype == torch.float32 and torch.equal(e.gate_up_proj_scale_inv, scale)
        # The other weights went through bfloat16: close, not equal (measured 0.9988).
        assert F.cosine_similarity(model(ids).logits.flatten(), before.flatten(), dim=0) > 0.99
        copied = __import__("copy").deepcopy(model)
        copied.half()
        assert copied.get_submodule(experts_names(model)[0]).gate_up_proj.dtype == E4


class FloatCopies(TorchDispatchMode):
    """Records the ops that make a floating-point tensor of 2 or more bytes per element and at least `numel`
    elements."""

    def __init__(self, numel):
        super().__init__()
        self.numel, self.seen = numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else [out]):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.element_size() >= 2 and t.numel() >= self.numel:
                self.seen.append((str(func), tuple(t.shape), t.dtype))
        return out


def test_a_fine_grained_fp8_moe_checkpoint_loads_into_fp8_experts_without_a_float_copy(tmp_path):
    # DeepSeek-V3's format: per expert and projection, float8_e4m3fn codes and a 128x128-block weight_scale_inv.
    safetensors = pytest.importorskip("safetensors.torch")
    model = fp8_tiny("Qwen3Moe")
    checkpoint = {}
    for key, value in model.state_dict().items():
        if ".experts." not in key:
            checkpoint[key] = value
            continue
        prefix, proj = key.rsplit(".", 1)
        halves = value.chunk(2, dim=1) if proj == "gate_up_proj" else [value]
        for part, w in zip(["gate_proj", "up_proj"] if proj == "gate_up_proj" else ["down_proj"], halves):
            for e in range(w.shape[0]):
                codes, scale = ops.quantize_fp8(w[e], "block")
                checkpoint[f"{prefix}.{e}.{part}.weight"] = codes
                checkpoint[f"{prefix}.{e}.{part}.weight_scale_inv"] = scale
    path = tmp_path / "model.safetensors"
    safetensors.save_file(checkpoint, str(path))

    accelerate = pytest.importorskip("accelerate")
    with accelerate.init_empty_weights():  # parameters on the meta device, buffers (rotary frequencies) computed
        loaded = type(model)(model.config)
    loaded.eval()
    report = ops.nn.convert(loaded, fp8="blockwise")
    assert report.fp8_experts == experts_names(loaded)
    smallest = min(getattr(e, p).numel() for e in map(loaded.get_submodule, report.fp8_experts)
                   for p in ops.moe._projections(e))
    state = safetensors.load_file(str(path))
    with FloatCopies(smallest) as copies:
        result = loaded.load_state_dict(state, strict=True, assign=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert copies.seen == []  # no float tensor of an expert weight's size was made
    with FloatCopies(smallest) as probe:  # as a dequantization would
        codes = state["model.layers.0.mlp.experts.0.down_proj.weight"]
        codes.repeat(-(-smallest // codes.numel()), 1).to(torch.bfloat16)
    assert probe.seen
    # The same codes and scales as the float model converted in memory (its experts' widths are whole blocks).
    converted = __import__("copy").deepcopy(model)
    ops.nn.convert(converted, fp8="blockwise")
    for name in report.fp8_experts:
        for key, value in converted.get_submodule(name).state_dict().items():
            got = loaded.get_submodule(name).state_dict()[key]
            assert got.dtype == value.dtype and torch.equal(got.view(torch.uint8) if got.dtype == E4 else got,
                                                            value.view(torch.uint8) if value.dtype == E4 else value)
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, converted(ids).logits)


def test_transposed_fp8_experts_load_their_codes_k_major_with_assign():
    # GPT-OSS stores weights (E, K, N); a checkpoint holds them N-major, the FP8 grouped GEMM reads K-major (a
    # copy per call on CUDA otherwise).
    model = fp8_converted("GptOss", "rowwise")
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    other = fp8_converted("GptOss", "rowwise")
    assert str(other.load_state_dict(state, assign=True)) == "<All keys matched successfully>"
    for name in experts_names(other):
        for proj in ops.moe._projections(other.get_submodule(name)):
            codes = getattr(other.get_submodule(name), proj)
            assert codes.dtype == E4 and codes.stride(1) == 1, (name, proj, codes.stride())
    assert_same_logits(other, model)


def test_fp8_experts_load_a_floating_point_state_dict_quantized():
    model = fp8_tiny("Qwen3Moe")
    floats = {k: v.clone() for k, v in model.state_dict().items()}
    expected = __import__("copy").deepcopy(model)
    ops.nn.convert(expected, fp8="rowwise")
    other = fp8_tiny("Qwen3Moe")
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(0.5)
    ops.nn.convert(other, fp8="rowwise")
    assert not other.load_state_dict(floats, strict=True).missing_keys
    name = experts_names(other)[0]
    for key, value in expected.get_submodule(name).state_dict().items():
        got = other.get_submodule(name).state_dict()[key]
        assert torch.equal(got.view(torch.uint8) if got.dtype == E4 else got,
                           value.view(torch.uint8) if value.dtype == E4 else value), key
    bad = dict(floats, **{f"{name}.down_proj_scale_inv": expected.get_submodule(name).down_proj_scale_inv})
    with pytest.raises(RuntimeError, match=rf"ops.moe: {name}.down_proj is torch.float32 beside a "
                                           rf"{name}.down_proj_scale_inv: expected the FP8 codes"):
        other.load_state_dict(bad)


def test_fp8_experts_refuse_a_second_quantization_and_training():
    import warnings

    # Linears of no FP8 shape (head_dim 24): only the experts are FP8, so they are what convert checks.
    config = transformers.Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=1, num_attention_heads=3,
                                         num_key_value_heads=1, head_dim=24, moe_intermediate_size=128, num_experts=4,
                                         num_experts_per_tok=2)
    model = transformers.Qwen3MoeForCausalLM(config)
    with warnings.catch_warnings(record=True):
        assert ops.nn.convert(model, fp8="rowwise").fp8_experts == ["model.layers.0.mlp.experts"]
        with pytest.raises(ValueError, match=r"ops.nn.convert: fp8='blockwise', but model.layers.0.mlp.experts holds "
                                             r"FP8 experts \(Qwen3MoeExperts, rowwise\): quantizing their codes again"):
            ops.nn.convert(model, fp8="blockwise")
        assert ops.nn.convert(model, fp8="rowwise").fp8_experts == ["model.layers.0.mlp.experts"]
    experts = model.model.layers[0].mlp.experts
    with pytest.raises(ValueError, match=r"ops.moe.quantize: expected an experts module with floating-point weights, "
                                         r"got Qwen3MoeExperts: its weights are FP8 already"):
        ops.moe.quantize(experts, "rowwise")
    with pytest.raises(ValueError, match=r'ops.moe.quantize: recipe must be "rowwise" or "blockwise", got \'block\''):
        ops.moe.quantize(experts, "block")
    ids = torch.randint(0, VOCAB, (1, 4))
    with pytest.raises(RuntimeError, match=r"ops.moe: FP8 experts are inference only .* torch.no_grad\(\)"):
        model(ids, labels=ids)
    with torch.no_grad():
        with pytest.raises(RuntimeError, match=r"ops.moe: FP8 experts compute in torch.float32, torch.bfloat16 or "
                                               r"torch.float16 .* got hidden states of torch.float64"):
            __import__("copy").deepcopy(model).double()(ids)
        # Another experts implementation would read the codes as weights (ATen: "expected m1 and m2 to have the
        # same dtype"); a float model sharing the config switches it too.
        for implementation in ("eager", "grouped_mm"):
            model.set_experts_implementation(implementation)
            with pytest.raises(RuntimeError, match=rf"ops.moe: Qwen3MoeExperts holds FP8 codes .* only the experts "
                                                   rf"implementation 'ops' runs, and the model's config names "
                                                   rf"'{implementation}': call model.set_experts_implementation"):
                model(ids)
        model.set_experts_implementation("ops")
        model(ids)


def test_gpt_oss_blockwise_experts_stay_rowwise_through_a_second_convert_and_are_never_left_unconverted():
    import warnings

    model = fp8_tiny("GptOss")
    for _ in range(2):  # the second convert finds them FP8 (rowwise: K 144 is no whole block) and says so again
        with warnings.catch_warnings(record=True):
            report = ops.nn.convert(model, fp8="blockwise")
        assert [n for n, _ in report.experts_rowwise] == report.fp8_experts == experts_names(model)
    # Their biases are floating-point matrices; FP8 experts are still not listed as kept in floating point.
    assert not set(experts_names(model)) & set(model.config.quantization_config.modules_to_not_convert)
