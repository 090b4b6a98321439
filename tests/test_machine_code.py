"""The built library's machine code, read without a GPU (benchmarks/machine_code.py: cuobjdump, nvdisasm,
c++filt, objdump). Per target arch of this checkout's build: every kernel the dispatcher can choose has a
body there; SM90 GEMMs hold wgmma and TMA instructions, SM80 GEMMs mma.sync (DMMA for float64) and
cp.async; no kernel touches local memory (STL/LDL, a stack frame) outside the list below; registers and
shared memory let every launch run. Skipped without a CUDA build, or without the tools outside CI
(requirements.txt installs cuobjdump and nvdisasm). OPS_MACHINE_CODE_SO=PATH checks another build of this
checkout's sources (a candidate build, or a deliberately broken one) instead of ops.library_path()."""

import os

import pytest

import ops
from benchmarks import machine_code as mc

pytestmark = pytest.mark.skipif(not ops.build_info.WITH_CUDA, reason="a CPU-only build has no machine code")

# The archs of the build (ops.build_info.CUDA_ARCH_LIST "8.0;9.0a" -> sm_80, sm_90a).
ARCHS = ["sm_" + a.replace(".", "") for a in ops._library.built_archs()]

# Local-memory traffic accepted: (arch, kernel) -> why.
LOCAL_MEMORY_ALLOWED = {
    ("sm_90a", "sm90_tf32_128x128x32_2x1x1_ntt_align4_warpspecialized_cooperative"):
        "A column-major in TF32: wgmma reads A from registers (RmemA), and at the 168 registers of 384 threads "
        "ptxas keeps 64 B on the stack; the SASS has its STL/LDL in the prologue, the per-tile tail and the "
        "producer warp's TMA issue, none in the HGMMA loop (benchmarks/results/2026-12-06-cpu/machine_code)",
}

# What each launch needs: at least one block per SM (0 is a launch that fails). The SM90 CUTLASS kernels are
# persistent with one CTA per SM (MinBlocksPerMultiprocessor 1, stages filling the shared memory); the SM80
# ones and the hand-written kernels size their grids from the problem.
ASSUMED_BLOCKS_PER_SM = {"sm90_gemm": 1, "sm90_scaled_gemm": 1, "sm90_grouped_gemm": 1, "sm90_scaled_grouped_gemm": 1,
                         "sm80_gemm": 1, "hand_written": 1}


@pytest.fixture(scope="module")
def lib():
    """The reading of ops.library_path() (about 20 s on 2 cores: nvdisasm of every cubin), once per module."""
    missing = mc.missing_tools()
    if missing:
        message = (f"{', '.join(missing)} not installed: pip install -r requirements.txt (nvidia-cuda-cuobjdump, "
                   "nvidia-cuda-nvdisasm); binutils for c++filt and objdump")
        if os.environ.get("CI"):
            pytest.fail(f"CI installs the machine-code tools: {message}")
        pytest.skip(message)
    return mc.read(os.environ.get("OPS_MACHINE_CODE_SO"))


def bodies(lib, arch):
    return [k for k in lib.of(arch) if not k.no_body]


def _names(kernels):
    return sorted({k.name for k in kernels})


def test_the_build_has_a_cubin_per_target_arch(lib):
    assert lib.archs == sorted(ARCHS)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_dispatchable_gemm_kernel_has_a_body_in_its_arch(lib, arch):
    """ops.kernels()'s CUTLASS kernels for this arch (expected_gemms: kernel_list.h's sm and on_sm90, the build
    switch) each have exactly one kernel with a body in the cubin, and no other CUTLASS GEMM has one there."""
    expected = sorted(e["name"] for e in mc.expected_gemms(lib.listing, arch, lib.candidates))
    assert expected, f"no GEMM kernel expected in {arch}"
    gemms = [k for k in bodies(lib, arch) if k.family in ("sm90_gemm", "sm80_gemm")]
    found = sorted(k.name for k in gemms)
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    assert not missing, f"{arch}: no machine code for {missing}"
    assert not extra, f"{arch}: CUTLASS kernels with a body that the kernel list does not expect here: {extra}"
    assert len(found) == len(set(found)), f"{arch}: a kernel-list entry matches several kernels"


@pytest.mark.parametrize("arch", ARCHS)
def test_every_declared_hand_written_kernel_has_a_body_in_every_arch(lib, arch):
    """Each kernel the sources declare has a body in every arch, with the same instantiations as in the other
    archs (those the launch sites make): csrc/'s everywhere; cutlass_gemm/'s (the candidate build's SM90
    GEMV and grouped-GEMM helpers) in sm_90a."""
    assert lib.declared, "no hand-written kernel declaration found under csrc/"

    def expected_here(name):
        return arch == "sm_90a" or not lib.declared[name.split("<")[0]][0].startswith("cutlass_gemm")

    here = {k.name for k in bodies(lib, arch) if k.family == "hand_written"}
    missing = sorted(n for n in lib.declared if expected_here(n) and not any(h.split("<")[0] == n for h in here))
    assert not missing, f"{arch}: declared in {sorted({lib.declared[n][0] for n in missing})} but no body: {missing}"
    everywhere = {k.name for k in lib.kernels if k.family == "hand_written" and not k.no_body and expected_here(k.name)}
    assert sorted(everywhere - here) == [], f"{arch} lacks instantiations the other archs have"


def test_every_kernel_with_a_body_is_known(lib):
    """Every kernel with a body is a listed CUTLASS GEMM or a declared hand-written kernel: a new kernel
    comes with its declaration in the lists the checks above read."""
    unknown = sorted({(k.arch, k.name[:120]) for k in lib.kernels if not k.no_body and k.family == "other"})
    assert not unknown, unknown


def test_sm90_gemms_hold_wgmma_and_tma(lib):
    if "sm_90a" not in ARCHS:
        pytest.skip("no sm_90a image in this build")
    gemms = [k for k in bodies(lib, "sm_90a") if k.family.startswith("sm90_")]
    assert gemms
    assert [k.name for k in gemms if not k.has(mc.WGMMA)] == [], "SM90 GEMMs without wgmma (HGMMA/QGMMA)"
    assert [k.name for k in gemms if not k.has(mc.TMA_LOAD)] == [], "SM90 GEMMs without TMA loads (UTMALDG)"


@pytest.mark.parametrize("arch", ARCHS)
def test_sm80_gemms_hold_mma_sync_and_cp_async(lib, arch):
    gemms = [k for k in bodies(lib, arch) if k.family == "sm80_gemm"]
    if not gemms:
        pytest.skip(f"no SM80 GEMM has a body in {arch}")
    listed = {e["name"]: e for e in lib.listing}
    for k in gemms:
        mma = "DMMA" if listed[k.name]["dtype"] == "float64" else "HMMA"
        assert k.counts.get(mma, 0) > 0, f"{arch} {k.name}: no {mma}"
        assert k.counts.get("LDGSTS", 0) > 0, f"{arch} {k.name}: no cp.async (LDGSTS)"


def _local_memory(k):
    return {"stack": k.stack, "local": k.local, "STL": k.counts.get("STL", 0), "LDL": k.counts.get("LDL", 0)}


@pytest.mark.parametrize("arch", ARCHS)
def test_no_local_memory_outside_the_allowed_list(lib, arch):
    touching = {k.name: _local_memory(k) for k in bodies(lib, arch)
                if (arch, k.name) not in LOCAL_MEMORY_ALLOWED and any(_local_memory(k).values())}
    assert not touching, f"{arch}: kernels with local-memory traffic or a stack frame: {touching}"


@pytest.mark.parametrize("arch, name", list(LOCAL_MEMORY_ALLOWED))
def test_every_allowed_kernel_still_needs_its_entry(lib, arch, name):
    if arch not in ARCHS:
        pytest.skip(f"no {arch} image in this build")
    found = [k for k in bodies(lib, arch) if k.name == name]
    assert found, f"{arch}: no kernel {name} with a body: remove it from LOCAL_MEMORY_ALLOWED"
    assert all(any(_local_memory(k).values()) for k in found), \
        f"{arch}: {name} no longer touches local memory: remove it from LOCAL_MEMORY_ALLOWED"


@pytest.mark.parametrize("arch", ARCHS)
def test_registers_and_shared_memory_let_every_launch_run(lib, arch):
    """Blocks per SM from registers, threads per block and static + dynamic shared memory (cuda_occupancy.h's
    rules, this arch's limits) reach what each launch assumes (ASSUMED_BLOCKS_PER_SM)."""
    assert lib.host_conflicts == {}, f"launches of one kernel with different sizes: {lib.host_conflicts}"
    short = []
    for k in bodies(lib, arch):
        if k.family not in ASSUMED_BLOCKS_PER_SM:
            continue
        assert k.threads, f"{arch} {k.name}: threads per block unknown"
        assert k.dynamic_smem is not None, f"{arch} {k.name}: dynamic shared memory unknown"
        if k.blocks_per_sm < ASSUMED_BLOCKS_PER_SM[k.family]:
            short.append((k.name, k.blocks_per_sm, k.limiter, k.registers, k.threads, k.static_smem + k.dynamic_smem))
    assert not short, f"{arch}: launches that cannot run as assumed (name, blocks/SM, limit, regs, threads, smem): {short}"


@pytest.mark.parametrize("arch", ARCHS)
def test_cutlass_launch_sizes_match_the_kernels(lib, arch):
    """The sizes read from the host code agree with the kernels: an SM80 launch's block is 32 threads per warp
    tile of its threadblock tile; an SM90 launch's block is the kernel's launch bound; the hand-written
    kernels all have a launch bound (their launches use at most that many threads)."""
    for k in bodies(lib, arch):
        if k.family == "sm80_gemm":
            assert k.threads == k.tile_threads, (k.name, k.threads, k.tile_threads)
        elif k.family.startswith("sm90_"):
            assert k.threads == k.launch_bound and k.threads % 128 == 0, (k.name, k.threads, k.launch_bound)
        elif k.family == "hand_written":
            assert k.launch_bound, f"{arch} {k.name}: no __launch_bounds__"


@pytest.mark.parametrize("registers, threads, smem, arch, expected", [
    (32, 256, 0, "sm_80", (8, "registers")),  # 64 warps of 1024 registers; 8 blocks of 8 warps
    (64, 1024, 0, "sm_80", (1, "registers")),  # exactly the register file
    (65, 1024, 0, "sm_80", (0, "registers")),  # 2304 registers per warp: 28 warps fit ("too many resources")
    (168, 384, 1024 + 231424, "sm_90a", (1, "registers")),  # SM90 cooperative GEMM, shared memory full too
    (168, 384, 1024 + 231425, "sm_90a", (0, "shared memory")),  # one byte over the 227 KB opt-in
    (40, 128, 100 * 1024, "sm_80", (1, "shared memory")),  # 164 KB per SM holds one 101 KB block
    (16, 32, 0, "sm_90a", (32, "blocks")),
])
def test_occupancy_follows_cuda_occupancy_h(registers, threads, smem, arch, expected):
    assert mc.occupancy(arch, registers, threads, smem) == expected


def test_template_ids_and_names():
    demangled = "void ops::fused::(anonymous namespace)::rms_norm_kernel<__half, true, false>(__half*, long, double)"
    assert mc.template_id(demangled) == "rms_norm_kernel<__half, true, false>"
    assert mc.template_name(demangled) == "rms_norm_kernel"
    assert mc.template_args("a::B<c::D<1, 2>, (e::F)3, g>", "a::B") == ["c::D<1, 2>", "(e::F)3", "g"]
