"""`pip install .` with no extras gives a working CLI: every subcommand's `--help`, and the
commands that need neither the demo's embedded API nor matplotlib, in `.venv-core` (made by
scripts/setup.sh), where kmock and matplotlib are not installed at all.

The checkout is reinstalled into `.venv-core` (no dependencies) first, so the test reads the
code as it is now, installed the way a user installs it (package data included)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from kneecap.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / ".venv-core"
SETUP_HINT = "run `bash scripts/setup.sh` (it makes .venv-core with `pip install .`, no extras)"


@pytest.fixture(scope="module")
def kneecap_plain(tmp_path_factory):
    """A runner of the plain install's `kneecap` console script, in an empty directory."""
    python = CORE / "bin" / "python"
    assert python.exists(), f"{CORE} is missing: {SETUP_HINT}"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    cwd = tmp_path_factory.mktemp("plain")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(CORE / "bin" / "kneecap"), *argv], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=300)
    run.python, run.cwd, run.env = python, cwd, env  # (a PYTHONPATH would import the checkout instead)
    return run


def test_the_plain_install_has_no_extras(kneecap_plain):
    for extra in ("kmock", "matplotlib", "pytest"):
        p = subprocess.run([str(kneecap_plain.python), "-c", f"import {extra}"], capture_output=True, text=True,
                           env=kneecap_plain.env)
        assert p.returncode == 1 and "ModuleNotFoundError" in p.stderr, (extra, p.stderr)
    p = subprocess.run([str(kneecap_plain.python), "-c", "import kneecap, sys; print(kneecap.__file__)"],
                       capture_output=True, text=True, cwd=kneecap_plain.cwd, env=kneecap_plain.env)
    assert str(CORE) in p.stdout, p.stdout  # the installed package, not the checkout


def test_every_subcommand_helps(kneecap_plain):
    top = kneecap_plain("--help")
    assert top.returncode == 0, top.stderr
    for name in COMMANDS:
        assert name in top.stdout
        p = kneecap_plain(name, "--help")
        assert p.returncode == 0 and p.stdout.startswith("usage: kneecap " + name), (name, p.stderr[-2000:])


def test_the_model_commands_and_replay_run(kneecap_plain, tmp_path):
    calib = tmp_path / "calib.json"
    fit = kneecap_plain("fit", str(ROOT / "data" / "real-h100" / "profiles.csv"), "--gpu", "h100-64gb",
                        "--where", "source=batching_results", "-o", str(calib), "--json")
    assert fit.returncode == 0 and calib.exists(), fit.stderr
    advise = kneecap_plain("advise", str(calib), "--model", "opt-1.3b", "--input-len", "161", "--output-len", "338",
                           "--json")
    assert advise.returncode == 0, advise.stderr
    assert json.loads(advise.stdout)["max_num_seqs"] > 8  # OPT-1.3B on an H100: a knee far above 8
    memory = kneecap_plain("memory", "--model", "llama-2-7b", "--gpu", "h100-64gb", "--max-num-seqs", "64", "--json")
    assert memory.returncode == 0 and json.loads(memory.stdout), memory.stderr
    simulate = kneecap_plain("simulate", "--rate", "3", "--servers", "4", "--service-mean", "1", "--json")
    assert simulate.returncode == 0 and json.loads(simulate.stdout), simulate.stderr
    plan = kneecap_plain("plan", "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--budget-per-hour", "30",
                         "--prefill-cost", "5", "--decode-cost", "5", "--kv-cost-per-gibps", "0.1", "--json")
    assert plan.returncode == 0 and json.loads(plan.stdout)["decode_replicas"] >= 1, plan.stderr
    rng = np.random.default_rng(3)
    arrivals = np.cumsum(rng.exponential(1 / 8.0, 480))
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n"
                     + "".join(f"{a:.6f},{int(rng.integers(200, 1500))},{int(rng.integers(50, 400))}\n"
                               for a in arrivals))
    replay = kneecap_plain("replay", str(trace), "--policy", "kneecap", "--max-replicas", "2", "--json")
    assert replay.returncode == 0, replay.stderr[-3000:]
    report = json.loads(replay.stdout)["policies"]["kneecap"]
    assert report["requests"] == 480 and report["completed"] + report["lost"] + report["rejected"] == 480


def test_a_command_that_needs_an_extra_names_it(kneecap_plain, tmp_path):
    p = kneecap_plain("demo", "--out", str(tmp_path / "out"))
    assert p.returncode == 2 and "pip install 'kneecap[demo]'" in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


EMULATIONS = ("kneecap.emulation", "kneecap.demo", "kneecap.sim.engine_node",
              "kneecap.sim.cluster", "kmock")
GRAPH = """
import contextlib, io, sys
from kneecap.cli import main
import kneecap.control.handlers, kneecap.control.loop, kneecap.commands.run  # what `kneecap run` starts
for argv in {commands!r}:
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0, argv
print(sorted(n for n in sys.modules if n.startswith({emulations!r})))
"""


def test_the_operator_and_the_model_commands_never_import_the_emulations(kneecap_plain, tmp_path):
    """The emulated API and kubelet (the demo's and virtual time's) stay out of what `kneecap run`
    and the model commands import: the import graph, read from the plain install's sys.modules."""
    calib, points = tmp_path / "calib.json", tmp_path / "points.csv"
    points.write_text("model,batch,input_len,output_len\nopt-1.3b,16,161,338\nopt-1.3b,64,161,338\n")
    commands = [
        ["fit", str(ROOT / "data" / "real-h100" / "profiles.csv"), "--gpu", "h100-64gb", "--where",
         "source=batching_results", "-o", str(calib), "--json"],
        ["predict", str(calib), str(points), "-o", str(tmp_path / "predicted.csv"), "--json"],
        ["advise", str(calib), "--model", "opt-1.3b", "--input-len", "161", "--output-len", "338", "--json"],
        ["memory", "--model", "llama-2-7b", "--gpu", "h100-64gb", "--max-num-seqs", "64", "--json"],
        ["simulate", "--rate", "3", "--servers", "4", "--service-mean", "1", "--json"],
        ["plan", "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--budget-per-hour", "30", "--json"],
    ]
    p = subprocess.run([str(kneecap_plain.python), "-c", GRAPH.format(commands=commands, emulations=EMULATIONS)],
                       cwd=kneecap_plain.cwd, env=kneecap_plain.env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip() == "[]", p.stdout
