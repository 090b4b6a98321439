"""The SHA-256 of the sources ``ops._C`` is built from: every file under csrc/ and cutlass_gemm/, and
setup.py. setup.py records it in ops/_build_info.py when it builds the library (SOURCE_SHA256), and
benchmarks/prebuilt.py compares it with a checkout's. Standard library only: both load this file by
path, before (or without) the compiled library, so it must not import ``ops`` or torch."""

import hashlib
import os

SOURCES = ("csrc", "cutlass_gemm", "setup.py")


def source_digest(root: str) -> str:
    """SHA-256 (hex) over the relative path and bytes of every build input under `root` (SOURCES), in
    sorted path order; __pycache__ folders are skipped."""
    digest = hashlib.sha256()
    paths = []
    for entry in SOURCES:
        top = os.path.join(root, entry)
        if os.path.isfile(top):
            paths.append(entry)
            continue
        for folder, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            paths += [os.path.relpath(os.path.join(folder, f), root) for f in files]
    for rel in sorted(paths):
        digest.update(rel.encode() + b"\0")
        with open(os.path.join(root, rel), "rb") as f:
            digest.update(f.read() + b"\0")
    return digest.hexdigest()
