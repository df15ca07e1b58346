"""`kneecap run` needs only the core dependencies; the demo's emulated API (kmock) and the PNGs
(matplotlib) are extras, and a command that needs a missing one says which to install (each
command a process without them; the extras as pyproject.toml declares them:
tests/unit/test_ship_extras.py).

A missing package is simulated the way Python defines it: `sys.modules[name] = None` makes
its import raise ModuleNotFoundError."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WITHOUT = "import sys\nfor m in ('kmock', 'matplotlib'):\n    sys.modules[m] = None\n"


def _kneecap(tmp_path, *argv: str) -> subprocess.CompletedProcess:
    code = WITHOUT + "from kneecap.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)


def test_run_works_without_the_extras(tmp_path):
    p = _kneecap(tmp_path, "run", "--help")
    assert p.returncode == 0 and "--liveness" in p.stdout, p.stderr
    code = WITHOUT + "import kneecap.control.handlers, kneecap.commands.run, kneecap.sim.server\nprint('ok')\n"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr


def test_demo_without_its_extra_names_it_and_starts_nothing(tmp_path):
    p = _kneecap(tmp_path, "demo", "--help")
    assert p.returncode == 0 and "--time-scale" in p.stdout and "kneecap[demo]" in p.stdout.replace("\n", " ")
    p = _kneecap(tmp_path, "demo", "--out", str(tmp_path / "out"))
    assert p.returncode == 2 and "kmock" in p.stderr and "pip install 'kneecap[demo]'" in p.stderr
    assert not (tmp_path / "out").exists()


def test_plot_without_matplotlib_names_the_extra(tmp_path):
    p = _kneecap(tmp_path, "plan", "--help")
    assert p.returncode == 0
    calib = tmp_path / "calib.json"
    fit = _kneecap(tmp_path, "fit", str(ROOT / "data" / "real-h100" / "profiles.csv"), "--gpu", "h100-64gb",
                   "--where", "source=batching_results", "-o", str(calib), "--json")
    assert fit.returncode == 0, fit.stderr
    p = _kneecap(tmp_path, "advise", str(calib), "--model", "opt-1.3b", "--input-len", "161", "--output-len", "338",
                 "--plot", str(tmp_path / "knee.png"), "--json")
    assert p.returncode == 2 and not (tmp_path / "knee.png").exists()
    err = json.loads(p.stderr.splitlines()[0])
    assert err["field"] == "--plot" and "pip install 'kneecap[plot]'" in err["error"]
