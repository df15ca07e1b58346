"""The SLO's error budget: how many of the last hour's requests surely missed, against the
share the SLO quantile allows. Pure.

An SLO at quantile q holds over many requests, not in every window: a p95 target lets 5% of
the requests miss. A pool whose tail crosses the target for a few minutes (a burst of long
prompts lengthening every decode step) while it stays stable (its queue does not build) can
spend that allowance instead of a GPU: the scale-up waits while the requests that surely missed,
plus those the current window's share would miss until a new pod could serve, stay within what
the quantile allows. A pool whose queue builds, or whose budget is spent, scales as before. Counting as the SRE error-budget practice does: requests, not windows,
over a period (``PERIOD_S``, exponentially weighted: an old miss fades rather than drops out).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kneecap.control import status as status_helpers

PERIOD_S = 3600.0  # the budget's period: requests weigh e^(−age / PERIOD_S)


@dataclass(frozen=True)
class Budget:
    """Requests and surely-missed requests, exponentially weighted to ``time_s``."""

    requests: float = 0.0
    missed: float = 0.0
    time_s: float | None = None

    def to_status(self) -> dict:
        return {"requests": round(self.requests, 1), "missedRequests": round(self.missed, 1),
                "time": status_helpers.iso(self.time_s) if self.time_s is not None else None}

    def missed_fraction(self) -> float | None:
        return self.missed / self.requests if self.requests > 0 else None


def from_status(block) -> Budget:
    """``status.sloBudget`` as written by :meth:`Budget.to_status`; an empty budget where it is
    absent or unreadable (a garbage status must not stop a decision)."""
    try:
        requests, missed = float(block["requests"]), float(block["missedRequests"])
        time_s = status_helpers.parse_iso(block["time"])
    except (KeyError, TypeError, ValueError):
        return Budget()
    if not (math.isfinite(requests) and math.isfinite(missed) and 0 <= missed <= requests) or time_s is None:
        return Budget()
    return Budget(requests, missed, time_s)


def updated(prev: Budget, rate_rps: float, missed_share: float | None, now_s: float, interval_s: float,
            window_s: float) -> Budget:
    """``prev`` decayed to ``now_s`` with the requests since its time added: the window's rate
    over the time since (at most one window: the windows overlap when the interval is shorter),
    the window's surely-missed share of them."""
    since_s = interval_s if prev.time_s is None else now_s - prev.time_s
    if not (math.isfinite(since_s) and since_s > 0):
        return prev
    if not (math.isfinite(rate_rps) and rate_rps >= 0):
        return prev
    share = min(max(missed_share, 0.0), 1.0) if missed_share is not None and math.isfinite(missed_share) else 0.0
    keep = math.exp(-since_s / PERIOD_S)
    new = rate_rps * min(since_s, window_s)
    return Budget(prev.requests * keep + new, prev.missed * keep + share * new, now_s)


def room_to_hold(b: Budget, quantile: float, rate_rps: float, missed_share: float | None, ahead_s: float) -> bool:
    """Whether the budget absorbs the misses of holding the pool as it is until a scale-up
    decided now could serve (``ahead_s``) at the current window's surely-missed share: at most
    the share the quantile allows (1 − q) of all the requests counted then. Counting the whole
    wait at the window's share, though the next tick may scale, is the margin for misses the
    buckets do not show (a target inside a bucket; a request that missed two SLOs counts once)."""
    if missed_share is None or not math.isfinite(missed_share) or b.requests <= 0:
        return False
    ahead = max(rate_rps, 0.0) * max(ahead_s, 0.0)
    return b.missed + missed_share * ahead <= (1.0 - quantile) * (b.requests + ahead)
