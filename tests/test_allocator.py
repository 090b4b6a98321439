"""ops' pluggable CUDA allocator. On any machine: the library exports the functions PyTorch loads, with
the types it calls them with, and the Python API fails clearly without a GPU. On a GPU (marked `cuda`):
each case from public failure reports, each in a fresh process, since the global install must happen
before CUDA allocates."""

import os
import subprocess
import textwrap

import pytest
import torch

import ops
from conftest import HAS_CUDA, REPO, run_python

needs_cuda_build = pytest.mark.skipif(not ops.build_info.WITH_CUDA, reason="CPU-only build of ops")
EXPORTED = ["ops_alloc", "ops_pool_alloc", "ops_free", "ops_allocator_record_stream", "ops_allocator_stats", "ops_allocator_reset_peak",
            "ops_allocator_trim", "ops_allocator_set_release_threshold", "ops_allocator_error_string"]


@needs_cuda_build
def test_library_exports_the_allocator_functions():
    out = subprocess.run(["nm", "-D", "--defined-only", ops.library_path()], capture_output=True,
                         text=True, check=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if " T " in line}
    missing = [name for name in EXPORTED if name not in exported]
    assert not missing, f"not exported as functions: {missing}"


def _stats_layout_asserts():
    """static_asserts that ops.allocator's ctypes mirror of OpsAllocatorStats has the C struct's fields,
    in order, at the same offsets, with the same size (ctypes reads the struct by position)."""
    import ctypes

    lines = [f"static_assert(sizeof(OpsAllocatorStats) == {ctypes.sizeof(ops.allocator._Stats)});"]
    for name, ctype in ops.allocator._Stats._fields_:
        offset = getattr(ops.allocator._Stats, name).offset
        lines.append(f"static_assert(offsetof(OpsAllocatorStats, {name}) == {offset});")
        lines.append(f"static_assert(sizeof(OpsAllocatorStats::{name}) == {ctypes.sizeof(ctype)});")
    return "\n        ".join(["#include <cstddef>"] + lines)


@needs_cuda_build
def test_allocator_signatures_match_what_pytorch_calls(tmp_path):
    # PyTorch stores the functions as std::function<void*(size_t, int, cudaStream_t)> and
    # std::function<void(void*, size_t, int, cudaStream_t)> (torch/csrc/cuda/CUDAPluggableAllocator.h)
    # and calls them through raw pointers looked up by name: C symbols carry no types, so check ours
    # against those at compile time.
    src = tmp_path / "signatures.cpp"
    src.write_text(textwrap.dedent("""
        #include "csrc/allocator/allocator.h"
        #include <type_traits>
        static_assert(std::is_same_v<decltype(&ops_alloc), void* (*)(size_t, int, cudaStream_t)>);
        static_assert(std::is_same_v<decltype(&ops_pool_alloc), void* (*)(size_t, int, cudaStream_t)>);
        static_assert(std::is_same_v<decltype(&ops_free), void (*)(void*, size_t, int, cudaStream_t)>);
        static_assert(std::is_same_v<decltype(&ops_allocator_record_stream), void (*)(void*, cudaStream_t)>);
        @STATS@
        int main() { return 0; }
    """).replace("@STATS@", _stats_layout_asserts()))
    cuda_include = os.path.join(ops.build_info.CUDA_HOME, "include")
    result = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", f"-I{REPO}", f"-I{cuda_include}", str(src)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@needs_cuda_build
def test_pytorch_accepts_the_functions():
    allocator = ops.allocator.pluggable()
    assert isinstance(allocator, torch.cuda.memory.CUDAPluggableAllocator)
    assert allocator.allocator() is not None
    assert ops.allocator.pluggable(ops.allocator.POOL_ALLOC_FN).allocator() is not None
    for name in ("ops_free", "nope"):  # an exported symbol that is no allocator, one that is not there
        with pytest.raises(ValueError, match=f"ops.allocator.pluggable: expected alloc_fn to be 'ops_alloc' .* "
                                             f"got '{name}'"):
            ops.allocator.pluggable(name)


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-GPU message")
@pytest.mark.parametrize("call", ["install", "pool", "stats", "reset_peak", "trim"])
def test_api_without_gpu_fails_clearly(call):
    with pytest.raises(RuntimeError, match=r"ops\.allocator: (no CUDA GPU is available|this build of ops "
                                           r"has no CUDA code)"):
        getattr(ops.allocator, call)()


# ---- on a GPU: each case in a fresh interpreter ---------------------------------------------------

def _run_gpu(code, env=None):
    # 90 s: a hang (say, a capture waiting on itself) must not eat the device check's whole test budget.
    result = run_python("import torch, ops\n" + textwrap.dedent(code), cwd=REPO, env=env, timeout=90)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result.stdout


@pytest.mark.cuda
def test_install_after_cuda_allocated_is_a_clear_error():
    _run_gpu("""
        torch.ones(1, device="cuda")
        try:
            ops.allocator.install()
        except RuntimeError as e:
            assert "already initialised" in str(e) and "use_mem_pool" in str(e), e
        else:
            raise AssertionError("install() after a CUDA allocation must fail")
    """)


@pytest.mark.cuda
def test_global_install_stats_and_ops():
    _run_gpu("""
        ops.allocator.install()
        s0 = ops.allocator.stats()
        A = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
        B = torch.randn(512, 128, device="cuda", dtype=torch.bfloat16)
        C = ops.cutlass_gemm(A, B)
        torch.testing.assert_close(C.float(), (A.double() @ B.double()).float(), atol=0.5, rtol=2e-2)
        s1 = ops.allocator.stats()
        assert s1["allocations"] >= s0["allocations"] + 3
        assert s1["bytes_in_use"] >= s0["bytes_in_use"] + (256 * 512 + 512 * 128 + 256 * 128) * 2
        assert s1["peak_bytes_in_use"] >= s1["bytes_in_use"] and s1["bytes_reserved"] >= s1["bytes_in_use"]
        assert s1["peak_bytes_reserved"] >= s1["bytes_reserved"]
        del A, B, C
        torch.cuda.synchronize()
        s2 = ops.allocator.stats()
        assert s2["frees"] >= s0["frees"] + 3 and s2["bytes_in_use"] <= s1["bytes_in_use"] - 2 * 256 * 512
        ops.allocator.reset_peak()
        s3 = ops.allocator.stats()
        assert s3["peak_bytes_in_use"] == s3["bytes_in_use"] and s3["peak_bytes_reserved"] == s3["bytes_reserved"]
        ops.allocator.trim()
        assert ops.allocator.stats()["bytes_reserved"] <= s1["bytes_reserved"]
    """)


@pytest.mark.cuda
def test_out_of_memory_raises_and_pool_stays_usable():
    _run_gpu("""
        ops.allocator.install()
        try:
            torch.empty(1 << 46, dtype=torch.uint8, device="cuda")  # 64 TiB
        except torch.cuda.OutOfMemoryError as e:
            assert "ops allocator" in str(e)
        else:
            raise AssertionError("expected OutOfMemoryError")
        assert ops.allocator.stats()["failed_allocations"] >= 1
        x = torch.ones(1 << 20, device="cuda")
        assert x.sum().item() == 1 << 20
    """)


@pytest.mark.cuda
def test_pool_after_install_is_a_clear_error():
    _run_gpu("""
        ops.allocator.install()
        try:
            ops.allocator.pool()
        except RuntimeError as e:
            assert "ops.allocator.pool(): the process's CUDA allocator is " in str(e) and "install()" in str(e), e
        else:
            raise AssertionError("a MemPool needs PyTorch's caching allocator")
        assert torch.ones(8, device="cuda").sum().item() == 8
    """)


@pytest.mark.cuda
def test_mem_pool_out_of_memory():
    _run_gpu("""
        pool = ops.allocator.pool()
        with torch.cuda.use_mem_pool(pool):
            try:
                torch.empty(1 << 46, dtype=torch.uint8, device="cuda")
            except torch.cuda.OutOfMemoryError:
                pass
            else:
                raise AssertionError("expected OutOfMemoryError")
            x = torch.ones(1 << 20, device="cuda")
        assert x.sum().item() == 1 << 20
    """)


@pytest.mark.cuda
def test_tensor_outliving_its_pool_is_freed_by_our_free():
    _run_gpu("""
        before = ops.allocator.stats()
        pool = ops.allocator.pool()
        with torch.cuda.use_mem_pool(pool):
            x = torch.randn(1 << 22, device="cuda")
        x_sum = x.sum().item()
        del pool                      # the pool object dies first ...
        assert x.sum().item() == x_sum  # ... its tensor still works
        del x
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        after = ops.allocator.stats()
        made = after["allocations"] - before["allocations"]
        assert made >= 1 and after["frees"] - before["frees"] == made, (before, after)
    """)


@pytest.mark.cuda
def test_mem_pool_keeps_pytorch_stats_and_ops_work():
    _run_gpu("""
        pool = ops.allocator.pool()
        with torch.cuda.use_mem_pool(pool):
            A = torch.randn(128, 64, device="cuda")
            B = torch.randn(64, 96, device="cuda")
            C = ops.cutlass_gemm(A, B)
        torch.testing.assert_close(C, A @ B, atol=1e-4, rtol=1e-4)
        assert torch.cuda.memory_allocated() >= C.numel() * 4
        assert torch.cuda.memory_stats()["allocation.all.current"] >= 3
        s = torch.cuda.Stream()
        C.record_stream(s)  # works under a MemPool (PyTorch's caching allocator is in charge)
    """)


@pytest.mark.cuda
def test_side_stream_reader_is_not_overwritten():
    # Memory freed on the host while a kernel on a side stream still reads it must not be handed out
    # again before that stream is done (no record_stream under a global pluggable allocator).
    _run_gpu("""
        ops.allocator.install()
        side = torch.cuda.Stream()
        n = 1 << 24
        a = torch.full((n,), 3.0, device="cuda")
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)   # keep the side stream busy
            b = a * 2                         # reads a, later
        del a                                 # freed on the host now
        c = torch.full((n,), -1.0, device="cuda")   # same size, default stream: must not reuse a
        torch.cuda.synchronize()
        assert torch.all(b == 6.0).item(), "a side stream read memory that was handed out again"
        assert torch.all(c == -1.0).item()
    """)


@pytest.mark.cuda
def test_one_stream_frees_are_stream_ordered():
    # While one stream has used the pool, frees run on it directly (no internal stream): a block freed
    # while queued kernels still read it is reused only after them, in stream order.
    _run_gpu("""
        ops.allocator.install()
        n = 1 << 24
        a = torch.full((n,), 3.0, device="cuda")
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)   # the kernels below run later than the host frees
        b = a * 2
        del a
        c = torch.full((n,), -1.0, device="cuda")
        d = b + 1
        del b
        e = torch.zeros(n, device="cuda")
        torch.cuda.synchronize()
        assert torch.all(c == -1.0).item() and torch.all(d == 7.0).item() and torch.all(e == 0).item()
        assert ops.allocator.stats()["frees"] >= 2
    """)


@pytest.mark.cuda
def test_trim_waits_for_frees_queued_on_a_busy_stream():
    _run_gpu("""
        ops.allocator.install()
        big = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        torch.cuda._sleep(200_000_000)
        big.fill_(1)
        del big                           # the free is queued behind the sleep
        ops.allocator.trim()
        reserved = ops.allocator.stats()["bytes_reserved"]
        assert reserved < (256 << 20), f"trim left {reserved} bytes reserved"
    """)


@pytest.mark.cuda
def test_trim_during_another_threads_graph_capture():
    # PyTorch captures in global mode: a cudaStreamSynchronize from another thread during the capture is a
    # prohibited call that invalidates it. trim synchronises streams, so it runs in relaxed capture
    # mode, as allocate does.
    _run_gpu("""
        import threading
        ops.allocator.install()
        x = torch.ones(1 << 20, device="cuda")
        torch.cuda.synchronize()
        stop, errors = threading.Event(), []

        def trimmer():
            while not stop.is_set():
                ops.allocator.trim()

        thread = threading.Thread(target=trimmer)
        thread.start()
        try:
            for i in range(50):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):  # global capture mode, PyTorch's default
                    y = x * 2 + i
                graph.replay()
                torch.cuda.synchronize()
                assert torch.all(y == 2 + i).item(), i
        finally:
            stop.set()
            thread.join()
    """)


@pytest.mark.cuda
def test_record_stream_orders_frees_after_a_stream_that_never_allocated():
    # The side stream only writes in place: the allocator knows of it through record_stream alone.
    _run_gpu("""
        ops.allocator.install()
        side = torch.cuda.Stream()
        n = 1 << 24
        a = torch.zeros(n, device="cuda")
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)
            a.add_(5.0)                       # in place, later: nothing allocated on the side stream
        a.record_stream(side)
        del a
        c = torch.full((n,), -1.0, device="cuda")   # reusing a's memory now would get the side's +5 later
        torch.cuda.synchronize()
        assert torch.all(c == -1.0).item(), "memory still written by a side stream was handed out again"
    """)


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_record_stream_of_a_block_on_a_device_that_is_not_current():
    # PyTorch's record_stream sets no device guard: an event created on the current device could not be
    # recorded on a stream of the block's device, and frees would stop waiting for that stream.
    _run_gpu("""
        ops.allocator.install()
        n = 1 << 24
        a = torch.zeros(n, device="cuda:1")
        side = torch.cuda.Stream(device=1)
        torch.cuda.synchronize(1)
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)
            a.add_(5.0)
        assert torch.cuda.current_device() == 0
        a.record_stream(side)
        del a
        c = torch.full((n,), -1.0, device="cuda:1")
        torch.cuda.synchronize(1)
        assert torch.all(c == -1.0).item(), "memory still written by a side stream was handed out again"
    """)


@pytest.mark.cuda
def test_graph_capture_under_global_install():
    # Memory allocated before a capture and freed during it (rebinding a warmed-up output) is freed
    # after the capture; the graph's own allocations are graph memory; replays compute right.
    _run_gpu("""
        ops.allocator.install()
        x = torch.randn(1 << 20, device="cuda")
        w = torch.randn(256, 256, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            y = ops.cutlass_gemm(ops.rms_norm(x.view(-1, 256), w[0]), w)  # warm-up, allocated on s
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        assert ops.allocator.stats()["deferred_frees"] == 0
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s):
            y = ops.cutlass_gemm(ops.rms_norm(x.view(-1, 256), w[0]), w)  # frees the warm-up y in capture
        assert ops.allocator.stats()["deferred_frees"] >= 1  # the warm-up y: not the graph's memory
        for value in (1.0, 2.0):
            x.fill_(value)
            graph.replay()
            torch.cuda.synchronize()
            expected = ops.cutlass_gemm(ops.rms_norm(x.view(-1, 256), w[0]), w)
            torch.testing.assert_close(y, expected)
        z = torch.empty(1 << 20, device="cuda")             # the deferred free runs by now
        assert ops.allocator.stats()["deferred_frees"] == 0
        del graph, y
        torch.cuda.synchronize()
        ops.allocator.trim()
    """)


@pytest.mark.cuda
def test_graph_capture_into_an_ops_mem_pool():
    # PyTorch's caching allocator asks the pool for a segment during capture: it must be real memory,
    # usable outside the graph afterwards.
    _run_gpu("""
        pool = ops.allocator.pool()
        x = torch.randn(1024, 1024, device="cuda")
        graph = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            x * 2                                    # warm-up
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(graph, pool=pool.id):          # the capture allocates from our pool
            y = x * 2 + 1
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(y, x * 2 + 1)
        assert ops.allocator.stats()["allocations"] >= 1
        with torch.cuda.use_mem_pool(pool):
            z = torch.ones(1024, 1024, device="cuda")   # may reuse the pool's segments outside the graph
        torch.cuda.synchronize()
        assert z.sum().item() == 1024 * 1024
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(y, x * 2 + 1)
    """)


@pytest.mark.cuda
def test_process_exits_cleanly_with_a_live_pool():
    out = _run_gpu("""
        pool = ops.allocator.pool()
        with torch.cuda.use_mem_pool(pool):
            keep = torch.randn(1 << 20, device="cuda")
        ops_global = keep.sum().item()
        print("done")
    """)
    assert "done" in out


@pytest.mark.cuda
def test_process_exits_cleanly_under_global_install():
    out = _run_gpu("""
        ops.allocator.install()
        keep = [torch.randn(1 << 16, device="cuda") for _ in range(10)]
        print("done")
    """)
    assert "done" in out
