// The pluggable allocator (allocator.h). Plain C++ on the CUDA runtime; no torch headers beyond c10's
// exception type.
//
// Stream ordering: memory is allocated on the caller's stream from a per-device cudaMemPool_t. A free
// is ordered after the work queued so far on every stream this allocator has seen allocate on that
// device: an internal stream waits on an event recorded on each of them, then cudaFreeAsync runs on
// the internal stream. The pool hands a block out again only once that free has executed, so memory
// freed on the host while a kernel on a side stream still reads it is not reused early, without
// PyTorch's record_stream (a no-op for pluggable allocators) and without making user streams wait on
// each other. Inside CUDA graph capture the free is plain cudaFreeAsync on the capturing stream.
#include "allocator.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

namespace {

constexpr int kMaxDevices = 64;

struct DeviceState {
  std::mutex mu;
  cudaMemPool_t pool = nullptr;
  cudaStream_t free_stream = nullptr;
  std::vector<std::pair<cudaStream_t, cudaEvent_t>> streams;  // seen at allocation
  std::atomic<int64_t> in_use{0}, peak{0}, allocations{0}, frees{0}, failed{0};
};

// Never destroyed: frees can arrive during interpreter shutdown, after static destructors would run.
DeviceState* states() {
  static DeviceState* s = new DeviceState[kMaxDevices];
  return s;
}

std::atomic<uint64_t>& release_threshold() {
  static std::atomic<uint64_t> value([] {
    const char* env = std::getenv("OPS_ALLOCATOR_RELEASE_THRESHOLD");
    return env ? std::strtoull(env, nullptr, 10) : UINT64_MAX;
  }());
  return value;
}

// Runs `fn` with `device` current, restoring the caller's device.
template <typename Fn>
cudaError_t on_device(int device, Fn&& fn) {
  int previous = -1;
  cudaError_t err = cudaGetDevice(&previous);
  if (err != cudaSuccess) return err;
  if (previous != device && (err = cudaSetDevice(device)) != cudaSuccess) return err;
  err = fn();
  if (previous != device) cudaSetDevice(previous);
  return err;
}

// Creates the device's pool and internal stream on first use. Caller holds state.mu, device current.
cudaError_t ensure_pool(DeviceState& state, int device) {
  if (state.pool != nullptr) return cudaSuccess;
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  cudaError_t err = cudaMemPoolCreate(&pool, &props);
  if (err != cudaSuccess) return err;
  uint64_t threshold = release_threshold().load();
  cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
  err = cudaStreamCreateWithFlags(&state.free_stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) {
    cudaMemPoolDestroy(pool);
    return err;
  }
  state.pool = pool;
  return cudaSuccess;
}

void remember_stream(DeviceState& state, cudaStream_t stream) {
  for (const auto& entry : state.streams) {
    if (entry.first == stream) return;
  }
  cudaEvent_t event = nullptr;
  if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) == cudaSuccess) {
    state.streams.emplace_back(stream, event);
  }
}

bool is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone;
}

void* allocate(size_t size, int device, cudaStream_t stream, cudaError_t* error) {
  *error = cudaSuccess;
  if (size == 0) return nullptr;
  if (device < 0 || device >= kMaxDevices) {
    *error = cudaErrorInvalidDevice;
    return nullptr;
  }
  DeviceState& state = states()[device];
  void* ptr = nullptr;
  *error = on_device(device, [&] {
    std::lock_guard<std::mutex> lock(state.mu);
    cudaError_t err = ensure_pool(state, device);
    if (err != cudaSuccess) return err;
    err = cudaMallocFromPoolAsync(&ptr, size, state.pool, stream);
    if (err == cudaSuccess && !is_capturing(stream)) remember_stream(state, stream);
    return err;
  });
  if (*error != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so PyTorch's next check does not see it
    state.failed.fetch_add(1);
    return nullptr;
  }
  state.allocations.fetch_add(1);
  const int64_t now = state.in_use.fetch_add(static_cast<int64_t>(size)) + static_cast<int64_t>(size);
  int64_t peak = state.peak.load();
  while (now > peak && !state.peak.compare_exchange_weak(peak, now)) {
  }
  return ptr;
}

}  // namespace

extern "C" {

void* ops_pool_alloc(size_t size, int device, cudaStream_t stream) {
  cudaError_t error = cudaSuccess;
  return allocate(size, device, stream, &error);
}

void* ops_alloc(size_t size, int device, cudaStream_t stream) {
  cudaError_t error = cudaSuccess;
  void* ptr = allocate(size, device, stream, &error);
  if (ptr == nullptr && size > 0) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "ops allocator: could not allocate ", size,
                     " bytes on CUDA device ", device, ": ", cudaGetErrorString(error),
                     ". The pool stays usable; free tensors or call ops.allocator.trim().");
  }
  return ptr;
}

void ops_free(void* ptr, size_t size, int device, cudaStream_t stream) {
  if (ptr == nullptr || device < 0 || device >= kMaxDevices) return;
  DeviceState& state = states()[device];
  on_device(device, [&] {
    if (is_capturing(stream)) return cudaFreeAsync(ptr, stream);
    std::lock_guard<std::mutex> lock(state.mu);
    cudaStream_t free_stream = state.free_stream ? state.free_stream : stream;
    for (auto it = state.streams.begin(); it != state.streams.end();) {
      // A stream that is being captured now cannot be waited on from outside the capture.
      if (!is_capturing(it->first) && cudaEventRecord(it->second, it->first) == cudaSuccess) {
        cudaStreamWaitEvent(free_stream, it->second, 0);
        ++it;
      } else if (cudaGetLastError() != cudaSuccess) {  // destroyed stream: forget it
        cudaEventDestroy(it->second);
        it = state.streams.erase(it);
      } else {
        ++it;
      }
    }
    return cudaFreeAsync(ptr, free_stream);
  });
  cudaGetLastError();
  state.frees.fetch_add(1);
  state.in_use.fetch_sub(static_cast<int64_t>(size));
}

int ops_allocator_stats(int device, OpsAllocatorStats* out) {
  if (device < 0 || device >= kMaxDevices || out == nullptr) return cudaErrorInvalidValue;
  DeviceState& state = states()[device];
  out->bytes_in_use = state.in_use.load();
  out->peak_bytes_in_use = state.peak.load();
  out->allocations = state.allocations.load();
  out->frees = state.frees.load();
  out->failed_allocations = state.failed.load();
  out->bytes_reserved = 0;
  std::lock_guard<std::mutex> lock(state.mu);
  if (state.pool != nullptr) {
    uint64_t reserved = 0;
    const cudaError_t err = cudaMemPoolGetAttribute(state.pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
    if (err != cudaSuccess) return err;
    out->bytes_reserved = static_cast<int64_t>(reserved);
  }
  return cudaSuccess;
}

int ops_allocator_reset_peak(int device) {
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidValue;
  DeviceState& state = states()[device];
  state.peak.store(state.in_use.load());
  return cudaSuccess;
}

int ops_allocator_trim(int device, size_t keep_bytes) {
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidValue;
  DeviceState& state = states()[device];
  std::lock_guard<std::mutex> lock(state.mu);
  if (state.pool == nullptr) return cudaSuccess;
  return on_device(device, [&] {
    // Frees queued on the internal stream must have run before their memory can be released.
    if (state.free_stream != nullptr) {
      const cudaError_t err = cudaStreamSynchronize(state.free_stream);
      if (err != cudaSuccess) return err;
    }
    return cudaMemPoolTrimTo(state.pool, keep_bytes);
  });
}

int ops_allocator_set_release_threshold(uint64_t bytes) {
  release_threshold().store(bytes);
  for (int device = 0; device < kMaxDevices; ++device) {
    DeviceState& state = states()[device];
    std::lock_guard<std::mutex> lock(state.mu);
    if (state.pool != nullptr) {
      const cudaError_t err = cudaMemPoolSetAttribute(state.pool, cudaMemPoolAttrReleaseThreshold, &bytes);
      if (err != cudaSuccess) return err;
    }
  }
  return cudaSuccess;
}

const char* ops_allocator_error_string(int error) {
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}

}  // extern "C"
