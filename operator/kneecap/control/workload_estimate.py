"""The workload the models are asked about: the latest window's length mix, pooled with the
windows before it that are statistically the same mix.

One window's mean prompt and output lengths are estimates from the requests it finished, with
a sampling error of CV·mean/√n (the standard error of a mean). On real traffic that error is
the size of the window-to-window change itself (benchmarks/results/gauss_reuse.md: 4–5% per
window, 6–7% apart), so models fed the latest window alone follow its noise: BCA's cap, the
KV reservation and GAUSS's λ* move every window, and each move is a new λ search. Pooling the
windows whose means agree with the pooled estimate within ``POOL_Z`` standard errors of their
difference (a two-sample z-test on each mean) shrinks the error by √(windows pooled), while a
shift of the mix stops the pooling at once: the first window that disagrees, and every window
before it, are left out, so the estimate is the new mix's from its first window on.

Pooled moments are request-weighted: mean M = Σnₖmₖ / Σnₖ and second moment
Σnₖmₖ²(1 + cₖ²) / Σnₖ, so the pooled CV is √(E[x²]/M² − 1) (the law of total variance: the
spread within windows plus the spread of their means). Only the lengths are pooled; rates,
tails and batch statistics stay the latest window's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from kneecap.observe.observation import Observation

POOL_Z = 3.0  # a window whose mean differs by more than this many standard errors is another mix
POOL_MAX_WINDOWS = 8  # the most windows pooled (the estimate still follows a slow drift)


def _requests(obs) -> float:
    """Requests finished in the window (the ring keeps their rate and the window's length)."""
    return float(obs.request_rate_rps) * float(obs.window_s)


def _usable(obs) -> bool:
    vals = (obs.request_rate_rps, obs.window_s, obs.input_len_mean, obs.output_len_mean, obs.output_len_cv)
    return (all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in vals)
            and _requests(obs) >= 1.0 and obs.input_len_mean > 0 and obs.output_len_mean > 0)


def _weighted_moments(obs, requests: float, input_cv: float) -> list[float]:
    """``requests`` × (prompt mean, its E[x²], output mean, its E[x²]) of one window, E[x²] = m²(1 + c²)."""
    return [requests * obs.input_len_mean, requests * obs.input_len_mean ** 2 * (1.0 + input_cv ** 2),
            requests * obs.output_len_mean, requests * obs.output_len_mean ** 2 * (1.0 + obs.output_len_cv ** 2)]


def pooled(latest: Observation, ring: Sequence, z: float = POOL_Z,
           max_windows: int = POOL_MAX_WINDOWS) -> tuple[Observation, int]:
    """(``latest`` with its length means and CVs pooled over the windows of ``ring`` (oldest
    first; Observations or the ring's entries) before it that agree with it, the number of
    windows pooled, ``latest`` included). Its ``finished_requests`` are then the requests the
    lengths are estimated from. ``latest`` is returned unchanged when it has no finished request
    to weigh, or nothing agrees.

    The ring keeps no prompt-length CV: a ring window's is taken to be the latest's (the test
    asks whether the windows are one mix, and under that hypothesis they share it)."""
    if not _usable(latest) or not math.isfinite(latest.input_len_cv):
        return latest, 1
    cv_in = latest.input_len_cv
    n = _requests(latest)
    sums = _weighted_moments(latest, n, cv_in)  # request-weighted sums over the windows pooled
    count = 1
    for obs in reversed([o for o in ring if o is not latest and o.t_end_s < latest.t_end_s]):
        if count >= max_windows:
            break
        if not _usable(obs):
            continue  # an idle window says nothing about the mix
        k = _requests(obs)
        window = _weighted_moments(obs, k, cv_in)
        # each mean against the pooled one, with the pooled spread (as under one mix)
        if any(abs(window[m] / k - sums[m] / n) > z * math.sqrt(max(sums[m + 1] / n - (sums[m] / n) ** 2, 0.0))
               * math.sqrt(1.0 / n + 1.0 / k) for m in (0, 2)):
            break  # a shift: this window and the ones before it are another mix
        sums = [a + b for a, b in zip(sums, window)]
        n += k
        count += 1
    if count == 1:
        return latest, 1
    m_in, m_out = sums[0] / n, sums[2] / n
    cv = lambda mean, second: math.sqrt(max(second / (mean * mean) - 1.0, 0.0))  # noqa: E731
    return dataclasses.replace(latest, input_len_mean=m_in, input_len_cv=cv(m_in, sums[1] / n),
                               output_len_mean=m_out, output_len_cv=cv(m_out, sums[3] / n),
                               finished_requests=n), count
