"""The Deployments kneecap renders for the examples are valid for the current Kubernetes: the
kubernetes-validate CLI (the venv's test extra), strict, on every one. The pods' restricted
profile: tests/unit/test_control_pod_security.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.examples import kneecap_pod_examples, rendered_deployments as rendered

EXAMPLES = kneecap_pod_examples()
K8S_VERSION = "1.37.0"


def test_rendered_deployments_validate_strict_for_current_kubernetes(tmp_path):
    exe = Path(sys.executable).parent / "kubernetes-validate"
    if not exe.exists():
        pytest.fail("kubernetes-validate is not installed in the venv: run `bash scripts/setup.sh` (test extra)")
    docs = [d for example in EXAMPLES for d in rendered(example)]
    path = tmp_path / "pools.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    p = subprocess.run([str(exe), "--strict", "-k", K8S_VERSION, str(path)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count(" passed for resource ") == len(docs) >= len(EXAMPLES), p.stdout
