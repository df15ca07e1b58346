"""`kneecap run` refuses bad flags before it looks for a cluster (exit 2, the flag named).
The process against the real API: tests/kube/test_run_cli.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.twins import ROOT


@pytest.mark.parametrize("argv,needle", [
    (["--metrics-port", "70000"], "--metrics-port"),
    (["--liveness", "0"], "--liveness"),
    (["--tick", "0"], "--tick"),
    (["--selector", "kneecap.io/shard in (a"], "--selector"),
    (["--selector", ""], "--selector"),
    (["--fleet-inventory", "h100=4"], "--fleet-inventory"),  # ambiguous: which H100
    (["--fleet-inventory", "l40s=4,l4=many"], "--fleet-inventory"),
    (["--fleet-inventory", "l4=2", "--fleet-inventory", "l4=1"], "--fleet-inventory"),  # duplicate type
    (["--fleet-interval", "0"], "--fleet-interval"),
    (["--fleet-interval", "nan"], "--fleet-interval"),
    (["--fleet-cpu-share", "0"], "--fleet-cpu-share"),
    (["--fleet-cpu-share", "1.5"], "--fleet-cpu-share"),
    (["--fleet-max-evaluations", "0"], "--fleet-max-evaluations"),
    (["--max-concurrent-reconciles", "0"], "--max-concurrent-reconciles"),
])
def test_kneecap_run_rejects_bad_flags(argv, needle):
    res = subprocess.run([sys.executable, "-m", "kneecap", "run", *argv], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT / "operator")), timeout=60)
    assert res.returncode == 2 and needle in res.stderr, res.stderr
