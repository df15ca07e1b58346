"""The real command-line tools the shipping tests drive (installed by scripts/setup-tools.sh)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def tool(name: str) -> str:
    """Path of a tool installed by scripts/setup-tools.sh (or on PATH); fails loudly if missing."""
    local = ROOT / ".tools" / "bin" / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found:
        return found
    pytest.fail(f"`{name}` not found in .tools/bin or on PATH: run `bash scripts/setup-tools.sh`")
