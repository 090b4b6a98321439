"""The Python API and the nn modules compile with TorchScript: a converted model scripts and matches
eager, and scripted functions can call ops.* (the wrappers avoid `OpOverload` attribute calls and
torch.finfo, which TorchScript cannot compile)."""

import warnings

import pytest
import torch

import ops

TS_SCRIPT_DEPRECATION = r"`torch\.jit\.script` is deprecated"


def _script(obj):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=TS_SCRIPT_DEPRECATION, category=FutureWarning)
        return torch.jit.script(obj)


def test_converted_model_scripts():
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.SiLU(), torch.nn.RMSNorm(8, eps=1e-5),
                                torch.nn.Linear(8, 4), torch.nn.RMSNorm(4))
    x = torch.randn(3, 16)
    expected = model(x)
    ops.nn.convert(model)
    torch.testing.assert_close(_script(model)(x), expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_default_eps_is_torchs(dtype):
    # eps=None: torch.nn.RMSNorm computes with float32's epsilon for half types (not the dtype's, as its
    # docs say); small inputs make a different eps visible (bf16's 0.0078 shrank outputs by 28%).
    x = (0.05 * torch.randn(4, 64)).to(dtype)
    ref, mine = torch.nn.RMSNorm(64, dtype=dtype), ops.nn.RMSNorm(64, dtype=dtype)
    torch.testing.assert_close(mine(x), ref(x))
    torch.testing.assert_close(_script(mine)(x), ref(x))


def _uses_every_op(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    ops.cutlass_gemm(a, b, out=out)
    h = ops.linear(ops.cutlass_gemm(a, b), w, None, "gelu")
    r = h.clone()
    ops.fused_add_rms_norm(h, r, torch.ones(h.shape[-1]), 1e-6)
    return ops.silu_and_mul(ops.rms_norm(h, torch.ones(h.shape[-1]), 1e-6)) + out.sum()


def test_python_api_scripts():
    a, b, w = torch.randn(3, 4), torch.randn(4, 6), torch.randn(8, 6)
    scripted = _script(_uses_every_op)
    out_s, out_e = torch.empty(3, 6), torch.empty(3, 6)
    torch.testing.assert_close(scripted(a, b, out_s, w), _uses_every_op(a, b, out_e, w))
    torch.testing.assert_close(out_s, a @ b)
