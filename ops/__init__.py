"""C++/CUDA custom operators for PyTorch, registered with torch.library as ``torch.ops.ops.*``.

``import ops`` loads the compiled library (checking it was built for the running torch) and registers
the ops' fake kernels. Python users call ``ops.<op>(...)`` (scripted functions can too); C++ users call
``torch.ops.ops.<op>(...)`` after loading the library.
"""

import torch  # noqa: F401  (must be imported before the extension library is loaded)

from . import _nested, _vmap, allocator, compile, fp8, grouped, moe, nn, recipes  # noqa: F401  (_vmap: the ops' batching rules)
from ._library import build_info, kernels, library_path
from .fp8 import fp8_grouped_mm, fused_add_rms_norm_fp8, quantize_fp8, rms_norm_fp8, scaled_gemm, scaled_grouped_gemm, silu_and_mul_fp8
from .fused import fused_add_rms_norm, rms_norm, silu_and_mul
from .gemm import cutlass_gemm
from .grouped import grouped_gemm
from .linear import linear

moe._register_when_loaded()  # the "ops" experts implementation, once transformers' interface is loaded
_nested.register()  # clear errors for jagged nested tensors, which never reach the C++ checks
if torch.distributed.is_available():
    from . import _dtensor  # noqa: F401  (the ops' DTensor sharding rules)

__all__ = ["allocator", "compile", "fp8", "grouped", "moe", "nn", "recipes", "cutlass_gemm", "grouped_gemm", "scaled_gemm", "scaled_grouped_gemm", "fp8_grouped_mm", "quantize_fp8", "rms_norm_fp8", "fused_add_rms_norm_fp8", "silu_and_mul_fp8", "linear", "rms_norm", "fused_add_rms_norm",
           "silu_and_mul", "build_info", "kernels", "library_path"]
