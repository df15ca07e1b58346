"""Calibration: identifiability on synthetic data from the model itself, few-point sanity, JSON."""

import json

import numpy as np
import pytest

from kneecap.errors import InputError
from kneecap.model import calibrate, slim
from kneecap.model.hardware import get_gpu

GPU = get_gpu("h100-64gb")
MODELS = ["opt-1.3b", "opt-2.7b", "llama-2-7b"]


def _grid():
    b = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 400], float)
    rows = [(m, bb, il, ol) for m in MODELS for ol in (130, 390) for il in (120, 500) for bb in b]
    m, b, il, ol = zip(*rows)
    return list(m), np.array(b), np.array(il, float), np.array(ol, float)


TRUE = {
    "paper-a": slim.SlimParams(eta_c=0.45, eta_m=0.7, alpha_s=2e-5, gamma_s=1.5e-7, b0=40.0, t_fixed_s=0.02),
    "paper-b": slim.SlimParams(eta_c=0.45, eta_m=0.7, alpha_s=2e-5, gamma_s=1.5e-7, b0=40.0, t_fixed_s=0.02),
    "kneecap": slim.SlimParams(eta_c=0.45, eta_m=0.75, alpha_s=3e-5, gamma_s=3e-8, t_step_s=3e-4,
                               t_layer_s=7e-5, eta_w=0.9, t_fixed_s=0.02),
}
# Parameters the throughput data pins down (t_fixed and η_c barely move throughput at these sizes).
WELL_DETERMINED = {"paper-a": ("eta_m", "alpha_s", "gamma_s", "b0"), "paper-b": ("eta_m", "alpha_s", "gamma_s", "b0"),
                   "kneecap": ("eta_m", "alpha_s", "t_layer_s", "eta_w")}


@pytest.mark.parametrize("form", slim.FORMS)
def test_fit_recovers_known_parameters_from_its_own_data(form):
    m, b, il, ol = _grid()
    truth = TRUE[form]
    thr = slim.predict(form, truth, m, GPU, b, il, ol).throughput_tok_s
    cal = calibrate.fit(m, GPU, b, il, ol, thr, form=form, prior_weight=1e-6, n_starts=4)
    assert cal.metrics["mape_pct"] < 0.05
    for k in WELL_DETERMINED[form]:
        assert cal.params[k] == pytest.approx(getattr(truth, k), rel=0.03), k
    # and the uncertainty is honest: truth within 4σ+1% for every fitted parameter
    for k, v in cal.params.items():
        assert abs(v - getattr(truth, k)) <= 4 * cal.std[k] + 0.01 * abs(getattr(truth, k)) + 1e-12, k


def test_noisy_fit_recovers_within_its_reported_uncertainty():
    m, b, il, ol = _grid()
    truth = TRUE["kneecap"]
    rng = np.random.default_rng(3)
    thr = slim.predict("kneecap", truth, m, GPU, b, il, ol).throughput_tok_s * (1 + rng.normal(0, 0.01, b.size))
    cal = calibrate.fit(m, GPU, b, il, ol, thr, form="kneecap", prior_weight=1e-6)
    for k in ("eta_m", "alpha_s", "t_layer_s", "eta_w"):
        assert abs(cal.params[k] - getattr(truth, k)) < 4 * cal.std[k], k
        assert cal.std[k] < 0.3 * cal.params[k], k
    assert 0.5 < cal.metrics["mape_pct"] < 1.5


def test_three_points_give_a_sane_fit():
    thr = np.array([580.1, 1087.0, 3994.8])  # batching_results opt-1.3b, B≈1, 2, 8
    cal = calibrate.fit("opt-1.3b", GPU, [0.989, 1.966, 7.874], 242, 226, thr)
    for k, v in cal.params.items():
        pri = calibrate.form_priors("kneecap", GPU)[k]
        assert pri.lo <= v <= pri.hi
        assert np.isfinite(cal.std[k])
    assert cal.metrics["n_points"] == 3 and cal.metrics["mape_pct"] < 2.0
    big, _ = calibrate.predict(cal, "opt-1.3b", None, np.array([64.0, 512.0]), 242, 226)
    assert 5_000 < big[0] < big[1] < 60_000  # saturating, plausible (measured 14.9k and 19.9k)


def test_calibration_json_round_trip_and_predict():
    m, b, il, ol = _grid()
    thr = slim.predict("paper-a", TRUE["paper-a"], m, GPU, b, il, ol).throughput_tok_s
    cal = calibrate.fit(m, GPU, b, il, ol, thr, form="paper-a", n_starts=2, created="2026-01-01T00:00:00+00:00")
    back = calibrate.Calibration.from_json(cal.to_json())
    assert back == cal
    d = json.loads(cal.to_json())
    assert {"form", "gpu", "models", "params", "std", "metrics", "created"} <= set(d)
    assert d["models"] == MODELS and d["gpu"] == "h100-64gb"
    t, e = calibrate.predict(back, "opt-2.7b", None, np.array([4.0, 128.0]), 242, 226)
    assert t.shape == e.shape == (2,)
    np.testing.assert_allclose(t, np.array([4.0, 128.0]) * 468 / e)  # eq. 6
    assert "MAPE" in calibrate.report(cal)


@pytest.mark.parametrize("text,field", [("{", "calibration"), ('{"form": "paper-a", "gpu": "h100-64gb"}', "calibration.params"),
                                        ('{"form": "x", "gpu": "h100-64gb", "params": {}}', "model_form"),
                                        ('{"form": "paper-a", "gpu": "h100-64gb", "params": {"eta_c": 1}}', "calibration.params")])
def test_bad_calibration_json(text, field):
    with pytest.raises(InputError) as e:
        calibrate.Calibration.from_json(text)
    assert e.value.field == field


def test_fit_rejects_bad_throughput():
    with pytest.raises(InputError) as e:
        calibrate.fit("opt-1.3b", GPU, [1, 2], 100, 100, [100.0, -1.0])
    assert e.value.field == "throughput_tok_s"
