"""Loading the compiled library `ops._C`, with readable errors instead of `undefined symbol`."""

import importlib

import torch


def _build_info():
    try:
        return importlib.import_module("ops._build_info")
    except ImportError as exc:
        raise ImportError(
            "ops: the compiled library is not built (ops/_build_info.py is missing). Install the package "
            "with `pip install --no-build-isolation .` or `python setup.py install` from the repository "
            "root, and import it from outside that folder (or build in place with "
            "`python setup.py build_ext --inplace`)."
        ) from exc


def load():
    """Check the build against the running torch, then import `ops._C` (registering the ops).

    Raises:
        ImportError: the library is not built, or was built against another torch version (the C++ ABI
            of torch changes between releases, so that would fail with an `undefined symbol`).
    """
    info = _build_info()
    if info.TORCH_VERSION != torch.__version__:
        raise ImportError(
            f"ops was built against torch {info.TORCH_VERSION} but torch {torch.__version__} is installed. "
            "A C++ extension only loads into the torch it was compiled with: rebuild ops "
            "(`pip install --no-build-isolation --force-reinstall .`) or install torch "
            f"{info.TORCH_VERSION}."
        )
    try:
        return importlib.import_module("ops._C")
    except ImportError as exc:
        raise ImportError(
            f"ops: loading the compiled library failed ({exc}). It was built with torch "
            f"{info.TORCH_VERSION} (CUDA {info.TORCH_CUDA_VERSION}); rebuild it in this environment."
        ) from exc


_C = load()
build_info = _build_info()
