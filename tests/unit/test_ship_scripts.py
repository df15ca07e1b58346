"""The e2e script's contract, read from it: marked as not run here, on a valid twin example.
The shipping scripts run by bash (syntax, the CRD sync, setup-tools idempotence):
tests/integration/test_ship_scripts_run.py."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_e2e_script_says_it_is_not_run_here_and_uses_a_valid_example():
    text = (ROOT / "tests" / "e2e" / "kind.sh").read_text()
    header = text.split("set -euo pipefail")[0]
    assert "NOT RUN" in header
    assert "examples/twin.yaml" in text
    twin = yaml.safe_load((ROOT / "examples" / "twin.yaml").read_text())
    assert twin["spec"]["engine"]["command"] == ["kneecap", "twin"]
    assert "image: ghcr.io/kneecap/kneecap:0.1.0" in (ROOT / "examples" / "twin.yaml").read_text()  # what kind.sh rewrites
