"""Paths shared by the benchmark scripts."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("KNEECAP_SHARED", ROOT.parent / "shared"))
PROFILES_CSV = SHARED / "data" / "real-h100" / "profiles.csv"
OFFLINE_CSV = SHARED / "data" / "real-h100" / "offline.csv"
RESULTS = ROOT / "benchmarks" / "results"
