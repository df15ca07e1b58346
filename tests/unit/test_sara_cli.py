"""`kneecap plan`: JSON keys, exit codes, exhaustive comparison, plot."""

from __future__ import annotations

import json

import pytest

from kneecap.cli import main

BASE = ["plan", "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--budget-per-hour", "30",
        "--prefill-cost", "5", "--decode-cost", "5", "--kv-cost-per-gibps", "0.1"]


def _run(capsys, argv):
    try:
        rc = main(argv)
    except SystemExit as exc:  # a usage error (argparse: a flag's type)
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def test_plan_json_keys_and_values(capsys):
    rc, out, _ = _run(capsys, BASE + ["--json", "--tail", "light", "--input-cv", "1", "--quantile", "0.95"])
    assert rc == 0
    d = json.loads(out)
    for key in ("goodput_rps", "prefill_replicas", "decode_replicas", "kv_bandwidth_gibps", "max_num_seqs",
                "cost_per_hour", "binding", "solve_seconds"):
        assert key in d
    assert d["feasible"] and d["goodput_rps"] > 0 and d["cost_per_hour"] <= 30
    assert d["prefill_replicas"] >= 1 and d["decode_replicas"] >= 1 and d["max_num_seqs"] >= 1
    assert set(d["binding"]) >= {"prefill", "kv", "decode"}
    assert d["predicted"]["ttft_s"] <= 0.5 and d["predicted"]["tpot_s"] <= 0.04 and d["predicted"]["kv_s"] <= 0.15


def test_plan_exhaustive_reports_time_and_gap(capsys):
    rc, out, _ = _run(capsys, BASE + ["--json", "--exhaustive"])
    assert rc == 0
    d = json.loads(out)
    assert d["exhaustive_goodput_rps"] > 0 and d["exhaustive_seconds"] > d["solve_seconds"]
    assert abs(d["gap_pct"]) < 5


def test_plan_plot(capsys, tmp_path):
    png = tmp_path / "goodput.png"
    rc, out, _ = _run(capsys, BASE + ["--json", "--plot", str(png)])
    assert rc == 0 and json.loads(out)["plot"] == str(png)
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"


def test_plan_text_output(capsys):
    rc, out, _ = _run(capsys, BASE + ["--colocated-rate-per-replica", "4"])
    assert rc == 0
    assert "goodput" in out and "max_num_seqs" in out and "colocated" in out


def test_infeasible_budget_exit_1_with_message(capsys):
    rc, out, _ = _run(capsys, ["plan", "--model", "gpt-3-175b", "--budget-per-hour", "20", "--json"])
    assert rc == 1
    d = json.loads(out)
    assert not d["feasible"] and d["message"].startswith("infeasible: ") and "stability floor" in d["message"]


def test_infeasible_slo_below_service_time(capsys):
    rc, out, _ = _run(capsys, BASE + ["--slo-ttft-s", "0.001", "--json"])
    assert rc == 1
    assert json.loads(out)["message"].startswith("infeasible: prefill")


@pytest.mark.parametrize("extra,field", [
    (["--model", "no-such-model"], "model"),
    (["--gpu", "tpu"], "gpu"),
    (["--input-cv", "0"], "input_cv"),
    (["--quantile", "1.5"], "quantile"),
    (["--slo-tpot-s", "-1"], "slo_tpot_s"),
    (["--budget-per-hour", "0"], "budget_per_hour"),
    (["--prefill-coeffs", "1,2"], "prefill_coeffs"),
    (["--calibration", "/nonexistent/calib.json"], "calibration"),
])
def test_bad_arguments_exit_2(capsys, extra, field):
    rc, out, err = _run(capsys, BASE + extra + ["--json"])
    assert rc == 2 and out == ""
    assert json.loads(err.splitlines()[0])["field"] == field


def test_explicit_prefill_coefficients_change_the_plan(capsys):
    rc, out, _ = _run(capsys, BASE + ["--json", "--prefill-coeffs", "0.01,1e-4,0"])
    assert rc == 0
    slow = json.loads(out)
    rc, out, _ = _run(capsys, BASE + ["--json"])
    fast = json.loads(out)
    # 0.01 + 1e-4·IL ≈ 0.11 s per mean prompt vs ≈ 0.02 s from N_mul/F_p: fewer req/s for the budget
    assert slow["goodput_rps"] < fast["goodput_rps"]


def test_calibration_file_sets_prefill_time(capsys, tmp_path):
    from dataclasses import asdict

    from kneecap.model import calibrate, slim

    params = {k: float(v) for k, v in asdict(slim.SlimParams()).items() if isinstance(v, (int, float))}
    params["eta_c"] = 0.5
    cal = calibrate.Calibration(form=slim.DEFAULT_FORM, gpu="a100-80gb", models=("llama-3.1-8b",), params=params,
                                std={}, metrics={}, created="test")
    path = tmp_path / "calib.json"
    path.write_text(cal.to_json())
    rc, out, _ = _run(capsys, BASE + ["--json", "--calibration", str(path)])
    assert rc == 0
    calibrated = json.loads(out)
    rc, out, _ = _run(capsys, BASE + ["--json"])
    # 2·N_mul FLOPs at 50% of peak: prefill ~4× slower than SARA's N_mul/F_p, so less goodput
    assert calibrated["goodput_rps"] < json.loads(out)["goodput_rps"]
    assert calibrated["prefill_replicas"] >= 1
    rc, _, err = _run(capsys, BASE + ["--json", "--calibration", str(path), "--gpu", "h100-80gb"])
    assert rc == 2 and json.loads(err.splitlines()[0])["field"] == "calibration"


def test_plan_colocated_by_gauss_with_the_engine_limits(capsys):
    """GAUSS's λ* per replica is checked at the cap it would run with: a tight --max-num-seqs
    lowers it (more replicas), even under a looser TTFT SLO; --max-num-seqs also bounds the
    decode pool's max_num_seqs."""
    argv = BASE + ["--colocated-gauss", "--samples", "20000", "--json"]
    rc, out, _ = _run(capsys, argv + ["--max-num-seqs", "64"])
    wide = json.loads(out)
    assert rc == 0 and wide["max_num_seqs"] <= 64
    c = wide["colocated"]
    assert c["limits"]["max_num_seqs"] == 64 and c["limits"]["max_num_batched_tokens"] == 2048  # vLLM on an A100
    assert c["limits"]["kv_capacity_tokens"] > 100_000 and 0 < c["sustainable_rate_per_replica_rps"]
    rc, out, _ = _run(capsys, argv + ["--max-num-seqs", "3", "--slo-ttft-s", "2"])
    tight = json.loads(out)["colocated"]
    assert tight["rate_binding"] in ("ttft_slo", "batch") and tight["limits"]["max_num_seqs"] == 3
    assert tight["sustainable_rate_per_replica_rps"] < c["sustainable_rate_per_replica_rps"]


@pytest.mark.parametrize("extra, field", [
    (["--kv-cache-memory-bytes", "4G"], "kv_cache_memory_bytes"),
    (["--cached-tokens", "100"], "cached_tokens"),
    (["--max-num-seqs", "0"], "max_num_seqs"),
    (["--colocated-gauss", "--colocated-rate-per-replica", "4"], "colocated_rate_per_replica"),
])
def test_plan_engine_limits_need_the_colocated_gauss_plan(capsys, extra, field):
    rc, out, err = _run(capsys, BASE + extra + ["--json"])
    assert rc == 2 and out == ""
    assert json.loads(err.splitlines()[0])["field"] == field
