"""`kneecap demo`'s closed loop in virtual time: the load-independent version of the demo's
expectations (the operator moves the cap down from 256 with one restart), checked against
the in-memory API's objects, and identical on a second run."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from kneecap.control import vllm_args
from kneecap.control.manifests import vllm_container
from kneecap.demo.harness import DemoConfig
from kneecap.demo.report import template_changes
from kneecap.sim.demo_virtual import run_demo_virtual

CFG = DemoConfig(duration_s=160.0, interval_s=10.0, cooldown_s=120.0, warmup_intervals=2)


def flags(deploy: dict) -> tuple[int, float]:
    c = vllm_container(deploy)
    return (int(vllm_args.container_flag(c, "--max-num-seqs")),
            float(vllm_args.container_flag(c, "--gpu-memory-utilization")))


@pytest.fixture(scope="module")
def run():
    return run_demo_virtual(CFG)


def test_cap_moves_down_from_256_with_one_restart(run):
    s = run.summary
    assert flags(run.deployment_history[0]) == (256, 0.9)
    assert (s["converged_max_num_seqs"], s["converged_gpu_memory_utilization"]) == flags(run.deployment)
    assert s["converged_max_num_seqs"] < 256 and s["converged_gpu_memory_utilization"] < 0.9
    assert s["deployment_changes"] == template_changes(run.deployment_history) == 1
    assert s["restarts"] == run.kubelet_restarts == 1
    assert run.llmd["status"]["applied"]["maxNumSeqs"] == s["converged_max_num_seqs"]
    ready = [e for e in run.kubelet_events if e["event"] == "ready"]
    assert ready[-1]["max_num_seqs"] == s["converged_max_num_seqs"]  # the new pod runs the applied cap
    assert len(run.rows) == CFG.duration_s // CFG.interval_s
    assert any(r.decision == "Applied" for r in run.rows)
    assert s["throughput_converged_tok_s"] > 0 and s["phase"] == "Running"


def test_a_second_run_gives_the_same_rows(run):
    again = run_demo_virtual(CFG)
    assert [asdict(r) for r in again.rows] == [asdict(r) for r in run.rows]
    assert again.kubelet_events == run.kubelet_events


def test_the_start_up_throughput_counts_only_windows_of_the_steady_load(run):
    """A window is the warm-up's while most of it lies before the steady load, so the summary's
    throughput at the start-up flags is not pulled down by a light window."""
    assert [CFG.phase_of(t) for t in (10.0, 20.0, 24.9, 25.1, 30.0)] == ["warmup"] * 3 + ["steady"] * 2
    steady = [r for r in run.rows if r.phase == "steady"]
    assert steady and all(r.t_s - CFG.interval_s / 2 >= CFG.warmup_s for r in steady)
    before = [r.throughput_tok_s for r in steady if r.max_num_seqs == 256 and r.throughput_tok_s]
    light = [r.throughput_tok_s for r in run.rows if r.phase == "warmup" and r.throughput_tok_s]
    assert before and light and min(before) > 2 * max(light)


def test_kneecap_demo_virtual_prints_the_runs_summary_and_writes_its_files(tmp_path, capsys):
    """`kneecap demo --virtual` is this run behind the CLI: the same summary, its PNG and JSON."""
    from kneecap.cli import main

    argv = ["demo", "--virtual", "--duration", "160", "--interval", "10", "--cooldown", "120", "--json",
            "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    expected = run_demo_virtual(DemoConfig(duration_s=160.0, interval_s=10.0, cooldown_s=120.0)).summary
    summary = {k: v for k, v in printed.items() if k not in ("png", "run_json")}
    timing = ("wall_s",)  # the CPU seconds the run took
    assert ({k: v for k, v in summary.items() if k not in timing}
            == {k: v for k, v in json.loads(json.dumps(expected, default=str)).items() if k not in timing})
    assert summary["restarts"] == 1 and summary["converged_max_num_seqs"] < 256
    assert (tmp_path / "out" / "trajectory.png").stat().st_size > 0
    assert json.loads((tmp_path / "out" / "run.json").read_text())["summary"] == summary


@pytest.mark.parametrize("flag", ["--adopt", "--disaggregated"])
def test_kneecap_demo_virtual_refuses_what_it_does_not_run(tmp_path, capsys, flag):
    from kneecap.cli import main

    assert main(["demo", "--virtual", flag, "--json", "--out", str(tmp_path / "out")]) == 2
    err = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert err["field"] == "virtual" and flag in err["error"]
    assert not (tmp_path / "out").exists()
