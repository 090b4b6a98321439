"""The compile pass against eager on programs written by the differential fuzzer (tests/compile_fuzz.py):
a bounded, derandomized run here; `python tests/compile_fuzz.py --graphs 10000` is the long one."""

import os

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings

import ops
from compile_fuzz import Tally, check, programs

GRAPHS = int(os.environ.get("OPS_COMPILE_FUZZ_GRAPHS", "60"))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_pass_agrees_with_eager_on_fuzzed_programs():
    tally = Tally()

    @settings(max_examples=GRAPHS, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink])
    @given(programs())
    def run(program):
        check(program, tally)

    with torch._inductor.config.patch(compile_threads=1):
        run()
    summary = tally.summary()
    assert tally.graphs >= GRAPHS // 2, summary  # most programs ran (not skipped)
    # The run shows rewrites, not only graphs left alone.
    assert all(tally.graphs_rewritten[name] for name in ops.compile.PATTERNS), summary
    print(summary)
