"""The metric updates a tick exports: the collector the plan fills, the spec's targets, the
calibrated curve with the batching efficiency at the observed batch, and the recommendation. Pure.

The plan records each update as a :class:`~kneecap.control.tick.MetricUpdate` (the loop sets
them on :class:`~kneecap.control.metrics.OperatorMetrics`); the curve is read here from the
calibrated SLIM fit at the window's lengths (eq. 6).
"""

from __future__ import annotations

import logging
from typing import Protocol

import numpy as np

from kneecap.control import decide
from kneecap.control.metric_series import Series
from kneecap.control.metrics import CURVE_BATCHES
from kneecap.control.spec import LLMDeploymentSpec
from kneecap.control.tick import MetricUpdate
from kneecap.errors import InputError
from kneecap.model import calibrate
from kneecap.observe.observation import Observation

log = logging.getLogger("kneecap.plan")  # the exports are part of the plan: its logger


class MetricCollector:
    """Collects MetricUpdates with the OperatorMetrics call shape."""

    def __init__(self):
        self.updates: list[MetricUpdate] = []

    def set(self, series: Series, value: float | None, *labels: str) -> None:
        if value is not None:
            self.updates.append(MetricUpdate("set", series, labels, float(value)))

    def inc(self, series: Series, *labels: str, amount: float = 1.0) -> None:
        self.updates.append(MetricUpdate("inc", series, labels, float(amount)))

    def drop(self, series: Series, *labels: str) -> None:
        self.updates.append(MetricUpdate("drop", series, labels))


class Planning(Protocol):
    """What the exporters read of the plan being built (plan's tick)."""

    @property
    def spec(self) -> LLMDeploymentSpec: ...

    @property
    def labels(self) -> tuple[str, str]: ...

    @property
    def m(self) -> MetricCollector: ...


def slim_curve(cal: calibrate.Calibration, spec: LLMDeploymentSpec, obs: Observation,
               batch: np.ndarray) -> np.ndarray:
    """Calibrated SLIM token throughput per pod at `batch`, at the window's lengths (eq. 6)."""
    thr, _ = calibrate.predict(cal, spec.model.architecture, spec.accelerator.gpu, np.asarray(batch, float),
                               max(obs.input_len_mean, 1.0), max(obs.output_len_mean, 1.0),
                               output_cv=obs.output_len_cv, tensor_parallel_size=decide.model_tp(spec))
    return np.broadcast_to(np.asarray(thr, float), np.shape(batch))


def _efficiency_batch(obs: Observation) -> float:
    """The batch the efficiency is read at: the window's mean running batch; B < 1 reads as 1."""
    return max(decide.observed_batch(obs), 1.0)


def _efficiency(t1_tok_s: float, tb_tok_s: float, b: float) -> float:
    return tb_tok_s / (b * t1_tok_s)  # T(B)/(B·T(1)), paper 000 eq. 13


def batching_efficiency(cal: calibrate.Calibration, spec: LLMDeploymentSpec, obs: Observation) -> float:
    """T(B)/(B·T(1)) at the window's mean running batch B (paper 000, eq. 13); B < 1 reads as 1."""
    b = _efficiency_batch(obs)
    t1, tb = slim_curve(cal, spec, obs, np.array([1.0, b]))
    return float(_efficiency(t1, tb, b))


def export_spec(t: Planning) -> None:
    spec, labels = t.spec, t.labels
    t.m.set(Series.EFFICIENCY_FLOOR, spec.batching.efficiency_floor, *labels)
    t.m.set(Series.SLO_QUANTILE, spec.slo.quantile, *labels)
    for kind, v in (("ttft", spec.slo.ttft_s), ("tpot", spec.slo.tpot_s), ("e2e", spec.slo.e2e_s)):
        if v is None:
            t.m.drop(Series.SLO_TARGET, *labels, kind)
        else:
            t.m.set(Series.SLO_TARGET, v, *labels, kind)


def export_curve(t: Planning, role: str, cal: calibrate.Calibration, obs: Observation) -> None:
    """The calibrated curve at CURVE_BATCHES (≤ maxMaxNumSeqs), the efficiency T(B)/(B·T(1)) at
    the observed batch (paper 000, eq. 13) and the prediction at the window's own batch (the fit
    checked against the window it has just seen): one SLIM evaluation (eq. 6)."""
    spec, labels = t.spec, t.labels
    batch = np.array([b for b in CURVE_BATCHES if b <= spec.batching.max_max_num_seqs], float)
    b_obs = max(decide.observed_batch(obs), 1e-3)  # as decide.fit_rows reads it
    b_eff = _efficiency_batch(obs)
    try:
        thr = slim_curve(cal, spec, obs, np.concatenate([batch, [1.0, b_eff, b_obs]]))
    except (InputError, ValueError, FloatingPointError) as exc:
        log.warning("SLIM curve for %s/%s: %s", labels[0], labels[1], exc)
        return
    t1, t_eff, t_obs = (float(x) for x in thr[len(batch):])
    for b, thr_b in zip(batch, thr):
        if np.isfinite(thr_b):
            t.m.set(Series.PREDICTED_CURVE, float(thr_b), *labels, role, str(int(b)))
    eff = _efficiency(t1, t_eff, b_eff)
    if np.isfinite(eff):
        t.m.set(Series.BATCHING_EFFICIENCY, eff, *labels, role)
    if np.isfinite(t_obs):
        t.m.set(Series.PREDICTED_THROUGHPUT, t_obs, *labels, role)
    for b in CURVE_BATCHES:
        if b > spec.batching.max_max_num_seqs:
            t.m.drop(Series.PREDICTED_CURVE, *labels, role, str(b))


def export_recommendation(t: Planning, role: str, r: decide.Recommendation) -> None:
    labels = t.labels
    t.m.set(Series.RECOMMENDED_MAX_NUM_SEQS, r.max_num_seqs, *labels, role)
    t.m.set(Series.RECOMMENDED_GPU_MEMORY_UTILIZATION, r.gpu_memory_utilization, *labels, role)
    t.m.set(Series.MEMORY_RELEASED_BYTES, r.released_bytes, *labels, role)
    t.m.set(Series.KNEE_BATCH, r.knee_batch, *labels, role)
    t.m.set(Series.RECOMMENDED_THROUGHPUT, r.pred_throughput_tok_s, *labels, role)
