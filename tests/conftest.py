"""Shared fixtures: the repository's data files."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.data import PROFILES_CSV


@pytest.fixture(scope="session")
def profiles_csv() -> Path:
    return PROFILES_CSV
