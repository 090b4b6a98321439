"""The built library's machine code, read without a GPU: for every kernel in every target arch's cubin,
its registers, stack frame, local-memory traffic (STL/LDL instructions), static and dynamic shared memory,
threads per block, blocks per SM, and whether it holds the instructions of its hardware path (SM90
GEMMs: HGMMA/QGMMA = wgmma, UTMALDG = TMA loads; SM80 GEMMs: HMMA or DMMA = mma.sync, LDGSTS = cp.async).

    python -m benchmarks.machine_code [--so PATH] [--out DIR]

writes machine_code.md and machine_code.json (default DIR: benchmarks/results/local) for the library at
PATH (default: this checkout's ops/_C*.so). tests/test_machine_code.py asserts on the same reading (read()).

Where each figure comes from:
- cubins: `cuobjdump -xelf all` of the library; registers, stack frame, static shared memory and local
  memory per kernel from `cuobjdump --dump-resource-usage`; the launch bound (__launch_bounds__'s threads)
  from the cubin's EIATTR_MAX_THREADS; instruction counts from `nvdisasm` of each cubin.
- kernel names: demangled with `c++filt -r` (GNU c++filt's default recursion limit refuses the CUTLASS 3.x
  names) or llvm-cxxfilt. CUTLASS kernels are matched to ops.kernels() by the fields their template
  arguments spell (dtype, math, layouts, tile, cluster, schedule, stages, epilogue, scheduler, swap-AB);
  hand-written kernels by the names their sources declare (csrc/*.cu, csrc/*.cuh).
- dynamic shared memory: the CUTLASS launchers set cudaFuncAttributeMaxDynamicSharedMemorySize to the
  kernel's sizeof(SharedStorage) and launch with that many bytes (cutlass_gemm/kernels/cutlass_common.cuh's
  ensure_max_dynamic_smem for SM90, CUTLASS 2.x's GemmUniversalBase for SM80): read from the immediate of
  each cudaFuncSetAttribute(kernel, 8, bytes) call in the x86-64 host code (`objdump -d`). The hand-written
  kernels launch with none (csrc/fused_device.cuh's launch_kernel: <<<grid, threads, 0, stream>>>).
- threads per block: the launch bound where the kernel has one (the most its launches use: CUTLASS 3.x
  kernels launch exactly MaxThreadsPerBlock, the hand-written ones at most their bound); CUTLASS 2.x
  kernels have none and launch 32 threads per warp tile (threadblock shape / warp shape).
- blocks per SM: cuda_occupancy.h's register, warp, shared-memory and block limits (CUDA 13.0) for an
  A100 (sm_80) and an H100 / H200 (sm_90a). Every launch here assumes at least 1 (SM90 CUTLASS kernels are
  persistent, 1 CTA per SM by their MinBlocksPerMultiprocessor and their stage count, which fills the
  shared memory); 0 means the launch fails.

Tools: the CUDA toolkit's cuobjdump and nvdisasm where it has them, else the nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm wheels of requirements.txt; c++filt and objdump from binutils.
"""

import argparse
import concurrent.futures
import dataclasses
import datetime
import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Device limits per target arch, as cuda_occupancy.h reads them from cudaDeviceProp (CUDA 13.0; the CUDA
# C++ Programming Guide's compute capability table): A100 for sm_80, H100 / H200 for sm_90a.
ARCH_LIMITS = {
    "sm_80": {"regs_per_sm": 65536, "regs_per_block": 65536, "max_regs_per_thread": 255,
              "max_threads_per_block": 1024, "max_threads_per_sm": 2048, "max_blocks_per_sm": 32,
              "smem_per_sm": 167936, "smem_per_block_optin": 166912, "reserved_smem_per_block": 1024},
    "sm_90a": {"regs_per_sm": 65536, "regs_per_block": 65536, "max_regs_per_thread": 255,
               "max_threads_per_block": 1024, "max_threads_per_sm": 2048, "max_blocks_per_sm": 32,
               "smem_per_sm": 233472, "smem_per_block_optin": 232448, "reserved_smem_per_block": 1024},
}
REG_ALLOC_UNIT = 256  # registers, per warp (cudaOccRegAllocationGranularity, sm_80 and sm_90)
SUB_PARTITIONS = 4  # cudaOccSubPartitionsPerMultiprocessor
SMEM_ALLOC_UNIT = 128  # bytes (cudaOccSMemAllocationGranularity)

# SASS mnemonics (the part before the first '.') counted per kernel.
WGMMA = ("HGMMA", "QGMMA", "IGMMA", "BGMMA")  # wgmma.mma_async: f16/bf16/tf32, fp8, int8, binary
TMA_LOAD = ("UTMALDG",)  # cp.async.bulk.tensor global -> shared
MMA_SYNC = ("HMMA", "DMMA", "IMMA")  # mma.sync: f16/bf16/tf32, fp64, int8
CP_ASYNC = ("LDGSTS",)  # cp.async global -> shared
LOCAL = ("STL", "LDL")  # local memory (spills, or arrays the compiler could not keep in registers)
COUNTED = WGMMA + TMA_LOAD + ("UTMASTG",) + MMA_SYNC + CP_ASYNC + LOCAL


class ToolMissing(RuntimeError):
    """A tool this reader needs is not installed."""


def find_tool(name):
    """Path of a CUDA binary tool (cuobjdump, nvdisasm): on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin,
    or in an nvidia-* wheel (site-packages/nvidia/cu*/bin, where nvidia-cuda-cuobjdump and
    nvidia-cuda-nvdisasm put them); None if none is found."""
    found = shutil.which(name)
    if found:
        return found
    places = [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin")]
    spec = importlib.util.find_spec("nvidia")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        places += sorted(glob.glob(os.path.join(folder, "cu*", "bin")), reverse=True)
        places.append(os.path.join(folder, "cuda_nvcc", "bin"))
    for place in places:
        path = os.path.join(place, name)
        if os.access(path, os.X_OK):
            return path
    return None


def _demangler():
    """The command that demangles names on stdin, one per line, without a recursion limit."""
    if shutil.which("c++filt"):
        return ["c++filt", "-r"]
    for name in ("llvm-cxxfilt", "cu++filt"):
        if shutil.which(name):
            return [name]
    return None


def missing_tools():
    """The tools read() needs that are not installed (names), empty when all are."""
    missing = [t for t in ("cuobjdump", "nvdisasm") if find_tool(t) is None]
    if _demangler() is None:
        missing.append("c++filt")
    if shutil.which("objdump") is None:
        missing.append("objdump")
    return missing


def _run(cmd, cwd=None):
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"machine_code: `{' '.join(cmd)}` failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def demangle(names):
    """{mangled: demangled} for `names`."""
    names = sorted(set(names))
    if not names:
        return {}
    command = _demangler()
    if command is None:
        raise ToolMissing("machine_code: no demangler (c++filt from binutils, or llvm-cxxfilt)")
    out = subprocess.run(command, input="\n".join(names) + "\n", capture_output=True, text=True,
                         check=True).stdout.splitlines()
    if len(out) != len(names):
        raise RuntimeError(f"machine_code: {command[0]} returned {len(out)} names for {len(names)}")
    return dict(zip(names, out))


@dataclasses.dataclass
class Kernel:
    """One kernel of one arch's cubin. Sizes in bytes."""
    arch: str  # "sm_80", "sm_90a"
    mangled: str
    registers: int
    stack: int  # stack frame per thread
    local: int  # local memory per thread
    static_smem: int
    launch_bound: int | None  # __launch_bounds__'s threads (EIATTR_MAX_THREADS), None without one
    counts: dict  # SASS mnemonic (COUNTED) -> instructions
    instructions: int  # all but NOP
    no_body: bool  # at most 4 instructions: compiled out of this arch (a trap: OnlyOnSm90a, OnlyOnSm80Family; or empty)
    demangled: str = ""
    family: str = "other"  # "sm90_gemm", "sm80_gemm", "hand_written", "sm90_scaled_gemm", "sm90_grouped_gemm",
    # "sm90_scaled_grouped_gemm", "other"
    name: str = ""  # ops.kernels()'s name for a GEMM kernel; else the template id without namespaces
    threads: int | None = None  # threads per block of its launches (the most)
    tile_threads: int | None = None  # CUTLASS 2.x: 32 per warp tile of the threadblock tile
    dynamic_smem: int | None = None  # per launch; None where unknown
    blocks_per_sm: int | None = None
    limiter: str = ""  # what bounds blocks_per_sm: registers, warps, shared memory or blocks

    def has(self, mnemonics):
        return any(self.counts.get(op, 0) for op in mnemonics)


def _split_args(text, start):
    """The top-level template arguments of the template whose '<' is at text[start], and the index of
    its closing '>'."""
    depth, begin, args = 0, start + 1, []
    for i in range(start, len(text)):
        c = text[i]
        if c in "<(":
            depth += 1
        elif c in ">)":
            depth -= 1
            if depth == 0:
                args.append(text[begin:i].strip())
                return args, i
        elif c == "," and depth == 1:
            args.append(text[begin:i].strip())
            begin = i + 1
    raise ValueError(f"unbalanced template arguments in {text[:200]}...")


def template_args(text, name):
    """The arguments of the first `name<...>` in `text` (a demangled name), or None."""
    m = re.search(re.escape(name) + r"<", text)
    return None if m is None else _split_args(text, m.end() - 1)[0]


def _ints(text):
    return [int(v) for v in re.findall(r"cute::C<(-?\d+)>", text)]


def template_id(demangled):
    """`void ns::f<A, B>(args)` -> `f<A, B>` (namespaces dropped, template arguments kept)."""
    text = demangled[5:] if demangled.startswith("void ") else demangled
    depth, end = 0, len(text)
    for i, c in enumerate(text):  # the parameter list: the first '(' at depth 0 after the name
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0 and i > 0 and text[i - 1] not in ": ":
            end = i
            break
    head = text[:end]
    name_end = head.find("<") if "<" in head else len(head)
    base = re.sub(r"^.*::", "", head[:name_end].replace("(anonymous namespace)::", ""))
    return base + head[name_end:]


def template_name(demangled):
    """`void ns::f<A, B>(args)` -> `f`."""
    return template_id(demangled).split("<")[0]


_DTYPES = {"cutlass::half_t": "float16", "cutlass::bfloat16_t": "bfloat16", "float": "float32",
           "cutlass::tfloat32_t": "float32", "double": "float64", "cutlass::float_e4m3_t": "float8_e4m3fn",
           "cutlass::float_e5m2_t": "float8_e5m2"}


def _epilogue(demangled, activations):
    """ops.kernels()'s epilogue name of a GEMM kernel: "plain", or "bias" / "bias_<act>" for the
    Bias<Act> epilogue whose kernel_list.h Epilogue value (1 + the activation's index in csrc/activation.h,
    ops._library.ACTIVATIONS) the ActivationTemplate argument spells."""
    m = re.search(r"ActivationTemplate<\(ops::cutlass_gemm::Epilogue\)(\d+)>", demangled)
    if m is None:
        return "plain"
    act = activations[int(m.group(1)) - 1]
    return "bias" if act == "none" else f"bias_{act}"


def sm90_gemm_key(demangled, activations):
    """The fields of ops.kernels() an SM90 CUTLASS 3.x GemmUniversal kernel's template arguments spell
    (gemm_key()'s tuple), or None if `demangled` is not one."""
    gu = template_args(demangled, "cutlass::gemm::kernel::GemmUniversal")
    if gu is None or len(gu) < 3:
        return None
    mma = template_args(gu[1], "cutlass::gemm::collective::CollectiveMma")
    epi = template_args(gu[2], "cutlass::epilogue::collective::CollectiveEpilogue")
    if mma is None or epi is None or len(mma) < 6 or len(epi) < 7:
        return None
    policy = template_args(mma[0], mma[0].split("<")[0])
    if policy is None or len(policy) < 3:
        return None
    cluster, tile = _ints(policy[1]), _ints(mma[1])
    schedule = "pingpong" if "Pingpong" in policy[2] else "cooperative" if "Cooperative" in policy[2] else policy[2]

    def k_major(stride):  # a (rows, K, L) operand's stride: K-major when its K mode has the static 1
        return re.fullmatch(r"cute::tuple<long, cute::C<1>, long>", stride) is not None

    a_row, b_col = k_major(mma[3]), k_major(mma[5])  # A (M, K): K-major = row-major; B (N, K): = column-major
    d_col = re.fullmatch(r"cute::tuple<cute::C<1>, long, long>", epi[6]) is not None
    swap = d_col  # the kernels write D column-major only as D^T = B^T A^T (kernel_list.h)
    layout_a, layout_b = ("row" if a_row else "col"), ("col" if b_col else "row")
    if swap:  # the kernel's A is the GEMM's B^T, its B the GEMM's A^T
        layout_a, layout_b = ("col" if layout_b == "row" else "row"), ("col" if layout_a == "row" else "row")
    dtype = _DTYPES.get(mma[2], mma[2])
    math = "tf32" if dtype == "float32" else "standard"
    stream_k = "StreamKScheduler" in (gu[3] if len(gu) > 3 else "")
    return (90, dtype, math, layout_a, layout_b, _epilogue(demangled, activations), tuple(tile[:3]),
            tuple(cluster[:2]), 0, schedule, stream_k, swap)


def sm80_gemm_key(demangled, activations):
    """The fields of ops.kernels() an SM80 CUTLASS 2.x DefaultGemmUniversal kernel's template arguments
    spell (gemm_key()'s tuple) and its threads per block (32 per warp tile), or (None, None)."""
    args = template_args(demangled, "cutlass::gemm::kernel::DefaultGemmUniversal")
    if args is None or len(args) < 20:
        return None, None
    shapes = [[int(v) for v in template_args(a, "cutlass::gemm::GemmShape")] for a in args[13:15]]
    dtype = _DTYPES.get(args[0], args[0])
    math = ("3xtf32" if "OpMultiplyAddFastF32" in args[19] else "tf32") if dtype == "float32" else "standard"
    layout = {"cutlass::layout::RowMajor": "row", "cutlass::layout::ColumnMajor": "col"}
    tile, warp = shapes
    warps = (tile[0] // warp[0]) * (tile[1] // warp[1]) * (tile[2] // warp[2])
    key = (80, dtype, math, layout.get(args[1], args[1]), layout.get(args[5], args[5]),
           _epilogue(demangled, activations), tuple(tile), (1, 1), int(args[18]), "multistage", False, False)
    return key, 32 * warps


def gemm_key(entry):
    """The tuple sm90_gemm_key() / sm80_gemm_key() give, for an ops.kernels() entry (op "cutlass_gemm")."""
    return (entry["sm"], entry["dtype"], entry["math"], entry["layout_a"], entry["layout_b"], entry["epilogue"],
            (entry["tile"]["m"], entry["tile"]["n"], entry["tile"]["k"]), (entry["cluster"]["m"], entry["cluster"]["n"]),
            entry["stages"] if entry["sm"] == 80 else 0, entry["schedule"], entry["stream_k"], entry["swap_ab"])


def declared_kernels(root=ROOT, candidates=False):
    """The hand-written CUDA kernels the sources declare: {name: (source file, launch bound expression)}.
    A declaration is `__global__ void [__launch_bounds__(n)] name(` or a macro defined as
    `__global__ void __launch_bounds__(...)` (csrc/fused_device.cuh's OPS_FUSED_KERNEL) followed by the
    name. Read from csrc/*.cu and csrc/*.cuh (every CUDA build compiles them for every arch), and
    cutlass_gemm/*.cuh with `candidates` (the candidate-only TUs include the SIMT GEMV and grouped helpers;
    the CUTLASS kernels come from ops.kernels())."""
    files = sorted(glob.glob(os.path.join(root, "csrc", "*.cu")) + glob.glob(os.path.join(root, "csrc", "*.cuh")))
    if candidates:
        files += sorted(glob.glob(os.path.join(root, "cutlass_gemm", "**", "*.cuh"), recursive=True))
    texts = {f: open(f, encoding="utf-8").read() for f in files}
    macros = {m.group(1) for text in texts.values()
              for m in re.finditer(r"#define\s+(\w+)\((?:\w+|\.\.\.)\)\s+__global__\s+void\s+__launch_bounds__", text)}
    found = {}
    for path, text in texts.items():
        text = re.sub(r"#define[^\n]*", "", text)
        rel = os.path.relpath(path, root)
        for m in re.finditer(r"__global__\s+void\s+(?:__launch_bounds__\(([^()]*)\)\s+)?(\w+)\s*\(", text):
            found[m.group(2)] = (rel, m.group(1))
        for macro in macros:
            for m in re.finditer(re.escape(macro) + r"\(((?:[^()]|\([^()]*\))*)\)\s*(\w+)\s*\(", text):
                found[m.group(2)] = (rel, m.group(1).strip())
    return found


def occupancy(arch, registers, threads, smem):
    """(blocks per SM, the limiting resource) of a kernel with `registers` per thread, `threads` per block
    and `smem` bytes of static + dynamic shared memory per block on `arch`, by cuda_occupancy.h's rules
    (cudaOccMaxBlocksPerSMRegsLimit, ...WarpsLimit, ...SmemLimit, the block limit)."""
    lim = ARCH_LIMITS[arch]
    warps = -(-threads // 32)
    regs_per_warp = -(-registers * 32 // REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    assumed = regs_per_warp * (-(-warps // SUB_PARTITIONS) * SUB_PARTITIONS)
    if registers > lim["max_regs_per_thread"] or max(assumed, regs_per_warp * warps) > lim["regs_per_block"]:
        by_regs = 0
    else:
        by_regs = (lim["regs_per_sm"] // SUB_PARTITIONS // regs_per_warp) * SUB_PARTITIONS // warps
    by_warps = 0 if threads > lim["max_threads_per_block"] else (lim["max_threads_per_sm"] // 32) // warps
    allocated = -(-(smem + lim["reserved_smem_per_block"]) // SMEM_ALLOC_UNIT) * SMEM_ALLOC_UNIT
    if allocated > lim["smem_per_block_optin"] + lim["reserved_smem_per_block"]:
        by_smem = 0
    else:
        by_smem = lim["smem_per_sm"] // allocated
    limits = {"registers": by_regs, "warps": by_warps, "shared memory": by_smem, "blocks": lim["max_blocks_per_sm"]}
    limiter = min(limits, key=lambda k: limits[k])
    return limits[limiter], limiter


def _resource_usage(text):
    """{mangled: {"REG": .., "STACK": .., "SHARED": .., "LOCAL": ..}} from cuobjdump --dump-resource-usage."""
    usage, lines = {}, text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"\s*Function (\S+):\s*$", line)
        if m and i + 1 < len(lines):
            usage[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+):(\d+)", lines[i + 1])}
    return usage


def _launch_bounds(text):
    """{mangled: threads} of the kernels with a launch bound, from cuobjdump -elf's EIATTR_MAX_THREADS."""
    bounds, current, pending = {}, None, False
    for line in text.splitlines():
        m = re.match(r"\.nv\.info\.(\S+)$", line.strip())
        if m:
            current, pending = m.group(1), False
        elif "EIATTR_MAX_THREADS" in line:
            pending = True
        elif pending and line.strip().startswith("Value:"):
            x, y, z = (int(v, 16) for v in line.split(":", 1)[1].split()[:3])
            bounds[current] = x * y * z
            pending = False
    return bounds


_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")
# A kernel compiled out of an arch keeps at most a frame setup, a trap and a branch to itself (or an exit).
NO_BODY_INSTRUCTIONS = 4


def _sass_counts(text):
    """{mangled: (counts of COUNTED mnemonics, instructions but NOP)} from nvdisasm."""
    result, name, counts, total = {}, None, {}, 0

    def close():
        if name is not None:
            result[name] = (counts, total)

    for line in text.splitlines():
        if line.startswith(".text.") and line.rstrip().endswith(":"):
            close()
            name, counts, total = line.strip()[len(".text."):-1], {}, 0
            continue
        m = _INSTRUCTION.match(line)
        if m and name is not None:
            op = m.group(1)
            if op == "NOP":
                continue
            total += 1
            if op in COUNTED:
                counts[op] = counts.get(op, 0) + 1
    close()
    return result


def _read_cubin(path, arch, cuobjdump, nvdisasm):
    usage = _resource_usage(_run([cuobjdump, "--dump-resource-usage", path]))
    bounds = _launch_bounds(_run([cuobjdump, "-elf", path]))
    sass = _sass_counts(_run([nvdisasm, "-c", path]))
    kernels = []
    for mangled, u in usage.items():
        counts, total = sass.get(mangled, ({}, 0))
        kernels.append(Kernel(arch=arch, mangled=mangled, registers=u.get("REG", 0), stack=u.get("STACK", 0),
                              local=u.get("LOCAL", 0), static_smem=u.get("SHARED", 0),
                              launch_bound=bounds.get(mangled), counts=counts, instructions=total,
                              no_body=total <= NO_BODY_INSTRUCTIONS))
    return kernels


_LEA = re.compile(r"\blea\s+(\w+),\[rip\+0x[0-9a-f]+\]\s+#\s+[0-9a-f]+\s+<([^>+]+)>")
_MOV_IMM = re.compile(r"\bmov\s+(e[a-z]{2}|r\d+d),0x([0-9a-f]+)$")
_MOV_REG = re.compile(r"\bmov\s+(r[a-z0-9]+),(r[a-z0-9]+)$")


def host_launch_facts(so_path):
    """{host stub symbol: {"smem": {bytes}, "threads": {threads}}} from the x86-64 host code's calls whose
    kernel and sizes are immediates (System V argument registers):
    cudaFuncSetAttribute(kernel: rdi, cudaFuncAttributeMaxDynamicSharedMemorySize = 8: esi, bytes: edx),
    which the CUTLASS launchers make before launching with that many bytes, and
    cudaOccupancyMaxActiveBlocksPerMultiprocessor[WithFlags](&blocks, kernel: rsi, threads: edx, bytes: ecx),
    which CUTLASS 2.x's GemmUniversalBase makes with its launch's block size and shared memory."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-M", "intel", so_path], capture_output=True,
                         text=True, check=True).stdout
    found, regs, imms = {}, {}, {}
    for line in out.splitlines():
        if "\tcall " in line or line.endswith(">:"):
            if "<cudaFuncSetAttribute@plt>" in line and imms.get("esi") == 8 and "edx" in imms and "rdi" in regs:
                found.setdefault(regs["rdi"], {"smem": set(), "threads": set()})["smem"].add(imms["edx"])
            elif "<cudaOccupancyMaxActiveBlocksPerMultiprocessor" in line and "rsi" in regs and "edx" in imms \
                    and "ecx" in imms:
                facts = found.setdefault(regs["rsi"], {"smem": set(), "threads": set()})
                facts["smem"].add(imms["ecx"])
                facts["threads"].add(imms["edx"])
            regs, imms = {}, {}
            continue
        m = _LEA.search(line)
        if m:
            regs[m.group(1)] = m.group(2)
            continue
        m = _MOV_IMM.search(line)
        if m:
            imms[m.group(1)] = int(m.group(2), 16)
            continue
        m = _MOV_REG.search(line)
        if m and m.group(2) in regs:
            regs[m.group(1)] = regs[m.group(2)]
    return found


@dataclasses.dataclass
class Library:
    """What read() found in one library."""
    path: str
    archs: list  # the cubins' archs, e.g. ["sm_80", "sm_90a"]
    kernels: list  # Kernel, every arch
    listing: list  # ops.kernels() entries (op "cutlass_gemm") this build lists, each with "key"
    candidates: bool  # built with OPS_CANDIDATE_KERNELS=1
    declared: dict  # declared_kernels()
    host_conflicts: dict  # kernel (demangled) -> {"smem" or "threads": the differing values its launchers use}

    def of(self, arch):
        return [k for k in self.kernels if k.arch == arch]


def _build_facts(so_path):
    """(CUDA arch list, candidate kernels) recorded beside the library (ops/_build_info.py), or None."""
    path = os.path.join(os.path.dirname(os.path.abspath(so_path)), "_build_info.py")
    if not os.path.exists(path):
        return None
    facts = {}
    exec(compile(open(path, encoding="utf-8").read(), path, "exec"), facts)  # noqa: S102 (setup.py wrote it)
    return facts.get("CUDA_ARCH_LIST", ""), bool(facts.get("CANDIDATE_KERNELS", False))


def expected_gemms(listing, arch, candidates):
    """The ops.kernels() entries (op "cutlass_gemm", CUTLASS kernels) whose machine code `arch`'s cubin
    must hold: SM90 kernels in sm_90a; SM80 kernels in sm_8x, and in sm_90a those marked on_sm90 (Hopper
    dispatches to them); candidate-only ones only in a candidate build."""
    out = []
    for e in listing:
        if e["schedule"] == "simt" or (e["candidate_only"] and not candidates):
            continue
        if (e["sm"] == 90 and arch == "sm_90a") or (e["sm"] == 80 and (arch.startswith("sm_8") or
                                                                       (arch == "sm_90a" and e["on_sm90"]))):
            out.append(e)
    return out


def read(so_path=None, jobs=None):
    """Reads the library at `so_path` (default: ops.library_path(), this checkout's build): every kernel of
    every cubin, named and measured (Kernel). Raises ToolMissing without cuobjdump / nvdisasm / c++filt /
    objdump."""
    import ops  # the kernel lists and activation names come from the library's tables

    so_path = os.path.abspath(so_path or ops.library_path())
    cuobjdump, nvdisasm = find_tool("cuobjdump"), find_tool("nvdisasm")
    missing = missing_tools()
    if missing:
        raise ToolMissing(f"machine_code: {', '.join(missing)} not found (pip install nvidia-cuda-cuobjdump "
                          "nvidia-cuda-nvdisasm, as requirements.txt pins them; binutils for c++filt and objdump)")
    facts = _build_facts(so_path)
    candidates = facts[1] if facts else bool(ops.build_info.CANDIDATE_KERNELS)
    with tempfile.TemporaryDirectory(prefix="ops_machine_code_") as tmp:
        _run([cuobjdump, "-xelf", "all", so_path], cwd=tmp)
        cubins = sorted(glob.glob(os.path.join(tmp, "*.cubin")))
        jobs = jobs or max(1, min(len(cubins), os.cpu_count() or 1))
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            host = pool.submit(host_launch_facts, so_path)
            parts = [pool.submit(_read_cubin, c, re.search(r"\.(sm_\w+)\.cubin$", c).group(1), cuobjdump, nvdisasm)
                     for c in cubins]
            kernels = [k for p in parts for k in p.result()]
            by_stub = host.result()
    names = demangle([k.mangled for k in kernels] + list(by_stub))
    launches, conflicts = {}, {}
    for stub, facts in by_stub.items():  # a host stub demangles to its kernel's name
        merged = launches.setdefault(names[stub], {"smem": set(), "threads": set()})
        for what, values in facts.items():
            merged[what] |= values
    for kernel, facts in launches.items():
        differing = {what: sorted(values) for what, values in facts.items() if len(values) > 1}
        if differing:
            conflicts[kernel] = differing
    activations = list(ops._library.ACTIVATIONS)
    listing = [dict(e, key=gemm_key(e)) for e in ops.kernels("cutlass_gemm")]
    by_key = {}
    for e in listing:
        if e["schedule"] != "simt":
            by_key.setdefault(e["key"], []).append(e)
    declared = declared_kernels(candidates=candidates)
    for k in kernels:
        k.demangled = names[k.mangled]
        k.name = template_id(k.demangled)
        if "cutlass::gemm::kernel::GemmUniversal<" in k.demangled and "device_kernel<" in k.demangled:
            key = sm90_gemm_key(k.demangled, activations)
            # The candidate grouped (pointer-array problem shape), FP8 and FP8 grouped kernels: listed under other
            # ops (ops.kernels("grouped_gemm"), ("scaled_gemm"), ("scaled_grouped_gemm")) that this reader does
            # not match yet.
            grouped = "GroupProblemShape" in k.demangled
            fp8 = "float_e4m3_t" in k.demangled
            k.family = ("sm90_scaled_grouped_gemm" if grouped and fp8 else "sm90_grouped_gemm" if grouped else
                        "sm90_scaled_gemm" if key and key[1].startswith("float8") else "sm90_gemm")
        elif "cutlass::gemm::kernel::DefaultGemmUniversal<" in k.demangled:
            k.family = "sm80_gemm"
            key, k.tile_threads = sm80_gemm_key(k.demangled, activations)
        else:
            key = None
            if template_name(k.demangled) in declared:
                k.family = "hand_written"
        if key is not None and len(by_key.get(key, [])) == 1:
            k.name = by_key[key][0]["name"]
        elif key is not None:  # not a cutlass_gemm kernel (the candidate FP8 and grouped GEMMs): its fields
            k.name = "unlisted sm{}_{}_{}_{}_{}x{}_{}x{}_{}{}{}".format(
                key[0], key[1], key[2], key[3][0] + key[4][0], *key[6][:2], *key[7], key[9],
                "_streamk" if key[10] else "", "_swap" if key[11] else "") + f"_{key[5]}"
        launch = launches.get(k.demangled, {"smem": set(), "threads": set()})
        if len(launch["threads"]) == 1:
            k.threads = next(iter(launch["threads"]))
        else:
            k.threads = k.launch_bound if k.launch_bound is not None else k.tile_threads
        if k.family == "hand_written":
            k.dynamic_smem = 0
        elif len(launch["smem"]) == 1:
            k.dynamic_smem = next(iter(launch["smem"]))
        if k.threads and k.dynamic_smem is not None and k.arch in ARCH_LIMITS and not k.no_body:
            k.blocks_per_sm, k.limiter = occupancy(k.arch, k.registers, k.threads, k.static_smem + k.dynamic_smem)
    archs = sorted({k.arch for k in kernels})
    return Library(path=so_path, archs=archs, kernels=kernels, listing=listing, candidates=candidates,
                   declared=declared, host_conflicts=conflicts)


def rows(lib):
    """One row per kernel with a body and arch (a kernel two TUs instantiate once): the table's columns."""
    out, seen = [], set()
    for k in sorted(lib.kernels, key=lambda k: (k.family, k.name, k.arch)):
        if k.no_body or (k.arch, k.mangled) in seen:
            continue
        seen.add((k.arch, k.mangled))
        sm90 = k.family.startswith("sm90_")
        out.append({
            "kernel": k.name, "family": k.family, "arch": k.arch, "registers": k.registers, "stack": k.stack,
            "spill_stores": k.counts.get("STL", 0), "spill_loads": k.counts.get("LDL", 0),
            "static_smem": k.static_smem, "dynamic_smem": k.dynamic_smem, "threads": k.threads,
            "blocks_per_sm": k.blocks_per_sm, "limiter": k.limiter,
            "wgmma": k.has(WGMMA) if sm90 else None, "tma": k.has(TMA_LOAD) if sm90 else None,
            "mma_sync": k.has(MMA_SYNC) if k.family == "sm80_gemm" else None,
            "cp_async": k.has(CP_ASYNC) if k.family == "sm80_gemm" else None,
            "instructions": k.instructions, "mangled": k.mangled,
        })
    return out


def _shown(path):
    """`path` relative to the checkout where it lies in it."""
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


def _yes_no(v):
    return "" if v is None else ("yes" if v else "**no**")


def markdown(lib, table):
    spilling = [r for r in table if r["spill_stores"] or r["spill_loads"] or r["stack"]]
    per_arch = ", ".join(f"{a}: {sum(r['arch'] == a for r in table)}" for a in lib.archs)
    entries = sum(not k.no_body for k in lib.kernels)
    lines = [
        f"# Machine code of `{_shown(lib.path)}`", "",
        f"Archs: {', '.join(lib.archs)}; candidate kernels: {'yes' if lib.candidates else 'no'}. "
        f"{len(table)} kernels with a body, one row per kernel and arch ({per_arch}; the cubins hold {entries} entries: "
        "a kernel two translation units instantiate appears twice); "
        f"{len(spilling)} with local-memory traffic or a stack frame. Written by `python -m benchmarks.machine_code`.",
        "",
        "Stack: bytes per thread. Spill stores / loads: STL / LDL instructions. Shared memory: static + dynamic "
        "bytes per block. Blocks/SM: at the launch's threads per block, on an A100 (sm_80) or H100/H200 (sm_90a), "
        "with what bounds it. wgmma / TMA: HGMMA|QGMMA / UTMALDG in an SM90 GEMM; mma / cp.async: HMMA|DMMA / "
        "LDGSTS in an SM80 GEMM.", "",
    ]
    if spilling:
        lines += ["Local-memory traffic:", ""] + [
            f"- `{r['kernel']}` ({r['arch']}): {r['registers']} registers, {r['stack']} B stack, "
            f"{r['spill_stores']} STL + {r['spill_loads']} LDL" for r in spilling] + [""]
    lines += [
        "| kernel | arch | registers | stack | spill stores | spill loads | shared memory | threads | blocks/SM "
        "| wgmma | TMA | mma | cp.async |",
        "|---|---|--:|--:|--:|--:|--:|--:|---|---|---|---|---|",
    ]
    for r in table:
        smem = "?" if r["dynamic_smem"] is None else f"{r['static_smem']} + {r['dynamic_smem']}"
        blocks = "?" if r["blocks_per_sm"] is None else f"{r['blocks_per_sm']} ({r['limiter']})"
        lines.append(f"| `{r['kernel']}` | {r['arch']} | {r['registers']} | {r['stack']} | {r['spill_stores']} | "
                     f"{r['spill_loads']} | {smem} | {r['threads'] or '?'} | {blocks} | {_yes_no(r['wgmma'])} | "
                     f"{_yes_no(r['tma'])} | {_yes_no(r['mma_sync'])} | {_yes_no(r['cp_async'])} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--so", help="the library to read (default: this checkout's ops/_C*.so)")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "local"),
                        help="folder for machine_code.md and machine_code.json (default: benchmarks/results/local)")
    args = parser.parse_args(argv)
    lib = read(args.so)
    table = rows(lib)
    text = markdown(lib, table)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "machine_code.md"), "w", encoding="utf-8") as f:
        f.write(text)
    tools = {t: find_tool(t) for t in ("cuobjdump", "nvdisasm")}
    versions = {t: (_run([p, "--version"]).strip().splitlines()[-2:] if p else None) for t, p in tools.items()}
    facts = _build_facts(lib.path)
    with open(os.path.join(args.out, "machine_code.json"), "w", encoding="utf-8") as f:
        json.dump({"library": _shown(lib.path), "archs": lib.archs, "cuda_arch_list": facts[0] if facts else None,
                   "candidate_kernels": lib.candidates, "date": datetime.date.today().isoformat(),
                   "tools": versions, "arch_limits": ARCH_LIMITS, "kernels": table}, f, indent=1)
    print(text.split("\n| kernel |")[0].rstrip())
    print(f"machine_code: {len(table)} kernels -> {args.out}/machine_code.{{md,json}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
