"""Where the benchmark scripts read data and write results (all inside the repository)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROFILES_CSV = ROOT / "data" / "real-h100" / "profiles.csv"
OFFLINE_CSV = ROOT / "data" / "real-h100" / "offline.csv"
VLLM_CAPTURES = ROOT / "tests" / "fixtures" / "vllm-metrics"
RESULTS = ROOT / "benchmarks" / "results"
