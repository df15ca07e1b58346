"""Calibrating SLIM: nonlinear least squares on relative throughput error (DESIGN §5.1).

All parameters are positive and fitted in log space, within bounds, from several starts. Weak
log-normal priors toward physically plausible values enter as extra residuals, so a fit from 3
points stays sane (the unidentified directions stay near the prior). Parameter uncertainty is the
Gauss–Newton covariance from the Jacobian at the optimum.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Sequence

import numpy as np
from scipy.optimize import least_squares

from kneecap.errors import InputError
from kneecap.model import slim
from kneecap.model.arch import get_arch
from kneecap.model.hardware import GPU, get_gpu

CALIBRATION_VERSION = 1


@dataclass(frozen=True)
class Prior:
    center: float
    log_sigma: float  # std of ln(value)
    lo: float
    hi: float


# Plausible values on a modern GPU with vLLM (per-token overheads of ~10–100 µs, bandwidth
# efficiencies 0.5–0.9, prefill at half of peak). Wide: one σ is a factor e^log_sigma.
PRIORS: Mapping[str, Prior] = MappingProxyType({
    "eta_c": Prior(0.5, 0.7, 0.02, 1.0),
    # Decode attention streams the KV cache near DRAM bandwidth at large context (paper §V).
    "eta_m": Prior(0.8, 0.5, 0.02, 1.0),
    "alpha_s": Prior(4e-5, 1.0, 1e-8, 1e-2),
    "gamma_s": Prior(1e-7, 1.5, 1e-12, 1e-3),
    "b0": Prior(30.0, 1.0, 1e-3, 1e4),
    "t_fixed_s": Prior(0.01, 3.0, 1e-7, 1e3),
    "t_step_s": Prior(5e-5, 1.5, 1e-7, 0.1),
    "t_layer_s": Prior(8e-5, 0.7, 1e-7, 1e-2),
    # vs the nominal BW: measured weight streaming on the data's H100 runs ~10% above the
    # paper's 1.62 TB/s figure, so allow up to 1.3.
    "eta_w": Prior(0.9, 0.3, 0.05, 1.3),
})


def form_priors(form: str, gpu: GPU) -> dict[str, Prior]:
    """Priors for ``form`` on ``gpu``. In ``kneecap`` the weight read is its own term, so γ is
    only the marginal per-sequence compute: ~2·params ≈ 24·L·D² FLOP per token at ~70% of peak,
    i.e. γ0 = 24·1024²/(0.7·F_max) per L·(D/1024)² (eq. 10)."""
    pri = dict(PRIORS)
    if form == "kneecap":
        pri["gamma_s"] = Prior(24.0 * 1024**2 / (0.7 * gpu.peak_flops), 1.0, 1e-12, 1e-3)
    return pri


# A one-σ prior deviation costs as much as this relative throughput error on one point: about
# the repeat noise of the data (same config, 500/1000/2000 prompts: 0.2–2.2% at B = 1).
PRIOR_WEIGHT = 0.02


@dataclass(frozen=True)
class Calibration:
    """A fitted SLIM: what CALIB.json holds."""

    form: str
    gpu: str
    models: tuple[str, ...]
    params: dict[str, float]
    std: dict[str, float]
    metrics: dict[str, float]  # mape_pct, max_error_pct, n_points, cost
    created: str
    version: int = CALIBRATION_VERSION
    notes: dict = field(default_factory=dict)

    @property
    def slim_params(self) -> slim.SlimParams:
        return slim.SlimParams.from_dict(self.params)

    def to_json(self) -> str:
        return json.dumps({
            "version": self.version, "form": self.form, "gpu": self.gpu, "models": list(self.models),
            "params": self.params, "std": self.std, "metrics": self.metrics, "created": self.created,
            "notes": self.notes,
        }, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Calibration":
        try:
            d = json.loads(text)
        except (json.JSONDecodeError, TypeError) as exc:
            raise InputError("calibration", f"not valid JSON: {exc}") from None
        if not isinstance(d, dict):
            raise InputError("calibration", "expected a JSON object")
        for key in ("form", "gpu", "params"):
            if key not in d:
                raise InputError(f"calibration.{key}", "missing")
        slim.check_form(d["form"])
        if not isinstance(d["gpu"], str) or not d["gpu"]:  # a catalog key, or an inline accelerator's name
            raise InputError("calibration.gpu", f"expected a GPU name, got {d['gpu']!r}")
        params = {k: float(v) for k, v in dict(d["params"]).items()}
        slim.SlimParams.from_dict(params)
        missing = set(slim.FORM_PARAMS[d["form"]]) - set(params)
        if missing:
            raise InputError("calibration.params", f"form {d['form']} needs {sorted(missing)}")
        return cls(form=d["form"], gpu=d["gpu"], models=tuple(d.get("models", ())), params=params,
                   std={k: float(v) for k, v in dict(d.get("std", {})).items()},
                   metrics=dict(d.get("metrics", {})), created=str(d.get("created", "")),
                   version=int(d.get("version", CALIBRATION_VERSION)), notes=dict(d.get("notes", {})))


def _gpu(gpu) -> GPU:
    return gpu if isinstance(gpu, GPU) else get_gpu(gpu)


def predict(calibration: Calibration, arch, gpu, batch, input_len, output_len, **kw):
    """(throughput_tok_s, e2e_s) arrays from a calibration: the entry point for the operator,
    GAUSS and SARA. ``arch`` may be a key, a ModelArch or one per row; ``gpu`` None → the
    calibration's GPU. Keywords go to :func:`kneecap.model.slim.predict`."""
    g = _gpu(gpu if gpu is not None else calibration.gpu)
    pred = slim.predict(calibration.form, calibration.slim_params, arch, g, batch, input_len, output_len, **kw)
    return pred.throughput_tok_s, pred.e2e_s


def _errors_pct(measured, predicted):
    rel = np.abs(np.asarray(predicted, float) / np.asarray(measured, float) - 1.0) * 100.0
    return rel


def fit(archs, gpu, batch, input_len, output_len, throughput_tok_s, *, form: str = slim.DEFAULT_FORM,
        output_cv=0.0, chunked_prefill=False, priors: dict[str, Prior] | None = None, prior_weight: float = PRIOR_WEIGHT,
        fixed: dict[str, float] | None = None, n_starts: int = 6, seed: int = 0,
        created: str | None = None, start: dict[str, float] | None = None, xtol: float = 1e-10,
        ftol: float = 1e-12, tensor_parallel_size: int = 1) -> Calibration:
    """Fit ``form`` to measured throughput (one row per observation; ``archs`` one per row or one
    for all). Minimises Σ(T_pred/T − 1)² + prior_weight²·Σ((ln θ − ln θ0)/σ)².

    ``start``: parameters to start the first descent from instead of the priors' centres (a
    warm start from the previous fit; the other starts stay random around the priors). ``xtol``,
    ``ftol``: least_squares' stopping tolerances (a warm start near the optimum needs less).
    ``tensor_parallel_size``: the TP the rows were measured at; the fitted θ are one rank's
    (slim.predict's TP terms), so they predict other TP sizes through the same terms."""
    slim.check_form(form)
    g = _gpu(gpu)
    t_meas = np.asarray(throughput_tok_s, dtype=float)
    if t_meas.ndim != 1 or t_meas.size == 0:
        raise InputError("throughput_tok_s", "expected a non-empty 1-D array")
    if not np.all(np.isfinite(t_meas)) or np.any(t_meas <= 0):
        raise InputError("throughput_tok_s", "expected positive finite throughputs")
    n = t_meas.size
    arch_list = [get_arch(archs)] * n if isinstance(archs, str) or not isinstance(archs, Sequence) \
        else [get_arch(a) for a in archs]
    if len(arch_list) != n:
        raise InputError("model", f"expected {n} models (one per row), got {len(arch_list)}")
    aa = slim.arch_arrays(arch_list, tensor_parallel_size)  # validates TP against every model
    tp = int(tensor_parallel_size)
    b, il, ol = (np.broadcast_to(np.asarray(x, dtype=float), (n,)) for x in (batch, input_len, output_len))
    cv = np.broadcast_to(np.asarray(output_cv, dtype=float), (n,))
    chunked = np.broadcast_to(np.asarray(chunked_prefill, dtype=bool), (n,))
    pri = dict(form_priors(form, g), **(priors or {}))
    fixed = dict(fixed or {})
    names = [k for k in slim.FORM_PARAMS[form] if k not in fixed]
    center = np.log([pri[k].center for k in names])
    sigma = np.array([pri[k].log_sigma for k in names])
    lo = np.log([pri[k].lo for k in names])
    hi = np.log([pri[k].hi for k in names])
    base = slim.SlimParams(**{k: pri[k].center for k in slim.FORM_PARAMS[form]}, **fixed).as_dict()

    def params_of(x):  # called per residual evaluation: build from the dict computed once
        return slim.SlimParams(**{**base, **dict(zip(names, np.exp(x).tolist()))})

    def model(x):
        return slim.predict(form, params_of(x), aa, g, b, il, ol, output_cv=cv, chunked_prefill=chunked,
                            tensor_parallel_size=tp).throughput_tok_s

    def residuals(x):
        r = model(x) / t_meas - 1.0
        return np.concatenate([r, prior_weight * (x - center) / sigma])

    rng = np.random.default_rng(seed)
    best = None
    first = center
    if start is not None and all(k in start and float(start[k]) > 0 for k in names):
        first = np.log([float(start[k]) for k in names])
    for i in range(max(1, n_starts)):
        x0 = first if i == 0 else np.clip(center + rng.normal(0.0, 1.0, center.size) * sigma, lo + 1e-9, hi - 1e-9)
        x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)
        try:
            res = least_squares(residuals, x0, bounds=(lo, hi), method="trf", x_scale=1.0,
                                xtol=xtol, ftol=ftol, max_nfev=2000)
        except ValueError:
            continue
        if best is None or res.cost < best.cost:
            best = res
    if best is None:
        raise InputError("profiles", "the fit failed from every start (check the data)")
    x = best.x
    # Gauss–Newton covariance in log space; residual variance from the data part.
    jac = best.jac
    dof = max(n - len(names), 1)
    s2 = max(float(np.sum((model(x) / t_meas - 1.0) ** 2)) / dof, 1e-8)
    try:
        cov = np.linalg.pinv(jac.T @ jac) * s2
        log_std = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    except np.linalg.LinAlgError:
        log_std = np.full(len(names), np.inf)
    p = params_of(x)
    params = {k: getattr(p, k) for k in slim.FORM_PARAMS[form]}
    std = {k: float(params[k] * s) for k, s in zip(names, log_std)}  # delta method: σ_θ ≈ θ·σ_lnθ
    std.update({k: 0.0 for k in fixed if k in params})
    err = _errors_pct(t_meas, model(x))
    metrics = {"mape_pct": float(err.mean()), "max_error_pct": float(err.max()), "n_points": int(n),
               "cost": float(best.cost)}
    models = tuple(dict.fromkeys(a.key for a in arch_list))
    return Calibration(form=form, gpu=g.key, models=models, params=params, std=std, metrics=metrics,
                       created=created or datetime.now(timezone.utc).isoformat(timespec="seconds"))


def report(cal: Calibration) -> str:
    """Human-readable fit report: MAPE, max error, n points, value ± std per parameter."""
    m = cal.metrics
    lines = [f"SLIM form {cal.form} on {cal.gpu}, models {', '.join(cal.models)}",
             f"  n points {m.get('n_points')}, throughput MAPE {m.get('mape_pct', float('nan')):.2f}%, "
             f"max error {m.get('max_error_pct', float('nan')):.2f}%"]
    for k, v in cal.params.items():
        s = cal.std.get(k, float("nan"))
        lines.append(f"  {k:<10} {v:12.4g} ± {s:.3g}")
    return "\n".join(lines)
