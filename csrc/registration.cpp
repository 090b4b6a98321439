// The op catalogue: every schema of the `ops` library, in one place (DESIGN.md, "The op catalogue").
// Kernels register elsewhere with TORCH_LIBRARY_IMPL; fake kernels and autograd live in the Python
// package `ops`; set_python_module before each group names the module holding that group's fake
// kernels, so a missing fake kernel says what to import.
#include <torch/library.h>

TORCH_LIBRARY(ops, m) {
  m.set_python_module("ops.gemm");
  // C = A @ B. A (M, K), B (K, N), C (M, N); float16, bfloat16, float32, float64.
  m.def("cutlass_gemm(Tensor A, Tensor B) -> Tensor");
  // Out variant: writes A @ B into out (M, N). Returns nothing (see REFERENCES.md: an aliasing
  // return needs torch.Tag.out, whose name changed across torch releases).
  m.def("cutlass_gemm.out(Tensor A, Tensor B, *, Tensor(a!) out) -> ()");
}
