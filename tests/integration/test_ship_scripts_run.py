"""The shipping scripts run by bash: syntax, the CRD sync, setup-tools idempotence (the e2e
script's contract: tests/unit/test_ship_scripts.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = [ROOT / "scripts" / "setup-tools.sh", ROOT / "scripts" / "sync-crd.sh", ROOT / "tests" / "e2e" / "kind.sh"]


def test_scripts_parse():
    for s in SCRIPTS:
        p = subprocess.run(["bash", "-n", str(s)], capture_output=True, text=True)
        assert p.returncode == 0, f"{s.name}: {p.stderr}"
        assert "set -euo pipefail" in s.read_text()


def test_sync_crd_copies_the_crd_byte_for_byte(tmp_path):
    copies = ("charts/kneecap/crds/llmdeployment.yaml", "operator/kneecap/crds/llmdeployment.yaml")
    for rel in ("scripts/sync-crd.sh", "crds/llmdeployment.yaml", *copies):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    src = tmp_path / "crds" / "llmdeployment.yaml"
    src.write_bytes(src.read_bytes() + b"# changed\n")
    p = subprocess.run(["bash", str(tmp_path / "scripts" / "sync-crd.sh")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    for rel in copies:
        assert (tmp_path / rel).read_bytes() == src.read_bytes(), rel


def test_setup_tools_is_idempotent_and_leaves_working_tools():
    for _ in range(2):  # the first run installs whatever is missing; the second must find everything
        p = subprocess.run(["bash", str(ROOT / "scripts" / "setup-tools.sh")], capture_output=True, text=True,
                           timeout=600)
        assert p.returncode == 0, p.stdout + p.stderr
    for tool in ("promtool", "prometheus", "helm", "kubectl", "hadolint"):
        assert f"{tool} already in .tools/bin" in p.stdout or (tool in ("helm", "kubectl") and
                                                                 "helm and kubectl already in .tools/bin" in p.stdout), p.stdout
    assert "helm v4." in p.stdout and "Client Version: v1.37" in p.stdout
    assert "promtool, version 2." in p.stdout and "prometheus, version 2." in p.stdout
