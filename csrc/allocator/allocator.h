// ops' pluggable CUDA allocator: a stream-ordered pool per device (cudaMallocFromPoolAsync on a
// cudaMemPool_t of its own), loadable by torch.cuda.memory.CUDAPluggableAllocator. C linkage, no
// torch types: PyTorch looks the functions up by name (ops/allocator.py).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

extern "C" {

// The functions PyTorch calls. Their types are exactly what CUDAPluggableAllocator expects:
// alloc(size, device, stream) -> ptr and free(ptr, size, device, stream); `stream` in free is the one
// that was current at allocation.
//
// ops_alloc: for the global install (change_current_allocator). When the device is out of memory it
//   throws c10::OutOfMemoryError, which reaches Python as torch.cuda.OutOfMemoryError (PyTorch would
//   otherwise wrap a null pointer into a tensor); on any other CUDA error, c10::Error (RuntimeError).
// ops_pool_alloc: for torch.cuda.MemPool. On failure it returns nullptr, the caching allocator's
//   protocol: it then frees its cached blocks, retries, and raises torch.cuda.OutOfMemoryError itself.
void* ops_alloc(size_t size, int device, cudaStream_t stream);
void* ops_pool_alloc(size_t size, int device, cudaStream_t stream);
void ops_free(void* ptr, size_t size, int device, cudaStream_t stream);
// PyTorch's record_stream for our memory (CUDAPluggableAllocator's record_stream_fn, set by
// install_record_stream_hook): from now on every free waits for the work queued on `stream` at the
// time of the free, as for streams that allocated.
void ops_allocator_record_stream(void* ptr, cudaStream_t stream);

// Statistics PyTorch cannot give for pluggable allocators, per device (bytes and counts).
struct OpsAllocatorStats {
  int64_t bytes_in_use;       // allocated and not yet freed
  int64_t peak_bytes_in_use;  // since start or the last reset_peak
  int64_t bytes_reserved;     // held by the pool (cudaMemPoolAttrReservedMemCurrent)
  int64_t allocations;        // successful allocations
  int64_t frees;
  int64_t failed_allocations;
  int64_t peak_bytes_reserved;  // the pool's high-water mark (cudaMemPoolAttrReservedMemHigh), since
                                // start or the last reset_peak
  int64_t deferred_frees;       // frees asked for during a capture, waiting for it to end
};

// Each returns 0 on success, or a CUDA error code (message: ops_allocator_error_string).
int ops_allocator_stats(int device, OpsAllocatorStats* out);
int ops_allocator_reset_peak(int device);
// Returns free pool memory above `keep_bytes` to the driver (cudaMemPoolTrimTo), after waiting for the
// frees queued so far (on the internal stream and on the streams seen).
int ops_allocator_trim(int device, size_t keep_bytes);
// Bytes a pool keeps cached at synchronisation points before releasing to the driver
// (cudaMemPoolAttrReleaseThreshold); applies to existing pools and to pools created later.
// Default: UINT64_MAX (keep everything until trim), or $OPS_ALLOCATOR_RELEASE_THRESHOLD (decimal
// bytes; another value is reported on stderr and the default kept).
int ops_allocator_set_release_threshold(uint64_t bytes);
// The threshold set_release_threshold last set, else the default above.
uint64_t ops_allocator_release_threshold(void);
const char* ops_allocator_error_string(int error);

}  // extern "C"
