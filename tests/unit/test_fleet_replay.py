"""`kneecap replay --fleet` (kneecap.sim.fleet_replay, kneecap.commands.replay.run_fleet): a
small fleet's traces replayed at once under one-per-gpu (today: the fleet's declared GPUs) and
kneecap+pack (no more GPUs, every deployment's attainment reported); the same inputs and seed
give the same JSON; bad input exits 2 naming the entry and field or the deployment without a
trace. Short traces (two minutes of virtual time) and few GAUSS samples keep it fast."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from kneecap.errors import InputError
from kneecap.model import packing
from kneecap.sim import fleet_replay as fr
from kneecap.sim.shared_gpu import replay_arrivals
from kneecap.sim.trace import Trace
from tests.support.cli import run_cli
from tests.support.data import AZURE_CONVERSATION_CSV

FLEET = [
    {"name": "small", "model": "llama-3.2-3b", "accelerator": {"type": "h100-80gb", "count": 1}, "replicas": 2,
     "workload": {"requestsPerSecond": 2.0, "inputLengthMean": 512, "outputLengthMean": 128},
     "slo": {"quantile": 0.95, "ttftSeconds": 0.5, "tpotSeconds": 0.05}},
    {"name": "mid", "model": "qwen2.5-7b", "accelerator": {"type": "h100-80gb", "count": 1}, "replicas": 1,
     "workload": {"requestsPerSecond": 0.5, "inputLengthMean": 800, "outputLengthMean": 150},
     "slo": {"quantile": 0.95, "ttftSeconds": 1.5, "tpotSeconds": 0.08}},
]
FAST = ("--duration", "120", "--samples", "4000")


def _write(tmp_path, entries, name="fleet.yaml") -> str:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(entries))
    return str(p)


def _run(capsys, *argv):
    return run_cli(capsys, "replay", *argv)


@pytest.fixture(scope="module")
def fleet_file(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("fleet"), FLEET)


def test_one_per_gpu_holds_the_declared_gpus_and_kneecap_pack_no_more(fleet_file, capsys, tmp_path):
    png = tmp_path / "fleet.png"
    rc, out, _ = _run(capsys, str(AZURE_CONVERSATION_CSV), "--fleet", fleet_file, *FAST, "--json", "--plot", str(png))
    assert rc == 0
    rep = json.loads(out)
    today, packed = rep["policies"]["one-per-gpu"], rep["policies"]["kneecap+pack"]
    assert today["gpus"] == sum(e["replicas"] for e in FLEET) == 3
    assert today["by_type"] == {"h100-80gb": 3} and today["cost_per_hour"] > 0
    assert packed["feasible"] and packed["gpus"] <= today["gpus"]
    assert packed["cost_per_hour"] <= today["cost_per_hour"]
    assert rep["gpus_returned"] == today["gpus"] - packed["gpus"]
    for pol in (today, packed):
        assert [d["name"] for d in pol["deployments"]] == [e["name"] for e in FLEET]
        for d in pol["deployments"]:
            assert 0.0 <= d["slo_attainment_requests"] <= 1.0
            assert d["requests"] == rep["traces"][d["name"]]["requests"] > 0
            assert d["ttft_s"]["p95"] is not None and d["tpot_s"]["p99"] is not None
        # every replica's requests are served on some GPU, each request once
        served = {}
        for g in pol["placement"]:
            for e in g["engines"]:
                served[e["deployment"]] = served.get(e["deployment"], 0) + e["requests"]
        assert served == {d["name"]: d["requests"] for d in pol["deployments"]}
    # the derived traces run at the declared rates over the given duration
    assert rep["traces"]["small"]["observed_rate_rps"] == pytest.approx(2.0, rel=0.01)
    assert rep["traces"]["mid"]["span_s"] == pytest.approx(120.0)
    assert png.stat().st_size > 0


def test_the_fleet_replay_is_deterministic(fleet_file, capsys):
    argv = (str(AZURE_CONVERSATION_CSV), "--fleet", fleet_file, *FAST, "--json", "--policy", "kneecap+pack")
    rc1, out1, _ = _run(capsys, *argv)
    rc2, out2, _ = _run(capsys, *argv)
    assert rc1 == rc2 == 0 and out1 == out2
    assert set(json.loads(out1)["policies"]) == {"kneecap+pack"}


def test_own_traces_per_deployment_and_text_output(tmp_path, capsys):
    fleet = _write(tmp_path, FLEET)
    paths = []
    for name, rate in (("small", 2.0), ("mid", 0.5)):
        n = int(60 * rate)
        p = tmp_path / f"{name}.csv"
        rows = [f"{k / rate:.3f},{300 + 7 * (k % 11)},{60 + (k % 5) * 10}" for k in range(n)]
        p.write_text("arrival_s,input_tokens,output_tokens\n" + "\n".join(rows) + "\n")
        paths += ["--deployment-trace", f"{name}={p}"]
    rc, out, _ = _run(capsys, "--fleet", fleet, *paths, "--samples", "4000", "--policy", "one-per-gpu")
    assert rc == 0
    assert "one-per-gpu: 3 GPUs" in out and "small" in out and "attainment" in out


@pytest.mark.parametrize("argv, field, words", [
    (("--deployment-trace", "small=/nonexistent.csv"), "trace", "'mid' has no trace"),
    (("--deployment-trace", "nope=/x.csv"), "trace", "'nope' names no deployment"),
    (("--deployment-trace", "small"), "trace", "NAME=PATH"),
    (("--policy", "kneecap"), "policy", "with --fleet"),
    (("--observe", "-1"), "observe", "positive"),
    (("--margin", "1.5"), "margin", "fraction"),
    (("--gpus", "a99=2"), "gpus", "unknown GPU"),
])
def test_bad_input_exits_2_naming_it(fleet_file, capsys, argv, field, words):
    rc, out, err = _run(capsys, "--fleet", fleet_file, *argv, "--json")
    assert rc == 2 and out == ""
    report = json.loads(err.splitlines()[-1])
    assert report["field"] == field and words in report["error"], report


def test_a_bad_fleet_entry_exits_2_naming_the_entry_and_field(tmp_path, capsys):
    broken = json.loads(json.dumps(FLEET))
    broken[1]["workload"]["requestsPerSecond"] = -1
    rc, _, err = _run(capsys, str(AZURE_CONVERSATION_CSV), "--fleet", _write(tmp_path, broken), "--json")
    report = json.loads(err.splitlines()[-1])
    assert rc == 2 and report["field"] == "fleet[1].workload.requestsPerSecond" and "'mid'" in report["error"]


def test_a_deployment_trace_that_cannot_be_read_exits_2_naming_it(fleet_file, tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("when,what\n1,2\n")
    rc, _, err = _run(capsys, str(AZURE_CONVERSATION_CSV), "--fleet", fleet_file, "--deployment-trace", f"mid={bad}",
                      "--json")
    report = json.loads(err.splitlines()[-1])
    assert rc == 2 and report["field"] == "trace mid"


def test_fleet_options_without_fleet_are_refused(capsys):
    rc, _, err = _run(capsys, str(AZURE_CONVERSATION_CSV), "--policy", "one-per-gpu", "--json")
    assert rc == 2 and json.loads(err.splitlines()[-1])["field"] == "policy"
    rc, _, err = _run(capsys, "--json")
    assert rc == 2 and json.loads(err.splitlines()[-1])["field"] == "trace"
    rc, _, err = _run(capsys, str(AZURE_CONVERSATION_CSV), "--gpus", "l40s=2", "--json")
    assert rc == 2 and json.loads(err.splitlines()[-1])["field"] == "gpus"


def test_derive_trace_and_observed():
    from kneecap.sim.trace import read_trace

    deps = packing.parse_fleet(FLEET)
    base = read_trace(AZURE_CONVERSATION_CSV)
    a = fr.derive_trace(base, deps[0], 0, duration_s=300.0, seed=1)
    b = fr.derive_trace(base, deps[0], 0, duration_s=300.0, seed=1)
    c = fr.derive_trace(base, deps[0], 1, duration_s=300.0, seed=1)
    assert np.array_equal(a.arrival_s, b.arrival_s) and not np.array_equal(a.arrival_s, c.arrival_s)
    assert len(a) == 600 and a.span_s == pytest.approx(300.0)
    seen = fr.observed(deps[0], a)
    assert seen.rate_rps == pytest.approx(2.0)
    assert seen.workload.input_tokens.mean == pytest.approx(512, rel=0.02)
    assert fr.observed(deps[0], a, observe_s=60.0).rate_rps != seen.rate_rps
    with pytest.raises(InputError, match="observe"):
        fr.observed(deps[0], a, observe_s=1e-6)


def test_replay_arrivals_alone_refuses_what_cannot_run():
    """One engine alone: each request served once; one longer than the model's context refused
    (its latencies inf), as vLLM answers it."""
    from kneecap.model.colocation import EngineLoad
    from kneecap.model.gauss import FixedLength, Workload

    load = EngineLoad("llama-3.2-3b", Workload(FixedLength(100), FixedLength(20)), 1.0, 0.9, name="x")
    arrivals = (np.array([0.0, 0.5, 1.0]), np.array([100, 10 ** 7, 200]), np.array([20, 20, 1]))
    (run,) = replay_arrivals([load], "h100-80gb", [arrivals])
    assert run.refused.tolist() == [False, True, False]
    assert np.isfinite(run.ttft_s[[0, 2]]).all() and np.isinf(run.ttft_s[1])
    assert run.tpot_s[2] == 0.0 and run.tpot_s[0] > 0
    tr = Trace(np.array([0.0]), np.array([1]), np.array([1]), "x")
    with pytest.raises(InputError, match="trace"):
        fr.derive_trace(tr, packing.parse_fleet(FLEET)[0], 0)


@pytest.mark.parametrize("flag, value", [("--duration", "600"), ("--observe", "300")])
def test_a_fleet_option_without_fleet_exits_2_naming_it(capsys, flag, value):
    # a plain replay runs the whole trace: a cut it cannot make is refused, not ignored
    rc, out, err = _run(capsys, str(AZURE_CONVERSATION_CSV), flag, value, "--json")
    report = json.loads(err.splitlines()[-1])
    assert rc == 2 and out == "" and report["field"] == flag[2:] and "only with --fleet" in report["error"]


def test_a_single_replay_cut_with_fleet_exits_2_naming_it(fleet_file, capsys):
    rc, out, err = _run(capsys, str(AZURE_CONVERSATION_CSV), "--fleet", fleet_file, "--trace-seconds", "600", "--json")
    report = json.loads(err.splitlines()[-1])
    assert rc == 2 and out == "" and report["field"] == "trace-seconds" and "--duration" in report["error"]
