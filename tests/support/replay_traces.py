"""Traces for `kneecap replay` and the command run in process (shared by
tests/unit/test_sim_replay.py and tests/integration/test_cli_process.py)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np

from kneecap import cli


def write_trace(tmp_path: Path, rate_rps: float, duration_s: float, seed: int = 3) -> Path:
    """A Poisson trace at ``rate_rps`` with lognormal lengths (means ~900 in, ~180 out), as CSV."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate_rps, int(rate_rps * duration_s)))
    inp = np.maximum(rng.lognormal(np.log(900), 0.5, t.size).astype(int), 1)
    out = np.maximum(rng.lognormal(np.log(180), 0.5, t.size).astype(int), 1)
    p = tmp_path / "trace.csv"
    p.write_text("arrival_s,input_tokens,output_tokens\n" + "".join(f"{a:.6f},{i},{o}\n" for a, i, o in zip(t, inp, out)))
    return p


def replay_json(args: list[str]) -> str:
    """`kneecap replay ARGS --json` in process: its stdout."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli.main(["replay", *args, "--json"]) == 0
    return buf.getvalue()
