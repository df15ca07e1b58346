"""A scale-down sized for a rising rate (kneecap.control.replica_stabilisation.rising_rate_rps)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from kneecap.control.replica_stabilisation import rising_rate_rps


def windows(rates, window_s=30.0, t0=0.0):
    return [SimpleNamespace(t_end_s=t0 + (i + 1) * window_s, window_s=window_s, request_rate_rps=float(r))
            for i, r in enumerate(rates)]


def test_a_steady_climb_is_projected_to_when_a_scale_up_could_serve():
    ring = windows([10, 11, 12, 13, 14, 15, 16, 17, 18, 19])  # +1 req/s every 30 s window
    now = ring[-1].t_end_s
    assert rising_rate_rps(ring, now, span_s=300.0, ahead_s=90.0) == pytest.approx(19 + 3, rel=1e-6)
    # only the windows within the span count: the older half of a ring that first fell
    falling_then_rising = windows([30, 25, 20, 15, 10, 11, 12, 13, 14, 15, 16])
    now = falling_then_rising[-1].t_end_s
    assert rising_rate_rps(falling_then_rising, now, span_s=200.0, ahead_s=60.0) == pytest.approx(16 + 2, rel=1e-6)


def test_a_flat_a_falling_or_a_noisy_rate_gives_no_trend():
    rng = np.random.default_rng(7)
    flat = windows(rng.poisson(20 * 30, 10) / 30.0)  # Poisson counts at 20 req/s
    assert rising_rate_rps(flat, flat[-1].t_end_s, 300.0, 90.0) is None
    falling = windows([19, 18, 17, 16, 15, 14, 13, 12])
    assert rising_rate_rps(falling, falling[-1].t_end_s, 300.0, 90.0) is None
    # burstier than Poisson: a climb of the size of its own swings is not a trend
    bursty = windows([10, 30, 8, 28, 12, 35, 9, 33])
    assert rising_rate_rps(bursty, bursty[-1].t_end_s, 300.0, 90.0) is None
    few = windows([10, 12, 14])
    assert rising_rate_rps(few, few[-1].t_end_s, 300.0, 90.0) is None
