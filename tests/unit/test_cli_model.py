"""`kneecap fit | predict | advise` on the real H100 profiles, through kneecap.cli.main."""

import csv
import json

import pytest

from kneecap.cli import main


def _fit(profiles_csv, tmp_path, capsys, *extra):
    out = tmp_path / "calib.json"
    rc = main(["fit", str(profiles_csv), "--gpu", "h100-64gb", "--where", "source=batching_results",
               "--where", "num_prompts=2000", *extra, "-o", str(out), "--json"])
    assert rc == 0
    return out, json.loads(capsys.readouterr().out)


def test_fit_predict_advise_round_trip(profiles_csv, tmp_path, capsys):
    calib, fitted = _fit(profiles_csv, tmp_path, capsys)
    assert fitted["form"] == "kneecap" and fitted["gpu"] == "h100-64gb"
    assert sorted(fitted["models"]) == ["llama-2-7b", "opt-1.3b", "opt-2.7b"]
    assert fitted["metrics"]["n_points"] == 28  # 30 rows, 2 marked suspect_outlier
    assert fitted["metrics"]["mape_pct"] < 5.0
    assert set(fitted["params"]) == set(fitted["std"])

    out_csv = tmp_path / "pred.csv"
    assert main(["predict", str(calib), str(profiles_csv), "-o", str(out_csv), "--json"]) == 0
    pred = json.loads(capsys.readouterr().out)
    rows = list(csv.DictReader(out_csv.open()))
    src = list(csv.DictReader(profiles_csv.open()))
    assert len(rows) == len(src) == pred["n_rows"]
    assert list(rows[0])[: len(src[0])] == list(src[0])  # every input column copied, in order
    for r, s in zip(rows, src):
        assert {k: r[k] for k in s} == s
        assert float(r["pred_e2e_s"]) == pytest.approx(
            float(s["batch"]) * (float(s["input_len"]) + float(s["output_len"])) / float(r["pred_throughput_tok_s"]), rel=1e-4)
    fitted_rows = [(r, s) for r, s in zip(rows, src) if s["source"] == "batching_results"
                   and s["num_prompts"] == "2000" and s["suspect_outlier"] == "False"]
    errs = [abs(float(r["pred_throughput_tok_s"]) / float(s["throughput_tok_s"]) - 1) for r, s in fitted_rows]
    assert sum(errs) / len(errs) * 100 == pytest.approx(fitted["metrics"]["mape_pct"], rel=1e-3)

    png = tmp_path / "advise.png"
    assert main(["advise", str(calib), "--model", "opt-1.3b", "--input-len", "242", "--output-len", "226",
                 "--slo-e2e-s", "6", "--plot", str(png), "--json"]) == 0
    adv = json.loads(capsys.readouterr().out)
    for key in ("max_num_seqs", "gpu_memory_utilization", "kv_gib", "released_gib", "pred_throughput_tok_s",
                "pred_e2e_s", "efficiency", "knee_batch", "binding"):
        assert key in adv, key
    assert adv["binding"] == "slo" and adv["pred_e2e_s"] <= 6.0
    assert 0.05 <= adv["gpu_memory_utilization"] < 0.9 and adv["released_gib"] > 0
    assert adv["kv_gib"] == pytest.approx(adv["max_num_seqs"] * 468 * 196608 / 2**30, rel=0.05)
    assert png.stat().st_size > 10_000
    # Human output mentions the flag to set
    assert main(["advise", str(calib), "--model", "opt-1.3b", "--input-len", "242", "--output-len", "226"]) == 0
    assert "--max-num-seqs" in capsys.readouterr().out


@pytest.mark.parametrize("form", ["paper-a", "paper-b"])
def test_fit_paper_forms(profiles_csv, tmp_path, capsys, form):
    _, fitted = _fit(profiles_csv, tmp_path, capsys, "--model-form", form)
    assert fitted["form"] == form and "b0" in fitted["params"]


def _bad(argv, capsys, field):
    assert main(argv) == 2
    err = capsys.readouterr().err
    if "--json" in argv:
        assert json.loads(err.splitlines()[0])["field"] == field
    return err


def test_fit_bad_input_exits_2(profiles_csv, tmp_path, capsys):
    out = str(tmp_path / "c.json")
    no_tput = tmp_path / "no_tput.csv"
    no_tput.write_text("model,batch,input_len,output_len\nopt-1.3b,1,10,10\n")
    _bad(["fit", str(no_tput), "--gpu", "h100-64gb", "-o", out, "--json"], capsys, "throughput_tok_s")
    bad_model = tmp_path / "bad_model.csv"
    bad_model.write_text("model,batch,input_len,output_len,throughput_tok_s\ngpt-9,1,10,10,100\n")
    _bad(["fit", str(bad_model), "--gpu", "h100-64gb", "-o", out, "--json"], capsys, "model")
    bad_num = tmp_path / "bad_num.csv"
    bad_num.write_text("model,batch,input_len,output_len,throughput_tok_s\nopt-1.3b,x,10,10,100\n")
    assert "row 1" in _bad(["fit", str(bad_num), "--gpu", "h100-64gb", "-o", out, "--json"], capsys, "batch")
    _bad(["fit", str(profiles_csv), "--gpu", "tpu-v9", "-o", out, "--json"], capsys, "gpu")
    _bad(["fit", str(profiles_csv), "--gpu", "h100-64gb", "--where", "nosuchcol=1", "-o", out, "--json"], capsys, "--where")
    _bad(["fit", str(profiles_csv), "--gpu", "h100-64gb", "--where", "model=none", "-o", out, "--json"], capsys, "--where")
    _bad(["fit", str(tmp_path / "missing.csv"), "--gpu", "h100-64gb", "-o", out, "--json"], capsys, "PROFILES.csv")
    with pytest.raises(SystemExit) as e:  # argparse choices: exit 2 as well
        main(["fit", str(profiles_csv), "--gpu", "h100-64gb", "--model-form", "nope", "-o", out])
    assert e.value.code == 2


def test_predict_and_advise_bad_input_exit_2(profiles_csv, tmp_path, capsys):
    calib, _ = _fit(profiles_csv, tmp_path, capsys)
    junk = tmp_path / "junk.json"
    junk.write_text("not json")
    _bad(["predict", str(junk), str(profiles_csv), "-o", str(tmp_path / "o.csv"), "--json"], capsys, "calibration")
    pts = tmp_path / "pts.csv"
    pts.write_text("model,batch,input_len\nopt-1.3b,1,10\n")
    _bad(["predict", str(calib), str(pts), "-o", str(tmp_path / "o.csv"), "--json"], capsys, "output_len")
    base = ["advise", str(calib), "--model", "opt-1.3b", "--input-len", "242", "--output-len", "226", "--json"]
    _bad(base + ["--epsilon", "2"], capsys, "epsilon")
    _bad(base + ["--slo-e2e-s", "-3"], capsys, "slo_e2e_s")
    _bad(["advise", str(calib), "--model", "nope", "--input-len", "1", "--output-len", "1", "--json"], capsys, "model")
    _bad(["advise", str(calib), "--model", "opt-1.3b", "--input-len", "0", "--output-len", "1", "--json"], capsys, "input_len")


def test_fit_warns_when_the_filters_drop_a_workloads_output_spread(profiles_csv, tmp_path, capsys):
    """README's recipe fits on the fixed-prompt sweeps only: the ShareGPT rows' output-length CV
    is then in no calibration, and predict assumes fixed lengths for them. fit says so, with the
    CV to pass; with it, predict on the ShareGPT rows is far closer (measured here)."""
    calib, fitted = _fit(profiles_csv, tmp_path, capsys)
    (warning,) = fitted["warnings"]
    assert "dataset 'sharegpt' (output-length CV 0.92 in this file)" in warning and "--output-cv 0.92" in warning
    assert "sharegpt" not in fitted["notes"]["output_cv_by_dataset"]
    src = list(csv.DictReader(profiles_csv.open()))
    share = [r for r in src if r["dataset"] == "sharegpt" and r["suspect_outlier"] == "False"]

    def mape(cv: str) -> float:
        points, out = tmp_path / f"sg{cv}.csv", tmp_path / f"pred{cv}.csv"
        with points.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=[*src[0], "output_cv"])
            w.writeheader()
            w.writerows({**r, "output_cv": cv} for r in share)
        assert main(["predict", str(calib), str(points), "-o", str(out), "--json"]) == 0
        capsys.readouterr()
        errs = [abs(float(r["pred_throughput_tok_s"]) / float(r["throughput_tok_s"]) - 1)
                for r in csv.DictReader(out.open())]
        return sum(errs) / len(errs)

    assert mape("0.92") < 0.5 * mape("")
    # text mode: the same warning on stderr; keeping ShareGPT rows: no warning
    assert main(["fit", str(profiles_csv), "--gpu", "h100-64gb", "--where", "source=batching_results",
                 "-o", str(tmp_path / "c.json")]) == 0
    assert "kneecap fit: warning: --where keeps no usable rows of dataset 'sharegpt'" in capsys.readouterr().err
    assert main(["fit", str(profiles_csv), "--gpu", "h100-64gb", "--where", "source=batching_results",
                 "--where", "source=background", "-o", str(tmp_path / "c2.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == []
