"""GAUSS decode step from a SLIM calibrated on real H100 throughput, against the measured TPOT
of the same runs (data/real-h100/profiles.csv): the SLIM → GAUSS mapping on real data."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from kneecap.cli import main
from kneecap.model import gauss
from kneecap.model.arch import get_arch
from kneecap.model.calibrate import Calibration
from kneecap.model.hardware import get_gpu


@pytest.mark.parametrize("model, mape_max_pct", [("llama-2-7b", 5.0), ("opt-2.7b", 12.0)])
def test_decode_step_from_calibrated_slim_predicts_measured_tpot(profiles_csv, tmp_path, capsys, model, mape_max_pct):
    calib = tmp_path / "calib.json"
    assert main(["fit", str(profiles_csv), "--gpu", "h100-64gb", "--where", f"model={model}", "-o", str(calib)]) == 0
    capsys.readouterr()
    cal = Calibration.from_json(calib.read_text())
    coef = gauss.coefficients_for(get_arch(model), get_gpu("h100-64gb"), cal.slim_params, form=cal.form)
    errors = []
    with open(profiles_csv, newline="") as fh:
        for r in csv.DictReader(fh):
            if r["model"] != model or r["suspect_outlier"] == "True" or r["preempted"] == "True":
                continue
            b, il, ol = float(r["batch"]), float(r["input_len"]), float(r["output_len"])
            # resident context: B sequences at their mean decode context IL + (OL+1)/2 (eq. 12 / OL)
            step_s = float(gauss.decode_step_s(coef, b, b * (il + (ol + 1) / 2)))
            errors.append(step_s / (float(r["tpot_ms"]) / 1e3) - 1.0)
    errors = np.abs(np.array(errors))
    assert errors.size > 50
    assert 100 * errors.mean() < mape_max_pct


def test_decode_coefficients_fitted_to_measured_itl(profiles_csv):
    rows = []
    with open(profiles_csv, newline="") as fh:
        for r in csv.DictReader(fh):
            if r["model"] == "llama-2-7b" and r["suspect_outlier"] != "True" and r["preempted"] != "True":
                b, il, ol = float(r["batch"]), float(r["input_len"]), float(r["output_len"])
                rows.append((b, b * (il + (ol + 1) / 2), float(r["tpot_ms"]) / 1e3))
    b, c, y = map(np.array, zip(*rows))
    train = np.arange(b.size) % 3 != 0  # hold out every third run
    fit = gauss.fit_decode_coefficients(b[train], c[train], y[train])
    assert fit.points == train.sum() and fit.rms_relative_error < 0.08
    held = gauss.decode_step_s(fit.apply(gauss.ServiceCoefficients(prefill_s_per_token=1e-5, decode_step_s=1.0)),
                               b[~train], c[~train])
    assert np.mean(np.abs(held / y[~train] - 1)) < 0.08
    assert min(fit.decode_step_s, fit.decode_s_per_seq, fit.decode_s_per_resident_token) >= 0
    # exact data are recovered exactly
    bb, cc = np.array([1.0, 4, 16, 64, 128]), np.array([500.0, 3000, 9000, 40000, 100000])
    truth = gauss.ServiceCoefficients(prefill_s_per_token=1e-5, decode_step_s=0.01, decode_s_per_context_token=2e-6,
                                      decode_s_per_seq=3e-4, decode_s_per_resident_token=5e-8)
    exact = gauss.fit_decode_coefficients(bb, cc, gauss.decode_step_s(truth, bb, cc))
    assert exact.rms_relative_error < 1e-9
    assert exact.decode_s_per_seq == pytest.approx(3e-4, rel=1e-6)
