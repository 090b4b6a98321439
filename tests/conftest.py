import importlib.util
import os
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HAS_CUDA = torch.cuda.is_available()

# The devices every op test runs on: CPU always; CUDA variants always exist, are marked `cuda`, and
# skip without a GPU.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]



@pytest.fixture(autouse=True)
def _seeded_global_generator():
    """Every test starts from the same state of torch's global generator: a test's random tensors (torch.randn
    without generator=) do not depend on which tests ran before it."""
    torch.manual_seed(0)


@pytest.fixture(params=[True, False], ids=["candidate-kernels", "default-build"])
def candidate_kernels(request):
    """Both builds' choices in one (ops.gemm.set_candidate_kernels): a build without the candidate-only kernels
    runs the default build's paths either way."""
    import ops

    previous = ops.gemm.set_candidate_kernels(request.param)
    yield request.param
    ops.gemm.set_candidate_kernels(previous)


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords and not HAS_CUDA:
            item.add_marker(skip)


TINY_VOCAB = 128


def tiny_hf_decoder(family):
    """A transformers `<family>ForCausalLM` (Llama, Qwen2, ...) at a tiny config (hidden 64, 2 layers,
    vocabulary TINY_VOCAB) with random weights from seed 0: nothing is downloaded. Skips the test without
    transformers or without that family."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, f"{family}ForCausalLM"):
        pytest.skip(f"transformers {transformers.__version__} has no {family}")
    torch.manual_seed(0)
    config = getattr(transformers, f"{family}Config")(
        vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16)
    return getattr(transformers, f"{family}ForCausalLM")(config)


def run_python(code, *, cwd=None, env=None, timeout=300):
    """Runs `code` in a fresh interpreter (not this one: nothing imported here leaks in)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code], cwd=cwd or os.getcwd(), env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def cutlass_include():
    """CUTLASS's include folder, from the nvidia-cutlass package (as setup.py finds it), or None."""
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "source", "include")


@pytest.fixture(scope="session")
def fused_emulation(tmp_path_factory):
    """The fused CUDA kernels on emulated blocks, as a ctypes library (tests/emulation.py)."""
    import emulation
    return emulation.build(str(tmp_path_factory.mktemp("fused_emulation")))
