"""Every Python snippet of README.md and docs/*.md runs, each in a fresh interpreter in an empty folder
(snippets whose first line says they need a GPU are skipped without one)."""

import glob
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow


def _snippets():
    for path in [os.path.join(REPO, "README.md"), *sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))]:
        text = open(path).read()
        for i, match in enumerate(re.finditer(r"```python\n(.*?)```", text, re.S)):
            code = match.group(1)
            line = text[:match.start()].count("\n") + 1
            marks = [pytest.mark.cuda] if code.lstrip().startswith("# needs a GPU") else []
            yield pytest.param(code, id=f"{os.path.relpath(path, REPO)}:{line}", marks=marks)


SNIPPETS = list(_snippets())


def test_the_docs_have_snippets():
    assert len(SNIPPETS) >= 5


@pytest.mark.parametrize("code", SNIPPETS)
def test_snippet_runs(code, tmp_path):
    script = tmp_path / "snippet.py"  # a file: TorchScript reads the source of what it scripts
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), HF_HUB_OFFLINE="1")
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
