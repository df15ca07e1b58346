"""The decision seam: observations + calibration + what is live -> a recommendation. Pure.

No Kubernetes and no I/O here: the loop hands in plain values, this module calls the model
modules (SLIM calibration, BCA, memory, SARA, GAUSS) and returns frozen results that explain
themselves. The guards (policy.py) decide afterwards whether a recommendation is acted on.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass, fields, replace
from typing import Sequence

import numpy as np

from kneecap.control import gauss_reuse
from kneecap.control.manifests import EngineSettings
from kneecap.control.spec import LLMDeploymentSpec
from kneecap.errors import InputError
from kneecap.model import calibrate, memory
from kneecap.model.arch import get_arch
from kneecap.model.hardware import get_gpu
from kneecap.observe.observation import Observation
from kneecap.naming import status_key

GIB = 1024**3
MIN_BATCH_LEVELS = 2  # distinct operating batches before SLIM is (re)fitted (DESIGN §4.3)
GAUSS_SAMPLES = 20_000  # enough for p95 at the operator cadence; benchmarks use 10^6
GAUSS_REL_TOL = 0.01  # λ* to 1%: replicas are sized with spec.control.rateHeadroom (10% by default)


# ---------------------------------------------------------------- calibration

@dataclass(frozen=True)
class FitRows:
    """Observations of one pool as SLIM rows: per-pod batch, lengths, token throughput."""

    batch: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    output_cv: np.ndarray
    throughput_tok_s: np.ndarray

    @property
    def n(self) -> int:
        return int(self.batch.size)

    @property
    def batch_levels(self) -> int:
        return int(np.unique(np.round(self.batch)).size)


def fit_rows(observations: Sequence[Observation]) -> FitRows:  # or status.RingEntry: the same field names
    """Rows for SLIM: B = mean running batch, T = (prompt + generated tokens)/s per pod (eq. 6).

    B is Little's law over the window (Σ inference time / window) when vLLM exports it: two
    gauge samples per window are a noisy mean, the time integral is not."""
    ok = [o for o in observations if observed_batch(o) > 0 and o.prompt_tok_s + o.generation_tok_s > 0]
    arr = lambda f: np.array([f(o) for o in ok], dtype=float)  # noqa: E731
    return FitRows(
        batch=arr(lambda o: max(observed_batch(o), 1e-3)),
        input_len=arr(lambda o: max(o.input_len_mean, 1.0)),
        output_len=arr(lambda o: max(o.output_len_mean, 1.0)),
        output_cv=arr(lambda o: max(o.output_len_cv, 0.0)),
        throughput_tok_s=arr(lambda o: (o.prompt_tok_s + o.generation_tok_s) / max(o.pods, 1)),
    )


def observed_batch(o: Observation) -> float:
    """The window's mean running batch: Little's law when vLLM exports it, else the gauge mean."""
    return o.mean_batch_little if o.mean_batch_little else o.mean_batch


@dataclass(frozen=True)
class CalibrationOutcome:
    calibration: calibrate.Calibration | None  # the one to use: new, or the previous one kept
    ok: bool  # trustworthy enough to act on
    refit: bool  # a new fit replaced the previous one
    reason: str  # Fitted | KeptPrevious | TooFewBatchLevels | FitFailed | FitRejected | FitErrorTooHigh
    message: str
    error: float | None = None  # MAPE of the calibration in use on the current rows (fraction)
    revalidated: bool = False  # a refit on the current ring could not beat the fit in use


def _row_errors(cal: calibrate.Calibration, arch_key: str, rows: FitRows, gpu=None, tp: int = 1) -> np.ndarray:
    """|T_pred/T − 1| per row (SLIM eq. 6 at each row's batch and lengths, at TP ``tp``); ``gpu``
    None: the calibration's (catalog) GPU."""
    thr, _ = calibrate.predict(cal, arch_key, gpu, rows.batch, rows.input_len, rows.output_len,
                               output_cv=rows.output_cv, tensor_parallel_size=tp)
    return np.abs(np.asarray(thr, dtype=float) / rows.throughput_tok_s - 1.0)


def _mape(cal: calibrate.Calibration, arch_key: str, rows: FitRows, tp: int = 1) -> float:
    return float(np.mean(_row_errors(cal, arch_key, rows, tp=tp)))


REFIT_ERROR_FLOOR = 0.05  # a fit within max(this, 2 × its own error) of the ring still explains it:
REFIT_ERROR_GROWTH = 2.0  # window-to-window noise of a pod's tokens/s is a few percent
REFIT_BATCH_MARGIN = 1.1  # a batch beyond the fitted range by more than this factor is new ground
REFIT_WARM_ERROR = 0.5  # a previous fit within this fraction of maxFitError is refitted warm (1 start)
REFIT_SMALL_N = 8  # a fit on fewer points is refitted when the ring has twice as many
REFIT_MAX_AGE_S = 1800.0  # refit at least this often (well inside the 2 h CalibrationStale alert)


def _explain_tolerance(previous: calibrate.Calibration, max_fit_error: float) -> float:
    """The error on the ring up to which the previous fit still explains it: near the one it was
    fitted with, or the one a refit could not beat (``ringErrorPct``), and acceptable."""
    fitted_err = max(float(previous.metrics.get("mape_pct", 100.0)),
                     float((previous.notes or {}).get("ringErrorPct", 0.0))) / 100.0
    return min(max_fit_error, max(REFIT_ERROR_FLOOR, REFIT_ERROR_GROWTH * fitted_err))


def _new_ground(previous: calibrate.Calibration, rows: FitRows) -> np.ndarray:
    """Rows whose batch lies beyond the range the fit was fitted (or last checked) on."""
    b_lo, b_hi = float(previous.notes["batchMin"]), float(previous.notes["batchMax"])
    return (rows.batch < b_lo / REFIT_BATCH_MARGIN) | (rows.batch > b_hi * REFIT_BATCH_MARGIN)


def _refit_trigger(previous: calibrate.Calibration, row_err: np.ndarray | None, rows: FitRows,
                   max_fit_error: float, now_s: float | None) -> str | None:
    """Why the previous fit must be refitted, or None when it is current: it still explains the
    ring (its error is near the one it was fitted with), it predicts the batches beyond the range
    it was fitted (or last checked) on as well, a fit on < REFIT_SMALL_N points has not seen the
    ring double, and it is younger than REFIT_MAX_AGE_S. A refit costs ~5-50 ms of CPU per
    resource; most windows add a point the fit already predicts."""
    notes = previous.notes or {}
    try:
        b_lo, b_hi = float(notes["batchMin"]), float(notes["batchMax"])
        created_s = _dt.datetime.fromisoformat(str(previous.created).replace("Z", "+00:00")).timestamp()
    except (KeyError, TypeError, ValueError):
        return "the fit in status has no fitted batch range"  # from before these notes, or from elsewhere
    tol = _explain_tolerance(previous, max_fit_error)
    if row_err is None or not float(np.mean(row_err)) <= tol:
        return f"its error on the ring grew to {float(np.mean(row_err)):.1%}" if row_err is not None \
            else "no error on the ring"
    new = _new_ground(previous, rows)
    if new.any() and not float(np.mean(row_err[new])) <= tol:  # extrapolation that misses
        return (f"batches {rows.batch[new].min():.3g}-{rows.batch[new].max():.3g} beyond the fitted range "
                f"{b_lo:.3g}-{b_hi:.3g} are missed by {float(np.mean(row_err[new])):.1%}")
    n_fitted = max(int(previous.metrics.get("n_points", 0)), int(notes.get("ringN", 0)))
    if n_fitted < REFIT_SMALL_N and rows.n >= 2 * n_fitted:
        return f"the ring grew from {n_fitted} to {rows.n} observations"
    checked_s = float(notes.get("checkedS", created_s))
    if now_s is not None and now_s - max(created_s, checked_s) > REFIT_MAX_AGE_S:
        return f"the fit is older than {REFIT_MAX_AGE_S:.0f} s"
    return None


def _created(now_s: float | None) -> str | None:
    """A fit's creation time at the caller's clock (None: calibrate stamps the wall clock)."""
    return None if now_s is None else _dt.datetime.fromtimestamp(now_s, _dt.timezone.utc).isoformat(timespec="seconds")


def recalibrate(arch_key: str, gpu_key: str, observations: Sequence[Observation],
                previous: calibrate.Calibration | None, max_fit_error: float,
                now_s: float | None = None, tensor_parallel_size: int = 1) -> CalibrationOutcome:
    """Refit SLIM on the observation ring; keep the previous fit if the new one is worse or fails.
    ``tensor_parallel_size``: the pool's TP (the fitted θ are one rank's, kneecap.model.parallel).

    A previous fit that still explains the ring is kept without a refit (see `_refit_trigger`);
    one whose error on the ring is within half of ``max_fit_error`` (it meets new ground, or its
    error grew but is still far from the bound) is refitted from where it stands (one warm
    start); otherwise, and with no previous fit, from the priors (3 starts)."""
    rows = fit_rows(observations)
    tp = tensor_parallel_size
    row_err = _row_errors(previous, arch_key, rows, gpu_key, tp) if previous is not None and rows.n else None
    prev_err = float(np.mean(row_err)) if row_err is not None else None
    if rows.batch_levels < MIN_BATCH_LEVELS:
        msg = f"{rows.batch_levels} distinct batch level(s) in {rows.n} observations; need {MIN_BATCH_LEVELS}"
        if previous is not None:
            return CalibrationOutcome(previous, prev_err is None or prev_err <= max_fit_error, False, "KeptPrevious",
                                      msg + "; keeping the previous fit", prev_err)
        return CalibrationOutcome(None, False, False, "TooFewBatchLevels", msg)
    trigger = None
    if previous is not None:
        trigger = _refit_trigger(previous, row_err, rows, max_fit_error, now_s)
        if trigger is None:
            b_lo, b_hi = float(previous.notes["batchMin"]), float(previous.notes["batchMax"])
            new_ground = _new_ground(previous, rows)
            if new_ground.any():  # predicted as well as the rest: the checked range grows, no refit
                previous = replace(previous, notes={
                    **previous.notes, "batchMin": min(b_lo, float(rows.batch.min())),
                    "batchMax": max(b_hi, float(rows.batch.max()))})
            return CalibrationOutcome(previous, True, False, "KeptPrevious", (
                f"the fit still explains the ring (error {prev_err:.1%} on {rows.n} observations, batches "
                f"{rows.batch.min():.3g}-{rows.batch.max():.3g}"
                + (f", {int(new_ground.sum())} beyond the fitted {b_lo:.3g}-{b_hi:.3g} predicted as well); "
                   if new_ground.any() else f" within the fitted {b_lo:.3g}-{b_hi:.3g}); ")
                + "not refitted"), prev_err)
    why = f" (refitted: {trigger})" if trigger else ""
    warm = previous is not None and prev_err is not None and prev_err <= REFIT_WARM_ERROR * max_fit_error
    try:
        new = calibrate.fit(arch_key, gpu_key, rows.batch, rows.input_len, rows.output_len, rows.throughput_tok_s,
                            output_cv=rows.output_cv, n_starts=1 if warm else 3, created=_created(now_s),
                            start=previous.params if warm else None, tensor_parallel_size=tp,
                            **({"xtol": 1e-4, "ftol": 1e-4} if warm else {}))  # warm: the error is
        # percent-level; tighter tolerances only add iterations (same MAPE to 4 digits, half the CPU)
        # the batches seen since the last cold fit: one that left the ring and comes back is not new ground
        b_lo, b_hi = float(rows.batch.min()), float(rows.batch.max())
        if warm and isinstance((previous.notes or {}).get("batchMin"), (int, float)) \
                and isinstance(previous.notes.get("batchMax"), (int, float)):
            b_lo, b_hi = min(b_lo, float(previous.notes["batchMin"])), max(b_hi, float(previous.notes["batchMax"]))
        new = replace(new, notes={**new.notes, "batchMin": b_lo, "batchMax": b_hi})
        new_err = float(new.metrics["mape_pct"]) / 100.0
    except (InputError, ValueError, FloatingPointError) as exc:
        # never act on a failed fit; keep the last good one for status and the next try
        return CalibrationOutcome(previous, False, False, "FitFailed",
                                  f"refit failed ({exc})" + ("; keeping the previous fit" if previous else ""),
                                  prev_err)
    if new_err > max_fit_error:
        # the model no longer explains the pool: keep the last good fit, but do not act on it
        keep = previous if previous is not None else new
        return CalibrationOutcome(keep, False, keep is new, "FitRejected" if previous else "FitErrorTooHigh",
                                  f"fit error {new_err:.1%} > maxFitError {max_fit_error:.0%}"
                                  + ("; keeping the previous fit" if previous else ""),
                                  prev_err if previous is not None else new_err)
    if previous is not None and prev_err is not None and prev_err <= new_err:
        # a refit could not beat the fit in use on this ring: remember what it was tried on, so
        # that the next windows refit only when the ring moves on from it (not every window)
        previous = replace(previous, notes={
            **(previous.notes or {}), "ringErrorPct": round(100.0 * prev_err, 4), "ringN": rows.n,
            "batchMin": min(float(rows.batch.min()), float((previous.notes or {}).get("batchMin", np.inf))),
            "batchMax": max(float(rows.batch.max()), float((previous.notes or {}).get("batchMax", -np.inf))),
            **({"checkedS": round(float(now_s), 3)} if now_s is not None else {})})
        return CalibrationOutcome(previous, prev_err <= max_fit_error, False, "KeptPrevious",
                                  f"new fit error {new_err:.1%} is not better than the previous {prev_err:.1%}"
                                  + why, prev_err, revalidated=True)
    return CalibrationOutcome(new, True, True, "Fitted",
                              f"SLIM fitted on {rows.n} observations, {rows.batch_levels} batch levels, "
                              f"error {new_err:.1%}" + why, new_err)


# ---------------------------------------------------------------- recommendation

@dataclass(frozen=True)
class Recommendation:
    """What the models recommend for one pool, and the numbers behind it."""

    pool: str
    max_num_seqs: int
    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | None
    kv_bytes: int  # per GPU, the KV cache the cap needs
    released_bytes: int  # per replica, versus the live reservation (negative: it reserves more)
    replicas: int
    pred_throughput_tok_s: float  # per replica at the recommended cap
    current_pred_throughput_tok_s: float  # per replica at the live cap
    pred_e2e_s: float
    efficiency: float
    knee_batch: float
    binding: str  # BCA's binding constraint
    replicas_binding: str
    throughput_gain: float
    memory_gain: float
    allocation: dict
    replicas_saved: int = 0  # replicas GAUSS sizes at the live flags beyond those at these (0: BCA's own choice)

    @property
    def settings(self) -> EngineSettings:
        return EngineSettings(self.max_num_seqs, self.gpu_memory_utilization, self.kv_cache_memory_bytes,
                              self.replicas)

    def to_status(self) -> dict:
        # the fields are scalars (no deep copy as asdict would make); the allocation has its own key
        return {status_key(f.name): _round(getattr(self, f.name)) for f in fields(self) if f.name != "allocation"}


def _round(v):
    return round(v, 6) if isinstance(v, float) else v


def model_tp(spec: LLMDeploymentSpec) -> int:
    """The tensor-parallel size every model call of the operator takes (kneecap.model.parallel:
    SLIM, GAUSS, BCA, the memory split and SARA see one rank's weights and KV plus the
    all-reduces): spec.engine.tensorParallelSize, or an adopted Deployment's argv."""
    return spec.tensor_parallel_size


def measured_non_kv_bytes(arch, gpu, obs: Observation, tp: int = 1) -> float | None:
    """non_kv per GPU from the pod's cache config (DESIGN §5.3): total·u − KV capacity·bytes/token
    (one rank's bytes per token at TP ``tp``: every rank holds the same number of blocks)."""
    from kneecap.model.parallel import kv_bytes_per_token_per_gpu

    if obs.gpu_memory_utilization and obs.kv_capacity_tokens:
        v = (gpu.memory_bytes * obs.gpu_memory_utilization
             - obs.kv_capacity_tokens * kv_bytes_per_token_per_gpu(arch, tp))
        return float(v) if v > 0 else None
    return None


def most_memory(spec: LLMDeploymentSpec) -> float:
    """The most --gpu-memory-utilization kneecap gives a pod: spec.batching.maxGpuMemoryUtilization
    within memory.UTILIZATION_BOUNDS, and a shared GPU's share."""
    u = min(memory.UTILIZATION_BOUNDS[1], spec.batching.max_gpu_memory_utilization)
    return u if spec.shared_gpu_share is None else min(u, spec.shared_gpu_share)


def memory_for_cap(spec: LLMDeploymentSpec, obs: Observation, cap: int) -> tuple[float, int | None, float]:
    """(gpu_memory_utilization, kv_cache_memory_bytes or None, KV bytes) sized for `cap` (§5.3),
    at most :func:`most_memory`."""
    arch, gpu = get_arch(spec.model.architecture), spec.accelerator.gpu
    ctx_mean = obs.input_len_mean + obs.output_len_mean
    ctx_std = math.hypot(obs.input_len_mean * obs.input_len_cv, obs.output_len_mean * obs.output_len_cv)
    kv_tokens = int(memory.kv_tokens_for_cap(cap, ctx_mean, ctx_std))
    tp = model_tp(spec)
    non_kv = measured_non_kv_bytes(arch, gpu, obs, tp)
    try:
        split = memory.utilization_for_kv_tokens(arch, gpu, max(kv_tokens, 1), cap, measured_non_kv_bytes=non_kv,
                                                 tensor_parallel_size=tp)
    except InputError:
        split = None
    if split is None or split.gpu_memory_utilization > most_memory(spec):
        split = memory.memory_split(arch, gpu, most_memory(spec), cap, measured_non_kv_bytes=non_kv,
                                    tensor_parallel_size=tp)
        kv_tokens = min(kv_tokens, split.kv_capacity_tokens)
    kvb = memory.kv_cache_memory_bytes_for_tokens(arch, max(kv_tokens, 1), tensor_parallel_size=tp) \
        if spec.memory_knob == "kvCacheMemoryBytes" else None
    return split.gpu_memory_utilization, kvb, split.kv_bytes


def _kv_capacity_tokens(spec: LLMDeploymentSpec, obs: Observation, u: float, cap: int) -> int:
    arch, gpu, tp = get_arch(spec.model.architecture), spec.accelerator.gpu, model_tp(spec)
    non_kv = measured_non_kv_bytes(arch, gpu, obs, tp)
    try:
        return memory.memory_split(arch, gpu, u, max(cap, 1), measured_non_kv_bytes=non_kv,
                                   tensor_parallel_size=tp).kv_capacity_tokens
    except InputError:
        return 1


def gauss_limits(spec: LLMDeploymentSpec, obs: Observation, settings: EngineSettings | None):
    """GAUSS's engine limits of a pool at ``settings``: its cap and the KV cache its memory
    setting holds (the memory split, §5.3, with the pod's measured non-KV memory); None
    settings: vLLM's default cap and no KV limit."""
    from kneecap.model import gauss

    if settings is None:
        return gauss.DEFAULT_LIMITS
    if settings.kv_cache_memory_bytes:
        from kneecap.model.parallel import kv_bytes_per_token_per_gpu

        arch = get_arch(spec.model.architecture)  # --kv-cache-memory-bytes is per GPU
        blocks = settings.kv_cache_memory_bytes // (memory.DEFAULT_BLOCK_SIZE
                                                    * kv_bytes_per_token_per_gpu(arch, model_tp(spec)))
        kv = int(blocks) * memory.DEFAULT_BLOCK_SIZE
    else:
        kv = _kv_capacity_tokens(spec, obs, settings.gpu_memory_utilization, settings.max_num_seqs)
    return gauss.EngineLimits(max_num_seqs=int(settings.max_num_seqs), kv_capacity_tokens=max(int(kv), 1))


def _gauss_model(arch_key: str, gpu_key: str, cal: calibrate.Calibration, obs: Observation, limits, tp: int):
    """(d(B, C), the window's clamped lengths, GAUSS's workload): the calibrated SLIM mapped to
    GAUSS's step costs (GAUSS §3.3) at the engine's ``limits`` (vLLM refuses a token budget
    below the cap), and lognormal lengths at the window's means and CVs."""
    from kneecap.model import gauss

    coef = gauss.coefficients_for(get_arch(arch_key), get_gpu(gpu_key), cal.params, form=cal.form,
                                  chunk_tokens=max(gauss.DEFAULT_MAX_NUM_BATCHED_TOKENS, limits.slots),
                                  tensor_parallel_size=tp)
    lengths = (max(obs.input_len_mean, 1.0), max(obs.input_len_cv, 0.05),
               max(obs.output_len_mean, 1.0), max(obs.output_len_cv, 0.05))
    wl = gauss.Workload(input_tokens=gauss.LogNormalLength(lengths[0], lengths[1]),
                        output_tokens=gauss.LogNormalLength(lengths[2], lengths[3]))
    return coef, lengths, wl


def _gauss_rate(arch_key: str, gpu_key: str, cal: calibrate.Calibration, obs: Observation,
                slo_ttft_s: float | None, slo_tbt_s: float | None, quantile: float,
                seed: int, limits=None, tp: int = 1,
                runs: gauss_reuse.GaussRuns | None = None) -> tuple[float, str, bool]:
    """(λ* per replica, binding, reused) from GAUSS; λ* is 0 where no load meets the SLO.

    GAUSS's λ search runs on the calibrated SLIM mapped to d(B, C) at the window's lengths,
    with the engine's ``limits`` (:func:`gauss_limits`); a previous run whose inputs are all
    within tolerance in ``runs`` (the caller's, see :mod:`kneecap.control.gauss_reuse`; None:
    none kept) is reused instead, and the nearest one warm-starts the search otherwise: a cold search is ~9 evaluations of 20k
    samples (~0.1 s of CPU), a warm one ~5."""
    from kneecap.model import gauss

    limits = gauss.DEFAULT_LIMITS if limits is None else limits
    coef, lengths, wl = _gauss_model(arch_key, gpu_key, cal, obs, limits, tp)
    inputs = gauss_reuse.inputs_for(coef, *lengths, kv_tokens=limits.kv_capacity_tokens, slots=limits.slots)
    key = (arch_key, gpu_key, cal.form, slo_ttft_s, slo_tbt_s, quantile, seed, tp)
    hit = runs.find(key, inputs) if runs is not None else None
    if hit is not None:
        return (*hit, True)
    near = runs.nearest(key, inputs) if runs is not None else None
    res = gauss.sustainable_rate(wl, coef, rng=np.random.default_rng(seed), samples=GAUSS_SAMPLES, replications=4,
                                 slo_ttft_s=slo_ttft_s, slo_tbt_s=slo_tbt_s, quantile=quantile,
                                 rel_tol=GAUSS_REL_TOL, hint_rps=(near[0] or None) if near else None, limits=limits)
    out = (res.rate_rps if (slo_ttft_s or slo_tbt_s) else 0.8 * res.stable_rate_rps, res.binding)
    if runs is not None:
        runs.add(key, inputs, out)
    return (*out, False)


MEASURED_FACTOR_MAX = 2.0  # the most the measured tails raise GAUSS's λ* in one window
MEASURED_SWEEP_POINTS = 12  # GAUSS's p95 curves over λ (5%-98% of its stability limit)
MEASURED_SWEEP_SAMPLES = 5_000  # a position on the curve, not a tail to 1%: a quarter of GAUSS_SAMPLES' CPU


def _p95_curves(spec: LLMDeploymentSpec, cal: calibrate.Calibration, obs: Observation, limits, seed: int,
                runs: gauss_reuse.GaussRuns | None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(λ grid, GAUSS's p95 TTFT and TPOT over it): §3.7's sweep at ``limits``, or a past sweep
    of ``runs`` whose inputs are within tolerance (GaussRuns, keyed apart from the λ searches)."""
    from kneecap.model import gauss

    arch_key, gpu_key, tp = spec.model.architecture, spec.accelerator.gpu, model_tp(spec)
    coef, lengths, wl = _gauss_model(arch_key, gpu_key, cal, obs, limits, tp)
    inputs = gauss_reuse.inputs_for(coef, *lengths, kv_tokens=limits.kv_capacity_tokens, slots=limits.slots)
    key = ("p95-sweep", arch_key, gpu_key, cal.form, seed, tp)
    hit = runs.find(key, inputs) if runs is not None else None
    if hit is not None:
        return hit
    sweep = gauss.sweep_rates(wl, coef, rng=np.random.default_rng(seed), points=MEASURED_SWEEP_POINTS,
                              samples=MEASURED_SWEEP_SAMPLES, replications=4, limits=limits)
    out = (np.array([p.rate_rps for p in sweep]),
           {"TTFT": np.array([p.ttft_s[1] for p in sweep]),
            "TPOT": np.array([(p.tbt_s or (math.nan,) * 3)[1] for p in sweep])})
    for a in (out[0], *out[1].values()):
        a.setflags(write=False)  # shared by every tick that reuses it
    if runs is not None:
        runs.add(key, inputs, out)
    return out


def _p95_fields(o) -> dict[str, str]:
    """The field of the window (an Observation or a ring entry) each SLO metric's p95 is read
    from: TPOT per request (vLLM's ``request_time_per_output_token``), the SLO's definition and
    what GAUSS predicts; an engine that does not export it is read by its ITL p95 (every token's
    gap: never below the per-request p95, so a stricter check)."""
    return {"TTFT": "ttft_p95_s", "TPOT": "itl_p95_s" if getattr(o, "tpot_p95_s", None) is None else "tpot_p95_s",
            "E2E": "e2e_p95_s"}


def _slo_targets(spec: LLMDeploymentSpec) -> dict[str, float | None]:
    return {"TTFT": spec.slo.ttft_s, "TPOT": spec.slo.tpot_s, "E2E": spec.slo.e2e_s}


def _p95_floors(o) -> dict[str, float | None]:
    """The least each SLO metric's p95 can be given the window's buckets (None: not known)."""
    return {m: getattr(o, f.replace("_p95_s", "_p95_floor_s"), None) for m, f in _p95_fields(o).items()}


def measured_rate_factor(spec: LLMDeploymentSpec, cal: calibrate.Calibration, obs: Observation,
                         settings: EngineSettings | None, seed: int = 0,
                         gauss_runs: gauss_reuse.GaussRuns | None = None) -> tuple[float, dict]:
    """(factor ≥ 1 on GAUSS's λ*, the factor per metric): where the window's measured p95 TTFT
    and TPOT lie below GAUSS's p95 curves at the per-pod rate the window ran, each curve is read
    at the measured p95 instead: the pod ran at rate r with the tails the model gives at
    r_m < r, so the model's λ along that metric is scaled by r / r_m (capped at
    MEASURED_FACTOR_MAX). Only where no measured metric lies surely at or above its curve: one
    the model does not overestimate (a fit optimistic about decode) may bind once the other is
    loosened, and an optimistic model is left to the missed-rate bound, which corrects it by
    measurement. A metric whose p95 is interpolated above the curve inside a bucket whose floor
    (:func:`_p95_floors`) is below it gives no verdict (vLLM's TPOT buckets are 10, 25, 50 ms):
    its own λ, the model's, stands in the minimum where its curve crosses the SLO at all. A
    pessimistic model would otherwise
    keep the pool too large for it ever to be measured near its limit. The curves are GAUSS
    §3.7's λ sweep at the live ``settings``' engine limits (the settings the window ran with),
    reused from ``gauss_runs`` while its inputs stay within tolerance, as λ* is
    (:mod:`kneecap.control.gauss_reuse`): only the window's rate and tails are read afresh."""
    pods = max(obs.pods, 0)
    rate = obs.request_rate_rps / pods if pods else 0.0
    floors = _p95_floors(obs)
    measured = {m: (slo, y) for slo, y, m in slo_checks(spec, obs)
                if m in ("TTFT", "TPOT") and math.isfinite(y) and y > 0}
    if not (math.isfinite(rate) and rate > 0) or not measured:
        return 1.0, {}
    lam, curves = _p95_curves(spec, cal, obs, gauss_limits(spec, obs, settings), seed, gauss_runs)
    model_lam, corrected_lam, detail, optimistic = [], [], {}, False
    for m, (slo, y) in measured.items():
        p95 = np.maximum.accumulate(np.nan_to_num(curves[m], nan=0.0))  # CRN curves are monotone up to noise
        lam_m = float(np.interp(slo, p95, lam))  # where the p95 curve crosses the SLO (its ends outside)
        factor = 1.0
        model_at_rate = float(np.interp(rate, lam, p95))
        if rate >= lam[-1] or y < model_at_rate:  # measured below the model at this rate
            at_model_rps = float(np.interp(y, p95, lam))  # the curve's first rate below its first p95
            factor = min(max(rate / max(at_model_rps, 1e-12), 1.0), MEASURED_FACTOR_MAX)
        elif floors.get(m) is None or floors[m] >= model_at_rate:  # surely at or above the model
            optimistic = True
        elif p95[-1] < slo:  # no verdict, and the model's curve stays under the SLO: it binds nowhere
            model_lam.append(lam_m)
            detail[m] = round(factor, 4)
            continue
        # else no verdict (the bucket holding the p95 straddles the model's): the model's λ stands
        model_lam.append(lam_m)
        corrected_lam.append(factor * lam_m)
        detail[m] = round(factor, 4)
    if optimistic:  # a metric the model does not overestimate: its λ may be too high already
        return 1.0, detail
    if not corrected_lam:  # no metric gave a verdict
        return 1.0, detail
    ratio = min(corrected_lam) / max(min(model_lam), 1e-12)
    return max(1.0, ratio), detail


def slo_checks(spec: LLMDeploymentSpec, o) -> list[tuple[float, float, str]]:
    """(target, the window's p95, name) of each declared SLO the window (an Observation or a ring
    entry) measured, each p95 read from its field (:func:`_p95_fields`)."""
    targets = _slo_targets(spec)
    checks = [(targets[m], getattr(o, f), m) for m, f in _p95_fields(o).items()]
    return [(slo, v, n) for slo, v, n in checks if slo is not None and v is not None]


def p95_targets(spec: LLMDeploymentSpec) -> dict[str, float | None]:
    """The SLO each p95 field of an Observation is held to (TPOT's target holds per-request TPOT
    and, where the engine has none, every token's gap: :func:`_p95_fields`); None: none declared."""
    targets = _slo_targets(spec)
    return {"ttft_p95_s": targets["TTFT"], "tpot_p95_s": targets["TPOT"], "itl_p95_s": targets["TPOT"],
            "e2e_p95_s": targets["E2E"]}


def surely_missed(spec: LLMDeploymentSpec, o) -> list[str]:
    """The declared SLOs the window (an Observation or a ring entry) surely missed: its p95 is
    above the target and so is the p95's floor, the lower edge of the bucket that holds it
    (vLLM's latency buckets are coarse: TPOT's run 10, 25, 50, 75 ms, so a 20 ms target lies
    inside one, and a p95 interpolated past it may be a window whose every request took 12 ms).
    A window without floors (an older ring entry, or an engine without the histogram) is read
    by its p95 alone."""
    floors = _p95_floors(o)
    return [n for slo, v, n in slo_checks(spec, o)
            if v > slo and (floors[n] is None or floors[n] >= slo)]


KV_MATCH = 0.02  # a window's KV capacity within 2% of the sized flags' is the same cache


def served_rate_per_replica(spec: LLMDeploymentSpec, ring, latest: Observation,
                            kv_tokens: int | None = None) -> float | None:
    """The highest per-pod request rate of a ring window that met every declared SLO at its p95s
    with requests at least 80% as long as ``latest``'s (input and output): a rate the pool has
    been measured to serve (None: no such window, or no SLO declared). ``kv_tokens``: the KV
    cache of the flags being sized; a window that ran with a larger one does not count (what
    a larger cache served, a smaller one may not)."""
    best = None
    for o in ring:
        checks = slo_checks(spec, o)
        if (not checks or any(not (v <= slo) for slo, v, _ in checks) or o.pods < 1
                or o.input_len_mean < 0.8 * latest.input_len_mean or o.output_len_mean < 0.8 * latest.output_len_mean
                or (kv_tokens is not None and o.kv_capacity_tokens and o.kv_capacity_tokens > kv_tokens * (1 + KV_MATCH))):
            continue
        r = o.request_rate_rps / o.pods
        if math.isfinite(r) and (best is None or r > best):
            best = r
    return best


def missed_rate_per_replica(spec: LLMDeploymentSpec, ring, latest: Observation,
                            kv_tokens: int | None = None) -> float | None:
    """The highest per-pod request rate of a ring window that surely missed a declared SLO at its
    p95s (:func:`surely_missed`: the buckets cannot place the p95 within it) with requests at most
    1.25× as long as ``latest``'s (input and output): a rate the pool was measured not to serve,
    so λ* is below it (None: no such window, or no SLO declared). The highest, not the lowest: a
    window that drains the backlog of an overload misses at a lower rate than the pool can serve.
    ``kv_tokens``: the KV cache of the flags being sized; a window that ran with a smaller one
    does not count (what a smaller cache missed, a larger one may serve)."""
    worst = None
    for o in ring:
        if (not surely_missed(spec, o) or o.pods < 1
                or o.input_len_mean > 1.25 * latest.input_len_mean or o.output_len_mean > 1.25 * latest.output_len_mean
                or (kv_tokens is not None and o.kv_capacity_tokens and o.kv_capacity_tokens < kv_tokens * (1 - KV_MATCH))):
            continue
        r = o.request_rate_rps / o.pods
        if math.isfinite(r) and r > 0 and (worst is None or r > worst):
            worst = r
    return worst


def colocated_replicas(spec: LLMDeploymentSpec, cal: calibrate.Calibration, obs: Observation,
                       seed: int = 0, served_rps: float | None = None, missed_rps: float | None = None,
                       settings: EngineSettings | None = None,
                       gauss_runs: gauss_reuse.GaussRuns | None = None,
                       measured_factor: float = 1.0) -> tuple[int, str, dict]:
    """GAUSS: per-replica SLO-sustainable rate λ*, replicas = ⌈headroom·λ/λ*⌉ (clamped later).

    λ* is GAUSS's at the cap and memory ``settings`` the pool would run with (the
    recommendation's: :func:`gauss_limits`). ``served_rps``: a per-pod rate measured within the
    SLO (:func:`served_rate_per_replica`); λ* is never below it: where the fitted model says a
    pod cannot do what it has just been seen doing, the measurement wins (a fit on a narrow
    batch range can be far off). ``missed_rps``: a per-pod rate measured to miss the SLO
    (:func:`missed_rate_per_replica`) above the rate served; λ* is below it, the measurement
    winning over a model that is optimistic there. ``measured_factor``: GAUSS's λ* scaled where the
    window's tails put the model's curve too high (:func:`measured_rate_factor`), before both
    measured bounds. ``gauss_runs``: past GAUSS runs to reuse and add to (the loop's,
    :class:`kneecap.control.loop.LoopContext`)."""
    from kneecap.model.sara import plan_colocated

    rate = max(obs.request_rate_rps, 1e-6)
    pods = max(obs.pods, 1)
    limits = gauss_limits(spec, obs, settings)
    lam_star, binding, reused = _gauss_rate(spec.model.architecture, spec.accelerator.gpu, cal, obs,
                                            spec.slo.ttft_s, spec.slo.tpot_s, spec.slo.quantile, seed, limits,
                                            model_tp(spec), gauss_runs)
    if measured_factor > 1.0:
        lam_star = lam_star * measured_factor
    if served_rps is not None and served_rps > lam_star:
        lam_star, binding = served_rps, "served"
    if missed_rps is not None and missed_rps < lam_star and (served_rps is None or missed_rps > served_rps):
        lam_star, binding = missed_rps, "missed"
    cp = plan_colocated(lam_star, spec.gpus_per_replica, max(spec.accelerator.cost_per_hour, 1e-9),
                        rate_rps=spec.control.rate_headroom * rate, budget_per_hour=spec.max_cost_per_hour)
    alloc = {"replicas": cp.replicas, "gpusPerReplica": spec.gpus_per_replica,
             "sustainableRequestsPerSecondPerReplica": round(lam_star, 6),
             "servedRequestsPerSecondPerReplica": None if served_rps is None else round(served_rps, 6),
             "missedRequestsPerSecondPerReplica": None if missed_rps is None else round(missed_rps, 6),
             "observedRequestsPerSecond": round(rate, 6), "goodputRequestsPerSecond": round(cp.goodput_rps, 6),
             "costPerHour": round(cp.cost_per_hour, 4), "binding": binding if cp.binding == "rate" else cp.binding,
             "measuredRateFactor": round(measured_factor, 4), "feasible": cp.feasible, "message": cp.message,
             "gaussRunReused": reused,
             "gaussMaxNumSeqs": limits.slots, "gaussKvCacheTokens": limits.kv_capacity_tokens}
    return (cp.replicas if cp.feasible else pods), alloc["binding"], alloc


def disaggregated_allocation(spec: LLMDeploymentSpec, cal: calibrate.Calibration | None,
                             obs: Observation) -> dict:
    """SARA: cheapest prefill/KV/decode allocation meeting the SLO quantiles at the observed rate."""
    from kneecap.model import sara

    slo_kw = {k: v for k, v in (("ttft_s", spec.slo.ttft_s), ("tpot_s", spec.slo.tpot_s)) if v}
    slo = sara.SLO(quantile=max(spec.slo.quantile, 0.5), **slo_kw)
    wl = sara.make_workload(max(obs.input_len_mean, 1.0), max(obs.input_len_cv, 0.05),
                            max(obs.output_len_mean, 1.0), max(obs.output_len_cv, 0.05))
    gpu = spec.accelerator.gpu
    kv = spec.topology.kv_transfer
    costs = sara.Costs(max(spec.accelerator.cost_per_hour, 1e-9), max(spec.accelerator.cost_per_hour, 1e-9),
                       kv.cost_per_gib_s_hour if kv else 0.1)
    tp = model_tp(spec)
    service = None
    if cal is not None:
        arch_key = spec.model.architecture

        def service(il):  # calibrated SLIM at B = 1 (DESIGN §5.4)
            il = np.asarray(il, dtype=float)
            _, e2e = calibrate.predict(cal, arch_key, gpu, np.ones_like(il), il, np.ones_like(il),
                                       tensor_parallel_size=tp)
            return e2e
    gpus = spec.gpus_per_replica
    # a prefill replica is one TP engine; the decode pool comes in whole TP engines
    pb = sara.build_problem(spec.model.architecture, gpu, wl, slo, costs, prefill_service_s=service,
                            tensor_parallel_size=tp)
    rate = spec.control.rate_headroom * max(obs.request_rate_rps, 1e-6)
    alloc, binding = sara.min_resources(pb, rate)
    # SARA's decode pool is k_d GPUs in engines of `tp`; each of kneecap's pods is one engine
    # holding `gpus` GPUs (the TP size, or the GPU limit a pod had before spec.engine.tensorParallelSize)
    decode_pods = -(-alloc.decode_replicas // tp)
    cost = (gpus * (alloc.prefill_replicas * costs.prefill_gpu_per_hour + decode_pods * costs.decode_gpu_per_hour)
            + alloc.kv_bandwidth_gibps * costs.kv_per_gibps_hour)  # SARA (20b), per pod
    out = {"prefillReplicas": alloc.prefill_replicas, "decodeReplicas": decode_pods,
           "gpusPerReplica": gpus, "decodeGpus": alloc.decode_replicas,
           "kvBandwidthBytesPerSecond": int(round(alloc.kv_bandwidth_gibps * GIB)),
           "maxNumSeqs": alloc.max_num_seqs, "costPerHour": round(cost, 4), "targetRequestsPerSecond": round(rate, 6),
           "binding": binding}
    if spec.max_cost_per_hour:
        p = sara.plan(pb, spec.max_cost_per_hour)
        out.update(goodputRequestsPerSecond=round(p.goodput_rps, 6), budgetFeasible=p.feasible, budgetMessage=p.message)
    return out


TPOT_MARGIN = 1.25  # the cap's predicted mean TPOT stays this far below the TPOT SLO (a p95 target)


def e2e_bound_s(spec: LLMDeploymentSpec, obs: Observation) -> float | None:
    """The E2E latency BCA's cap must keep: the E2E SLO, and the TPOT SLO as the E2E of the
    window's mean output at TPOT SLO / TPOT_MARGIN (TPOT = (E2E − TTFT)/(OL − 1), its
    definition, with the TTFT share counted against it)."""
    bounds = [b for b in (spec.slo.e2e_s,) if b]
    if spec.slo.tpot_s:
        bounds.append(max(obs.output_len_mean, 1.0) * spec.slo.tpot_s / TPOT_MARGIN)
    return min(bounds) if bounds else None


def _throughputs(spec: LLMDeploymentSpec, cal: calibrate.Calibration, obs: Observation, current: EngineSettings,
                 cap: int, u: float) -> tuple[float, float]:
    """Calibrated SLIM tokens/s per pod at the live settings and at (cap, u), each with the KV
    capacity its memory holds (eq. 6)."""
    arch, gpu = get_arch(spec.model.architecture), spec.accelerator.gpu
    cur_kv = _kv_capacity_tokens(spec, obs, current.gpu_memory_utilization, current.max_num_seqs)
    new_kv = _kv_capacity_tokens(spec, obs, u, cap)
    thr, _ = calibrate.predict(cal, arch, gpu, np.array([current.max_num_seqs, cap], float),
                               obs.input_len_mean, obs.output_len_mean, output_cv=obs.output_len_cv,
                               kv_capacity_tokens=np.array([max(cur_kv, 1), max(new_kv, 1)], float),
                               tensor_parallel_size=model_tp(spec))
    return float(thr[0]), float(thr[1])


def gains(spec: LLMDeploymentSpec, cal: calibrate.Calibration, obs: Observation, current: EngineSettings,
          target: EngineSettings) -> tuple[float, float]:
    """(throughput gain, memory released) of ``target`` over ``current``, as :func:`recommend`
    predicts them for its own cap."""
    cur_thr, new_thr = _throughputs(spec, cal, obs, current, target.max_num_seqs, target.gpu_memory_utilization)
    return (new_thr / cur_thr - 1.0 if cur_thr > 0 else 0.0,
            _released(spec, current, target.gpu_memory_utilization)[1])


def _released(spec: LLMDeploymentSpec, current: EngineSettings, u: float) -> tuple[float, float]:
    """(bytes released per replica, their fraction of the live reservation) moving the live
    memory to ``u``: each of the replica's GPUs reserves the fraction ``u`` of its memory."""
    gpu, n = spec.accelerator.gpu, spec.gpus_per_replica
    released = n * memory.released_bytes(gpu.memory_bytes * current.gpu_memory_utilization, gpu.memory_bytes * u)
    return released, max(released, 0.0) / (n * gpu.memory_bytes * current.gpu_memory_utilization)


def kv_bound(spec: LLMDeploymentSpec, obs: Observation, settings: EngineSettings) -> bool:
    """Whether the KV cache, not the cap, bounds the batch at ``settings``: it holds fewer tokens
    than the cap's sequences at the window's mean context (prompt + output), so the engine
    queues or preempts before the cap is reached."""
    limits = gauss_limits(spec, obs, settings)
    return limits.kv_capacity_tokens < settings.max_num_seqs * (obs.input_len_mean + obs.output_len_mean)


def most_kv_settings(spec: LLMDeploymentSpec, obs: Observation, current: EngineSettings) -> EngineSettings | None:
    """``current``'s cap and replicas at the most memory a pod may reserve (:func:`most_memory`),
    in the pool's memory flag; None where that holds no more KV than ``current`` does."""
    u = most_memory(spec)
    kvb = None
    if spec.memory_knob == "kvCacheMemoryBytes":
        tokens = _kv_capacity_tokens(spec, obs, u, current.max_num_seqs)
        if tokens <= 1:
            return None
        kvb = memory.kv_cache_memory_bytes_for_tokens(get_arch(spec.model.architecture), tokens,
                                                      tensor_parallel_size=model_tp(spec))
    more = EngineSettings(current.max_num_seqs, u, kvb, current.replicas)
    live_kv = gauss_limits(spec, obs, current).kv_capacity_tokens
    return more if gauss_limits(spec, obs, more).kv_capacity_tokens > live_kv else None


def gauss_replicas(spec: LLMDeploymentSpec, cal: calibrate.Calibration, obs: Observation, settings: EngineSettings,
                   gauss_runs: gauss_reuse.GaussRuns | None = None, seed: int = 0) -> float:
    """Replicas GAUSS alone sizes for the window's rate at ``settings``' engine limits:
    headroom·λ/λ* (SARA's colocated count before rounding; inf where no load meets the SLO).
    No measured rate enters: they were measured at the live flags, and this compares flags."""
    limits = gauss_limits(spec, obs, settings)
    lam_star, _, _ = _gauss_rate(spec.model.architecture, spec.accelerator.gpu, cal, obs, spec.slo.ttft_s,
                                 spec.slo.tpot_s, spec.slo.quantile, seed, limits, model_tp(spec), gauss_runs)
    need = spec.control.rate_headroom * max(obs.request_rate_rps, 1e-6)
    return need / lam_star if lam_star > 0 else math.inf


def recommend_at(spec: LLMDeploymentSpec, r: Recommendation, cal: calibrate.Calibration, obs: Observation,
                 current: EngineSettings, settings: EngineSettings, binding: str,
                 replicas_saved: int = 0) -> Recommendation:
    """``r`` (BCA's recommendation, for its curve) moved to ``settings``' cap and memory, with the
    throughput, KV and memory released there against ``current``."""
    cur_thr, new_thr = _throughputs(spec, cal, obs, current, settings.max_num_seqs, settings.gpu_memory_utilization)
    released, memory_gain = _released(spec, current, settings.gpu_memory_utilization)
    kv_tokens = gauss_limits(spec, obs, settings).kv_capacity_tokens
    from kneecap.model.parallel import kv_bytes_per_token_per_gpu

    kv_bytes = kv_tokens * kv_bytes_per_token_per_gpu(get_arch(spec.model.architecture), model_tp(spec))
    return replace(r, max_num_seqs=settings.max_num_seqs, gpu_memory_utilization=float(settings.gpu_memory_utilization),
                   kv_cache_memory_bytes=settings.kv_cache_memory_bytes, kv_bytes=int(kv_bytes),
                   released_bytes=int(round(released)), pred_throughput_tok_s=new_thr,
                   current_pred_throughput_tok_s=cur_thr, binding=binding,
                   throughput_gain=new_thr / cur_thr - 1.0 if cur_thr > 0 else 0.0, memory_gain=memory_gain,
                   replicas_saved=replicas_saved)


def recommend(spec: LLMDeploymentSpec, role: str, cal: calibrate.Calibration, obs: Observation,
              current: EngineSettings, *, replicas: int | None = None, replicas_binding: str = "unchanged",
              allocation: dict | None = None) -> Recommendation:
    """BCA cap and the memory that holds it for one pool, with the predicted gain over `current`."""
    from kneecap.model import bca

    arch, gpu = get_arch(spec.model.architecture), spec.accelerator.gpu
    kv_cap_max = _kv_capacity_tokens(spec, obs, most_memory(spec), spec.batching.max_max_num_seqs)
    ctx_std = math.hypot(obs.input_len_mean * obs.input_len_cv, obs.output_len_mean * obs.output_len_cv)
    res = bca.advise(cal, arch, gpu, obs.input_len_mean, obs.output_len_mean, slo_e2e_s=e2e_bound_s(spec, obs),
                     epsilon=spec.batching.efficiency_floor, min_cap=spec.batching.min_max_num_seqs,
                     max_cap=spec.batching.max_max_num_seqs, kv_capacity_tokens=kv_cap_max,
                     output_cv=obs.output_len_cv, length_std_tok=ctx_std, tensor_parallel_size=model_tp(spec))
    cap = int(res.cap)
    u, kvb, kv_bytes = memory_for_cap(spec, obs, cap)
    cur_thr, new_thr = _throughputs(spec, cal, obs, current, cap, u)
    released, memory_gain = _released(spec, current, u)
    return Recommendation(
        pool=role, max_num_seqs=cap, gpu_memory_utilization=float(u), kv_cache_memory_bytes=kvb,
        kv_bytes=int(round(kv_bytes)), released_bytes=int(round(released)),
        replicas=current.replicas if replicas is None else int(replicas),
        pred_throughput_tok_s=new_thr, current_pred_throughput_tok_s=cur_thr,
        pred_e2e_s=float(res.pred_e2e_s), efficiency=float(res.efficiency), knee_batch=float(res.knee_batch),
        binding=str(res.binding), replicas_binding=replicas_binding,
        throughput_gain=new_thr / cur_thr - 1.0 if cur_thr > 0 else 0.0,
        memory_gain=memory_gain,
        allocation=dict(allocation or {}),
    )
