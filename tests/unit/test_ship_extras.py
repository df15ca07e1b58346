"""The demo's emulated API (kmock) and the PNGs (matplotlib) are extras of pyproject.toml, not
runtime dependencies. A command that needs a missing one, run as a process:
tests/integration/test_ship_without_extras.py."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_extras_are_not_runtime_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    assert "kmock" not in core and "matplotlib" not in core
    extras = project["optional-dependencies"]
    assert any(d.startswith("kmock") for d in extras["demo"]) and any(d.startswith("matplotlib") for d in extras["plot"])
    assert {"kmock", "matplotlib"} <= {d.split("=")[0].split(">")[0] for d in extras["test"]}
