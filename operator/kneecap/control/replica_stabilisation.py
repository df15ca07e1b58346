"""Replica stabilisation: when a colocated pool grows at once and when it may shrink. Pure.

GAUSS's replica count moves with every window's rate; a pool follows it up at once and down only
to the highest scale-down recommendation of the last cooldown (as the HPA's scale-down
stabilisation window does), once that window holds enough recommendations and the pool has been
watched a cooldown long. The history lives in ``status.scaleDownRecommendations``.
"""

from __future__ import annotations

import numpy as np

from kneecap.control.spec import LLMDeploymentSpec


def read_recommendations(history) -> list[tuple[float, int, bool]]:
    """``status.scaleDownRecommendations`` as (unix seconds, replicas, scale-up) tuples: the
    ``{"recommendedUnixSeconds", "replicas", "scaleUp"?}`` entries (and the positional
    ``[unixSeconds, replicas, 1?]`` of earlier versions); unreadable entries are dropped."""
    out = []
    for e in history or []:
        try:
            if isinstance(e, dict):
                out.append((float(e["recommendedUnixSeconds"]), int(e["replicas"]), bool(e.get("scaleUp", False))))
            else:
                out.append((float(e[0]), int(e[1]), len(e) > 2 and bool(e[2])))
        except (TypeError, ValueError, IndexError, KeyError):
            continue
    return out


def stabilised_replicas(want: int, want_down: int, history, current: int, now_s: float, window_s: float,
                        cooldown_s: float, min_recommendations: int = 1) -> tuple[int, list]:
    """(replicas, the history to keep in ``status.scaleDownRecommendations``).

    A pool grows to ``want`` at once. It shrinks only to the highest scale-down recommendation
    (sized for the rate plus the hysteresis band) of the last ``window_s``, once that window
    holds ``min_recommendations`` of them (a pool just taken over, or whose history was lost,
    does not shrink on one window), and never within ``cooldown_s`` of growing (a scale-up is
    kept in the history for the cooldown: no count is left and taken again within it).
    ``history``: ``[{"recommendedUnixSeconds", "replicas", "scaleUp"?}, ...]`` (the positional
    ``[unixSeconds, replicas, 1?]`` of earlier versions read too); unreadable entries are
    dropped."""
    kept = [(t_s, n, up) for t_s, n, up in read_recommendations(history)
            if 0.0 <= now_s - t_s < (cooldown_s if up else window_s)]

    def as_status(entries):
        return [{"recommendedUnixSeconds": t_s, "replicas": n, **({"scaleUp": True} if up else {})}
                for t_s, n, up in entries]
    if want > current:
        return want, as_status(kept + [(now_s, int(want), True)])
    kept.append((now_s, int(want_down), False))
    if want == current or sum(not up for _, _, up in kept) < min_recommendations:
        return current, as_status(kept)
    return min(current, max(want, *(n for _, n, _ in kept))), as_status(kept)


def scale_down_window_s(spec: LLMDeploymentSpec, restart_s: float) -> float:
    """How long a pod no longer needed is kept: the cooldown, so that a count left is not taken
    again within it, and at least as long as starting the pod again takes and three control
    windows. Keeping it only as long as a restart takes (the ski-rental break-even) prices the
    GPU-seconds alone: a burst that comes back within the reaction time (window, interval, pod
    start) is served by too few pods, a cost in SLO misses the rate history cannot price."""
    return max(spec.control.cooldown_s, restart_s, 3.0 * spec.control.interval_s)


def watched_long_enough(spec: LLMDeploymentSpec, ring, now_s: float) -> bool:
    """Whether the pool's windows in the ring reach a cooldown back (or fill the ring): before
    that, its traffic's swings are unknown and it is not shrunk (a pool just taken over is
    sized for a peak kneecap has not seen)."""
    if len(ring) >= spec.control.observation_history:
        return True
    starts = [o.t_end_s - o.window_s for o in ring]
    return bool(starts) and now_s - min(starts) >= spec.control.cooldown_s


def min_scale_down_recommendations(spec: LLMDeploymentSpec, restart_s: float) -> int:
    """Recommendations a scale-down window must hold before a pool shrinks: one per control
    interval it spans (at least three, as the window spans at least three)."""
    return max(3, int(scale_down_window_s(spec, restart_s) // spec.control.interval_s))


def _span(ring, now_s: float, span_s: float) -> list:
    """The ring's windows with a rate that ended within ``span_s`` of ``now_s``."""
    return [o for o in ring
            if now_s - span_s <= o.t_end_s <= now_s and o.window_s > 0 and o.request_rate_rps >= 0]


def rising_rate_rps(ring, now_s: float, span_s: float, ahead_s: float, z: float = 2.0) -> float | None:
    """The pool's request rate ``ahead_s`` from now on the trend of the ring's windows that
    ended within ``span_s``, where that trend rises significantly; None where it does not.

    Weighted least squares of each window's rate on its end time, each weighted by the inverse
    of its Poisson variance (rate / window length); the slope's standard error is scaled by the
    residuals' dispersion where traffic is burstier than Poisson (quasi-Poisson), and the trend
    counts only where the slope exceeds ``z`` standard errors. A scale-down is sized for it: a
    pod given back while the rate climbs is wanted again before a scale-up could bring it back."""
    pts = [(o.t_end_s, o.request_rate_rps, o.window_s) for o in _span(ring, now_s, span_s)]
    if len(pts) < 4:
        return None
    t, r, window = (np.array(column) for column in zip(*pts))
    w = window / np.maximum(r, 1.0 / window)
    t_bar, r_bar = float(np.average(t, weights=w)), float(np.average(r, weights=w))
    sxx = float(np.sum(w * (t - t_bar) ** 2))
    if sxx <= 0:
        return None
    slope = float(np.sum(w * (t - t_bar) * (r - r_bar))) / sxx
    residual = r - (r_bar + slope * (t - t_bar))
    dispersion = max(float(np.sum(w * residual**2)) / (len(pts) - 2), 1.0)
    if slope <= z * np.sqrt(dispersion / sxx):
        return None
    return r_bar + slope * (now_s + ahead_s - t_bar)


def load_margin(ring, now_s: float, span_s: float, z: float) -> float:
    """1 + ``z`` (spec.control.scaleDownDeviations) coefficients of variation of the pool's work
    over the ring's windows that ended within ``span_s``: the larger of the prefill work (rate × mean prompt) and the decode work
    (rate × mean output). A scale-down is sized for the rate times this margin: the smaller pool
    must serve the windows the span's own spread says are coming, not only those it has seen
    (a pool given back a cooldown before a heavier minute is wanted again within the cooldown).
    1 with fewer than four windows."""
    pts = [(o.request_rate_rps * o.input_len_mean, o.request_rate_rps * o.output_len_mean)
           for o in _span(ring, now_s, span_s)]
    if len(pts) < 4:
        return 1.0
    work = np.array(pts)
    mean = work.mean(axis=0)
    cv = np.where(mean > 0, work.std(axis=0, ddof=1) / np.maximum(mean, 1e-12), 0.0)
    return 1.0 + z * float(cv.max())
