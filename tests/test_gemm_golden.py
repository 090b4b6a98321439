"""Every kernel name and every planned kernel of the GEMM family, compared with tests/data/gemm_golden.json:
a restructuring of the host path must not rename or re-plan a kernel (tests/gemm_golden.py writes the file)."""
import json

import pytest

from tests import gemm_golden

with open(gemm_golden.PATH) as f:
    GOLDEN = json.load(f)


def test_kernel_list_unchanged():
    now = gemm_golden.kernels()
    assert [e["name"] for e in now] == [e["name"] for e in GOLDEN["kernels"]]
    assert now == GOLDEN["kernels"]


@pytest.mark.parametrize("part", ["dense_plans", "scaled_candidates"])
def test_plans_unchanged(part):
    now = getattr(gemm_golden, part)()
    assert sorted(now) == sorted(GOLDEN[part])
    changed = {key: (GOLDEN[part][key], now[key]) for key in now if now[key] != GOLDEN[part][key]}
    assert not changed, f"{len(changed)} of {len(now)} changed, e.g. {next(iter(changed.items()))}"
