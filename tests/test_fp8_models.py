"""FP8 in models: ops.nn.Fp8Linear (the quantized formula, casts, state_dicts, bad inputs),
ops.nn.convert(model, fp8=...) on transformers models (what stays in high precision, by role), and their
checkpoints (save_pretrained in transformers' FP8 formats, loaded back by transformers and by ops)."""

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

import ops

E4 = torch.float8_e4m3fn


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_linear_is_the_quantized_formula(recipe, dtype):
    lin = torch.nn.Linear(320, 48).to(dtype)
    fp8_lin = ops.nn.Fp8Linear.from_linear(lin, recipe, activation="silu")
    x = torch.randn(2, 5, 320).to(dtype)
    with torch.no_grad():
        y = fp8_lin(x)
        wq, ws = ops.quantize_fp8(lin.weight, "row" if recipe == "rowwise" else "block")
        xq, xs = ops.quantize_fp8(x.reshape(10, 320), "row" if recipe == "rowwise" else "group")
        expected = ops.scaled_gemm(xq, wq.t(), xs, ws.t(), lin.bias, out_dtype=dtype, activation="silu")
        assert y.dtype == dtype and torch.equal(y, expected.reshape(2, 5, 48))
        reference = F.silu(lin.float()(x.float()))
        assert F.cosine_similarity(y.float().flatten(), reference.flatten(), dim=0) > 0.999
        # state_dict round trip into a fresh module
        fresh = ops.nn.Fp8Linear(320, 48, recipe=recipe, activation="silu", dtype=dtype)
        fresh.load_state_dict(fp8_lin.state_dict())
        assert torch.equal(fresh(x), y)
        compiled = torch.compile(fp8_lin, fullgraph=True)
        torch.testing.assert_close(compiled(x), y)
    with pytest.raises(RuntimeError, match=r"ops.nn.Fp8Linear: inference only .* torch.no_grad\(\)"):
        fp8_lin(x.requires_grad_())


def test_fp8_linear_keeps_codes_and_scales_through_dtype_casts_and_state_dicts():
    lin = torch.nn.Linear(64, 32)
    fp8_lin = ops.nn.Fp8Linear.from_linear(lin)
    codes, scale = fp8_lin.weight.clone(), fp8_lin.weight_scale.clone()
    x = torch.randn(3, 64)
    with torch.no_grad():
        y = fp8_lin(x)
        for cast in (lambda m: m.to(torch.bfloat16), lambda m: m.half(), lambda m: m.float(), lambda m: m.double(),
                     lambda m: m.to("cpu", torch.float16)):
            cast(fp8_lin)
            assert torch.equal(fp8_lin.weight.view(torch.uint8), codes.view(torch.uint8))
            assert fp8_lin.weight_scale.dtype == torch.float32 and torch.equal(fp8_lin.weight_scale, scale)
        assert fp8_lin.bias.dtype == torch.float16
        fp8_lin.float()
        torch.testing.assert_close(fp8_lin(x), y, rtol=1e-3, atol=1e-3)  # the bias once rounded to float16
        # A module built without a dtype has torch's default one, as nn.Linear: the round trip is exact.
        fresh = ops.nn.Fp8Linear(64, 32)
        src = ops.nn.Fp8Linear.from_linear(lin)
        fresh.load_state_dict(src.state_dict())
        assert fresh.bias.dtype == torch.float32 and torch.equal(fresh(x), src(x))


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
def test_fp8_linear_quantizes_a_high_precision_checkpoint_on_load(recipe):
    # An nn.Linear's state_dict (no weight_scale) loads as from_linear quantizes it; its values are never
    # copied into the codes.
    lin, other = torch.nn.Linear(64, 32).to(torch.bfloat16), torch.nn.Linear(64, 32).to(torch.bfloat16)
    fp8_lin = ops.nn.Fp8Linear.from_linear(lin, recipe)
    assert str(fp8_lin.load_state_dict(other.state_dict(), strict=True)) == "<All keys matched successfully>"
    expected = ops.nn.Fp8Linear.from_linear(other, recipe)
    scale_name = ops.nn.Fp8Linear.SCALE_NAMES[recipe]
    assert list(expected.state_dict()) == ["weight", scale_name, "bias"]
    assert torch.equal(fp8_lin.weight.view(torch.uint8), expected.weight.view(torch.uint8))
    assert torch.equal(getattr(fp8_lin, scale_name), getattr(expected, scale_name))
    assert torch.equal(fp8_lin.bias, expected.bias)
    before = copy.deepcopy(fp8_lin.state_dict())
    bad = {"weight": other.weight.float(), scale_name: getattr(expected, scale_name), "bias": other.bias}
    with pytest.raises(RuntimeError, match=rf"ops.nn.Fp8Linear: weight is torch.float32 beside a {scale_name}"):
        fp8_lin.load_state_dict(bad)
    with pytest.raises(RuntimeError, match=r"ops.nn.Fp8Linear: weight is torch.float8_e5m2: expected the FP8 codes"):
        fp8_lin.load_state_dict({**bad, "weight": other.weight.to(torch.float8_e5m2)})
    def bits(t):
        return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t

    for name, tensor in fp8_lin.state_dict().items():  # a refused load wrote nothing
        assert torch.equal(bits(tensor), bits(before[name])), name
    if recipe == "blockwise":  # the scale's earlier key loads too
        old_keys = {"weight": expected.weight, "weight_scale": expected.weight_scale_inv, "bias": expected.bias}
        assert str(fp8_lin.load_state_dict(old_keys, strict=True)) == "<All keys matched successfully>"
        assert torch.equal(fp8_lin.weight_scale_inv, expected.weight_scale_inv)


def test_fp8_linear_bad_input():
    fp8_lin = ops.nn.Fp8Linear.from_linear(torch.nn.Linear(32, 16))
    with torch.no_grad():
        with pytest.raises(RuntimeError, match=r"ops.nn.Fp8Linear: expected input with last dimension 32 "
                                               r"\(in_features\), got shape \[4, 64\]"):
            fp8_lin(torch.randn(4, 64))
        with pytest.raises(RuntimeError, match=r"ops.nn.Fp8Linear: expected input of dtype .* got torch.float64"):
            fp8_lin(torch.randn(4, 32, dtype=torch.float64))


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
def test_fp8_linear_without_input_features_gives_the_bias_as_nn_linear(recipe):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nn.Linear: "Initializing zero-element tensors is a no-op"
        lin = torch.nn.Linear(0, 16)
    fp8_lin = ops.nn.Fp8Linear.from_linear(lin, recipe)
    with torch.no_grad():
        for shape in [(3, 0), (2, 3, 0), (0,), (0, 0)]:
            x = torch.randn(shape)
            assert torch.equal(fp8_lin(x), lin(x)), shape


def test_fp8_linear_bad_arguments():
    e4_weight, scale = torch.zeros(160, 144, dtype=E4), torch.ones(2, 2)
    with pytest.raises(ValueError, match=r"from_fp8: expected a float8_e4m3fn weight \(N, K\) .* got "
                                         r"torch.float8_e4m3fn \[2, 160, 144\]"):
        ops.nn.Fp8Linear.from_fp8(e4_weight.expand(2, 160, 144), scale)
    with pytest.raises(ValueError, match=r"from_fp8: expected a floating-point bias of shape \(160,\) \(N\), got "
                                         r"torch.float32 \[10\]"):
        ops.nn.Fp8Linear.from_fp8(e4_weight, scale, bias=torch.zeros(10))
    with pytest.raises(ValueError, match="multiples of 16"):
        ops.nn.Fp8Linear(20, 16)
    with pytest.raises(ValueError, match="recipe must be one of"):
        ops.nn.Fp8Linear(16, 16, recipe="tensorwise")
    with pytest.raises(ValueError, match=r"ops.nn.convert: fp8 must be None or one of \('rowwise', 'blockwise'\)"):
        ops.nn.convert(torch.nn.Sequential(torch.nn.Linear(16, 16)), fp8="per-tensor")


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
def test_a_tiny_llama_in_fp8_keeps_its_logits_and_generates(recipe):
    from conftest import tiny_hf_decoder
    import copy

    model = tiny_hf_decoder("Llama").eval()
    fp8_model = copy.deepcopy(model)
    report = ops.nn.convert(fp8_model, fp8=recipe)
    assert len(report.fp8) == 14 and report.kept_high_precision[0][0] == "lm_head"
    assert type(fp8_model.lm_head) is ops.nn.Linear and "FP8 model.layers.0.mlp.down_proj" in str(report)
    assert "recipe gated_mlp not applied: gate_proj is not a plain Linear (Fp8Linear;" in str(report)
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref, got = model(ids).logits, fp8_model(ids).logits
    # Measured 0.9990 (rowwise) and 0.9993 (blockwise).
    assert F.cosine_similarity(got.flatten(), ref.flatten(), dim=0) > 0.99
    assert (F.cosine_similarity(got, ref, dim=-1) > 0.98).all()
    out = fp8_model.generate(ids[:1, :4], max_new_tokens=5, do_sample=False)
    assert out.shape == (1, 9) and torch.equal(out[:, :4], ids[:1, :4])


def test_a_checkpoint_in_transformers_fine_grained_fp8_format_runs_on_ops_kernels(tmp_path):
    """A tiny Llama's Linears saved as FP8 codes + 128x128 `weight_scale_inv` (DeepSeek-V3's format) and loaded
    into transformers' FP8Linear modules: convert gives them ops' Fp8Linear, sharing the checkpoint's tensors,
    and the logits match the dequantized model (transformers' own CPU path dequantizes at load)."""
    import copy

    safetensors = pytest.importorskip("safetensors.torch")
    fg = pytest.importorskip("transformers.integrations.finegrained_fp8")
    from transformers import FineGrainedFP8Config
    from conftest import tiny_hf_decoder

    model = tiny_hf_decoder("Llama").eval()
    dequantized = copy.deepcopy(model)
    checkpoint = {}
    for name, m in model.named_modules():
        if type(m) is torch.nn.Linear and name != "lm_head":
            codes, scale = ops.quantize_fp8(m.weight.detach(), "block")
            checkpoint[name + ".weight"], checkpoint[name + ".weight_scale_inv"] = codes, scale
            expanded = scale.repeat_interleave(128, 0)[:codes.shape[0]].repeat_interleave(128, 1)[:, :codes.shape[1]]
            dequantized.get_submodule(name).weight.data = codes.float() * expanded
    safetensors.save_file(checkpoint, tmp_path / "model.safetensors")
    fp8_model = fg.replace_with_fp8_linear(copy.deepcopy(model), modules_to_not_convert=["lm_head"],
                                           quantization_config=FineGrainedFP8Config(weight_block_size=(128, 128)),
                                           pre_quantized=True)
    loaded = safetensors.load_file(tmp_path / "model.safetensors")
    fp8_model.load_state_dict(loaded, strict=False, assign=True)
    keys = list(fp8_model.state_dict())
    report = ops.nn.convert(fp8_model)
    assert len(report.fp8) == 14
    assert list(fp8_model.state_dict()) == keys  # the checkpoint's format, weight_scale_inv included
    assert not fp8_model.load_state_dict(loaded, strict=False).unexpected_keys
    down = fp8_model.model.layers[0].mlp.down_proj
    assert type(down) is ops.nn.Fp8Linear and down.weight.data_ptr() == loaded["model.layers.0.mlp.down_proj.weight"].data_ptr()
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, ref = fp8_model(ids).logits, dequantized(ids).logits
    assert F.cosine_similarity(got.flatten(), ref.flatten(), dim=0) > 0.999  # measured 0.9996
    with pytest.raises(ValueError, match="from_fp8: expected a float8_e4m3fn weight"):
        ops.nn.Fp8Linear.from_fp8(torch.zeros(32, 32, dtype=E4), torch.ones(2, 2))


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
def test_save_pretrained_of_a_converted_model_writes_the_fp8_format_transformers_reads(recipe, tmp_path):
    # The codes and scales are saved in transformers' format of the recipe, with its quantization_config:
    # from_pretrained of the stock class runs them as FP8 or dequantizes them (fine-grained "fp8" on CPU),
    # or refuses (FBGEMM's needs a GPU and fbgemm-gpu), never loads the codes as float weights.
    import json

    transformers = pytest.importorskip("transformers")
    safetensors = pytest.importorskip("safetensors.torch")
    # Features in whole 128-blocks: transformers' CPU dequantization (5.25) takes a block as the weight's
    # rows over the scale's rows (160 rows, 2 scales: blocks of 80, where the format has 128 and 32).
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32)).eval()
    dequantized = copy.deepcopy(model)  # each Linear's weight: its codes times their scales, in float32
    report = ops.nn.convert(model, fp8=recipe)
    method = {"rowwise": "fbgemm_fp8", "blockwise": "fp8"}[recipe]
    assert report.quantization_config == method and f"config.quantization_config: {method!r}" in str(report)
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(ids).logits
    model.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert written["quant_method"] == method and written["modules_to_not_convert"] == ["lm_head", "model.embed_tokens"]
    if recipe == "blockwise":
        assert written["weight_block_size"] == [128, 128] and written["activation_scheme"] == "dynamic"
        stock = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()  # dequantized on CPU
        for name in report.fp8:
            fp8_linear = model.get_submodule(name)
            scale = fp8_linear.weight_scale_inv.repeat_interleave(128, 0).repeat_interleave(128, 1)
            n, k = fp8_linear.weight.shape
            dequantized.get_submodule(name).weight.data = fp8_linear.weight.float() * scale[:n, :k]
        with torch.no_grad():
            got, expected = stock(ids).logits.float(), dequantized(ids).logits
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        # The FP8 model also quantizes its activations: measured 0.99939.
        assert F.cosine_similarity(got.flatten(), logits.flatten(), dim=0) > 0.999
    elif not torch.cuda.is_available():
        with pytest.raises(ImportError, match="fbgemm fp8 quantization requires a GPU"):
            transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    # Into ops' modules: the stock model from the config, converted, then the checkpoint: bit for bit.
    again = transformers.LlamaForCausalLM._from_config(transformers.AutoConfig.from_pretrained(tmp_path)).eval()
    ops.nn.convert(again, fp8=recipe)
    again.load_state_dict(safetensors.load_file(tmp_path / "model.safetensors"), strict=True)
    with torch.no_grad():
        assert torch.equal(again(ids).logits, logits)


def test_convert_warns_where_transformers_cpu_load_of_a_blockwise_checkpoint_is_wrong():
    # transformers 5.25 dequantizes 288 rows over 3 scale rows in blocks of 96 where the format has 128, 128, 32
    # (a dimension of one block, e.g. k_proj's 64 rows, it reads right).
    transformers = pytest.importorskip("transformers")

    def llama(intermediate_size):  # a config of its own: convert sets its quantization_config
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=128, hidden_size=128, intermediate_size=intermediate_size, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32))

    with pytest.warns(UserWarning, match=r"ops.nn.convert: 3 blockwise FP8 Linears have a dimension of several "
                                         r"128-blocks, the last partial \(e.g. model.layers.0.mlp.gate_proj\): "
                                         r"transformers' CPU"):
        ops.nn.convert(llama(288), fp8="blockwise")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ops.nn.convert(llama(288), fp8="rowwise")  # a scale per row: any size
        ops.nn.convert(llama(256), fp8="blockwise")


def test_convert_lists_every_module_it_keeps_in_floating_point_for_transformers():
    # An MoE model: its router keeps float weights, so modules_to_not_convert names it; its experts become FP8
    # (rowwise: hidden 64 is no whole 128-block), which transformers does not read back: convert warns.
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3MoeConfig(vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                         num_experts=4, num_experts_per_tok=2, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    model = transformers.Qwen3MoeForCausalLM(config)
    with pytest.warns(UserWarning, match=r"ops.nn.convert: 1 FP8 experts modules \(e.g. model.layers.0.mlp.experts\): "
                                         r"save_pretrained writes their rowwise scales one per expert, which "
                                         r"transformers' FP8 experts do not take"):
        ops.nn.convert(model, fp8="blockwise")
    assert model.config.quantization_config.modules_to_not_convert == [
        "lm_head", "model.embed_tokens", "model.layers.0.mlp.gate"]
    already = transformers.Qwen3MoeForCausalLM(config)
    already.config.quantization_config = transformers.FineGrainedFP8Config()
    with pytest.warns(UserWarning, match=r"config.quantization_config is .*'fp8'.*fp8='rowwise' stored scales in the "
                                         r"'fbgemm_fp8' format"):
        ops.nn.convert(already, fp8="rowwise")


@pytest.mark.cuda
def test_fp8_linear_agrees_with_transformers_fp8_linear_on_the_gpu():
    """transformers' own fine-grained FP8 path (its Triton or DeepGEMM kernels) against ops' on one layer."""
    fg = pytest.importorskip("transformers.integrations.finegrained_fp8")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs sm89+")
    w = torch.randn(512, 1024, device="cuda") / 32
    codes, scale = ops.quantize_fp8(w, "block")
    theirs = fg.FP8Linear(1024, 512, block_size=(128, 128)).cuda()
    with torch.no_grad():
        theirs.weight.copy_(codes)
        theirs.weight_scale_inv.copy_(scale)
    ours = ops.nn.Fp8Linear.from_fp8(codes, scale)
    x = torch.randn(3, 40, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        a = ours(x).float()
        try:
            b = theirs(x).float()
        except (ImportError, OSError) as e:  # its kernels come from the Hugging Face Hub ("kernels" package)
            pytest.skip(f"transformers' FP8 kernels cannot be loaded here: {e}")
    assert F.cosine_similarity(a.flatten(), b.flatten(), dim=0) > 0.999


# ---- what convert(fp8=...) keeps in high precision, by role ---------------------------------------------


def _tiny_moe(family):
    """A transformers MoE model of `family` with 16 experts (a multiple of 16, so the router's size alone
    would let it be quantized), hidden 64, random weights; and its forward's inputs."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, f"{family}Config"):
        pytest.skip(f"transformers {transformers.__version__} has no {family}")
    ids = torch.randint(0, 128, (2, 12))
    common = dict(vocab_size=128, hidden_size=64, num_hidden_layers=1, num_attention_heads=4)
    decoder = dict(common, num_key_value_heads=2, head_dim=16)
    if family == "HunYuanMoEV1":
        config = transformers.HunYuanMoEV1Config(**decoder, intermediate_size=64, num_experts=16, moe_topk=2)
    elif family == "Afmoe":
        config = transformers.AfmoeConfig(**decoder, intermediate_size=64, num_experts=16, num_experts_per_tok=2,
                                          moe_intermediate_size=32, num_dense_layers=0)
    elif family == "Gemma4Text":
        config = transformers.Gemma4TextConfig(
            **decoder, intermediate_size=64, num_experts=16, top_k_experts=2, moe_intermediate_size=32,
            enable_moe_block=True, global_head_dim=16, vocab_size_per_layer_input=128, hidden_size_per_layer_input=16,
            layer_types=["full_attention"])
        return transformers.Gemma4ForCausalLM(config), {"input_ids": ids}
    elif family == "Dbrx":
        config = transformers.DbrxConfig(d_model=64, n_heads=4, n_layers=1, vocab_size=128,
                                         ffn_config={"moe_num_experts": 16, "moe_top_k": 2, "ffn_hidden_size": 32},
                                         attn_config={"kv_n_heads": 2, "clip_qkv": 8.0})
        # transformers 5.25's DbrxAttention reads attn_config.rope_theta, which DbrxAttentionConfig lacks.
        config.attn_config.rope_theta = 10000.0
    elif family == "JetMoe":
        config = transformers.JetMoeConfig(vocab_size=128, hidden_size=64, num_hidden_layers=1, num_key_value_heads=4,
                                           kv_channels=16, intermediate_size=64, num_local_experts=16,
                                           num_experts_per_tok=2)
    elif family == "LongcatFlash":  # 16 routed experts and 16 zero experts: the router scores 32
        config = transformers.LongcatFlashConfig(
            vocab_size=128, hidden_size=64, num_layers=1, num_attention_heads=4, ffn_hidden_size=64,
            expert_ffn_hidden_size=32, n_routed_experts=16, zero_expert_num=16, moe_topk=2, kv_lora_rank=16,
            q_lora_rank=16, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, head_dim=16)
    elif family == "SwitchTransformers":
        config = transformers.SwitchTransformersConfig(
            vocab_size=128, d_model=64, d_kv=16, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=4,
            num_experts=16, encoder_sparse_step=1, decoder_sparse_step=1)
        return (transformers.SwitchTransformersForConditionalGeneration(config),
                {"input_ids": ids, "decoder_input_ids": ids[:, :5]})
    else:
        assert family == "NllbMoe"
        config = transformers.NllbMoeConfig(
            vocab_size=128, d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_experts=16, encoder_sparse_step=1,
            decoder_sparse_step=1)
        return (transformers.NllbMoeForConditionalGeneration(config),
                {"input_ids": ids, "decoder_input_ids": ids[:, :5]})
    return getattr(transformers, f"{family}ForCausalLM")(config), {"input_ids": ids}


# The router Linears of each family, by the end of their names (a model may hold several).
ROUTERS = {
    "HunYuanMoEV1": ("mlp.gate.wg",),
    "Afmoe": ("mlp.router.gate",),
    "Gemma4Text": ("layers.0.router.proj",),
    "Dbrx": ("ffn.router.layer",),
    "JetMoe": ("mlp.router.layer", "self_attention.experts.router.layer"),
    "LongcatFlash": ("mlp.router.classifier",),
    "SwitchTransformers": ("mlp.router.classifier",),
    "NllbMoe": ("ffn.router.classifier",),
}


def _fp8_logits(model, inputs):
    with torch.no_grad():
        out = model(**inputs)
    return (out.logits if hasattr(out, "logits") else out[0]).float()


def _dequantize_into(model, converted, names):
    """Gives `model`'s Linears `names` the weights blockwise FP8 Linears of `converted` hold: codes times scales."""
    for name in names:
        fp8_linear = converted.get_submodule(name)
        n, k = fp8_linear.weight.shape
        scale = fp8_linear.weight_scale_inv.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
        model.get_submodule(name).weight.data = fp8_linear.weight.float() * scale


def _reloads_in_transformers(model, dequantized, report, inputs, path):
    """save_pretrained of a blockwise FP8 model, from_pretrained by its stock class (dequantized on CPU): the
    logits of the model whose quantized Linears hold their codes times their scales and whose kept ones hold
    their own weights. A kept Linear loaded as FP8 would have no scale in the checkpoint."""
    model.save_pretrained(path)
    stock = type(model).from_pretrained(path).eval()
    _dequantize_into(dequantized, model, report.fp8)
    torch.testing.assert_close(_fp8_logits(stock, inputs), _fp8_logits(dequantized, inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", sorted(ROUTERS))
def test_convert_fp8_keeps_every_moe_router_in_high_precision(family, tmp_path):
    model, inputs = _tiny_moe(family)
    model.eval()
    dequantized = copy.deepcopy(model)
    routers = sorted(name for name, m in model.named_modules()
                     if isinstance(m, torch.nn.Linear) and name.endswith(ROUTERS[family]))
    assert len(routers) >= 2 if family in ("JetMoe", "SwitchTransformers", "NllbMoe") else len(routers) == 1
    x = torch.randn(5, 64)
    with torch.no_grad():
        scores = {name: model.get_submodule(name)(x) for name in routers}
    assert all(s.shape[-1] % 16 == 0 for s in scores.values())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = ops.nn.convert(model, fp8="blockwise")
    kept = dict(report.kept_high_precision)
    assert sorted(name for name, why in kept.items() if why.startswith("an MoE router")) == routers
    not_converted = model.config.quantization_config.modules_to_not_convert
    for name in routers:
        router = model.get_submodule(name)
        assert type(router) is ops.nn.Linear and name in not_converted
        with torch.no_grad():
            assert torch.equal(router(x), scores[name])
    assert report.fp8 and not set(report.fp8) & set(kept)
    if family in ("SwitchTransformers", "NllbMoe"):
        return  # their experts cast activations to wo's / fc2's weight dtype, FP8's: no FP8 forward
    assert torch.isfinite(_fp8_logits(model, inputs)).all()
    if report.fp8_experts:  # FP8 rowwise (hidden 64 is no whole 128-block): no format transformers reads
        assert report.experts_rowwise and any("load a save_pretrained checkpoint of this model with ops" in
                                              str(w.message) for w in caught)
        return
    _reloads_in_transformers(model, dequantized, report, inputs, tmp_path)


def test_an_fp8_router_changes_which_experts_tokens_go_to():
    # Why convert keeps routers: a tiny HunYuan-MoE's router in FP8 sends tokens elsewhere (measured: 7 of 128
    # tokens change their top-2 experts), where the router convert keeps picks as before.
    torch.manual_seed(0)
    model, _ = _tiny_moe("HunYuanMoEV1")
    model.eval()
    hidden = torch.randn(128, 64, generator=torch.Generator().manual_seed(0))
    gate = model.model.layers[0].mlp.gate
    with torch.no_grad():
        reference = gate(hidden)[2].sort(-1).values
        fp8_gate = copy.deepcopy(gate)
        fp8_gate.wg = ops.nn.Fp8Linear.from_linear(gate.wg, "blockwise")
        moved = (fp8_gate(hidden)[2].sort(-1).values != reference).any(-1).sum().item()
        ops.nn.convert(model, fp8="blockwise")
        assert torch.equal(model.model.layers[0].mlp.gate(hidden)[2].sort(-1).values, reference)
    assert moved >= 3


def _tiny_task_model(name):
    """A transformers task model whose head has a multiple of 16 outputs, its inputs, and the head's name."""
    transformers = pytest.importorskip("transformers")
    ids = torch.randint(0, 128, (2, 12))
    bert = transformers.BertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                   intermediate_size=64, num_labels=32 if "Token" in name else 16)
    if name == "ViTForImageClassification":
        config = transformers.ViTConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                        intermediate_size=64, image_size=32, patch_size=8, num_labels=16)
        return transformers.ViTForImageClassification(config), {"pixel_values": torch.randn(2, 3, 32, 32)}, "classifier"
    if name == "LlamaForSequenceClassification":
        config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_labels=16,
                                          pad_token_id=0)
        return transformers.LlamaForSequenceClassification(config), {"input_ids": ids + 1}, "score"
    return getattr(transformers, name)(bert), {"input_ids": ids}, "classifier"


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "BertForTokenClassification",
                                  "ViTForImageClassification", "LlamaForSequenceClassification"])
def test_convert_fp8_keeps_task_heads_in_high_precision(name, tmp_path):
    # The head of a task model is what lies outside its base model (base_model_prefix): num_labels of 16 or
    # 32 would let a rule by size quantize it.
    model, inputs, head = _tiny_task_model(name)
    model.eval()
    dequantized = copy.deepcopy(model)
    reference = _fp8_logits(model, inputs)
    report = ops.nn.convert(model, fp8="blockwise")
    kept = dict(report.kept_high_precision)
    assert kept == {head: "an output head (its errors reach the model's output undamped)"}
    assert type(model.get_submodule(head)) is ops.nn.Linear and model.get_submodule(head).out_features % 16 == 0
    assert head in model.config.quantization_config.modules_to_not_convert and len(report.fp8) >= 6
    logits = _fp8_logits(model, inputs)
    assert F.cosine_similarity(logits.flatten(), reference.flatten(), dim=0) > 0.99
    _reloads_in_transformers(model, dequantized, report, inputs, tmp_path)


def test_convert_fp8_keeps_what_a_model_keeps_in_float32():
    # T5 lists "wo" in _keep_in_fp32_modules and casts the activations to wo's weight dtype before it: an FP8
    # wo would receive FP8 activations.
    transformers = pytest.importorskip("transformers")
    config = transformers.T5Config(vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=1, num_heads=4,
                                   decoder_start_token_id=0)
    model = transformers.T5ForConditionalGeneration(config).eval()
    ids = torch.randint(0, 128, (2, 8))
    with torch.no_grad():
        reference = model(input_ids=ids, decoder_input_ids=ids).logits
        report = ops.nn.convert(model, fp8="rowwise")
        logits = model(input_ids=ids, decoder_input_ids=ids).logits
    kept = dict(report.kept_high_precision)
    wo = {"encoder.block.0.layer.1.DenseReluDense.wo", "decoder.block.0.layer.2.DenseReluDense.wo"}
    assert set(kept) == wo | {"lm_head"} and all("_keep_in_fp32_modules" in kept[name] for name in wo)
    assert wo <= set(model.config.quantization_config.modules_to_not_convert) and len(report.fp8) >= 8
    assert F.cosine_similarity(logits.flatten(), reference.flatten(), dim=0) > 0.99


# ---- converting again -----------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
def test_convert_fp8_after_convert_quantizes_the_ops_linears(recipe):
    # ops.nn.Linear is nn.Linear's maths: convert(fp8=...) quantizes it as it would the nn.Linear.
    from conftest import tiny_hf_decoder

    once = tiny_hf_decoder("Llama").eval()
    twice = copy.deepcopy(once)
    expected = ops.nn.convert(once, fp8=recipe)
    first = ops.nn.convert(twice)
    assert len(first.linear) == 15 and not first.fp8
    report = ops.nn.convert(twice, fp8=recipe)
    assert report.fp8 == report.quantized == expected.fp8 and len(report.fp8) == 14
    assert report.kept_high_precision == expected.kept_high_precision == [
        ("lm_head", "an output head (its errors reach the model's output undamped)")]
    assert not report.linear and type(twice.lm_head) is ops.nn.Linear
    assert report.quantization_config == expected.quantization_config
    assert twice.config.quantization_config.to_dict() == once.config.quantization_config.to_dict()
    ids = torch.randint(0, 128, (2, 12))
    with torch.no_grad():
        assert torch.equal(twice(ids).logits, once(ids).logits)


def test_convert_fp8_keeps_an_ops_linear_s_activation():
    linear = ops.nn.Linear(64, 32, activation="gelu")
    model = torch.nn.Sequential(linear)
    x = torch.randn(4, 64)
    with torch.no_grad():
        expected = ops.nn.Fp8Linear.from_linear(linear, "rowwise", activation="gelu")(x)
        report = ops.nn.convert(model, fp8="rowwise")
        assert report.fp8 == ["0"] and model[0].activation == "gelu" and torch.equal(model(x), expected)


def test_convert_fp8_to_another_recipe_raises_and_changes_nothing():
    from conftest import tiny_hf_decoder

    model = tiny_hf_decoder("Llama").eval()
    ops.nn.convert(model, fp8="rowwise")
    before = {name: t.clone() for name, t in model.state_dict().items()}
    modules = dict(model.named_modules())
    with pytest.raises(ValueError, match=r"ops.nn.convert: fp8='blockwise', but model.layers.0.self_attn.q_proj is "
                                         r"already FP8 \(Fp8Linear, rowwise\): quantizing its codes again would round "
                                         r"the weights twice. Pass fp8='rowwise' to keep them"):
        ops.nn.convert(model, fp8="blockwise")
    assert dict(model.named_modules()) == modules
    for name, t in model.state_dict().items():
        assert torch.equal(t.view(torch.uint8) if t.dtype == E4 else t, before[name].view(torch.uint8)
                           if t.dtype == E4 else before[name]), name
    # The same recipe again: the FP8 Linears are what was asked, and are listed; nothing is quantized again.
    report = ops.nn.convert(model, fp8="rowwise")
    assert len(report.fp8) == 14 and not report.quantized and [n for n, _ in report.kept_high_precision] == ["lm_head"]
    assert all(modules[name] is module for name, module in model.named_modules())
    assert len(model._load_state_dict_pre_hooks) == 1  # convert's checkpoint-key hook, given once


# ---- MoE checkpoints back into ops' modules ---------------------------------------------------------------


def _tiny_checkpointed_moe(family):
    """A transformers MoE model whose save_pretrained writes its experts one per expert (transformers' fused
    experts modules), 16 experts, hidden 64."""
    transformers = pytest.importorskip("transformers")
    decoder = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    if family == "Qwen3Moe":
        config = transformers.Qwen3MoeConfig(**decoder, head_dim=16, intermediate_size=128, moe_intermediate_size=32,
                                             num_experts=16, num_experts_per_tok=2)
    elif family == "Qwen2Moe":
        config = transformers.Qwen2MoeConfig(**decoder, intermediate_size=128, moe_intermediate_size=32,
                                             shared_expert_intermediate_size=32, num_experts=16, num_experts_per_tok=2)
    elif family == "Mixtral":
        config = transformers.MixtralConfig(**decoder, head_dim=16, intermediate_size=32, num_local_experts=16,
                                            num_experts_per_tok=2)
    else:
        assert family == "DeepseekV3"
        config = transformers.DeepseekV3Config(  # MLA: as many key-value heads as heads
            **dict(decoder, num_key_value_heads=4), intermediate_size=128, moe_intermediate_size=32,
            n_routed_experts=16, num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
            q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16)
    return getattr(transformers, f"{family}ForCausalLM")(config).eval()


@pytest.mark.parametrize("family, recipe", [("Qwen3Moe", "blockwise"), ("Qwen3Moe", "rowwise"),
                                            ("Qwen2Moe", "blockwise"), ("Mixtral", "rowwise"),
                                            ("DeepseekV3", "blockwise")])
def test_an_fp8_moe_checkpoint_loads_back_into_ops_modules_bit_for_bit(family, recipe, tmp_path):
    # The documented route: the stock model from the config, convert(fp8=...), load_state_dict of the file.
    # save_pretrained writes transformers' experts one per expert (and Mixtral's blocks as block_sparse_moe):
    # convert lets load_state_dict take those keys, through transformers' own conversion mapping.
    transformers = pytest.importorskip("transformers")
    safetensors = pytest.importorskip("safetensors.torch")
    model = _tiny_checkpointed_moe(family)
    ops.nn.convert(model, fp8=recipe)
    ids = torch.randint(0, 128, (2, 12))
    with torch.no_grad():
        logits = model(ids).logits
    model.save_pretrained(tmp_path)
    saved = safetensors.load_file(tmp_path / "model.safetensors")
    assert any(".experts.0." in key for key in saved) and not set(saved) <= set(model.state_dict())
    for strict in (True, False):
        again = type(model)._from_config(transformers.AutoConfig.from_pretrained(tmp_path)).eval()
        ops.nn.convert(again, fp8=recipe)
        result = again.load_state_dict(safetensors.load_file(tmp_path / "model.safetensors"), strict=strict)
        assert not result.missing_keys and not result.unexpected_keys
        with torch.no_grad():
            assert torch.equal(again(ids).logits, logits)
    # The model's own keys load as ever; a checkpoint missing an expert is an error, not random weights.
    assert str(again.load_state_dict(model.state_dict())) == "<All keys matched successfully>"
    partial = safetensors.load_file(tmp_path / "model.safetensors")
    del partial[next(key for key in partial if ".experts.3." in key)]
    with pytest.raises(RuntimeError, match=r"model.layers.[01].mlp.experts"):
        again.load_state_dict(partial, strict=False)
