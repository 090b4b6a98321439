"""benchmarks/prebuilt.py: the library built here for the device machine is used there only when it was
built from the same sources, against the same torch build, for the GPU's architecture; otherwise the
device check builds (a wrong library would cost a device call or, worse, test other code)."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import ops
from benchmarks import prebuilt
from conftest import REPO


@pytest.mark.parametrize("arch_list, capability, covered", [
    ("8.0;9.0a", (9, 0), True),
    ("9.0a", (9, 0), True),
    ("8.0;9.0", (9, 0), False),   # plain sm_90 has no wgmma: the SM90 kernels are only in 9.0a
    ("8.0", (9, 0), False),
    ("8.0;9.0a", (8, 6), True),   # sm_80 code runs on 8.6
    ("8.6", (8, 0), False),
    ("8.0+PTX", (8, 9), True),
    ("9.0a", (10, 0), False),
    ("8.0 9.0a", (9, 0), True),
    ("", (9, 0), False),
])
def test_arch_covers(arch_list, capability, covered):
    assert prebuilt.arch_covers(arch_list, capability) is covered


def _manifest(**changes):
    manifest = {"source_sha256": "abc", "torch_version": "2.11.0+cu130", "torch_git_version": "70d99e99",
                "cuda_arch_list": "9.0a"}
    manifest.update(changes)
    return manifest


def test_mismatch_names_what_differs():
    args = ("2.11.0+cu130", "70d99e99", (9, 0), "abc")
    assert prebuilt.mismatch(_manifest(), *args) is None
    assert "sources differ" in prebuilt.mismatch(_manifest(source_sha256="abd"), *args)
    assert "torch 2.14.1" in prebuilt.mismatch(_manifest(torch_version="2.14.1+cu130"), *args)
    assert "built against torch" in prebuilt.mismatch(_manifest(torch_git_version="0000"), *args)
    assert "compute capability 9.0" in prebuilt.mismatch(_manifest(cuda_arch_list="8.0"), *args)
    assert prebuilt.mismatch(_manifest(cuda_arch_list="8.0"), *args[:2], None, "abc") is None  # no GPU: not checked


def test_source_digest_follows_every_build_input(tmp_path):
    for entry in prebuilt.SOURCES:
        src = os.path.join(REPO, entry)
        (shutil.copytree if os.path.isdir(src) else shutil.copy2)(src, tmp_path / entry)
    base = prebuilt.source_digest(str(tmp_path))
    assert base == prebuilt.source_digest(REPO)
    header = tmp_path / "cutlass_gemm" / "tactic.h"
    header.write_text(header.read_text() + "\n")
    assert prebuilt.source_digest(str(tmp_path)) != base
    shutil.copy2(os.path.join(REPO, "cutlass_gemm", "tactic.h"), header)
    assert prebuilt.source_digest(str(tmp_path)) == base
    (tmp_path / "csrc" / "new_op.cpp").write_text("// a new file is a new build input\n")
    assert prebuilt.source_digest(str(tmp_path)) != base


@pytest.mark.skipif(not os.path.exists(ops.library_path()), reason="no built library")
def test_make_records_this_build_and_use_refuses_other_sources(tmp_path):
    out = tmp_path / "prebuilt"
    prebuilt.make(str(out))
    manifest = json.loads((out / prebuilt.MANIFEST).read_text())
    assert manifest["torch_version"] == torch.__version__ == manifest["build_info"]["TORCH_VERSION"]
    assert manifest["source_sha256"] == prebuilt.source_digest()
    assert (out / prebuilt.LIBRARY).stat().st_size == os.path.getsize(ops.library_path())
    # Sources changed since the build: `use` must leave ops/ alone and say why.
    manifest["source_sha256"] = "0" * 64
    (out / prebuilt.MANIFEST).write_text(json.dumps(manifest))
    before = os.stat(ops.library_path()).st_mtime_ns
    result = subprocess.run([sys.executable, "-m", "benchmarks.prebuilt", "use", str(out)], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "sources differ" in result.stdout, result.stdout + result.stderr
    assert os.stat(ops.library_path()).st_mtime_ns == before
