"""The compile pass against eager on programs written by the differential fuzzer (tests/compile_fuzz.py):
a bounded, derandomized run here; `python tests/compile_fuzz.py --graphs 10000` is the long one."""

import os

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings

import ops
from compile_fuzz import Input, Program, Tally, check, programs

GRAPHS = int(os.environ.get("OPS_COMPILE_FUZZ_GRAPHS", "60"))

# Programs the fuzzer found the pass wrong on, each with the rewrites the fixed pass makes.
FOUND = [
    # `x * 0.5 + 0.25` matched the residual sum `x + residual` with the number as the residual: the
    # re-traced match holds no residual (KeyError from the pass).
    (Program(source="def program(i1, i3):\n    t2 = i1 * 0.5 + 0.25\n    t4 = 1.0 + i3\n"
                    "    t5 = F.rms_norm(t2, (8,), t4, 1e-06)\n    return (t5, t2,)",
             inputs=[Input("i1", (1, 8), False), Input("i3", (8,), False, "positive")],
             dtype=torch.float32, dynamic="static", training=False),
     {"rms_norm": 1}),
]


@pytest.mark.parametrize("program, rewrites", FOUND, ids=range(len(FOUND)))
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_programs_the_fuzzer_found(program, rewrites):
    counts = check(program)
    assert {k: v for k, v in counts.items() if v} == rewrites


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
