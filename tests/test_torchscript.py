"""TorchScript: a scripted model calling torch.ops.ops.cutlass_gemm is saved, then loaded and run in a
fresh interpreter after `import ops`; without it, loading fails with a clear message."""

import warnings

import pytest
import torch

import ops  # noqa: F401
from conftest import REPO, run_python

TS_SCRIPT_DEPRECATION = r"`torch\.jit\.script` is deprecated"
TS_LOAD_DEPRECATION = r"`torch\.jit\.load` is deprecated"



class GemmModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.weight = torch.nn.Parameter(torch.randn(16, 8, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.ops.cutlass_gemm(x, self.weight)
        out = torch.empty(y.shape[0], 8, dtype=y.dtype, device=y.device)
        # The out overload, picked by signature; a column-major (transposed view) operand.
        torch.ops.ops.cutlass_gemm(torch.relu(y), self.weight[:8].t(), out=out)
        return out


def _script_and_save(path):
    with warnings.catch_warnings():
        # torch 2.14 deprecates TorchScript: filter exactly that warning, nothing else.
        warnings.filterwarnings("ignore", message=TS_SCRIPT_DEPRECATION, category=FutureWarning)
        scripted = torch.jit.script(GemmModel())
        scripted.save(str(path))
    return scripted


LOAD_AND_RUN = """
import warnings, sys, torch
{imports}
warnings.filterwarnings("ignore", message={load_warning!r}, category=FutureWarning)
m = torch.jit.load(sys.argv[1] if len(sys.argv) > 1 else {path!r})
x = torch.load({x_path!r})
with torch.no_grad():
    torch.save(m(x), {y_path!r})
"""


@pytest.mark.slow
def test_script_save_load_in_fresh_process(tmp_path):
    model_path = tmp_path / "gemm_model.pt"
    scripted = _script_and_save(model_path)
    x = torch.randn(5, 16)
    torch.save(x, tmp_path / "x.pt")
    with torch.no_grad():  # the out variant is for inference (it refuses to run under autograd)
        expected = scripted(x)
        eager = GemmModel()(x)
    torch.testing.assert_close(expected, eager)

    code = LOAD_AND_RUN.format(imports="import ops", path=str(model_path), x_path=str(tmp_path / "x.pt"),
                               y_path=str(tmp_path / "y.pt"), load_warning=TS_LOAD_DEPRECATION)
    result = run_python(code, cwd=REPO)
    assert result.returncode == 0, result.stderr
    torch.testing.assert_close(torch.load(tmp_path / "y.pt"), expected)


@pytest.mark.slow
def test_load_without_library_fails_clearly(tmp_path):
    model_path = tmp_path / "gemm_model.pt"
    _script_and_save(model_path)
    torch.save(torch.randn(5, 16), tmp_path / "x.pt")
    code = LOAD_AND_RUN.format(imports="", path=str(model_path), x_path=str(tmp_path / "x.pt"),
                               y_path=str(tmp_path / "y.pt"), load_warning=TS_LOAD_DEPRECATION)
    result = run_python(code, cwd=str(tmp_path))
    assert result.returncode != 0
    assert "Unknown builtin op: ops::cutlass_gemm" in result.stderr


@pytest.mark.filterwarnings(f"ignore:{TS_SCRIPT_DEPRECATION}:FutureWarning")
@pytest.mark.filterwarnings("ignore:`torch.jit.save` is deprecated:FutureWarning")
@pytest.mark.filterwarnings(f"ignore:{TS_LOAD_DEPRECATION}:FutureWarning")
@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.trace(_method)?` is deprecated:FutureWarning")
def test_blocks_with_a_recipe_script_and_trace_with_the_class_forward(tmp_path):
    # A recipe's forward has Python-only parts: torch.jit.script compiles the class's forward (the same
    # values), torch.jit.trace records the ops it calls (no Python autograd.Function), and both save.
    import copy
    from conftest import tiny_hf_decoder

    stock = tiny_hf_decoder("Llama").eval()
    model = copy.deepcopy(stock)
    assert ("model.layers.0.mlp", "gated_mlp") in ops.nn.convert(model).recipes
    mlp, x = model.model.layers[0].mlp, torch.randn(2, 7, 64)
    with torch.no_grad():
        expected = stock.model.layers[0].mlp(x)
        for kind, module in (("script", torch.jit.script(mlp)), ("trace", torch.jit.trace(mlp, (x,)))):
            path = str(tmp_path / f"{kind}.pt")
            module.save(path)
            torch.testing.assert_close(torch.jit.load(path)(x), expected, rtol=0, atol=1e-6)
        assert "forward" in vars(mlp)  # scripting the block itself leaves it as it was
