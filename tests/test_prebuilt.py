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
    ("10.0a", (10, 0), True),
    ("10.0a", (10, 3), False),    # architecture-specific code runs on that compute capability only
    ("8.6a", (8, 9), False),
    ("10.0f", (10, 3), True),     # family-portable code runs on later minors of the family
    ("Hopper", (9, 0), False),    # names it cannot read count as no code, without an exception
    ("sm_90a;9.0a", (9, 0), True),
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
    header = tmp_path / "cutlass_gemm" / "core" / "tactic.h"  # a header two folders down
    header.write_text(header.read_text() + "\n")
    assert prebuilt.source_digest(str(tmp_path)) != base
    shutil.copy2(os.path.join(REPO, "cutlass_gemm", "core", "tactic.h"), header)
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


def _tree_with_library(tmp_path):
    """A copy of what prebuilt's `make` and `use` read and write: the build inputs, the benchmarks and the
    ops package with this build's library and build record (they install into the ops/ beside them, so
    they run in the copy). Not through git: CI also tests a copy of the tree that is no repository."""
    tree = tmp_path / "tree"
    tree.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "results", "*.before-prebuilt", "*.prebuilt-new")
    for entry in (*prebuilt.SOURCES, "ops", "benchmarks"):
        src = os.path.join(REPO, entry)
        (shutil.copytree(src, tree / entry, ignore=skip) if os.path.isdir(src) else shutil.copy2(src, tree / entry))
    return tree


def _prebuilt(tree, *args, **environ):
    """benchmarks.prebuilt in `tree`, asking for the candidate kernels as this build has them (unless
    `environ` says otherwise)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OPS_CANDIDATE_KERNELS"] = "1" if ops.build_info.CANDIDATE_KERNELS else "0"
    env.update(environ)
    return subprocess.run([sys.executable, "-m", "benchmarks.prebuilt", *args], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=300)


def _ops_files(tree):
    return {name: (tree / "ops" / name).read_bytes() for name in sorted(os.listdir(tree / "ops"))
            if not name.startswith("__pycache__")}


@pytest.mark.skipif(not os.path.exists(ops.library_path()), reason="no built library")
@pytest.mark.parametrize("target", ["ops", "./ops/"])
def test_make_refuses_the_package_folder_and_keeps_its_library(tmp_path, target):
    tree = _tree_with_library(tmp_path)
    before = _ops_files(tree)
    result = _prebuilt(tree, "make", target)
    assert result.returncode != 0 and "is the package folder" in result.stderr, result.stderr
    assert _ops_files(tree) == before


@pytest.mark.skipif(not os.path.exists(ops.library_path()), reason="no built library")
def test_make_refuses_a_library_built_from_other_sources(tmp_path):
    """A library older than an edit must not go to the device labelled as the new sources: setup.py
    records the digest of the sources it built (SOURCE_SHA256), and `make` compares it with the
    checkout's."""
    assert ops.build_info.SOURCE_SHA256 == prebuilt.source_digest()  # this build's record
    tree = _tree_with_library(tmp_path)
    checks = tree / "csrc" / "checks.cpp"
    checks.write_text(checks.read_text() + "// an edit after the build\n")
    result = _prebuilt(tree, "make", str(tree / ".prebuilt"))
    assert result.returncode != 0 and "built from other sources than these" in result.stderr, result.stderr
    assert not (tree / ".prebuilt" / prebuilt.MANIFEST).exists()


@pytest.mark.skipif(not os.path.exists(ops.library_path()), reason="no built library")
def test_use_refuses_a_library_without_the_candidate_kernels_asked_for(tmp_path):
    # The GPU check asks for the candidate-only kernels (OPS_CANDIDATE_KERNELS=1): a default build must
    # not stand in for that build, nor the other way round.
    tree = _tree_with_library(tmp_path)
    out = tree / ".prebuilt"
    assert _prebuilt(tree, "make", str(out)).returncode == 0
    before = _ops_files(tree)
    other = "0" if ops.build_info.CANDIDATE_KERNELS else "1"
    result = _prebuilt(tree, "use", str(out), OPS_CANDIDATE_KERNELS=other)
    assert result.returncode == 1 and "candidate-only kernels" in result.stdout, result.stdout + result.stderr
    assert _ops_files(tree) == before


@pytest.mark.skipif(not os.path.exists(ops.library_path()), reason="no built library")
def test_use_installs_all_or_nothing(tmp_path):
    tree = _tree_with_library(tmp_path)
    out = tree / ".prebuilt"
    assert _prebuilt(tree, "make", str(out)).returncode == 0
    before = _ops_files(tree)
    # An incomplete or malformed prebuilt folder: refused before ops/ is touched (a failed copy must not
    # leave ops/ without a library).
    info = (out / prebuilt.BUILD_INFO).read_bytes()
    (out / prebuilt.BUILD_INFO).unlink()
    result = _prebuilt(tree, "use", str(out))
    assert result.returncode == 1 and "no usable prebuilt library" in result.stdout, result.stdout + result.stderr
    (out / prebuilt.BUILD_INFO).write_bytes(info)
    manifest = (out / prebuilt.MANIFEST).read_text()
    (out / prebuilt.MANIFEST).write_text("[1, 2]")
    result = _prebuilt(tree, "use", str(out))
    assert result.returncode == 1 and "not an object" in result.stdout, result.stdout + result.stderr
    assert _ops_files(tree) == before
    (out / prebuilt.MANIFEST).write_text(manifest)
    # The prebuilt copy is made to differ from what ops/ holds, so that installing it shows: bytes after
    # the ELF image (the loader ignores them) and a line of the build record.
    with open(out / prebuilt.LIBRARY, "ab") as f:
        f.write(b"prebuilt copy")
    # Complete and matching, but `import ops` fails with it: ops/ is rolled back to what it held.
    (out / prebuilt.BUILD_INFO).write_bytes(info + b"raise ImportError('a broken prebuilt build record')\n")
    result = _prebuilt(tree, "use", str(out))
    assert result.returncode == 1 and "`import ops` failed with it" in result.stdout, result.stdout + result.stderr
    assert _ops_files(tree) == before
    # Complete, matching and importable: installed, and nothing left beside it.
    (out / prebuilt.BUILD_INFO).write_bytes(info + b"# the prebuilt copy\n")
    result = _prebuilt(tree, "use", str(out))
    assert result.returncode == 0 and "installed" in result.stdout, result.stdout + result.stderr
    installed = {name: (out / name).read_bytes() for name in (prebuilt.LIBRARY, prebuilt.BUILD_INFO)}
    assert _ops_files(tree) == {**before, **installed}  # no staged or saved copies either
