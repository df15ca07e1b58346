"""Baselines SLIM is compared against (paper 000 §VI-E), adapted to throughput profiles.

* ``imai-lr``: Imai et al.-style out-of-domain linear regression of E2E latency on workload and
  architecture features with interaction terms; throughput = B·(IL+OL)/E2E.
* ``llmvisor-pw``: LLMVisor-style piecewise fit on aggregate token counts: E2E = prefill
  (B·IL, B·IL²) + OL·step(B), step piecewise-linear in B with a fitted breakpoint, plus the
  context tokens B·(IL+OL/2). Coefficients are shared across models (architecture enters only
  through the fit), as in the paper's LLMVisorAgg.

Both fit relative E2E error (rows weighted by 1/E2E), the same objective SLIM uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from kneecap.errors import InputError
from kneecap.model.slim import arch_arrays

BASELINES = ("imai-lr", "llmvisor-pw")
RIDGE = 1e-3  # on standardised features: keeps the few-point fits bounded


@dataclass(frozen=True)
class Baseline:
    name: str
    coef: np.ndarray
    mean: np.ndarray  # feature standardisation (imai-lr)
    scale: np.ndarray
    breakpoint: float  # llmvisor-pw hinge in B (nan for imai-lr)

    def predict(self, archs, batch, input_len, output_len) -> tuple[np.ndarray, np.ndarray]:
        """(throughput_tok_s, e2e_s)."""
        b, il, ol = _arrays(batch, input_len, output_len)
        x = _features(self.name, archs, b, il, ol, self.breakpoint)
        e2e = ((x - self.mean) / self.scale) @ self.coef if self.name == "imai-lr" else x @ self.coef
        e2e = np.maximum(e2e, 1e-6)  # a linear model can go negative out of domain; keep T finite
        return b * (il + ol) / e2e, e2e


def _arrays(batch, input_len, output_len):
    b, il, ol = (np.asarray(v, dtype=float) for v in (batch, input_len, output_len))
    b, il, ol = np.broadcast_arrays(b, il, ol)
    for name, v in (("batch", b), ("input_len", il), ("output_len", ol)):
        if not np.all(np.isfinite(v)) or np.any(v <= 0):
            raise InputError(name, "expected positive finite numbers")
    return b.astype(float), il.astype(float), ol.astype(float)


def _features(name, archs, b, il, ol, breakpoint):
    if name == "imai-lr":
        aa = arch_arrays(archs)
        layers, d = np.broadcast_to(aa.layers, b.shape), np.broadcast_to(aa.hidden / 1024.0, b.shape)
        heads = np.broadcast_to(aa.d_kv / 128.0, b.shape)
        cols = [np.ones_like(b), b, il, ol, layers, d, heads,
                b * il, b * ol, il * ol, b * il * ol, b * ol * ol,
                ol * layers * d * d, b * ol * layers * d * d, b * ol * (il + ol / 2) * layers * heads]
        return np.stack(cols, axis=-1)
    ctx = b * (il + ol / 2.0)
    hinge = np.maximum(b - breakpoint, 0.0)
    return np.stack([b * il, b * il * il / 1e3, ol, ol * b, ol * hinge, ol * ctx / 1e3], axis=-1)


def fit_baseline(name: str, archs, batch, input_len, output_len, throughput_tok_s) -> Baseline:
    if name not in BASELINES:
        raise InputError("baseline", f"unknown baseline {name!r}; expected one of {', '.join(BASELINES)}")
    b, il, ol = _arrays(batch, input_len, output_len)
    t = np.asarray(throughput_tok_s, dtype=float)
    if t.shape != b.shape or not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise InputError("throughput_tok_s", "expected one positive throughput per row")
    e2e = b * (il + ol) / t
    w = 1.0 / e2e  # relative error
    if name == "imai-lr":
        x = _features(name, archs, b, il, ol, np.nan)
        mean = x.mean(axis=0)
        mean[0] = 0.0
        scale = x.std(axis=0)
        scale[scale == 0] = 1.0
        z = (x - mean) / scale
        zw = z * w[:, None]
        # ridge (intercept unpenalised) on the weighted, standardised system
        pen = np.sqrt(RIDGE) * np.eye(z.shape[1])
        pen[0, 0] = 0.0
        coef, *_ = np.linalg.lstsq(np.vstack([zw, pen]), np.concatenate([e2e * w, np.zeros(z.shape[1])]), rcond=None)
        return Baseline(name, coef, mean, scale, float("nan"))
    best = None
    grid = np.unique(np.concatenate([np.geomspace(1.0, max(b.max(), 2.0), 40), b]))
    for bk in grid:
        x = _features(name, archs, b, il, ol, bk)
        coef, _ = nnls(x * w[:, None], e2e * w)
        err = float(np.sum((x @ coef / e2e - 1.0) ** 2))
        if best is None or err < best[0] - 1e-12:
            best = (err, coef, bk)
    _, coef, bk = best
    return Baseline(name, coef, np.zeros_like(coef), np.ones_like(coef), float(bk))
