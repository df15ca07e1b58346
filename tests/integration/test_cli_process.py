"""The `kneecap` entry point as a process (`python -m kneecap`): the version it prints, JSON on
stdout, exit code 2 with the error on stderr, and a replay whose report is byte for byte the one
made in process (another hash seed). The commands' logic in process: tests/unit/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kneecap import __version__
from tests.support.replay_traces import replay_json, write_trace

ROOT = Path(__file__).resolve().parents[2]


def test_version():
    p = subprocess.run([sys.executable, "-m", "kneecap", "--version"], capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": str(ROOT / "operator"), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0 and p.stdout.strip() == f"kneecap {__version__}"


def test_subprocess_json_round_trip():
    proc = subprocess.run([sys.executable, "-m", "kneecap", "simulate", "--rate", "3", "--servers", "4",
                           "--service-mean", "1", "--samples", "100000", "--sweep-points", "0", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["servers"] == 4 and out["ttft_s"]["p99"] > out["ttft_s"]["p50"] > 0
    bad = subprocess.run([sys.executable, "-m", "kneecap", "simulate", "--rate", "0", "--service-mean", "1", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and json.loads(bad.stderr.splitlines()[0])["field"] == "rate"


def test_memory_cli_bad_input_exits_2():
    r = subprocess.run([sys.executable, "-m", "kneecap", "memory", "--model", "llama-2-7b", "--gpu", "h100-64gb",
                        "--max-num-seqs", "8", "--gpu-memory-utilization", "0.1"], capture_output=True, text=True)
    assert r.returncode == 2
    assert "gpu_memory_utilization: 0.1 leaves no KV cache" in r.stderr
    r = subprocess.run([sys.executable, "-m", "kneecap", "memory", "--model", "llama-2-7b"], capture_output=True, text=True)
    assert r.returncode == 2 and "--gpu" in r.stderr


def test_replay_is_byte_identical_across_runs_and_processes(tmp_path):
    p = write_trace(tmp_path, 12.0, 90.0)
    args = [str(p), "--policy", "kneecap", "--policy", "defaults+hpa", "--max-replicas", "3", "--start-replicas", "2",
            "--seed", "7"]
    a = replay_json(args)
    b = replay_json(args)
    assert a == b
    env = dict(os.environ, PYTHONPATH=str(ROOT / "operator"), PYTHONHASHSEED="12345")
    c = subprocess.run([sys.executable, "-m", "kneecap", "replay", *args, "--json"], capture_output=True, text=True,
                       env=env, check=True).stdout
    assert c == a
    report = json.loads(a)
    assert set(report["policies"]) == {"kneecap", "defaults+hpa"}
    for s in report["policies"].values():
        assert s["requests"] == 1080 and s["completed"] + s["lost"] + s["rejected"] == 1080
        assert s["gpu_hours"] > 0
