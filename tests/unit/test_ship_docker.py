"""The operator image's Dockerfile and .dockerignore read as Docker reads them: the final image
runs `kneecap run` as non-root on slim Python with runtime dependencies only, and the
.dockerignore matcher follows Docker's rules. hadolint, the build context and the wheel built
from it: tests/integration/test_ship_docker_tools.py."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.dockerfile import final_stage, instructions, pattern_regex

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def test_final_image_runs_kneecap_run_as_non_root_on_slim_python():
    text = DOCKERFILE.read_text()
    stage = final_stage(text)
    assert stage[0] == ("FROM", "python:3.11-slim")
    users = [args for op, args in stage if op == "USER"]
    assert users and users[-1].split(":")[0].isdigit() and int(users[-1].split(":")[0]) != 0
    assert ("ENTRYPOINT", '["kneecap"]') in stage
    (cmd,) = [json.loads(args) for op, args in stage if op == "CMD"]
    assert cmd[0] == "run" and "--all-namespaces" in cmd
    labels = " ".join(args for op, args in stage if op == "LABEL")
    for key in ("title", "description", "version", "revision", "licenses", "source", "documentation"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    # only runtime dependencies: the package without its [test] extra
    runs = " ".join(args for op, args in instructions(text) if op == "RUN")
    assert "pip install --no-cache-dir ." in runs and "[test]" not in runs and "pytest" not in runs
    # the chart's UID and the image's agree; the CRD comes with the package (no path to set)
    import yaml

    values = yaml.safe_load((ROOT / "charts" / "kneecap" / "values.yaml").read_text())
    assert users[-1] == f"{values['podSecurityContext']['runAsUser']}:{values['podSecurityContext']['runAsGroup']}"
    assert "KNEECAP_CRD" not in " ".join(args for op, args in stage if op == "ENV")


def test_dockerignore_matcher():
    rx = pattern_regex("**/__pycache__")
    assert rx.match("__pycache__") and rx.match("operator/kneecap/__pycache__")
    assert pattern_regex("*").match("tests") and not pattern_regex("*").match("tests/unit")
