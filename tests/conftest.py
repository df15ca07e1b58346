"""Shared fixtures: where the project's shared data lives."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("KNEECAP_SHARED", ROOT.parent / "shared"))


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"shared data not found at {SHARED} (set KNEECAP_SHARED)")
    return SHARED


@pytest.fixture(scope="session")
def profiles_csv(shared_dir: Path) -> Path:
    return shared_dir / "data" / "real-h100" / "profiles.csv"
