"""A library built on a CPU machine for the device machine's software stack, so that a device call can
skip its build (minutes of a 15-minute lease: an SM90 16-bit kernel TU compiles for ~3 minutes on one
core of the 2-core machine; see device_check.sh).

    # here, in a checkout whose sources are the ones to test, against the device's torch:
    OPS_CANDIDATE_KERNELS=1 TORCH_CUDA_ARCH_LIST=9.0a PYTHONPATH=<torch 2.11 cu130> python setup.py build_ext --inplace
    PYTHONPATH=<torch 2.11 cu130> python -m benchmarks.prebuilt make .prebuilt
    # on the device (benchmarks/device_check.sh does this; carry .prebuilt, git-ignored):
    python -m benchmarks.prebuilt use .prebuilt      # exit 0: installed into ops/; 1: build instead

The library (`ops/_C.abi3.so`) is built against CPython's limited API and calls no Python API at all
(torch.ops.load_library dlopens it), so a Python 3.11 build loads under the device's Python 3.12. What
must match is torch's C++ ABI (the exact torch build) and the GPU's architecture.

`make` stores the library, its `_build_info.py` and a manifest: the SHA-256 of the sources (every file
under csrc/ and cutlass_gemm/, and setup.py; ops/_source_digest.py), torch's version and git commit,
and the arch list. It refuses a library that setup.py built from other sources than the checkout's now
(setup.py records the digest of the sources it built, SOURCE_SHA256 in _build_info.py).
`use` installs them into ops/ only if all of these hold, and says which one did not otherwise:
the sources here hash the same, as the library's own record does; torch here is the same build
(version and git commit); the GPU's compute capability is in the arch list (9.0 needs 9.0a: the SM90
kernels exist only there); it has the candidate-only kernels if OPS_CANDIDATE_KERNELS=1 asks for them
(as setup.py would build); the library then loads in a fresh interpreter (`import ops`). On any
failure it leaves ops/ as it was.
"""

import argparse
import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARY = "_C.abi3.so"
BUILD_INFO = "_build_info.py"
MANIFEST = "manifest.json"


def _load_digest_module():
    # By path: importing ops needs the compiled library, which `use` is about to install.
    spec = importlib.util.spec_from_file_location("_ops_source_digest", os.path.join(REPO, "ops", "_source_digest.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_DIGEST = _load_digest_module()
SOURCES = _DIGEST.SOURCES


def source_digest(root=REPO):
    """SHA-256 over the relative path and bytes of every build input (SOURCES), in sorted order: what
    setup.py records as SOURCE_SHA256 when it builds (ops/_source_digest.py)."""
    return _DIGEST.source_digest(root)


def _read_build_info(path):
    """The NAME = literal assignments of a generated _build_info.py, without importing ops."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    return {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}


def make(directory):
    """Store ops/_C.abi3.so, ops/_build_info.py and a manifest in `directory` (replacing what is there).

    Raises:
        SystemExit: `directory` is ops/ itself; no built library in ops/; it was built from other sources than
            the checkout's (edited since, or a build that failed after an edit), or by a setup.py that recorded
            none; or against another torch than the one imported now (build and run this with the same
            PYTHONPATH).
    """
    import torch

    library = os.path.join(REPO, "ops", LIBRARY)
    info_path = os.path.join(REPO, "ops", BUILD_INFO)
    if not (os.path.exists(library) and os.path.exists(info_path)):
        sys.exit(f"prebuilt make: no built library in {os.path.dirname(library)}: run setup.py build_ext --inplace first")
    info = _read_build_info(info_path)
    digest = source_digest()
    if info.get("SOURCE_SHA256") != digest:
        sys.exit(f"prebuilt make: the library in ops/ was built from other sources than these (built from "
                 f"{str(info.get('SOURCE_SHA256'))[:16]}, sources now {digest[:16]}): build it again first")
    if info.get("TORCH_VERSION") != torch.__version__:
        sys.exit(f"prebuilt make: ops was built against torch {info.get('TORCH_VERSION')}, but torch "
                 f"{torch.__version__} is imported; use the same PYTHONPATH for both")
    if os.path.realpath(directory) == os.path.dirname(os.path.realpath(library)):
        sys.exit(f"prebuilt make: {directory} is the package folder the library is stored from; name another "
                 "(e.g. .prebuilt)")
    os.makedirs(directory, exist_ok=True)
    for name in (LIBRARY, BUILD_INFO, MANIFEST):
        if os.path.exists(os.path.join(directory, name)):
            os.remove(os.path.join(directory, name))
    shutil.copy2(library, os.path.join(directory, LIBRARY))
    shutil.copy2(info_path, os.path.join(directory, BUILD_INFO))
    manifest = {
        "source_sha256": digest,
        "torch_version": torch.__version__,
        "torch_git_version": torch.version.git_version,
        "cuda_arch_list": info.get("CUDA_ARCH_LIST"),
        "build_info": info,
    }
    with open(os.path.join(directory, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
    candidates = bool(info.get("CANDIDATE_KERNELS"))
    print(f"prebuilt make: {directory}: torch {manifest['torch_version']} ({manifest['torch_git_version'][:12]}), "
          f"arch {manifest['cuda_arch_list']}, sources {manifest['source_sha256'][:16]}, candidate kernels "
          f"{'built' if candidates else 'not built'}")
    if not candidates:
        print("prebuilt make: warning: the GPU check (device_check.sh) asks for the candidate-only kernels and "
              "will not use this library: build it with OPS_CANDIDATE_KERNELS=1 for that")


def arch_covers(arch_list, capability):
    """Whether a TORCH_CUDA_ARCH_LIST string ("8.0;9.0a", "9.0a") has code for a (major, minor) GPU: an
    entry of the same major and a minor at most the GPU's ("8.0" runs on 8.6), except that
    architecture-specific code ("9.0a", "10.0a") runs on that very compute capability only, and 9.0
    needs "9.0a" itself (only that image has the SM90 kernels). Entries it cannot read (named
    architectures such as "Hopper") count as no code."""
    major, minor = capability
    for entry in arch_list.replace(",", ";").replace(" ", ";").split(";"):
        entry = entry.strip().removesuffix("+PTX")
        suffix = entry[-1:] if entry[-1:] in ("a", "f") else ""  # f: family-portable, as a plain entry
        m, dot, n = entry[:len(entry) - len(suffix)].partition(".")
        if not (m.isdigit() and dot and n.isdigit()):
            continue
        m, n = int(m), int(n)
        if m != major or n > minor:
            continue
        if suffix == "a" and n != minor:
            continue
        if (major, minor) == (9, 0) and suffix != "a":
            continue
        return True
    return False


def mismatch(manifest, torch_version, torch_git_version, capability, digest):
    """Why the prebuilt library cannot be used here (a sentence), or None if it can."""
    if manifest.get("source_sha256") != digest:
        return "the sources differ from those it was built from"
    if manifest.get("torch_version") != torch_version or manifest.get("torch_git_version") != torch_git_version:
        return (f"it was built against torch {manifest.get('torch_version')} "
                f"({str(manifest.get('torch_git_version'))[:12]}), this is torch {torch_version} ({torch_git_version[:12]})")
    if capability is not None and not arch_covers(manifest.get("cuda_arch_list") or "", capability):
        return f"its arch list {manifest.get('cuda_arch_list')!r} has no code for compute capability {capability[0]}.{capability[1]}"
    return None


def use(directory):
    """Install the prebuilt library into ops/ if it fits this machine (see the module docstring).
    Returns 0 if installed, 1 if not (with the reason printed)."""
    import torch

    try:
        with open(os.path.join(directory, MANIFEST)) as f:
            manifest = json.load(f)
        if not isinstance(manifest, dict):
            raise ValueError(f"a JSON {type(manifest).__name__}, not an object")
        info = _read_build_info(os.path.join(directory, BUILD_INFO))
        if not os.path.isfile(os.path.join(directory, LIBRARY)):
            raise OSError(f"no {LIBRARY}")
    except (OSError, ValueError, SyntaxError) as exc:
        print(f"prebuilt use: no usable prebuilt library in {directory} ({exc})")
        return 1
    capability = torch.cuda.get_device_capability(0) if torch.cuda.is_available() else None
    digest = source_digest()
    reason = mismatch(manifest, torch.__version__, torch.version.git_version, capability, digest)
    if reason is None and info.get("SOURCE_SHA256") != digest:
        reason = "its own build record names other sources than its manifest"
    wanted = os.environ.get("OPS_CANDIDATE_KERNELS", "0").lower() in ("1", "true", "yes", "on")
    if reason is None and bool(info.get("CANDIDATE_KERNELS")) != wanted:
        reason = (f"it was built with{'' if info.get('CANDIDATE_KERNELS') else 'out'} the candidate-only kernels, "
                  f"and OPS_CANDIDATE_KERNELS={os.environ.get('OPS_CANDIDATE_KERNELS', '0')} here (make it "
                  f"from a build with OPS_CANDIDATE_KERNELS={int(wanted)})")
    if reason:
        print(f"prebuilt use: not used: {reason}")
        return 1
    targets = {name: os.path.join(REPO, "ops", name) for name in (LIBRARY, BUILD_INFO)}
    saved = {name: path + ".before-prebuilt" for name, path in targets.items()}
    staged = {name: path + ".prebuilt-new" for name, path in targets.items()}
    # Copy both files beside their targets first: a failed copy leaves ops/ untouched. Then swap them
    # in by rename, keeping the previous files until the import check has passed.
    try:
        for name, path in staged.items():
            shutil.copy2(os.path.join(directory, name), path)
    except OSError as exc:
        for path in staged.values():
            if os.path.exists(path):
                os.remove(path)
        print(f"prebuilt use: not used: could not copy it into ops/ ({exc})")
        return 1
    for name, path in targets.items():
        if os.path.exists(path):
            os.replace(path, saved[name])
        os.replace(staged[name], path)
    check = subprocess.run([sys.executable, "-c", "import ops; print(ops.build_info.TORCH_VERSION, ops.build_info.CUDA_ARCH_LIST)"],
                           cwd=REPO, capture_output=True, text=True)
    if check.returncode != 0:
        for name, path in targets.items():
            os.remove(path)
            if os.path.exists(saved[name]):
                os.replace(saved[name], path)
        print(f"prebuilt use: not used: `import ops` failed with it:\n{check.stderr[-2000:]}")
        return 1
    for path in saved.values():
        if os.path.exists(path):
            os.remove(path)
    print(f"prebuilt use: installed ({check.stdout.strip()}; sources {manifest['source_sha256'][:16]})")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["make", "use"])
    parser.add_argument("directory")
    args = parser.parse_args(argv)
    if args.command == "make":
        make(args.directory)
        return 0
    return use(args.directory)


if __name__ == "__main__":
    sys.exit(main())
