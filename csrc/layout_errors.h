// Defining a public op: its schema, plus clear errors for tensors that are not dense and strided
// (layout_errors.cpp). Used by the op catalogue (registration.cpp) for every public op.
#pragma once

#include <torch/library.h>

namespace ops {

// m.def(schema), and a kernel on the sparse, nested, MKL-DNN and quantized dispatch keys that raises
// "<op>: expected <argument> to be a dense (strided) tensor, got <what>; <how to convert it>" instead
// of PyTorch's generic "Could not run 'ops::<op>' with arguments from the 'SparseCPU' backend".
// For an op that writes an argument (a "!" in its schema), also a kernel on the Negative key: a written
// negative view (z.conj().imag) is refused with an error naming it, a read one is resolved; and one on
// the ADInplaceOrView key that bumps the written tensors' versions.
void define(torch::Library& m, const char* schema);

}  // namespace ops
