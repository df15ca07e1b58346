"""The wheel is self-contained: it carries the CRD the operator reads its defaults from, and an
installed copy (away from the repository) loads it from the package, honours KNEECAP_CRD and
runs `kneecap run` / `kneecap demo` (pip builds and installs it; the package's CRD as a file:
tests/unit/test_ship_package.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE_CRD = ROOT / "crds" / "llmdeployment.yaml"
PACKAGE = ROOT / "operator" / "kneecap"
SPEC = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "accelerator": {"type": "h100-80gb"},
        "engine": {"image": "x"}}
PROBE = ("import sys, kneecap; from kneecap.control import spec; print(kneecap.__file__); print(spec.CRD_PATH); "
         f"print(spec.parse_spec({SPEC!r}).engine.max_num_seqs)")


def _runtime_files() -> set[str]:
    """Every file of the package source tree, as wheel paths (kneecap/...)."""
    return {"kneecap/" + p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """`pip wheel --no-deps` of a copy of the package sources (the build writes build/ and egg-info)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(PACKAGE, src / "operator" / "kneecap", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / f, src / f)
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                        "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    (whl,) = (tmp / "dist").glob("kneecap-*.whl")
    return whl


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> tuple[Path, dict]:
    """(site dir, env): the wheel installed with --target; the env sees it and not the repository."""
    site = tmp_path_factory.mktemp("site")
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(site),
           "MPLCONFIGDIR": str(site / ".mpl")}
    return site, env


def _run(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_wheel_holds_every_runtime_file_and_the_crd(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        crd = z.read("kneecap/crds/llmdeployment.yaml")
    missing = _runtime_files() - names
    assert not missing, sorted(missing)
    assert crd == SOURCE_CRD.read_bytes()
    assert not any(n.startswith(("tests/", "benchmarks/", "data/")) for n in names)


@pytest.mark.slow
def test_installed_copy_loads_the_crd_from_the_package(installed, tmp_path):
    site, env = installed
    p = _run(["-c", PROBE], env, tmp_path)
    assert p.returncode == 0, p.stderr
    where, crd_path, default_cap = p.stdout.split()
    assert where == str(site / "kneecap" / "__init__.py")
    assert crd_path == str(site / "kneecap" / "crds" / "llmdeployment.yaml") and default_cap == "256"


@pytest.mark.slow
def test_installed_copy_honours_kneecap_crd(installed, tmp_path):
    """Another CRD revision (default maxNumSeqs 128) named by KNEECAP_CRD wins over the package's."""
    site, env = installed
    other = tmp_path / "crd.yaml"
    text = SOURCE_CRD.read_text()
    old = "maxNumSeqs: {type: integer, minimum: 1, maximum: 65536, default: 256}"
    assert text.count(old) == 1
    other.write_text(text.replace(old, old.replace("default: 256", "default: 128")))
    p = _run(["-c", PROBE], {**env, "KNEECAP_CRD": str(other)}, tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split()[1:] == [str(other), "128"]
    p = _run(["-c", PROBE], {**env, "KNEECAP_CRD": str(tmp_path / "missing.yaml")}, tmp_path)
    assert p.returncode != 0 and "missing.yaml" in p.stderr


@pytest.mark.slow
@pytest.mark.parametrize("command, flag", [("run", "--liveness"), ("demo", "--time-scale")])
def test_installed_commands_start(installed, tmp_path, command, flag):
    site, env = installed
    p = _run(["-m", "kneecap", command, "--help"], env, tmp_path)
    assert p.returncode == 0 and flag in p.stdout, p.stderr
