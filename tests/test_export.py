"""torch.export + AOTInductor: every registered op's model is exported, compiled into an AOTInductor
package, and loaded and run in a fresh process after `import ops` (the package calls the C++-registered
op through AOTInductor's proxy executor). Without the import, loading or running fails clearly."""

import pytest
import torch

from conftest import DEVICES, REPO, run_python
from op_registry import OP_IDS, OPS

pytestmark = pytest.mark.slow

# The ops whose exported models hold FP8 tensors in Inductor's own kernels.
FP8_MODELS = {"scaled_gemm", "scaled_grouped_gemm", "quantize_fp8", "rms_norm_fp8", "fused_add_rms_norm_fp8", "silu_and_mul_fp8"}
# AOTInductor's CPU wrapper of torch 2.11 does not declare at::Float8_e4m3fn (g++: "'Float8_e4m3fn' is not
# a member of 'at'"); 2.13.0 and 2.14.1 compile these packages.
AOTI_CPU_FP8 = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13)

LOAD_AND_RUN = """
import sys, torch
{imports}
runner = torch._inductor.aoti_load_package({package!r})
x = torch.load({x_path!r}).to({device!r})
torch.save(runner(x).cpu(), {y_path!r})
"""


@pytest.mark.parametrize("spec", OPS, ids=OP_IDS)
@pytest.mark.parametrize("device", DEVICES)
def test_export_aoti_package_fresh_process(spec, device, tmp_path):
    if device == "cpu" and spec.name in FP8_MODELS and not AOTI_CPU_FP8:
        pytest.skip(f"torch {torch.__version__}: AOTInductor's CPU wrapper does not declare at::Float8_e4m3fn")
    model = spec.module().to(device).eval()
    x = spec.module_input(4).to(device)
    batch = torch.export.Dim("batch", min=1, max=1024)
    exported = torch.export.export(model, (x,), dynamic_shapes=({0: batch},))
    # The exported graph calls our op, not a decomposition of it.
    assert any(n.target == getattr(torch.ops.ops, spec.name).default for n in exported.graph.nodes)
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(x), model(x))
        package = torch._inductor.aoti_compile_and_package(exported, package_path=str(tmp_path / "m.pt2"))

    x_other = spec.module_input(9).to(device)  # another batch size: the dynamic dimension
    torch.save(x_other.cpu(), tmp_path / "x.pt")
    code = LOAD_AND_RUN.format(imports="import ops", package=package, x_path=str(tmp_path / "x.pt"),
                               device=device, y_path=str(tmp_path / "y.pt"))
    result = run_python(code, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    with torch.no_grad():
        torch.testing.assert_close(torch.load(tmp_path / "y.pt"), model(x_other).cpu())

    # Without the op library the package cannot run: a clear error naming the op.
    code = LOAD_AND_RUN.format(imports="", package=package, x_path=str(tmp_path / "x.pt"),
                               device=device, y_path=str(tmp_path / "y2.pt"))
    result = run_python(code, cwd=str(tmp_path), timeout=600)
    assert result.returncode != 0
    assert f"ops::{spec.name}" in result.stderr or f"ops.{spec.name}" in result.stderr, result.stderr[-3000:]
