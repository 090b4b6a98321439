"""transformers' MoE models with their experts on ops.grouped_gemm (ops.moe, ops.nn.convert): tiny configs of
every MoE family the tests list, against the same model's "eager" experts in logits, gradients and
generated tokens, and the experts module alone against transformers' "grouped_mm" implementation."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import ops

from conftest import run_python

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


def test_fp8_experts_are_left_to_transformers():
    # transformers' FP8Experts (a fine-grained FP8 checkpoint) hold float8 weights, which ops.grouped_gemm does
    # not take: convert leaves them and their config's experts implementation alone, and says so.
    fg = pytest.importorskip("transformers.integrations.finegrained_fp8")
    model = fg.replace_with_fp8_linear(tiny("Qwen3Moe"), modules_to_not_convert=["lm_head"], pre_quantized=True,
                                       quantization_config=transformers.FineGrainedFP8Config(weight_block_size=(128, 128)))
    names = experts_names(model)
    assert len(names) == 2 and all(type(model.get_submodule(n)).__name__ == "FP8Experts" for n in names)
    report = ops.nn.convert(model)
    assert report.experts == [] and model.config._experts_implementation != ops.moe.NAME
    assert [(n, why) for n, why in report.skipped if n in names] == [(n, ops.moe.FP8_EXPERTS) for n in names]
    assert f"left {names[0]} alone: FP8 experts" in str(report)


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
