// Connects tensor.record_stream(s) to ops' allocator under the global install. PyTorch's
// CUDAPluggableAllocator ignores record_stream unless a record_stream function is set on it, which
// only C++ can do; ops.allocator.install() calls this op right after installing the allocator.
#include <memory>

#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <torch/library.h>

#include "allocator.h"

namespace ops {
namespace {

// Sets ops_allocator_record_stream as the current CUDA allocator's record_stream function. Returns
// false (and changes nothing) when the current allocator is not a pluggable one.
bool install_record_stream_hook() {
  namespace pluggable = torch::cuda::CUDAPluggableAllocator;
  auto current = std::dynamic_pointer_cast<pluggable::CUDAPluggableAllocator>(pluggable::getCurrentAllocator());
  if (!current) return false;
  current->set_record_stream_fn(&ops_allocator_record_stream);
  return true;
}

}  // namespace
}  // namespace ops

TORCH_LIBRARY_IMPL(ops, CompositeImplicitAutograd, m) {
  m.impl("_allocator_install_record_stream_hook", &ops::install_record_stream_hook);
}
