"""Kernel selection by shape (cutlass_gemm/core/tactic.cpp), checked without a GPU.

The planner fixes how each operand is read (tests/test_gemm_plan.py); the tactic then picks the
configuration (tile, cluster, schedule) and the scheduler settings (data-parallel, split-K, stream-K,
swizzle). Here the real C++ path runs on CPU tensors through ``ops._library.gemm_emulate`` for a Hopper
target with a given SM count: the heuristic's choice, the candidate list, forcing a tactic, and that
every one of them still computes the right product (the launch is replayed on CPU; a GPU run checks each
instantiation itself: tests/test_gemm_cuda.py::test_every_tactic). Autotuning times kernels on a GPU; its
CPU-visible API is checked here, its behaviour in tests/test_gemm_cuda.py.
"""

import os
import re
import subprocess
import sys

import pytest
import torch

import ops
from tests.test_gemm_plan import HOPPER, AMPERE, KERNEL_NAME, reference_check, strided, tactic

H200_SMS = 132



@pytest.fixture(autouse=True)
def sm80_kernels_on_hopper(monkeypatch):
    """The tactic tests cover every instantiation on the emulated targets, including the SM80 kernels on
    Hopper that the library withholds there by default (tests/test_gemm_plan.py)."""
    monkeypatch.setenv("OPS_CUTLASS_SM80_ON_SM90", "1")


def emulate(A, B, sm_count=H200_SMS, target=HOPPER, allow_tf32=False, epilogue="plain", bias=None,
            candidate_kernels=True):
    """A @ B through the host path for `target`, a binary with the candidate-only kernels by default (the
    GPU check's build: OPS_CANDIDATE_KERNELS=1)."""
    out = torch.full((A.shape[0], B.shape[1]), float("nan"), dtype=A.dtype)
    plan = ops._library.gemm_emulate(A, B, out, target["cc_major"], target["cc_minor"], target["arch_list"],
                                     allow_tf32, True, bias, epilogue, sm_count, candidate_kernels)
    return out, plan


def operands(M, N, K, dtype=torch.bfloat16, b_layout="col", values=True):
    """A (M, K) row-major and B (K, N): column-major as x @ W^T with an nn.Linear weight ("col", the
    model-shape suite) or row-major (the square suite). values=False: uninitialized (plans only)."""
    if not values:
        A = torch.empty(M, K, dtype=dtype)
        B = torch.empty(N, K, dtype=dtype).t() if b_layout == "col" else torch.empty(K, N, dtype=dtype)
        return A, B
    return strided(M, K, dtype, "row", seed=1), strided(K, N, dtype, b_layout, seed=2)


def plan_only(A, B, sm_count=H200_SMS, target=HOPPER, allow_tf32=False, epilogue="plain", candidate_kernels=True):
    """The plan for A @ B on the target (with the candidate-only kernels, as emulate), without running
    (or replaying) anything."""
    return ops._library.gemm_plan_for_target(A, B, target["cc_major"], target["cc_minor"], target["arch_list"],
                                             allow_tf32, sm_count, epilogue, candidate_kernels=candidate_kernels)


@pytest.fixture(autouse=True)
def _no_forced_tactic():
    yield
    ops.gemm.set_tactic(None)
    ops.gemm.set_candidate_kernels(True)


# ---- the instantiation list ----------------------------------------------------------------------

def test_every_shape_config_exists_for_both_half_types_and_common_layouts():
    kernels = {k["id"]: k for k in ops.kernels("cutlass_gemm")}
    for dt in ("f16", "bf16"):
        for layout in ("rr", "rc"):
            assert kernels[f"sm90_{dt}_{layout}"]["config"] == "coop_128x128_c2x1"
            assert kernels[f"sm90_{dt}_{layout}_coop256"]["config"] == "coop_128x256_c2x1"
            assert kernels[f"sm90_{dt}_{layout}_ping"]["config"] == "pingpong_64x128_c1x1"
            assert kernels[f"sm90_{dt}_{layout}_streamk"]["config"] == "streamk_128x128_c1x1"
            assert kernels[f"sm90_{dt}_{layout}_swap"]["config"] == "swap_ab_streamk_128x32_c1x1"
        assert kernels[f"sm90_{dt}_rc_gemv"]["config"] == "simt_gemv_m16"
        for act in ("none", "relu", "gelu", "gelu_tanh", "silu"):
            assert kernels[f"sm90_{dt}_rc_{act}_streamk"]["config"] == "streamk_128x128_c1x1"
            assert kernels[f"sm90_{dt}_rc_{act}_coop256"]["config"] == "coop_128x256_c2x1"
            assert kernels[f"sm90_{dt}_rc_{act}_gemv"]["config"] == "simt_gemv_m16"
    # The SIMT GEMV kernels serve x @ W^T only (both operands K-contiguous).
    assert {(k["layout_a"], k["layout_b"]) for k in kernels.values() if k["config"] == "simt_gemv_m16"} == \
        {("row", "col")}
    assert {k["config"] for k in kernels.values() if k["sm"] == 80} == {"sm80"}


NAME = re.compile(
    r"sm(?P<sm>80|90)_(?P<element>f16|bf16|tf32|3xtf32|f64)_"
    r"(?:(?P<m2>\d+)x(?P<n2>\d+)_(?P<k2>\d+)x(?P<stages>\d+)_(?P<ab2>[tn]{2})"  # CUTLASS 2.x
    r"|(?P<m3>\d+)x(?P<n3>\d+)x(?P<k3>\d+)_(?P<cm>\d+)x(?P<cn>\d+)x1_(?P<abd>[tn]{3}))"  # CUTLASS 3.x
    r"_align(?P<align>\d+)(?P<stream_k>_stream_k)?"
    r"(?P<schedule>_warpspecialized_cooperative|_warpspecialized_pingpong|_simt_gemv)?"
    r"(?:_(?P<epilogue>bias(?:_relu|_gelu_tanh|_gelu|_silu)?))?")


def test_every_kernel_name_spells_its_fields():
    # Names as CUTLASS's generator spells kernels (cutlass_library procedural_name: arch, element type,
    # tile, cluster or stages, layouts in BLAS letters, alignment, tile scheduler, schedule), then the
    # fused epilogue; each field read back must be the kernel's.
    letter = {"row": "t", "col": "n"}
    flip = {"row": "col", "col": "row"}
    element = {("float16", "standard"): "f16", ("bfloat16", "standard"): "bf16", ("float32", "tf32"): "tf32",
               ("float32", "3xtf32"): "3xtf32", ("float64", "standard"): "f64"}
    kernels = ops.kernels("cutlass_gemm")
    assert len({k["name"] for k in kernels}) == len(kernels)
    for k in kernels:
        match = NAME.fullmatch(k["name"])
        assert match, k["name"]
        f = match.groupdict()
        assert int(f["sm"]) == k["sm"] and f["element"] == element[(k["dtype"], k["math"])], k
        # The kernel's own operands: swap-AB reads B^T as A, A^T as B, and writes D column-major.
        a, b = (flip[k["layout_b"]], flip[k["layout_a"]]) if k["swap_ab"] else (k["layout_a"], k["layout_b"])
        if k["sm"] == 80:
            assert (int(f["m2"]), int(f["n2"]), int(f["k2"])) == (k["tile"]["m"], k["tile"]["n"], k["tile"]["k"])
            assert int(f["stages"]) == k["stages"] > 0 and k["schedule"] == "multistage" and f["schedule"] is None
            assert f["ab2"] == letter[a] + letter[b]
        else:
            assert (int(f["m3"]), int(f["n3"]), int(f["k3"])) == (k["tile"]["m"], k["tile"]["n"], k["tile"]["k"])
            assert (int(f["cm"]), int(f["cn"])) == (k["cluster"]["m"], k["cluster"]["n"])
            assert f["abd"] == letter[a] + letter[b] + ("n" if k["swap_ab"] else "t")
            assert f["schedule"] == {"cooperative": "_warpspecialized_cooperative", "simt": "_simt_gemv",
                                     "pingpong": "_warpspecialized_pingpong"}[k["schedule"]]
        assert int(f["align"]) == k["alignment"]
        assert bool(f["stream_k"]) == k["stream_k"]
        assert (f["epilogue"] or "plain") == k["epilogue"]
    # The configs' short labels name the same fields.
    for k in kernels:
        label = re.fullmatch(r"(coop|pingpong|streamk|swap_ab_streamk|swap_ab_pingpong)_(\d+)x(\d+)_c(\d)x(\d)",
                             k["config"])
        if label:
            schedule, m, n, cm, cn = label.groups()
            assert (int(m), int(n), int(cm), int(cn)) == (k["tile"]["m"], k["tile"]["n"], k["cluster"]["m"],
                                                          k["cluster"]["n"]), k
            assert k["stream_k"] == ("streamk" in schedule) and k["swap_ab"] == schedule.startswith("swap")
            assert k["schedule"] == ("pingpong" if schedule.endswith("pingpong") else "cooperative")
        else:
            assert k["config"] in ("sm80", "simt_gemv_m16"), k


# ---- the heuristic -------------------------------------------------------------------------------

@pytest.mark.parametrize("M,N,K,b_layout,config,decomposition", [
    # Large squares and 4096-token projections: 128x256 tiles (as full a last wave as 128x128's).
    (4096, 4096, 4096, "row", "coop_128x256_c2x1", "data_parallel"),
    (8192, 8192, 8192, "row", "coop_128x256_c2x1", "data_parallel"),
    (4096, 14336, 4096, "col", "coop_128x256_c2x1", "data_parallel"),
    # 128 tiles of 128x256 in 0.97 wave against 256 of 128x128 in 1.94, both 97 % efficient: 128x256.
    (2048, 2048, 512, "row", "coop_128x256_c2x1", "data_parallel"),
    (1024, 4096, 4096, "col", "coop_128x256_c2x1", "data_parallel"),  # q_proj at T = 1024
    (4096, 1024, 4096, "col", "coop_128x256_c2x1", "data_parallel"),  # kv_proj at T = 4096
    # gate_up at T = 1024: 128x256's last wave 85 % full, 128x128's 97 %: general.
    (1024, 14336, 4096, "col", "coop_128x128_c2x1", "data_parallel"),
    # One row of tiles but a full wave of them: data-parallel, without the general kernel's 2x1 cluster.
    (64, 32768, 1024, "col", "streamk_128x128_c1x1", "data_parallel"),
    # Decode: one row of tiles against a large weight, long K: stream-K while it puts at most 4 CTAs on
    # a tile (gate_up: 112 tiles, 132 units), else split-K into 4 (q_proj, down: 32 tiles, 132 units;
    # kv_proj: 8 tiles, 64 units).
    (16, 14336, 4096, "col", "streamk_128x128_c1x1", "stream_k"),
    (1024, 1024, 4096, "col", "streamk_128x128_c1x1", "stream_k"),  # 64 tiles, 132 units
    (1, 4096, 4096, "col", "streamk_128x128_c1x1", "split_k"),
    (128, 4096, 14336, "col", "streamk_128x128_c1x1", "split_k"),
    (1, 1024, 4096, "col", "streamk_128x128_c1x1", "split_k"),
    # Under one wave with a short K, or a small weight (MiniLM's ffn_down: 1.2 MB, no K split worth
    # its memset and reduction): smaller ping-pong tiles.
    (128, 1536, 384, "col", "pingpong_64x128_c1x1", "data_parallel"),
    (1, 384, 384, "col", "pingpong_64x128_c1x1", "data_parallel"),
    (16, 384, 1536, "col", "pingpong_64x128_c1x1", "data_parallel"),
])
def test_heuristic_choice(M, N, K, b_layout, config, decomposition):
    plan = plan_only(*operands(M, N, K, b_layout=b_layout, values=False))
    assert plan["tactic"]["config"] == config, plan["tactic"]
    assert plan["tactic"]["decomposition"] == decomposition
    assert plan["tactic"]["name"] in plan["candidates"]


@pytest.mark.parametrize("M,N,K,config", [
    (4096, 4096, 4096, "coop_128x256_c2x1"),    # prefill / training: 128x256 tiles, as plain GEMMs
    (4096, 14336, 4096, "coop_128x256_c2x1"),
    (1024, 14336, 4096, "coop_128x128_c2x1"),   # 128x256's last wave 85 % full, 128x128's 97 %
    (1024, 4096, 4096, "coop_128x256_c2x1"),    # both 97 %: the larger tile
    (16, 4096, 4096, "streamk_128x128_c1x1"),   # decode
])
def test_linear_heuristic_choice(M, N, K, config):
    x = strided(M, K, torch.bfloat16, "row")
    weight = strided(N, K, torch.bfloat16, "row")
    plan = ops._library.gemm_plan_for_target(x, weight.t(), 9, 0, "8.0;9.0a", epilogue="gelu")
    assert plan["tactic"]["config"] == config, plan["tactic"]
    assert plan["kernel_id"].endswith("_gelu" + {"coop_128x256_c2x1": "_coop256", "coop_128x128_c2x1": "",
                                              "streamk_128x128_c1x1": "_streamk"}[config])


def test_sm_count_is_the_wave_size():
    # 8 x 16 = 128 output tiles of 128x128: one wave on a 108-SM A100-sized part, under one on 132 SMs.
    A, B = operands(1024, 2048, 2048, values=False)
    assert plan_only(A, B, sm_count=132)["tactic"]["config"] == "streamk_128x128_c1x1"
    assert plan_only(A, B, sm_count=108)["tactic"]["config"] == "coop_128x128_c2x1"


@pytest.mark.parametrize("lb", ["row", "col"])
def test_other_layouts_run_the_general_kernel(lb):
    # cr and cc have only the general config: the heuristic never picks a kernel the plan cannot use.
    A = torch.empty(4096, 64, dtype=torch.bfloat16).t()  # (64, 4096) column-major: no row-major kernel reads it
    B = torch.empty(4096, 4096, dtype=torch.bfloat16)
    B = B.t() if lb == "col" else B
    plan = plan_only(A, B)
    assert plan["tactic"]["config"] == "coop_128x128_c2x1"
    assert plan["candidates"] == [plan["kernel"]]


@pytest.mark.parametrize("dtype,allow_tf32,target,config", [
    (torch.float32, True, HOPPER, "coop_128x128_c2x1"),  # tf32: one config
    (torch.float32, False, HOPPER, "sm80"),              # 3xTF32 (SM80 kernel on Hopper)
    (torch.float64, False, HOPPER, "sm80"),
    (torch.bfloat16, False, AMPERE, "sm80"),
])
def test_single_config_families(dtype, allow_tf32, target, config):
    A, B = operands(1, 4096, 4096, dtype=dtype, values=False)
    plan = plan_only(A, B, target=target, allow_tf32=allow_tf32)
    assert plan["tactic"]["config"] == config
    assert plan["tactic"]["decomposition"] == "data_parallel"


@pytest.mark.parametrize("M,K,decomposition", [(1, 4096, "split_k"), (1, 1024, "stream_k"), (16, 256, "data_parallel")])
def test_linear_uses_stream_k_kernels_at_small_m(M, K, decomposition):
    x = strided(M, K, torch.bfloat16, "row")
    weight = strided(4096, K, torch.bfloat16, "row")
    bias = torch.randn(4096, dtype=torch.bfloat16)
    out, plan = emulate(x, weight.t(), epilogue="silu", bias=bias)
    assert plan["kernel_id"] == "sm90_bf16_rc_silu_streamk"
    assert plan["tactic"]["decomposition"] == decomposition
    expected = torch.nn.functional.silu(x.float() @ weight.float().t() + bias.float())
    torch.testing.assert_close(out.float(), expected, atol=2e-2 * K ** 0.5, rtol=2e-2)


# ---- candidates and forcing ----------------------------------------------------------------------

@pytest.mark.parametrize("M,N,K", [(1, 4096, 4096), (4096, 4096, 4096), (128, 1536, 384), (77, 300, 1000)])
def test_candidates(M, N, K):
    plan = plan_only(*operands(M, N, K, values=False))
    names = plan["candidates"]
    assert len(names) == len(set(names))
    assert plan["tactic"]["name"] in names
    kernels = {k["name"]: k for k in ops.kernels("cutlass_gemm")}
    k_iterations = -(-K // 64)
    for name in names:
        kernel, *settings = name.split("/")
        info = kernels[kernel]
        assert (info["dtype"], info["layout_a"], info["layout_b"], info["epilogue"]) == \
            ("bfloat16", "row", "col", "plain")
        for s in settings:
            if s.startswith("splitk"):
                assert 4 * int(s[len("splitk"):]) <= k_iterations  # every slice >= 4 K iterations
    # Every config of the family is a candidate (swap-AB for small M only).
    configs = {kernels[n.split("/")[0]]["config"] for n in names}
    swap = {"swap_ab_streamk_128x32_c1x1", "swap_ab_pingpong_64x16_c1x1", "swap_ab_pingpong_64x32_c1x1"}
    assert configs == {"coop_128x128_c2x1", "coop_128x256_c2x1", "pingpong_64x128_c1x1", "streamk_128x128_c1x1",
                       "pingpong_128x128_c2x1", "coop_128x256_c1x2", "coop_256x128_c2x1", "pingpong_64x128_c2x1"} \
        | (swap if M <= 64 else set()) | ({"simt_gemv_m16"} if M <= 16 else set())
    # Several waves of tiles: a persistent kernel with every swizzle and raster order.
    for kernel in {n.split("/")[0] for n in names}:
        variants = {n for n in names if n.split("/")[0] == kernel}
        info = kernels[kernel]
        tile_m, tile_n = (info["tile"]["n"], info["tile"]["m"]) if info["swap_ab"] else (info["tile"]["m"], info["tile"]["n"])
        tiles = -(-M // tile_m) * -(-N // tile_n)
        if not info["stream_k"] and info["config"] != "simt_gemv_m16" and tiles >= 4 * H200_SMS:
            assert variants == {"/".join(p for p in (kernel, z, r) if p)
                                for z in ("", "swz2", "swz4", "swz8") for r in ("", "raster_m", "raster_n")}
        else:
            assert not [n for n in variants if "/swz" in n or "/raster" in n]


@pytest.mark.parametrize("b_layout", ["col", "row"])
def test_swap_ab_kernels_are_decode_candidates_but_not_the_default(b_layout):
    # Swap-AB (D^T = B^T A^T on 128x32 tiles) is built as a candidate to measure against stream-K at
    # small M (tactic.h); the heuristic keeps stream-K until measurements say otherwise.
    layout = "rc" if b_layout == "col" else "rr"
    plan = plan_only(*operands(1, 4096, 4096, b_layout=b_layout, values=False))
    assert plan["tactic"]["config"] == "streamk_128x128_c1x1"
    swap = [n for n in plan["candidates"] if n.startswith(KERNEL_NAME[f"sm90_bf16_{layout}_swap"] + "/")]
    # 32 tiles of 32x128 (in M x N terms) on 132 SMs, 64 K iterations: every decomposition applies.
    assert sorted(swap) == sorted(tactic(f"sm90_bf16_{layout}_swap", s) for s in ["dp", "streamk", "splitk2", "splitk4",
                                                                           "splitk8"])


@pytest.mark.parametrize("M", [1, 3, 8, 16, 17, 64])
@pytest.mark.parametrize("epilogue", ["plain", "silu"])
def test_simt_gemv_is_a_decode_candidate_but_not_the_default(M, epilogue):
    # The hand-written SIMT GEMV kernel (simt_gemv.cuh) takes M <= 16 with B column-major (x @ W^T): a
    # candidate to measure there, never the heuristic's choice until measured; rr GEMMs have none.
    x = strided(M, 4096, torch.bfloat16, "row")
    weight = strided(4096, 4096, torch.bfloat16, "row")
    plan = ops._library.gemm_plan_for_target(x, weight.t(), 9, 0, "8.0;9.0a", epilogue=epilogue,
                                                   candidate_kernels=True)
    gemv = tactic("sm90_bf16_rc_gemv" if epilogue == "plain" else f"sm90_bf16_rc_{epilogue}_gemv")
    assert (gemv in plan["candidates"]) == (M <= 16)
    assert plan["tactic"]["config"] != "simt_gemv_m16"
    rr = plan_only(*operands(M, 4096, 4096, b_layout="row", values=False))
    assert not [n for n in rr["candidates"] if "_simt_gemv" in n]
    # Ampere has no SIMT GEMV kernel (sm_90a only, like the other SM90 configs).
    ampere = ops._library.gemm_plan_for_target(x, weight.t(), 8, 0, "8.0;9.0a", epilogue=epilogue,
                                                   candidate_kernels=True)
    assert not [n for n in ampere["candidates"] if "_simt_gemv" in n]


def test_linear_epilogues_have_no_swap_ab_candidates():
    x = strided(4, 4096, torch.bfloat16, "row")
    weight = strided(4096, 4096, torch.bfloat16, "row")
    plan = ops._library.gemm_plan_for_target(x, weight.t(), 9, 0, "8.0;9.0a", epilogue="silu",
                                                   candidate_kernels=True)
    assert plan["candidates"] and not [n for n in plan["candidates"] if "_tnn_" in n]  # D^T: swap-AB


def test_a_build_without_the_candidate_kernels_leaves_them_out_and_says_so():
    # The default build (OPS_CANDIDATE_KERNELS=0) compiles no candidate-only kernel: the planner offers
    # only what the binary has and lists the rest; the heuristic's choice is the same.
    A, B = operands(1, 4096, 4096, values=False)
    full, lean = plan_only(A, B), plan_only(A, B, candidate_kernels=False)
    swap, gemv = KERNEL_NAME["sm90_bf16_rc_swap"], KERNEL_NAME["sm90_bf16_rc_gemv"]
    candidate_only = {k["name"] for k in ops.kernels("cutlass_gemm") if k["candidate_only"]}
    assert any(n.startswith(swap + "/") for n in full["candidates"]) and gemv in full["candidates"]
    assert lean["candidates"] == [n for n in full["candidates"] if n.split("/")[0] not in candidate_only]
    assert lean["tactic"] == full["tactic"]
    assert sorted(lean["candidates"] + lean["candidates_not_built"]) == sorted(full["candidates"])
    assert {n.split("/")[0] for n in lean["candidates_not_built"]} == {n.split("/")[0] for n in full["candidates"]} & candidate_only
    assert full["candidates_not_built"] == []
    # Only what a build with them would offer this GEMM: no SIMT GEMV above M = 16, no swap-AB above 64.
    not_built = plan_only(*operands(300, 4096, 4096, values=False), candidate_kernels=False)["candidates_not_built"]
    assert not_built and not [n for n in not_built if "_simt_gemv" in n or re.search(r"_[tn]{2}n_align", n)]
    # Forcing one names the build switch; with the kernels built it runs.
    A, B = operands(1, 256, 512)
    ops.gemm.set_tactic(tactic("sm90_bf16_rc_swap", "dp"))
    with pytest.raises(RuntimeError, match=f"{swap} is a candidate-only kernel.*OPS_CANDIDATE_KERNELS=1"):
        emulate(A, B, candidate_kernels=False)
    out, plan = emulate(A, B)
    assert plan["tactic"]["name"] == tactic("sm90_bf16_rc_swap", "dp")
    reference_check(out, A, B)
    # A launch variant of a candidate-only kernel names the switch too; a suffix no build takes does not.
    ping = KERNEL_NAME["sm90_bf16_rc_ping128"]
    ops.gemm.set_tactic(ping + "/swz4/raster_n")
    with pytest.raises(RuntimeError, match=f"{ping} is a candidate-only kernel.*OPS_CANDIDATE_KERNELS=1"):
        emulate(A, B, candidate_kernels=False)
    for bad in (ping + "/swz3", ping + "/raster_m/swz4", KERNEL_NAME["sm90_bf16_rc_gemv"] + "/swz2"):
        ops.gemm.set_tactic(bad)
        with pytest.raises(RuntimeError, match="cannot run this GEMM") as error:
            emulate(*operands(1, 256, 512), candidate_kernels=False)
        assert "OPS_CANDIDATE_KERNELS" not in str(error.value), bad
    # A GEMV at M = 64 is no candidate in any build: no word of the switch.
    ops.gemm.set_tactic(tactic("sm90_bf16_rc_gemv"))
    with pytest.raises(RuntimeError, match="cannot run this GEMM") as error:
        emulate(*operands(64, 256, 512), candidate_kernels=False)
    assert "OPS_CANDIDATE_KERNELS" not in str(error.value)


def test_candidate_kernels_turned_off_leave_the_default_builds_choice():
    A, B = operands(1, 4096, 4096, values=False)
    full = plan_only(A, B)
    assert ops.gemm.candidate_kernels_enabled() and ops.gemm.set_candidate_kernels(False) is True
    assert not ops.gemm.candidate_kernels_enabled()
    assert plan_only(A, B) == plan_only(A, B, candidate_kernels=False) != full
    swap = KERNEL_NAME["sm90_bf16_rc_swap"]
    ops.gemm.set_tactic(tactic("sm90_bf16_rc_swap", "dp"))
    with pytest.raises(RuntimeError, match=f"{swap} is a candidate-only kernel, turned off by "
                                           r"ops.gemm.set_candidate_kernels\(False\)\)"):
        emulate(*operands(1, 256, 512))
    assert ops.gemm.set_candidate_kernels(True) is False
    assert plan_only(A, B) == full
    with pytest.raises(TypeError, match="ops.gemm.set_candidate_kernels: expected enabled to be True or False"):
        ops.gemm.set_candidate_kernels(1)


def test_a_tactic_named_by_kernel_id_says_the_name():
    A, B = operands(16, 256, 512)
    ops.gemm.set_tactic("sm90_bf16_rc_streamk/dp")
    with pytest.raises(RuntimeError, match=f"'sm90_bf16_rc_streamk' is the kernel's id in cutlass_gemm/kernels/kernel_list.h; "
                                           f"tactic names use its name, {KERNEL_NAME['sm90_bf16_rc_streamk']}"):
        emulate(A, B)


def test_candidate_only_means_the_configs_the_heuristic_never_picks():
    kernels = ops.kernels("cutlass_gemm")
    assert {k["config"] for k in kernels if k["candidate_only"]} == {
        "swap_ab_streamk_128x32_c1x1", "simt_gemv_m16", "pingpong_128x128_c2x1", "coop_128x256_c1x2", "coop_256x128_c2x1",
        "pingpong_64x128_c2x1", "swap_ab_pingpong_64x16_c1x1", "swap_ab_pingpong_64x32_c1x1"}
    assert ops._library.compiled_build_info()["candidate_kernels"] == ops.build_info.CANDIDATE_KERNELS


def test_candidates_leave_out_what_cannot_pay_off():
    names = lambda M, N, K: plan_only(*operands(M, N, K, values=False))["candidates"]  # noqa: E731
    # Many waves: no split-K (its workspace would be a partial fp32 tile per slice and output tile).
    assert not [n for n in names(8192, 8192, 8192) if "/splitk" in n]
    # Exactly full waves (132 x 2 tiles of 128x128): stream-K would run data-parallel.
    assert not [n for n in names(128 * 132, 256, 4096) if n.endswith("/streamk")]
    # K loop of 8 iterations (K = 512): CUTLASS gives no tile stream-K work.
    assert not [n for n in names(128, 1024, 512) if n.endswith("/streamk")]
    assert tactic("sm90_bf16_rc_streamk", "streamk") in names(128, 1024, 576)
    assert plan_only(*operands(128, 1024, 512, values=False))["tactic"]["decomposition"] != "stream_k"


@pytest.mark.parametrize("M,N,K,b_layout", [(77, 300, 1000, "col"), (1, 520, 4096, "col"), (260, 136, 64, "col"),
                                             (33, 520, 4096, "row")])
def test_every_forced_candidate_computes_the_product(M, N, K, b_layout):
    A, B = operands(M, N, K, b_layout=b_layout)
    names = plan_only(A, B)["candidates"]
    assert any(n.split("/")[0] == KERNEL_NAME[f"sm90_bf16_r{b_layout[0]}_swap"] for n in names) == (M <= 64)
    for name in names:
        ops.gemm.set_tactic(name)
        out, plan = emulate(A, B)
        assert plan["tactic"]["name"] == name
        reference_check(out, A, B)


def test_forcing_a_tactic_that_cannot_run_names_the_candidates():
    A, B = operands(64, 64, 64)
    forced = tactic("sm90_f16_rc_streamk", "streamk")  # bf16 operands: not a candidate
    previous = ops.gemm.set_tactic(forced)
    assert previous is None
    assert ops.gemm.get_tactic() == forced
    with pytest.raises(RuntimeError, match=f"forced tactic '{forced}' cannot run this "
                       f"GEMM .*candidates are: .*{KERNEL_NAME['sm90_bf16_rc']}"):
        emulate(A, B)
    assert ops.gemm.set_tactic(None) == forced
    assert ops.gemm.get_tactic() is None
    emulate(A, B)  # the normal choice again


def test_forced_tactic_does_not_affect_cpu_tensors():
    ops.gemm.set_tactic(tactic("sm90_bf16_rc_streamk", "streamk"))
    A, B = torch.randn(8, 16), torch.randn(16, 4)
    torch.testing.assert_close(ops.cutlass_gemm(A, B), A @ B)


def test_set_tactic_rejects_non_strings():
    with pytest.raises(TypeError, match="set_tactic: expected a tactic name"):
        ops.gemm.set_tactic(3)


# ---- autotuning API (behaviour on a GPU: tests/test_gemm_cuda.py) --------------------------------

def test_autotune_switch():
    assert ops.gemm.autotune_enabled() is False  # off by default
    try:
        assert ops.gemm.set_autotune(True) is False
        assert ops.gemm.autotune_enabled() is True
        # CPU tensors are never tuned (no CUTLASS kernel runs there).
        ops.cutlass_gemm(torch.randn(8, 8), torch.randn(8, 8))
        assert ops.gemm.tuning_cache() == []
    finally:
        assert ops.gemm.set_autotune(False) is True
    ops.gemm.clear_tuning_cache()
    assert ops.gemm.tuning_cache() == []


def test_autotune_environment_variable():
    code = "import ops; print(ops.gemm.autotune_enabled())"
    env = dict(os.environ, OPS_GEMM_AUTOTUNE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_plan_on_cpu_names_aten_as_the_fp8_and_grouped_plans_do():
    plan = ops.gemm.plan(torch.randn(4, 6), torch.randn(6, 5), out=torch.empty(5, 4).t())
    assert plan["kernel"] == "aten" and plan["tactic"] == {"name": "aten"} and plan["candidates"] == []
    assert "ATen's BLAS" in plan["fallback"] and (plan["m"], plan["n"], plan["k"]) == (4, 5, 6)
    assert (plan["kind"], plan["path"], plan["reason"]) == ("dense", "aten", plan["fallback"])
    # One plan behaviour: every kind's plan is the C++ op's and opens with the same head.
    a8, b8 = torch.randn(16, 32).to(torch.float8_e4m3fn), torch.randn(16, 32).to(torch.float8_e4m3fn).t()
    scaled = ops.fp8.plan(a8, b8, torch.ones(()), torch.ones(()))
    ag, bg = torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(2, 16, 16, dtype=torch.bfloat16)
    grouped = ops.grouped.plan(ag, bg, torch.tensor([4, 8], dtype=torch.int32))
    for p, kind in ((plan, "dense"), (scaled, "scaled"), (grouped, "grouped")):
        assert list(p)[:3] == ["kind", "path", "kernel"] and p["kind"] == kind and p["reason"], p
    A = torch.randn(4, 4)
    with pytest.raises(RuntimeError, match=r"cutlass_gemm: A \(M, K\) and B \(K, N\) must agree on K"):  # as the op
        ops.gemm.plan(A, torch.randn(3, 4))
    with pytest.raises(RuntimeError, match="cutlass_gemm: out overlaps A in memory"):
        ops.gemm.plan(A, torch.randn(4, 4), out=A)
    with pytest.raises(RuntimeError, match="ops.gemm.plan: expected CPU or CUDA tensors, got A on meta"):
        ops.gemm.plan(A.to("meta"), A.to("meta"))
    # Every plan of the family: a meta tensor runs no kernel, so it has no plan.
    e4, offs = torch.float8_e4m3fn, torch.tensor([2, 4], dtype=torch.int32, device="meta")
    codes, grouped_codes = torch.empty(4, 32, dtype=e4, device="meta"), torch.empty(2, 32, 16, dtype=e4, device="meta")
    meta_plans = {"ops.grouped.plan": lambda: ops.grouped.plan(A.to("meta"), A.expand(2, 4, 4).to("meta"), offs),
                  "ops.fp8.plan": lambda: ops.fp8.plan(codes, codes[:, :16].t(), torch.empty(4, 1, device="meta"),
                                                       torch.empty(1, 16, device="meta")),
                  "ops.fp8.grouped_plan": lambda: ops.fp8.grouped_plan(codes, grouped_codes, torch.empty(4, device="meta"),
                                                                       torch.empty(2, 16, device="meta"), offs)}
    for name, call in meta_plans.items():
        with pytest.raises(RuntimeError, match=f"{name}: expected CPU or CUDA tensors, got A on meta"):
            call()


def test_plan_with_a_column_major_out_lists_forcible_candidates():
    # A column-major out swaps the operands (another kernel family): the plan must be asked with it.
    A, B = operands(64, 256, 512, b_layout="row")
    out = torch.full((256, 64), float("nan"), dtype=torch.bfloat16).t()
    plan = ops._library.gemm_plan_for_target(A, B, 9, 0, "8.0;9.0a", out=out)
    assert plan["swap_ab"]
    for name in plan["candidates"]:
        ops.gemm.set_tactic(name)
        result = ops._library.gemm_emulate(A, B, out, 9, 0, "8.0;9.0a", False)
        assert result["tactic"]["name"] == name
        reference_check(out, A, B)


def test_plan_for_target_allocates_nothing():
    # An expanded (2^30, 64) A: planning must not allocate the (2^30, 64) output (128 GiB).
    A = torch.empty(1, 64, dtype=torch.bfloat16).expand(2 ** 30, 64)
    plan = ops._library.gemm_plan_for_target(A, torch.empty(64, 64, dtype=torch.bfloat16), 9, 0, "9.0a")
    assert plan["a"]["source"] == "copy"  # stride 0 rows are copied first


@pytest.mark.parametrize("sm_count", [0, -1, 2 ** 32 + 5])
def test_bad_sm_count(sm_count):
    A, B = operands(8, 8, 8, values=False)
    with pytest.raises(ValueError, match="sm_count must be in"):
        ops._library.gemm_plan_for_target(A, B, 9, 0, "9.0a", sm_count=sm_count)


def test_unknown_autotune_environment_value_warns():
    code = "import warnings; warnings.simplefilter('error'); import ops"
    env = dict(os.environ, OPS_GEMM_AUTOTUNE="enable")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "OPS_GEMM_AUTOTUNE='enable' not understood" in out.stderr


# ---- the tuning cache: cached choices run, files round-trip (timing itself: test_gemm_cuda.py) ------

@pytest.fixture
def clean_tuning_cache():
    ops.gemm.clear_tuning_cache()
    yield
    ops.gemm.clear_tuning_cache()
    ops.gemm.set_autotune(False)


def write_tuning_file(path, entries, **fields):
    import json

    payload = {"format": "ops.gemm tuning cache", "version": 2, "entries": entries, **fields}
    path.write_text(json.dumps(payload))
    return path


def test_a_loaded_choice_runs_and_round_trips(tmp_path, clean_tuning_cache):
    A, B = operands(16, 256, 512)
    heuristic = plan_only(A, B)
    assert heuristic["tactic_source"] == "heuristic"
    other = next(name for name in heuristic["candidates"] if name != heuristic["tactic"]["name"])
    entry = {"key": heuristic["tuning_key"], "best": other, "timings_ms": {other: 0.01, "failed": None}}
    assert ops.gemm.load_tuning_cache(write_tuning_file(tmp_path / "t.json", [entry])) == 1
    assert ops.gemm.tuning_cache() == [entry]
    for autotune in (False, True):  # a cached choice is used with autotuning on or off
        ops.gemm.set_autotune(autotune)
        out, plan = emulate(A, B)
        assert (plan["tactic"]["name"], plan["tactic_source"]) == (other, "tuned")
        reference_check(out, A, B)
    # Another shape, or the same shape on a GPU model with another SM count: not in the cache.
    assert emulate(*operands(32, 256, 512))[1]["tactic_source"] == "heuristic"
    assert emulate(A, B, sm_count=114)[1]["tactic_source"] == "heuristic"
    # set_tactic takes precedence.
    ops.gemm.set_tactic(heuristic["tactic"]["name"])
    assert emulate(A, B)[1]["tactic_source"] == "forced"
    ops.gemm.set_tactic(None)
    # Saved, cleared, loaded again: the same choice.
    assert ops.gemm.save_tuning_cache(tmp_path / "saved.json") == 1
    ops.gemm.clear_tuning_cache()
    assert emulate(A, B)[1]["tactic_source"] == "heuristic"
    assert ops.gemm.load_tuning_cache(str(tmp_path / "saved.json")) == 1
    assert ops.gemm.tuning_cache() == [entry]
    assert emulate(A, B)[1]["tactic"]["name"] == other


def test_tuning_key_names_device_model_shape_and_leading_dimensions():
    A, B = operands(16, 256, 512)
    key = plan_only(A, B)["tuning_key"]
    assert key == "emulated sm90x132 sm90_bf16_tn m=16 n=256 k=512 ld=512,512,256", key
    assert plan_only(A, B, sm_count=114)["tuning_key"] != key


def test_a_stale_choice_is_dropped_with_a_warning(tmp_path, clean_tuning_cache, capfd):
    A, B = operands(16, 256, 512)
    key = plan_only(A, B)["tuning_key"]
    ops.gemm.load_tuning_cache(write_tuning_file(tmp_path / "t.json", [{"key": key, "best": "sm90_bf16_rc_gone/dp"}]))
    out, plan = emulate(A, B)
    # TORCH_WARN from an op called through torch.ops reaches stderr (c10's warning handler).
    assert "the tuning cache chose 'sm90_bf16_rc_gone/dp'" in capfd.readouterr().err
    assert plan["tactic_source"] == "heuristic"
    reference_check(out, A, B)
    assert ops.gemm.tuning_cache() == []  # dropped: warned once


def test_the_fp8_and_grouped_kernels_choose_as_cutlass_gemm_does(tmp_path, clean_tuning_cache, capfd):
    # scaled_gemm's and grouped_gemm's SM90 kernels (candidates: kernel names) take the forced tactic, else
    # the tuning cache's choice for their key, else the heuristic's; autotuning is due where nothing is
    # forced or cached and there is a choice. plan() and the launch both choose through this.
    import json

    names = [k["name"] for k in ops.kernels("grouped_gemm") if k["dtype"] == "bfloat16" and k["layout_b"] == "col"]
    assert len(names) == 2  # unswapped, swapped

    def choice(key, candidates=names, heuristic=0):
        return json.loads(torch.ops.ops._named_tactic_choice("grouped_gemm", key, candidates, heuristic))

    assert choice("k1") == {"index": 0, "tactic_source": "heuristic", "autotune": False}
    assert choice("k1", heuristic=1)["index"] == 1
    ops.gemm.set_autotune(True)
    assert choice("k1") == {"index": 0, "tactic_source": "heuristic", "autotune": True}
    assert choice("k1", names[:1])["autotune"] is False  # nothing to choose from
    ops.gemm.set_autotune(False)
    ops.gemm.load_tuning_cache(write_tuning_file(tmp_path / "t.json", [
        {"key": "k1", "best": names[1], "timings_ms": {names[0]: 2.0, names[1]: 1.0}},
        {"key": "k2", "best": "sm90_bf16_gone"}]))
    assert choice("k1") == {"index": 1, "tactic_source": "tuned", "autotune": False}
    ops.gemm.set_tactic(names[0])
    try:
        assert choice("k1") == {"index": 0, "tactic_source": "forced", "autotune": False}
        ops.gemm.set_tactic(names[0] + "/dp")
        with pytest.raises(RuntimeError, match="grouped_gemm: the forced tactic .* cannot run this call"):
            choice("k1")
    finally:
        ops.gemm.set_tactic(None)
    assert choice("k2", heuristic=1) == {"index": 1, "tactic_source": "heuristic", "autotune": False}
    assert "grouped_gemm: the tuning cache chose 'sm90_bf16_gone' for 'k2'" in capfd.readouterr().err
    assert [e["key"] for e in ops.gemm.tuning_cache()] == ["k1"]  # the stale entry dropped, warned once
    with pytest.raises(ValueError, match="heuristic must index candidates"):
        choice("k1", heuristic=2)


def test_a_cached_candidate_this_build_lacks_is_dropped_saying_why(tmp_path, clean_tuning_cache, capfd):
    A, B = operands(16, 256, 512)
    key = plan_only(A, B)["tuning_key"]
    ops.gemm.load_tuning_cache(write_tuning_file(tmp_path / "t.json", [{"key": key, "best": tactic("sm90_bf16_rc_gemv")}]))
    out, plan = emulate(A, B, candidate_kernels=False)
    err = capfd.readouterr().err
    assert f"the tuning cache chose '{tactic('sm90_bf16_rc_gemv')}'" in err and "OPS_CANDIDATE_KERNELS=1" in err, err
    assert plan["tactic_source"] == "heuristic"
    reference_check(out, A, B)


@pytest.mark.parametrize("content,match", [
    ("{not json", "is not JSON"),
    ('{"entries": []}', "is not a tuning cache"),
    ('{"format": "ops.gemm tuning cache", "version": 3, "entries": []}', "has version 3; this library reads version 2"),
    ('{"format": "ops.gemm tuning cache", "version": 1, "entries": []}', "has version 1; .*former names: autotune again"),
    ('{"format": "ops.gemm tuning cache", "version": 2, "entries": {}}', "expected a list of entries"),
    ('{"format": "ops.gemm tuning cache", "version": 2, "entries": [{"key": "k", "best": "t"}, {"key": "k"}]}',
     "entry 1 is malformed"),
    ('{"format": "ops.gemm tuning cache", "version": 2, "entries": [{"key": "k", "best": "t", "timings_ms": [1]}]}',
     "entry 0 is malformed"),
    ('{"format": "ops.gemm tuning cache", "version": true, "entries": []}', "has version True"),
    ('[' * 100000 + ']' * 100000, "is not JSON"),
] + [  # the first entry is valid, the second not: nothing may be loaded
    ('{"format": "ops.gemm tuning cache", "version": 2, "entries": [{"key": "k", "best": "t"}, '
     f'{{"key": {key}, "best": "t", "timings_ms": {{"t": {ms}}}}}]}}', "entry 1 is malformed")
    for key, ms in [('"k2"', "1" + "0" * 400), ('"k2"', "NaN"), ('"k2"', "-1"), ('"k2"', "true"), ('"\\ud800"', "1")]
])
def test_load_tuning_cache_rejects_bad_files(tmp_path, clean_tuning_cache, content, match):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=f"ops.gemm.load_tuning_cache: .*{match}"):
        ops.gemm.load_tuning_cache(path)
    assert ops.gemm.tuning_cache() == []  # nothing loaded, not even the valid entries
    with pytest.raises(FileNotFoundError):
        ops.gemm.load_tuning_cache(tmp_path / "missing.json")


def test_tuning_cache_environment_variable(tmp_path):
    # A file that cannot be loaded warns; whatever is wrong with it, `import ops` goes on.
    A, B = operands(16, 256, 512, values=False)
    key = plan_only(A, B)["tuning_key"]
    path = write_tuning_file(tmp_path / "t.json", [{"key": key, "best": tactic("sm90_bf16_rc_streamk", "splitk2")}])
    code = "import ops; print([e['best'] for e in ops.gemm.tuning_cache()])"
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, OPS_GEMM_TUNING_CACHE=str(path)),
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str([tactic("sm90_bf16_rc_streamk", "splitk2")])
    out = subprocess.run([sys.executable, "-W", "error", "-c", "import ops"],
                         env=dict(os.environ, OPS_GEMM_TUNING_CACHE=str(tmp_path / "missing.json")),
                         capture_output=True, text=True)
    assert out.returncode != 0 and "OPS_GEMM_TUNING_CACHE=" in out.stderr and "not loaded" in out.stderr
    (tmp_path / "deep.json").write_text("[" * 100000 + "]" * 100000)
    out = subprocess.run([sys.executable, "-c", "import ops; print(ops.gemm.tuning_cache())"],
                         env=dict(os.environ, OPS_GEMM_TUNING_CACHE=str(tmp_path / "deep.json")),
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]" and "not loaded" in out.stderr


# ---- launch parameters: swizzle and raster order -------------------------------------------------

@pytest.mark.parametrize("settings,swizzle,raster", [("swz4/raster_m", 4, "along_m"), ("raster_n", 1, "along_n"),
                                                    ("swz2", 2, "heuristic")])
def test_swizzle_and_raster_round_trip_through_forced_tactics_plans_and_the_tuning_cache(
        settings, swizzle, raster, tmp_path, clean_tuning_cache):
    # Launch parameters of every SM90 kernel: a forced or cached tactic may name any of them, also for a
    # problem too small to list them among its autotuning candidates.
    A, B = operands(16, 256, 512)
    name = tactic("sm90_bf16_rc_ping", settings)
    assert name not in plan_only(A, B)["candidates"]
    ops.gemm.set_tactic(name)
    out, plan = emulate(A, B)
    assert (plan["tactic"]["name"], plan["tactic"]["swizzle"], plan["tactic"]["raster"]) == (name, swizzle, raster)
    reference_check(out, A, B)
    ops.gemm.set_tactic(None)
    key = plan_only(A, B)["tuning_key"]
    entry = {"key": key, "best": name, "timings_ms": {name: 0.01}}
    assert ops.gemm.load_tuning_cache(write_tuning_file(tmp_path / "t.json", [entry])) == 1
    out, plan = emulate(A, B)
    assert (plan["tactic"]["name"], plan["tactic_source"], plan["tactic"]["raster"]) == (name, "tuned", raster)
    assert ops.gemm.save_tuning_cache(tmp_path / "saved.json") == 1
    ops.gemm.clear_tuning_cache()
    assert ops.gemm.load_tuning_cache(tmp_path / "saved.json") == 1
    assert emulate(A, B)[1]["tactic"]["name"] == name
    # Not a launch parameter of the SIMT GEMV, nor a swizzle the schedulers take.
    for bad in (tactic("sm90_bf16_rc_gemv", "swz2"), tactic("sm90_bf16_rc_ping", "swz3")):
        ops.gemm.set_tactic(bad)
        with pytest.raises(RuntimeError, match="cannot run this GEMM"):
            emulate(A, B)
    ops.gemm.set_tactic(None)


def test_the_default_tactic_keeps_cutlass_defaults():
    plan = plan_only(*operands(8192, 8192, 8192, b_layout="row", values=False))
    assert (plan["tactic"]["swizzle"], plan["tactic"]["raster"]) == (1, "heuristic")
    assert "/" not in plan["tactic"]["name"]


@pytest.mark.parametrize("act", ["none", "relu", "gelu", "gelu_tanh", "silu"])
def test_every_fused_linear_candidate_computes_its_epilogue(act):
    # ops.linear's candidates (the ping-pong fused kernels among them) replayed on CPU, bias and activation
    # in the epilogue, against the float64 formula.
    x = strided(77, 512, torch.bfloat16, "row", seed=1)
    weight = strided(200, 512, torch.bfloat16, "row", seed=2)
    bias = torch.randn(200, dtype=torch.bfloat16)
    names = ops._library.gemm_plan_for_target(x, weight.t(), 9, 0, "8.0;9.0a", epilogue=act,
                                                    candidate_kernels=True)["candidates"]
    assert any("_warpspecialized_pingpong" in n and n.startswith("sm90_bf16_128x128x64_2x1x1") for n in names)
    fn = {"none": lambda v: v, "relu": torch.relu, "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu,
          "gelu_tanh": lambda v: torch.nn.functional.gelu(v, approximate="tanh")}[act]
    expected = fn(x.double() @ weight.double().t() + bias.double())
    for name in names:
        ops.gemm.set_tactic(name)
        out, plan = emulate(x, weight.t(), epilogue=act, bias=bias)
        assert plan["tactic"]["name"] == name
        torch.testing.assert_close(out.double(), expected, atol=0.15, rtol=2e-2, msg=name)
    ops.gemm.set_tactic(None)


def test_the_plan_of_an_out_sharing_a_buffer_is_the_fresh_tensors_it_runs():
    # cutlass_gemm.out computes into a fresh row-major tensor where out may share A's buffer (strided views
    # ATen cannot tell apart), then copies: plan(A, B, out) names that GEMM, not one into out's layout.
    buf = torch.zeros(16, 16, dtype=torch.bfloat16)
    A, B, out = buf[:8, :8], torch.randn(8, 8, dtype=torch.bfloat16), buf[8:, :8].t()
    fresh = plan_only(A, B)

    def plan(out):
        return ops._library.gemm_plan_for_target(A, B, HOPPER["cc_major"], HOPPER["cc_minor"], HOPPER["arch_list"],
                                                 False, H200_SMS, "plain", out, True)

    assert plan(out) == fresh
    assert plan(torch.empty(8, 8, dtype=torch.bfloat16).t()) != fresh  # out's own layout where it has its own memory
