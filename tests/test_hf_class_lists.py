"""ops' transformers class lists (ops/_hf_classes.py) hold exactly the classes of the installed transformers
that compute a reference class's formula: every class of every importable
``transformers.models.<folder>.modeling_*`` module whose own ``forward`` is the reference's forward, the
same code up to docstrings, comments, annotations, argument and local names and ``v = e; return v``
written ``return e``, and, for a block recipe, whose ``__init__`` builds the parts the recipe reads (an
``nn.Linear`` for each projection, an activation from ``ACT2FN`` or a torch.nn activation the recipe
knows). The recipe checks those parts again at every call; tests/test_models.py runs every listed class
against its stock output."""

import ast
import glob
import importlib
import inspect
import os
import textwrap
import warnings

import pytest
import torch

import ops
from ops import _hf_classes

pytestmark = pytest.mark.slow


def _recipe(name):
    return ops.recipes.RECIPES[name]


# list -> (the classes ops lists, the reference classes as (folder, class), the recipe whose parts
# __init__ must build, None for a norm: convert checks a norm's weight and eps itself).
LISTS = {
    "RMS_NORM_LLAMA": (_hf_classes.RMS_NORM_LLAMA, [("llama", "LlamaRMSNorm")], None),
    # Helium's form casts the weight to float32 before the multiply: the same values for weights of
    # float32 and narrower types.
    "RMS_NORM_CAST": (_hf_classes.RMS_NORM_CAST, [("olmo2", "Olmo2RMSNorm"), ("helium", "HeliumRMSNorm")], None),
    "dense_act": (_recipe("dense_act").classes, [("bert", "BertIntermediate")], _recipe("dense_act")),
    "gated_mlp": (_recipe("gated_mlp").classes, [("llama", "LlamaMLP")], _recipe("gated_mlp")),
    "gate_up_mlp": (_recipe("gate_up_mlp").classes, [("phi3", "Phi3MLP")], _recipe("gate_up_mlp")),
}


def normalized_forward(fn) -> str:
    """ops' normalized form of a function's source (names by position, no docstring or annotations)."""
    return _hf_classes.normalized_forward(inspect.getsource(fn))


def _self_attributes(fn) -> frozenset:
    """The ``self.<name>`` attributes a function reads."""
    return frozenset(n.attr for n in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(fn))))
                     if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self")


def _known_activation(value, recipe) -> bool:
    """ACT2FN[...] (the config chooses; the recipe checks at each call), or a torch.nn activation built
    with constant arguments that the recipe knows."""
    if isinstance(value, ast.Subscript):
        return ast.unparse(value.value) == "ACT2FN"
    if not (isinstance(value, ast.Call) and not value.args
            and all(isinstance(k.value, ast.Constant) and k.arg for k in value.keywords)):
        return False
    func = ast.unparse(value.func)
    cls = getattr(torch.nn, func.rpartition(".")[2], None) if func.rpartition(".")[0] in ("nn", "torch.nn") else None
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        return False
    return ops.recipes.activation_of(cls(**{k.arg: k.value.value for k in value.keywords})) in recipe.acts


def builds_parts(cls, recipe) -> bool:
    """Whether cls.__init__ assigns (on some branch) an nn.Linear to each projection the recipe reads and a
    known activation to its activation attribute."""
    assigned = {}
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))):
        for target in node.targets if isinstance(node, ast.Assign) else ():
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                assigned.setdefault(target.attr, []).append(node.value)
    linear = ("nn.Linear", "torch.nn.Linear")
    return (all(any(isinstance(v, ast.Call) and ast.unparse(v.func) in linear for v in assigned.get(name, ()))
                for name in recipe.linears)
            and any(_known_activation(v, recipe) for v in assigned.get(recipe.activation, ())))


def _modeling_modules(transformers):
    root = os.path.dirname(transformers.models.__file__)
    for path in sorted(glob.glob(os.path.join(root, "*", "modeling_*.py"))):
        folder, name = os.path.basename(os.path.dirname(path)), os.path.basename(path)[:-3]
        yield f"transformers.models.{folder}.{name}", path


def _name(key) -> str:
    """A key as _hf_classes writes it: folder.Class or folder.module.Class."""
    module, qualname = key
    _, _, folder, file = module.split(".")
    return f"{folder}.{qualname}" if file == f"modeling_{folder}" else f"{folder}.{file}.{qualname}"


def scan_transformers(transformers):
    """{list: the classes found}, and the modeling modules judged: those that exist, less those that do not
    import here. ``print_lists`` writes the found lists as _hf_classes spells them."""
    references = {}
    for name, (_, refs, _) in LISTS.items():
        forwards = []
        for folder, qualname in refs:
            try:
                forwards.append(getattr(importlib.import_module(f"transformers.models.{folder}.modeling_{folder}"),
                                        qualname).forward)
            except (ImportError, AttributeError):  # a reference this transformers lacks
                continue
        # A forward with a reference's AST reads the reference's attributes: its file names them all.
        references[name] = ({normalized_forward(fn) for fn in forwards}, [_self_attributes(fn) for fn in forwards])
    found, judged = {name: set() for name in LISTS}, set()
    for module_name, path in _modeling_modules(transformers):
        judged.add(module_name)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        wanted = [name for name, (_, attrs) in references.items() if any(all(a in text for a in s) for s in attrs)]
        if not wanted:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = importlib.import_module(module_name)
        except Exception:  # noqa: BLE001 - a model whose optional dependencies are missing here
            judged.discard(module_name)
            continue
        for cls in vars(module).values():
            # The class's own forward, as ops._hf_classes.class_key requires.
            if not (isinstance(cls, type) and cls.__module__ == module_name and "forward" in vars(cls)
                    and getattr(cls.forward, "__qualname__", None) == f"{cls.__qualname__}.forward"):
                continue
            try:
                forward = normalized_forward(cls.forward)
            except (OSError, TypeError, SyntaxError):  # no source (a wrapped or generated forward)
                continue
            for name in wanted:
                recipe = LISTS[name][2]
                if forward in references[name][0] and (recipe is None or builds_parts(cls, recipe)):
                    found[name].add((module_name, cls.__qualname__))
    return found, judged


def print_lists():
    """The lists this transformers gives, in _hf_classes' notation (python -c "import test_hf_class_lists as t;
    t.print_lists()" in tests/)."""
    import transformers

    for name, keys in scan_transformers(transformers)[0].items():
        print(f"{name} ({len(keys)}):")
        print(textwrap.fill(" ".join(sorted(map(_name, keys), key=str.lower)), width=108, initial_indent="    ",
                            subsequent_indent="    ", break_on_hyphens=False, break_long_words=False))


@pytest.fixture(scope="module")
def scan():
    return scan_transformers(pytest.importorskip("transformers"))


def test_the_normalization_ignores_names_docstrings_and_a_returned_temporary():
    def a(self, x):
        """Docstring."""
        y = self.down(self.act(self.gate(x)) * self.up(x))  # a comment
        return y

    def b(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.gate(hidden)) * self.up(hidden))

    def c(self, x):
        return self.down(self.act(self.up(x)) * self.gate(x))

    assert normalized_forward(a) == normalized_forward(b) != normalized_forward(c)


def test_a_reference_forward_over_parts_the_recipe_never_takes_is_not_listed():
    # Gemma-4's vision MLP runs LlamaMLP's forward over clippable wrappers of nn.Linear, which the recipe
    # never reads in place of calling them; Deimv2's SwiGLU builds nn.SiLU() itself, which it does.
    transformers = pytest.importorskip("transformers")
    llama = transformers.models.llama.modeling_llama
    try:
        gemma4 = importlib.import_module("transformers.models.gemma4.modeling_gemma4")
        deimv2 = importlib.import_module("transformers.models.deimv2.modeling_deimv2")
    except ImportError:
        pytest.skip("this transformers has no Gemma-4 or DEIMv2")
    recipe = _recipe("gated_mlp")
    for cls in (gemma4.Gemma4VisionMLP, deimv2.Deimv2SwiGLUFFN):
        assert normalized_forward(cls.forward) == normalized_forward(llama.LlamaMLP.forward)
    assert not builds_parts(gemma4.Gemma4VisionMLP, recipe) and builds_parts(deimv2.Deimv2SwiGLUFFN, recipe)
    assert builds_parts(llama.LlamaMLP, recipe) and not builds_parts(llama.LlamaMLP, _recipe("gate_up_mlp"))
    assert (gemma4.__name__, "Gemma4VisionMLP") not in recipe.classes
    assert (deimv2.__name__, "Deimv2SwiGLUFFN") in recipe.classes


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")
@pytest.mark.parametrize("name", list(LISTS))
def test_each_list_is_every_class_with_the_reference_formula(name, scan):
    found, judged = scan
    listed, references, _ = LISTS[name]
    assert found[name], f"{name}: no class found, not even the references {references}"
    missing = found[name] - listed
    # A listed class this transformers lacks (another release) or cannot import is not judged here.
    wrong = {key for key in listed if key[0] in judged} - found[name]
    assert not missing and not wrong, (
        f"{name}: classes with the reference formula that are not listed: {' '.join(sorted(map(_name, missing)))}; "
        f"listed classes that do not have it: {' '.join(sorted(map(_name, wrong)))}")


@pytest.mark.parametrize("name", list(LISTS))
def test_each_lists_formula_is_its_reference_classes_forward(name):
    # The formulas convert compares classes with at run time (ops._hf_classes.formula_changed) are the
    # installed references' forwards: a release that changes a reference fails here.
    transformers = pytest.importorskip("transformers")
    listed, references, _ = LISTS[name]
    formulas = {_hf_classes.normalized_forward(f) for f in listed.formulas}
    for folder, qualname in references:
        cls = getattr(importlib.import_module(f"transformers.models.{folder}.modeling_{folder}"), qualname, None)
        if cls is not None:
            assert normalized_forward(cls.forward) in formulas, f"{name}: {qualname} {transformers.__version__}"


class ChangedRMSNorm(torch.nn.Module):
    """LlamaRMSNorm's attributes, Gemma's formula ((1 + weight) * x_hat)."""

    def __init__(self, hidden):
        super().__init__()
        self.weight, self.variance_epsilon = torch.nn.Parameter(torch.randn(hidden)), 1e-6

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return (1 + self.weight) * hidden_states.to(input_dtype)


class ClampedMLP(torch.nn.Module):
    """LlamaMLP's parts; its forward clamps the product (as BailingHybridMLP's in transformers 5.25)."""

    def __init__(self, hidden):
        super().__init__()
        self.gate_proj, self.up_proj = torch.nn.Linear(hidden, 32), torch.nn.Linear(hidden, 32)
        self.down_proj, self.act_fn = torch.nn.Linear(32, hidden), torch.nn.SiLU()

    def forward(self, x):
        return self.down_proj((self.act_fn(self.gate_proj(x)) * self.up_proj(x)).clamp(-0.1, 0.1))


class RenamedMLP(ClampedMLP):
    """LlamaMLP's forward, other names."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out = self.down_proj(self.act_fn(self.gate_proj(hidden)) * self.up_proj(hidden))
        return out


def test_convert_leaves_a_listed_class_alone_whose_forward_is_not_its_lists_formula(monkeypatch):
    # As if a transformers release changed listed classes' forwards: convert compares each with its list's
    # formula at run time and reports the changed ones instead of converting them.
    def listed(classes, *extra):
        return _hf_classes.ClassList(classes | {(c.__module__, c.__qualname__) for c in extra}, classes.formulas)

    monkeypatch.setattr(_hf_classes, "RMS_NORM_LLAMA", listed(_hf_classes.RMS_NORM_LLAMA, ChangedRMSNorm))
    recipe = _recipe("gated_mlp")
    monkeypatch.setattr(recipe, "classes", listed(recipe.classes, ClampedMLP, RenamedMLP))
    torch.manual_seed(0)
    model = torch.nn.Sequential(ChangedRMSNorm(16), ClampedMLP(16), RenamedMLP(16))
    x = torch.randn(3, 16)
    expected = model(x)
    report = ops.nn.convert(model)
    assert type(model[0]) is ChangedRMSNorm and report.rms_norm == []
    assert report.recipes == [("2", "gated_mlp")]
    reasons = dict(report.skipped)
    assert "ChangedRMSNorm.forward in transformers" in reasons["0"]
    assert "ClampedMLP.forward in transformers" in reasons["1"] and "not the formula" in reasons["1"]
    torch.testing.assert_close(model(x), expected)


def test_the_docs_count_the_lists():
    # README.md and docs/fusion.md state the lists' sizes and the transformers release they come from.
    from conftest import REPO

    readme = open(os.path.join(REPO, "README.md")).read()
    fusion = open(os.path.join(REPO, "docs", "fusion.md")).read()
    norms = len(_hf_classes.RMS_NORM_LLAMA) + len(_hf_classes.RMS_NORM_CAST)
    assert f"and {norms} listed transformers" in readme.replace("\n", " ")
    assert f"({len(_hf_classes.RMS_NORM_LLAMA)} with Llama's formula, {len(_hf_classes.RMS_NORM_CAST)} with Olmo2's" \
        in fusion
    for name, blocks in (("dense_act", _hf_classes.DENSE_ACT), ("gated_mlp", _hf_classes.GATED_MLP),
                         ("gate_up_mlp", _hf_classes.GATE_UP_MLP)):
        assert f"| `{name}` | {len(blocks)} blocks with" in fusion, name
    release = " ".join(_hf_classes.__doc__.split()).split("Listed from transformers ")[1].split()[0]
    assert f"every class of transformers {release} whose" in fusion
