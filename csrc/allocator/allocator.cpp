// The pluggable allocator (allocator.h). Plain C++ on the CUDA runtime; no torch headers beyond c10's
// exception type.
//
// Stream ordering: memory is allocated on the caller's stream from a per-device cudaMemPool_t. A free
// is ordered after the work queued so far on every stream this allocator has seen use its memory (each
// stream that allocated, and each stream a tensor was record_stream'ed to, see
// ops_allocator_record_stream): an internal stream waits on an event recorded on each of them, then
// cudaFreeAsync runs on the internal stream. The pool hands a block out again only once that free has
// executed, so memory freed on the host while a kernel on a side stream still reads it is not reused
// early. (The pool may make a later allocation wait on that free, as cudaMallocAsync pools do.)
// While a device has seen one stream only, a free runs on that stream directly (the same order, with
// no event and no cross-stream dependency for the next allocation).
//
// CUDA graph capture (what CUDA allows, and what PyTorch's cudaMallocAsync backend does):
//  * an allocation on a capturing stream becomes a graph allocation (a memory node of the graph) for
//    ops_alloc (global install); for ops_pool_alloc (a MemPool segment, which PyTorch's caching
//    allocator keeps and reuses beyond the graph) it is real memory, allocated outside the capture;
//  * a graph allocation freed while its stream captures becomes a free node of the graph;
//  * ordinary memory freed while its stream captures cannot be freed inside the graph: the free is
//    deferred until that stream's capture is over (done at the next allocation or free).
#include "allocator.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

namespace {

constexpr int kMaxDevices = 64;

struct DeviceState {
  std::mutex mu;
  cudaMemPool_t pool = nullptr;
  cudaStream_t free_stream = nullptr;
  std::vector<std::pair<cudaStream_t, cudaEvent_t>> streams;  // seen using our memory
  std::unordered_set<void*> graph_allocations;  // allocated on a capturing stream (graph memory nodes)
  struct DeferredFree {
    void* ptr;
    cudaStream_t stream;  // the capturing stream the free was asked on
  };
  std::vector<DeferredFree> deferred;  // ordinary memory freed during a capture: freed after it
  std::atomic<int64_t> in_use{0}, peak{0}, allocations{0}, frees{0}, failed{0};
};

// Never destroyed: frees can arrive during interpreter shutdown, after static destructors would run.
DeviceState* states() {
  static DeviceState* s = new DeviceState[kMaxDevices];
  return s;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// OPS_ALLOCATOR_RELEASE_THRESHOLD: decimal digits (bytes, at most UINT64_MAX), blanks around them
// allowed, as ops/allocator.py accepts. Unset or blank: UINT64_MAX (keep everything until trim). Any
// other value is reported on stderr, once, and the default kept: it is read inside an allocation or a
// ctypes call, where an exception cannot be thrown (ops.allocator raises for it before installing).
uint64_t release_threshold_from_env() {
  const char* env = std::getenv("OPS_ALLOCATOR_RELEASE_THRESHOLD");
  if (env == nullptr) return UINT64_MAX;
  const char* p = env;
  while (is_space(*p)) ++p;
  if (*p == '\0') return UINT64_MAX;
  uint64_t value = 0;
  bool ok = *p >= '0' && *p <= '9';
  for (; ok && *p >= '0' && *p <= '9'; ++p) {
    const uint64_t digit = static_cast<uint64_t>(*p - '0');
    if (value > (UINT64_MAX - digit) / 10) ok = false;  // beyond UINT64_MAX
    value = value * 10 + digit;
  }
  while (ok && is_space(*p)) ++p;
  if (ok && *p == '\0') return value;
  std::fprintf(stderr,
               "ops.allocator: OPS_ALLOCATOR_RELEASE_THRESHOLD='%s' is not a non-negative integer number of "
               "bytes (at most %llu); ignored: pools keep their memory until trim()\n",
               env, static_cast<unsigned long long>(UINT64_MAX));
  return UINT64_MAX;
}

std::atomic<uint64_t>& release_threshold() {
  static std::atomic<uint64_t> value(release_threshold_from_env());
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
  // Pool memory is visible to other devices only through cudaMemPoolSetAccess (peer access enabled
  // with cudaDeviceEnablePeerAccess, which is all PyTorch does for pluggable allocators, covers
  // cudaMalloc memory only): map it for every peer that can access this device, so that kernels
  // reading across devices (copies between GPUs that are not plain memcpys) work as with the caching
  // allocator.
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  for (int peer = 0; peer < devices; ++peer) {
    int can_access = 0;
    if (peer == device || cudaDeviceCanAccessPeer(&can_access, peer, device) != cudaSuccess || !can_access) continue;
    cudaMemAccessDesc access = {};
    access.location.type = cudaMemLocationTypeDevice;
    access.location.id = peer;
    access.flags = cudaMemAccessFlagsProtReadWrite;
    (void)cudaMemPoolSetAccess(pool, &access, 1);  // best effort: without it, only peer reads fail
  }
  (void)cudaGetLastError();  // what these best-effort calls left (once per device, when its pool is made)
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
  } else {
    (void)cudaGetLastError();  // our failed call: do not leave its error for PyTorch's next check
  }
}

bool is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t err = cudaStreamIsCapturing(stream, &status);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    // The legacy default stream while a blocking stream captures: any work on it (an event record, a
    // free, a synchronize) would join and invalidate that capture, so treat it as capturing (the free
    // is deferred, trim skips it).
    if (err == cudaErrorStreamCaptureImplicit) return true;
    return false;  // e.g. a stream destroyed since: not capturing, and no error left behind
  }
  return status != cudaStreamCaptureStatusNone;
}

// Frees `ptr`, allocated on `stream`, after the work queued so far on every remembered stream and on
// `stream` (which a MemPool segment allocated during a capture never was): on the internal stream, or
// on `stream` itself when it is the only stream seen.
// Caller holds state.mu, device current, and no capture runs on `stream`.
cudaError_t free_ordered(DeviceState& state, void* ptr, cudaStream_t stream) {
  remember_stream(state, stream);
  // `stream` is the only stream seen using our memory (one-stream programs, the common case): a free
  // on it is already ordered after all that work. No event, no wait on the internal stream, and the
  // next allocation on `stream` can reuse the block in stream order, with no cross-stream dependency
  // (as PyTorch's cudaMallocAsync backend frees).
  if (state.streams.size() == 1 && state.streams.front().first == stream) return cudaFreeAsync(ptr, stream);
  cudaStream_t free_stream = state.free_stream;
  for (auto it = state.streams.begin(); it != state.streams.end();) {
    // A stream that is being captured now cannot be waited on from outside the capture: its work
    // queued before the capture was waited on by earlier frees, its captured work is in a graph.
    if (is_capturing(it->first)) {
      ++it;
      continue;
    }
    if (cudaEventRecord(it->second, it->first) == cudaSuccess) {
      cudaStreamWaitEvent(free_stream, it->second, 0);
      ++it;
    } else {  // a destroyed stream: forget it
      (void)cudaGetLastError();
      cudaEventDestroy(it->second);
      it = state.streams.erase(it);
    }
  }
  return cudaFreeAsync(ptr, free_stream);
}

// Frees the deferred blocks whose capture is over. Caller holds state.mu, device current.
void flush_deferred(DeviceState& state) {
  for (auto it = state.deferred.begin(); it != state.deferred.end();) {
    if (is_capturing(it->stream)) {
      ++it;
      continue;
    }
    if (free_ordered(state, it->ptr, it->stream) != cudaSuccess) (void)cudaGetLastError();
    it = state.deferred.erase(it);
  }
}

// graph_memory: whether an allocation on a capturing stream may be a graph allocation (ops_alloc) or
// must be real memory (ops_pool_alloc).
void* allocate(size_t size, int device, cudaStream_t stream, bool graph_memory, cudaError_t* error) {
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
    if (!is_capturing(stream)) {
      if (!state.deferred.empty()) flush_deferred(state);
      err = cudaMallocFromPoolAsync(&ptr, size, state.pool, stream);
      if (err == cudaSuccess) remember_stream(state, stream);
      return err;
    }
    if (graph_memory) {
      err = cudaMallocFromPoolAsync(&ptr, size, state.pool, stream);
      if (err == cudaSuccess) state.graph_allocations.insert(ptr);
      return err;
    }
    // Real memory while `stream` captures: allocate on the internal stream, outside the capture
    // (relaxed mode lets this thread make calls a global-mode capture forbids), and wait for it, since
    // a capturing stream cannot wait on an event recorded outside its capture.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    err = cudaMallocFromPoolAsync(&ptr, size, state.pool, state.free_stream);
    if (err == cudaSuccess) err = cudaStreamSynchronize(state.free_stream);
    cudaThreadExchangeStreamCaptureMode(&mode);
    return err;
  });
  if (*error != cudaSuccess) {
    (void)cudaGetLastError();  // our failed call's error: PyTorch's next launch check must not see it
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
  return allocate(size, device, stream, /*graph_memory=*/false, &error);
}

void* ops_alloc(size_t size, int device, cudaStream_t stream) {
  cudaError_t error = cudaSuccess;
  void* ptr = allocate(size, device, stream, /*graph_memory=*/true, &error);
  if (ptr == nullptr && size > 0) {
    // Out of memory only for that error: a caller that catches it to retry smaller must not loop on
    // a failed context (a sticky error) or a bad device.
    TORCH_CHECK_WITH(OutOfMemoryError, error != cudaErrorMemoryAllocation, "ops allocator: could not allocate ",
                     size, " bytes on CUDA device ", device, ": ", cudaGetErrorString(error),
                     ". The pool stays usable; free tensors or call ops.allocator.trim().");
    TORCH_CHECK(false, "ops allocator: allocating ", size, " bytes on CUDA device ", device, " failed: ",
                cudaGetErrorString(error));
  }
  return ptr;
}

void ops_free(void* ptr, size_t size, int device, cudaStream_t stream) {
  if (ptr == nullptr || device < 0 || device >= kMaxDevices) return;
  DeviceState& state = states()[device];
  const cudaError_t err = on_device(device, [&] {
    std::lock_guard<std::mutex> lock(state.mu);
    const bool graph_allocation = state.graph_allocations.erase(ptr) > 0;
    if (is_capturing(stream)) {
      if (graph_allocation) return cudaFreeAsync(ptr, stream);  // a free node of the graph
      state.deferred.push_back({ptr, stream});
      return cudaSuccess;
    }
    if (!state.deferred.empty()) flush_deferred(state);
    return free_ordered(state, ptr, stream);
  });
  if (err != cudaSuccess) (void)cudaGetLastError();
  state.frees.fetch_add(1);
  state.in_use.fetch_sub(static_cast<int64_t>(size));
}

void ops_allocator_record_stream(void* ptr, cudaStream_t stream) {
  cudaPointerAttributes attributes = {};
  if (ptr == nullptr || cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess ||
      attributes.type != cudaMemoryTypeDevice || attributes.device < 0 || attributes.device >= kMaxDevices) {
    (void)cudaGetLastError();
    return;
  }
  DeviceState& state = states()[attributes.device];
  if (is_capturing(stream)) return;  // captured work is ordered by the graph, not by our frees
  // The event remember_stream creates must belong to the block's device, which PyTorch's record_stream
  // does not make current: an event of another device cannot be recorded on the stream, and free_ordered
  // would then take the stream for destroyed and stop waiting for it.
  const cudaError_t err = on_device(attributes.device, [&] {
    std::lock_guard<std::mutex> lock(state.mu);
    remember_stream(state, stream);
    return cudaSuccess;
  });
  if (err != cudaSuccess) (void)cudaGetLastError();
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
  out->peak_bytes_reserved = 0;
  std::lock_guard<std::mutex> lock(state.mu);
  out->deferred_frees = static_cast<int64_t>(state.deferred.size());
  if (state.pool != nullptr) {
    uint64_t reserved = 0, high = 0;
    cudaError_t err = cudaMemPoolGetAttribute(state.pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
    if (err == cudaSuccess) err = cudaMemPoolGetAttribute(state.pool, cudaMemPoolAttrReservedMemHigh, &high);
    if (err != cudaSuccess) return err;
    out->bytes_reserved = static_cast<int64_t>(reserved);
    out->peak_bytes_reserved = static_cast<int64_t>(high);
  }
  return cudaSuccess;
}

int ops_allocator_reset_peak(int device) {
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidValue;
  DeviceState& state = states()[device];
  state.peak.store(state.in_use.load());
  std::lock_guard<std::mutex> lock(state.mu);
  if (state.pool != nullptr) {
    uint64_t zero = 0;  // resets the high-water mark to the current reservation
    return cudaMemPoolSetAttribute(state.pool, cudaMemPoolAttrReservedMemHigh, &zero);
  }
  return cudaSuccess;
}

int ops_allocator_trim(int device, size_t keep_bytes) {
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidValue;
  DeviceState& state = states()[device];
  cudaMemPool_t pool = nullptr;
  cudaStream_t free_stream = nullptr;
  std::vector<cudaStream_t> seen;  // one-stream frees are queued on the stream itself (free_ordered)
  {
    std::lock_guard<std::mutex> lock(state.mu);
    pool = state.pool;
    free_stream = state.free_stream;
    // Frees deferred past a capture that has ended since (no allocation or free has run them yet).
    if (pool != nullptr && !state.deferred.empty()) on_device(device, [&] { flush_deferred(state); return cudaSuccess; });
    for (const auto& entry : state.streams) seen.push_back(entry.first);
  }
  if (pool == nullptr) return cudaSuccess;
  // Queued frees must have run before their memory can be released. Waited for without the lock, so
  // allocations and frees of other threads go on meanwhile. A capturing stream cannot be synchronised
  // (and its frees wait for the capture anyway). Relaxed capture mode, as in allocate: while another
  // thread captures in global mode (PyTorch's default), a synchronise from this thread would be a
  // prohibited call that invalidates that capture (CUDA programming guide, stream capture modes).
  return on_device(device, [&] {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudaError_t err = cudaStreamSynchronize(free_stream);
    if (err == cudaSuccess) {
      for (cudaStream_t stream : seen) {
        if (is_capturing(stream)) continue;
        if (cudaStreamSynchronize(stream) != cudaSuccess) {
          (void)cudaGetLastError();  // a seen stream destroyed since, as free_ordered forgets them
        }
      }
      err = cudaMemPoolTrimTo(pool, keep_bytes);
    }
    cudaThreadExchangeStreamCaptureMode(&mode);
    return err;
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

uint64_t ops_allocator_release_threshold() { return release_threshold().load(); }

const char* ops_allocator_error_string(int error) {
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}

}  // extern "C"
