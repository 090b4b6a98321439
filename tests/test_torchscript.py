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
