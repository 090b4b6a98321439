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



def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords and not HAS_CUDA:
            item.add_marker(skip)


def run_python(code, *, cwd=None, env=None, timeout=300):
    """Runs `code` in a fresh interpreter (not this one: nothing imported here leaks in)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code], cwd=cwd or os.getcwd(), env=full_env,
                          capture_output=True, text=True, timeout=timeout)
