"""Every public op (tests/op_registry.py) in every execution mode PyTorch has: eager values against the
reference, bad inputs (the fake kernel says the same), autograd (or its refusal), opcheck (schema, fake tensors,
AOT dispatch), torch.compile without graph breaks (also dynamic shapes and non-contiguous inputs), torch.export,
TorchScript, and the fake kernel's metadata against the real kernel's. vmap, AOTInductor, C++, DDP and streams:
test_vmap.py, test_export.py, test_cpp_loader.py, test_distributed.py, test_streams.py."""

import warnings

import pytest
import torch
import torch._dynamo

from conftest import DEVICES
from op_registry import OP_IDS, OPS, bits, flatten

ops_params = pytest.mark.parametrize("spec", OPS, ids=OP_IDS)
TS_SCRIPT_DEPRECATION = r"`torch\.jit\.script` is deprecated"


def test_registry_lists_every_public_op():
    # The public ops are the library's schemas without a leading underscore (csrc/registration.cpp): a new one
    # fails here until it has an OpSpec, and so reaches every mode.
    public = {name.split("::")[1].split(".")[0] for name in torch._C._dispatch_get_all_op_names()
              if name.startswith("ops::") and not name.startswith("ops::_")}
    assert set(OP_IDS) == public and len(OP_IDS) == len(public), sorted(public ^ set(OP_IDS))
    for spec in OPS:
        assert spec.errors and (spec.differentiable == (spec.grad_error is None)), spec.name
        assert (spec.opcheck_utils is None) == ("test_schema" not in spec.skips), spec.name


def _snapshot(values):
    return [bits(v).clone() if isinstance(v, torch.Tensor) and v.layout == torch.strided else None for v in values]


def _unchanged(values, snapshot):
    return all(s is None or torch.equal(bits(v), s) for v, s in zip(values, snapshot))


def _same(spec, got, expected):
    """Results of two runs of one kernel: bit for bit where the reference is exact, else torch's tolerances."""
    if spec.exact:
        spec.check(got, expected, exact=True)
    else:
        torch.testing.assert_close(flatten(got), flatten(expected))


@ops_params
def test_values_equal_the_reference_on_cpu(spec):
    # Bit for bit where the reference is the op's formula (spec.exact), else within the dtype's tolerance of float64.
    checked = 0
    for dtype in spec.dtypes:
        for sample in spec.samples("cpu", dtype, False):
            got = spec.run(spec.call, sample.args, sample.kwargs)
            spec.check(got, spec.reference(*sample.args, **sample.kwargs), exact=spec.exact)
            checked += 1
        for sample in (spec.out_samples("cpu", dtype) if spec.out_overload else []):
            out = sample.kwargs["out"]
            spec.out_overload(*sample.args, **sample.kwargs)
            spec.check(out, spec.reference(*sample.args, **sample.kwargs), exact=spec.exact)
    assert checked >= 20


def test_values_check_can_fail():
    # A negative control: the largest FP8 code one step smaller fails the exact check; two steps, the tolerance too.
    spec = next(s for s in OPS if s.name == "quantize_fp8")
    codes, scale = spec.reference(*spec.samples("cpu", torch.float32, False)[0].args)
    largest = int(codes.float().abs().argmax())
    for steps, exact in ((1, True), (2, False)):
        wrong = codes.clone()
        wrong.view(torch.uint8).view(-1)[largest] -= steps  # sign and magnitude: toward zero either way
        with pytest.raises(AssertionError):
            spec.check((wrong, scale), (codes, scale), exact=exact)
    spec.check((codes, scale), (codes, scale), exact=True)


BAD_INPUTS = [(spec, case) for spec in OPS for case in spec.errors]


@pytest.mark.parametrize("spec, case", BAD_INPUTS, ids=[f"{spec.name}-{case.name}" for spec, case in BAD_INPUTS])
def test_bad_inputs_raise_the_ops_error_and_the_fake_kernel_says_the_same(spec, case):
    messages = []
    for device in ("cpu", "meta"):
        args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in case.args]
        kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in case.kwargs.items()}
        before = _snapshot(args + list(kwargs.values())) if device == "cpu" else None
        with pytest.raises(case.error, match=case.pattern) as info:
            spec.call(*args, **kwargs)
        messages.append(str(info.value).splitlines()[0])
        assert messages[-1].startswith(f"{spec.name}: "), messages[-1]
        if before is not None:
            assert _unchanged(args + list(kwargs.values()), before)  # nothing written before the error
    assert messages[0] == messages[1], messages


@ops_params
def test_non_differentiable_ops_refuse_grad(spec):
    if spec.differentiable:
        pytest.skip("differentiable: test_gradcheck")
    # Each tensor argument of each sample in turn (weights, scales and biases too); under no_grad the call runs.
    names = [a.name for a in spec.overload._schema.arguments]
    samples, checked = spec.samples("cpu", torch.float32, False), 0
    for sample in samples:
        for i in spec.data_positions(sample):
            args = [a.detach().clone().requires_grad_() if j == i else a for j, a in enumerate(sample.args)]
            with pytest.raises(RuntimeError, match=f"^{spec.name}: " + spec.grad_error.format(arg=names[i])):
                spec.run(spec.call, args, sample.kwargs)
            with torch.no_grad():
                assert not any(t.requires_grad for t in spec.run(spec.call, args, sample.kwargs))
            checked += 1
    assert checked > len(samples)


@ops_params
@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(spec, device):
    spec.skip("autograd")
    for sample in spec.samples(device, torch.float64, True):
        tensors = [a for a in sample.args if isinstance(a, torch.Tensor)]
        # gradcheck's numerical gradients cannot perturb empty or self-overlapping (expanded) inputs.
        if any(a.numel() == 0 or any(st == 0 and n > 1 for st, n in zip(a.stride(), a.shape))
               for a in tensors):
            continue
        assert torch.autograd.gradcheck(spec.call, sample.args, **sample.kwargs), sample.name
        assert torch.autograd.gradgradcheck(spec.call, sample.args), sample.name


@ops_params
@pytest.mark.parametrize("device", DEVICES)
def test_backward_matches_reference_and_no_registration_warning(spec, device):
    spec.skip("autograd")
    for sample in spec.samples(device, torch.float32, True):
        with warnings.catch_warnings():
            # "autograd kernel was not registered" would mean a silent no-grad path: make it an error.
            warnings.filterwarnings("error", message=".*autograd kernel was not registered.*")
            out = spec.call(*sample.args, **sample.kwargs)
            data = spec.data_positions(sample)
            tensors = [sample.args[i] for i in data]
            grads = torch.autograd.grad(out.sum(), tensors, allow_unused=True)
        ref_args = [a.detach().double().requires_grad_() if i in data else a for i, a in enumerate(sample.args)]
        ref_tensors = [ref_args[i] for i in data]
        ref_grads = torch.autograd.grad(spec.reference(*ref_args).sum(), ref_tensors, allow_unused=True)
        for g, rg in zip(grads, ref_grads):
            torch.testing.assert_close(g.double(), rg, atol=1e-4, rtol=1e-4)


@ops_params
@pytest.mark.parametrize("device", DEVICES)
def test_only_needed_gradients_are_computed(spec, device):
    spec.skip("autograd")
    args = list(spec.samples(device, torch.float32, False)[0].args)
    args[0] = args[0].detach().requires_grad_()
    assert all(not (isinstance(a, torch.Tensor) and a.requires_grad) for a in args[1:])
    out = spec.call(*args)
    out.sum().backward()
    assert args[0].grad is not None and all(a.grad is None for a in args[1:] if isinstance(a, torch.Tensor))


@ops_params
@pytest.mark.parametrize("device", DEVICES)
def test_out_variant_rejects_requires_grad(spec, device):
    if spec.out_overload is None:
        pytest.skip("no out variant")
    sample = spec.out_samples(device, torch.float32)[0]
    data = spec.data_positions(sample)
    args = [a.detach().requires_grad_() if i in data else a for i, a in enumerate(sample.args)]
    expected = "the out= variant does not support automatic differentiation" if spec.differentiable else \
        spec.grad_error.format(arg=spec.out_overload._schema.arguments[data[0]].name)  # the op's own refusal
    with pytest.raises(RuntimeError, match=expected):
        spec.out_overload(*args, **sample.kwargs)
    with torch.no_grad():
        spec.out_overload(*args, **sample.kwargs)  # allowed without grad mode, like torch.mm(out=)


@ops_params
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck(spec, device, requires_grad):
    if requires_grad:
        spec.skip("autograd")
    utils = {"test_utils": spec.opcheck_utils} if spec.opcheck_utils else {}  # None: all of opcheck's tests
    for dtype in spec.dtypes:
        for sample in spec.samples(device, dtype, requires_grad):
            # The schema's claim that no other input is written, also where test_schema cannot run (spec.skips).
            values = [a for i, a in enumerate(sample.args) if i not in spec.mutated] + list(sample.kwargs.values())
            before = _snapshot(values)
            torch.library.opcheck(spec.overload, sample.args, sample.kwargs, **utils)
            assert _unchanged(values, before), sample.name
    if spec.out_overload is not None and not requires_grad:
        for sample in spec.out_samples(device, torch.float32):
            before = _snapshot(sample.args)
            torch.library.opcheck(spec.out_overload, sample.args, sample.kwargs, **utils)
            assert _unchanged(sample.args, before), sample.name


@ops_params
@pytest.mark.parametrize("device", DEVICES)
def test_fake_kernel_metadata_matches_real(spec, device):
    from torch._subclasses.fake_tensor import FakeTensorMode

    for sample in spec.samples(device, torch.float32, False):
        real = spec.run(spec.overload, sample.args, sample.kwargs)
        with FakeTensorMode(allow_non_fake_inputs=False) as mode:
            fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in sample.args]
            fake = spec.run(spec.overload, fake_args, sample.kwargs)
        assert [(f.shape, f.stride(), f.dtype, f.device) for f in fake] == \
            [(r.shape, r.stride(), r.dtype, r.device) for r in real], sample.name


# Tensors that are not dense and strided, as a user might pass them, with the fix the error suggests.
NON_STRIDED = {
    "sparse_coo": (lambda t: t.to_sparse(), "a sparse COO tensor", r"\.to_dense\(\)"),
    "sparse_csr": (lambda t: t.to_sparse_csr() if t.dim() == 2 else None, "layout SparseCsr", r"\.to_dense\(\)"),
    # on the meta device (a sparse tensor made under FakeTensorMode's meta conversion, or by .to("meta"))
    "sparse_coo_meta": (lambda t: t.to_sparse().to("meta"), "a sparse COO tensor", r"\.to_dense\(\)"),
    "nested": (lambda t: torch.nested.nested_tensor([t, t]), "a nested tensor", r"\.unbind\(\)"),
    # A Python subclass, not a dispatch key: ops/_nested.py gives the ops' errors (not bare
    # NotImplementedErrors, nor for rms_norm torch's "Normalization over the ragged dim not supported").
    "nested_jagged": (lambda t: torch.nested.nested_tensor([t, t], layout=torch.jagged) if t.dim() >= 1 else None,
                      "a nested tensor", r"\.unbind\(\)"),
    "quantized": (lambda t: torch.quantize_per_tensor(t, 0.1, 0, torch.qint8), "a quantized tensor",
                  r"\.dequantize\(\)"),
}


@ops_params
@pytest.mark.parametrize("layout", list(NON_STRIDED))
@pytest.mark.filterwarnings("ignore:.*(beta|prototype|deprecated).*:UserWarning")  # making the inputs
def test_non_strided_argument_gets_an_error_naming_op_and_argument(spec, layout):
    # Without the library's kernels for these backends, PyTorch's message names neither the argument nor
    # the fix ("Could not run 'ops::rms_norm' with arguments from the 'SparseCPU' backend").
    convert, kind, fix = NON_STRIDED[layout]
    calls = [(spec.name, spec.overload, spec.samples("cpu", torch.float32, False)[0])]
    if spec.out_overload:
        calls.append((f"{spec.name}.out", spec.out_overload, spec.out_samples("cpu", torch.float32)[0]))
    checked = 0
    for op_name, overload, sample in calls:  # through the Python API, each tensor argument in turn
        names = [a.name for a in overload._schema.arguments]
        values = list(sample.args) + list(sample.kwargs.values())
        for i, value in enumerate(values):
            # torch makes no sparse, nested or quantized FP8 tensors
            usable = isinstance(value, torch.Tensor) and value.element_size() > 1
            quantizable = usable and (value.is_floating_point() or layout != "quantized")
            converted = convert(value.detach()) if quantizable else None
            if converted is None:
                continue
            args, kwargs = list(sample.args), dict(sample.kwargs)
            if i < len(args):
                args[i], name = converted, names[i]
            else:
                name = list(kwargs)[i - len(args)]
                kwargs[name] = converted
            before = _snapshot(values)
            with pytest.raises(RuntimeError, match=rf"^{op_name}: expected {name} to be a dense \(strided\) "
                                                   rf"tensor, got .*{kind}.*{fix}"):
                spec.call(*args, **kwargs)
            assert _unchanged(values, before)  # nothing written (fused_add_rms_norm's input by its residual's error)
            checked += 1
    assert checked > 0


def test_opcheck_can_fail():
    # A negative control: an op whose output aliases its input violates its schema; opcheck must say so.
    @torch.library.custom_op("ops_test::bad_alias", mutates_args=())
    def bad_alias(x: torch.Tensor) -> torch.Tensor:
        return x.view(-1)

    @bad_alias.register_fake
    def _(x):
        return x.new_empty(x.numel())

    with pytest.raises(Exception, match="alias"):
        torch.library.opcheck(bad_alias, (torch.randn(3),))


@ops_params
@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_no_graph_breaks(spec, device):
    torch._dynamo.reset()
    model = spec.module().to(device)
    x = spec.module_input(8).to(device)
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(x), model(x))


@ops_params
@pytest.mark.parametrize("device", DEVICES)
def test_compile_dynamic_shapes(spec, device):
    torch._dynamo.reset()
    model = spec.module().to(device)
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for n in (3, 8, 17, 1):
        x = spec.module_input(n).to(device)
        torch.testing.assert_close(compiled(x), model(x))


@ops_params
@pytest.mark.parametrize("device", DEVICES)
def test_compile_non_contiguous_and_transposed_inputs(spec, device):
    torch._dynamo.reset()
    compiled = torch.compile(spec.call, fullgraph=True)
    samples = spec.samples(device, torch.float32, False)
    # One graph per sample where their options (strings, None or a tensor) differ, not an error past 8.
    with torch._dynamo.config.patch(recompile_limit=2 * len(samples)):
        for sample in samples:
            # the arguments it writes too (copies: OpSpec.run), written back by the compiled code
            _same(spec, spec.run(compiled, sample.args, sample.kwargs),
                  spec.run(spec.call, sample.args, sample.kwargs))


@ops_params
@pytest.mark.parametrize("device", DEVICES)
def test_export_with_a_dynamic_batch(spec, device):
    # The graph calls the op itself (not a decomposition), and runs another batch size. AOTInductor and a fresh
    # process: test_export.py.
    model = spec.module().to(device).eval()
    batch = torch.export.Dim("batch", min=1, max=1024)
    exported = torch.export.export(model, (spec.module_input(4).to(device),), dynamic_shapes=({0: batch},))
    assert any(n.target == spec.overload for n in exported.graph.nodes)
    x = spec.module_input(9).to(device)
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(x), model(x))


@ops_params
@pytest.mark.parametrize("device", DEVICES)
def test_torchscript_module_equals_eager(spec, device):
    # A scripted model calls torch.ops.ops.<op> with every argument positional; from C++: test_cpp_loader.py.
    model = spec.module().to(device)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=TS_SCRIPT_DEPRECATION, category=FutureWarning)
        scripted = torch.jit.script(model)
    x = spec.module_input(5).to(device)
    with torch.no_grad():
        torch.testing.assert_close(scripted(x), model(x))


@ops_params
@pytest.mark.parametrize("device", DEVICES)
def test_compile_backward(spec, device):
    spec.skip("autograd")
    torch._dynamo.reset()
    model = spec.module().to(device)
    x = spec.module_input(6).to(device)
    compiled = torch.compile(model, fullgraph=True)
    compiled(x).square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().sum().backward()
    for g, ref in zip(grads, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(g, ref)


@ops_params
@pytest.mark.parametrize("device", DEVICES)
def test_compile_out_variant(spec, device):
    if spec.out_overload is None:
        pytest.skip("no out variant")
    torch._dynamo.reset()

    def f(*args):
        *inputs, out = args
        spec.out_overload(*inputs, out=out)
        return out * 2

    for sample in spec.out_samples(device, torch.float32):
        # Dynamo traces out= calls only with a contiguous out (its rule for every op, torch.mm's too:
        # "Attempted to call op with non-contiguous `out=` tensor"); other outs run eagerly after a
        # graph break, and must still be right.
        fullgraph = sample.kwargs["out"].is_contiguous()
        compiled = torch.compile(f, fullgraph=fullgraph)
        out = sample.kwargs["out"]
        out_c = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=out.device).zero_()
        out_e = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=out.device).zero_()
        torch.testing.assert_close(compiled(*sample.args, out_c), f(*sample.args, out_e))
        torch.testing.assert_close(out_c, out_e)
        torch._dynamo.reset()


def _writes(device):
    """(name of the tensor written, a call writing it) for every op with an out or in-place argument."""
    import ops

    g = torch.Generator().manual_seed(0)

    def t(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    a, b, x, r, w = t(4, 32), t(32, 16), t(4, 32), t(4, 32), t(32)
    codes, scale = ops.quantize_fp8(a, "tensor")
    wcodes, wscale = ops.quantize_fp8(b.t().contiguous(), "tensor")
    experts, offs = t(2, 32, 16), torch.tensor([1, 4], dtype=torch.int32, device=device)
    expert_codes, expert_scales = ops.quantize_fp8(experts, "tensor")[0], t(2, 16).abs()
    return {
        "cutlass_gemm.out": ("out", lambda out: ops.cutlass_gemm(a, b, out=out), t(4, 16)),
        "scaled_gemm.out": ("out", lambda out: ops.scaled_gemm(codes, wcodes.t(), scale, wscale, out_dtype=torch.float32,
                                                               out=out), t(4, 16)),
        "grouped_gemm.out": ("out", lambda out: ops.grouped_gemm(a, experts, offs, out=out), t(4, 16)),
        "scaled_grouped_gemm.out": ("out", lambda out: ops.scaled_grouped_gemm(
            codes, expert_codes, scale.expand(4), expert_scales, offs, out_dtype=torch.float32, out=out), t(4, 16)),
        "fused_add_rms_norm": ("input", lambda inp: ops.fused_add_rms_norm(inp, r.clone(), w), x),
        "fused_add_rms_norm_fp8": ("residual", lambda res: ops.fused_add_rms_norm_fp8(x, res, w), r),
    }


# Every out variant and in-place op of the registry: a new one fails here until _writes has its call.
WRITING_OPS = [f"{s.name}.out" for s in OPS if s.out_overload] + [s.name for s in OPS if s.mutated]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", WRITING_OPS)
@pytest.mark.parametrize("mode", ["grad", "no_grad", "inference_mode"])
def test_a_write_bumps_the_version_once_and_a_saved_tensor_overwritten_is_refused(device, op, mode):
    # As torch's in-place ops: the written tensor's version goes up by one in every mode (inference mode
    # skips the Autograd kernels), so that a backward through it as a saved tensor raises.
    name, call, template = _writes(device)[op]
    context = torch.enable_grad() if mode == "grad" else getattr(torch, mode)()
    plain = template.clone()
    with context:
        call(plain)
    assert plain._version == 1
    if mode == "grad":
        return  # a written tensor that requires grad is refused in grad mode (test_func_transforms)
    saved = template.clone().requires_grad_().exp()  # exp saves its result for its backward
    with context:
        call(saved)
    assert saved._version == 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", WRITING_OPS)
def test_inference_tensors_are_written_only_in_inference_mode(device, op):
    # torch's rule for its own in-place and out= ops, which a call whose tensors are all inference tensors
    # would otherwise bypass (ATen checks it in a dispatch key inference tensors lack).
    name, call, template = _writes(device)[op]
    with torch.inference_mode():
        written, expected = template.clone(), template.clone()
        call(expected)
    before = written.clone()
    with pytest.raises(RuntimeError, match=rf"{op.split('.')[0]}: {name} is an inference tensor .* outside "
                                           "inference mode"):
        call(written)
    assert torch.equal(written, before)
    with torch.inference_mode():
        call(written)
    assert torch.equal(written, expected)
