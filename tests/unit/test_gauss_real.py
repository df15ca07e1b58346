"""GAUSS decode step from a SLIM calibrated on real H100 throughput, against the measured TPOT
of the same runs (shared/data/real-h100/profiles.csv): the SLIM → GAUSS mapping on real data."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from kneecap.cli import main
from kneecap.model import gauss as g
from kneecap.model.arch import get_arch
from kneecap.model.calibrate import Calibration
from kneecap.model.hardware import get_gpu


@pytest.mark.parametrize("model, mape_max_pct", [("llama-2-7b", 5.0), ("opt-2.7b", 12.0)])
def test_decode_step_from_calibrated_slim_predicts_measured_tpot(profiles_csv, tmp_path, capsys, model, mape_max_pct):
    calib = tmp_path / "calib.json"
    assert main(["fit", str(profiles_csv), "--gpu", "h100-64gb", "--where", f"model={model}", "-o", str(calib)]) == 0
    capsys.readouterr()
    cal = Calibration.from_json(calib.read_text())
    coef = g.coefficients_for(get_arch(model), get_gpu("h100-64gb"), cal.slim_params, form=cal.form)
    errors = []
    with open(profiles_csv, newline="") as fh:
        for r in csv.DictReader(fh):
            if r["model"] != model or r["suspect_outlier"] == "True" or r["preempted"] == "True":
                continue
            b, il, ol = float(r["batch"]), float(r["input_len"]), float(r["output_len"])
            # resident context: B sequences at their mean decode context IL + (OL+1)/2 (eq. 12 / OL)
            step_s = float(g.decode_step_s(coef, b, b * (il + (ol + 1) / 2)))
            errors.append(step_s / (float(r["tpot_ms"]) / 1e3) - 1.0)
    errors = np.abs(np.array(errors))
    assert errors.size > 50
    assert 100 * errors.mean() < mape_max_pct
