"""cutlass_gemm/ is laid out by layer (docs/architecture.md), and its includes run one way: the kernels
(torch-free) below the host core, the core below the CUDA services, those below the families (dense, scaled,
grouped), which never include each other; csrc/ never includes cutlass_gemm/. Every repository path a docstring,
comment or doc names exists."""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GEMM = os.path.join(ROOT, "cutlass_gemm")
LAYERS = {"kernels": 0, "core": 1, "cuda": 2, "dense": 3, "scaled": 3, "grouped": 3, "scaled_grouped": 3, ".": 4}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _sources(top):
    for folder, _, files in os.walk(top):
        for name in files:
            if name.endswith((".h", ".cuh", ".cpp", ".cu")):
                yield os.path.join(folder, name)


def _includes(path):
    """(included path relative to the repository, as written) for every quoted include that resolves."""
    with open(path) as f:
        text = f.read()
    for written in INCLUDE.findall(text):
        target = os.path.normpath(os.path.join(os.path.dirname(path), written))
        if os.path.exists(target):
            yield os.path.relpath(target, ROOT), written


def _room(rel):
    parts = rel.split(os.sep)
    if parts[0] != "cutlass_gemm":
        return None
    return parts[1] if len(parts) > 2 else "."


def test_top_level_holds_at_most_four_files():
    files = [f for f in os.listdir(GEMM) if os.path.isfile(os.path.join(GEMM, f))]
    assert len(files) <= 4, files
    assert set(os.listdir(GEMM)) - set(files) == set(LAYERS) - {"."}


@pytest.mark.parametrize("path", sorted(os.path.relpath(p, ROOT) for p in _sources(GEMM)))
def test_includes_run_one_way(path):
    room = _room(path)
    for target, written in _includes(os.path.join(ROOT, path)):
        other = _room(target)
        if other is None:
            assert target.startswith("csrc" + os.sep), f"{path} includes {written}"
            continue
        assert LAYERS[other] <= LAYERS[room], f"{path} ({room}) includes {written} from a higher layer ({other})"
        if LAYERS[room] == 3 and LAYERS[other] == 3:
            assert other == room, f"the {room} family includes the {other} family's {written}"


def test_csrc_never_includes_cutlass_gemm():
    for path in _sources(os.path.join(ROOT, "csrc")):
        for target, written in _includes(path):
            assert not target.startswith("cutlass_gemm"), f"{os.path.relpath(path, ROOT)} includes {written}"


# A path in this repository written in a docstring, comment, doc or script, as `cutlass_gemm/core/plan.cpp`.
# Not a torch path (`torch/csrc/...`, `ATen/ops/...`: preceded by a folder) and not a generated file.
NAMED_PATH = re.compile(r"(?<![\w/.-])((?:cutlass_gemm|csrc|ops|tests|benchmarks|docs|\.ci)/[\w./-]*\w\.(?:h|cuh|cpp|cu|py|md|json|txt))\b")
GENERATED = {"ops/_build_info.py"}
SKIP_DIRS = {".git", "build", "dist", "results", "data", "__pycache__", ".pytest_cache", ".hypothesis", ".prebuilt"}


def _written_files():
    """The project's own files: its folders and top-level files (not a virtual environment or build beside them)."""
    for name in os.listdir(ROOT):
        if os.path.isfile(os.path.join(ROOT, name)) and (name.endswith((".py", ".md", ".txt", ".toml", ".in"))
                                                          or name == "Makefile"):
            yield os.path.join(ROOT, name)
    for top in ("cutlass_gemm", "csrc", "ops", "tests", "benchmarks", "docs", ".ci"):
        yield from _files_below(os.path.join(ROOT, top))


def _files_below(root):
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for name in files:
            if name.endswith((".py", ".h", ".cuh", ".cpp", ".cu", ".md", ".txt", ".toml", ".in")) or name in {"Makefile", "run"}:
                yield os.path.join(folder, name)


def test_every_path_named_in_the_tree_exists():
    """Moving a file leaves no docstring, comment or doc pointing at its old place."""
    missing = []
    for path in _written_files():
        with open(path, errors="replace") as f:
            text = f.read()
        for named in set(NAMED_PATH.findall(text)) - GENERATED:
            if named.startswith("benchmarks/results/local/"):
                continue  # where benchmarks write their output
            if not os.path.exists(os.path.join(ROOT, named)):
                missing.append(f"{os.path.relpath(path, ROOT)} names {named}")
    assert not missing, "\n".join(sorted(missing))
