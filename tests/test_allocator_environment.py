"""OPS_ALLOCATOR_RELEASE_THRESHOLD and ops.allocator.set_release_threshold, checked without a GPU: the
Python side raises for a value that is not a number of bytes before the allocator reaches PyTorch; the C
library (csrc/allocator/allocator.cpp), which reads the variable inside allocations, reports it on
stderr and keeps the default (UINT64_MAX: keep everything until trim())."""

import json
import os
import subprocess
import sys

import pytest

import ops
from conftest import REPO

needs_cuda_build = pytest.mark.skipif(not ops.build_info.WITH_CUDA, reason="CPU-only build of ops")
ENV = "OPS_ALLOCATOR_RELEASE_THRESHOLD"
UINT64_MAX = 2**64 - 1

GOOD = [("0", 0), ("1024", 1024), (" 4096\n", 4096), ("18446744073709551615", UINT64_MAX), ("", None), ("  ", None)]
BAD = ["garbage", "-1", "+5", "1.5", "1e9", "0x10", "12abc", "1_000", "1 000", "18446744073709551616",
       "99999999999999999999999", "\u0661\u0662"]  # the last: Arabic-Indic digits, which int() takes


@pytest.mark.parametrize("value,expected", GOOD + [(None, None)])
def test_threshold_environment_values(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, value)
    assert ops.allocator._release_threshold_from_environment() == expected


@pytest.mark.parametrize("value", BAD)
def test_a_bad_threshold_environment_value_is_an_error(monkeypatch, value):
    monkeypatch.setenv(ENV, value)
    with pytest.raises(ValueError, match=f"ops.allocator: environment variable {ENV}=.*: expected a non-negative "
                                         "integer number of bytes"):
        ops.allocator._release_threshold_from_environment()


@needs_cuda_build
def test_pluggable_refuses_a_bad_threshold_environment_value(monkeypatch):
    monkeypatch.setenv(ENV, "garbage")
    with pytest.raises(ValueError, match=f"{ENV}='garbage': expected a non-negative integer number of bytes"):
        ops.allocator.pluggable()


READ_THRESHOLD = r"""
import ctypes, json, sys
import torch  # the library links against torch's

lib = ctypes.CDLL(sys.argv[1])
lib.ops_allocator_release_threshold.restype = ctypes.c_uint64
print(json.dumps(lib.ops_allocator_release_threshold()))
"""


@needs_cuda_build
def test_the_c_library_ignores_a_bad_threshold_environment_value_saying_so():
    # One process per value: the library reads the variable once. No GPU needed: no pool is made.
    cases = [(" 4096\n", 4096), ("18446744073709551615", UINT64_MAX), ("", None), ("garbage", None), ("-1", None),
             ("18446744073709551616", None)]
    procs = []
    for value, expected in cases:
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env[ENV] = value
        procs.append(subprocess.Popen([sys.executable, "-c", READ_THRESHOLD, ops.library_path()], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for (value, expected), proc in zip(cases, procs):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        assert json.loads(out) == (UINT64_MAX if expected is None else expected), value
        said = f"ops.allocator: {ENV}='{value}' is not a non-negative integer number of bytes" in err
        is_bad = value in BAD
        assert said == is_bad, (value, err[-2000:])


@pytest.mark.parametrize("num_bytes,error,match", [
    (-1, ValueError, "expected num_bytes in \\[0, 2\\*\\*64 - 1\\], got -1"),
    (2**64, ValueError, "expected num_bytes in \\[0, 2\\*\\*64 - 1\\], got 18446744073709551616"),
    (1.5, TypeError, "expected num_bytes to be an int \\(bytes\\) or None, got float"),
    (True, TypeError, "expected num_bytes to be an int \\(bytes\\) or None, got bool"),
    ("1024", TypeError, "expected num_bytes to be an int \\(bytes\\) or None, got str"),
])
def test_set_release_threshold_checks_its_argument(num_bytes, error, match):
    with pytest.raises(error, match=f"ops.allocator.set_release_threshold: {match}"):
        ops.allocator.set_release_threshold(num_bytes)
