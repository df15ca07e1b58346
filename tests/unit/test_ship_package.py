"""The package carries the CRD the operator reads its defaults from, byte for byte the source
CRD. The wheel built and installed away from the repository:
tests/integration/test_ship_wheel.py."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_CRD = ROOT / "crds" / "llmdeployment.yaml"
PACKAGE = ROOT / "operator" / "kneecap"


def test_package_crd_is_byte_identical_to_the_source_crd():
    copy = (PACKAGE / "crds" / "llmdeployment.yaml").read_bytes()
    assert copy == SOURCE_CRD.read_bytes(), "operator/kneecap/crds/llmdeployment.yaml differs from crds/: run scripts/sync-crd.sh"
