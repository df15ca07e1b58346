"""A scale-down sized for a rising rate and for the spread of the pool's work
(kneecap.control.replica_stabilisation.rising_rate_rps, load_margin)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from kneecap.control.replica_stabilisation import load_margin, rising_rate_rps


def windows(rates, window_s=30.0, t0=0.0, inputs=None, outputs=None):
    n = len(rates)
    inputs = [1000.0] * n if inputs is None else inputs
    outputs = [200.0] * n if outputs is None else outputs
    return [SimpleNamespace(t_end_s=t0 + (i + 1) * window_s, window_s=window_s, request_rate_rps=float(r),
                            input_len_mean=float(inputs[i]), output_len_mean=float(outputs[i]))
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


def test_steady_work_needs_no_margin_and_a_spread_one_needs_z_of_its_spread():
    steady = windows([10] * 8)
    assert load_margin(steady, steady[-1].t_end_s, 300.0, 1.0) == 1.0
    # the same prefill work per window, however the rate and the prompts trade off
    traded = windows([10, 20, 10, 20, 10, 20], inputs=[2000, 1000, 2000, 1000, 2000, 1000], outputs=[200] * 6)
    prefill = np.array([20_000, 20_000, 20_000, 20_000, 20_000, 20_000])
    decode = np.array([2000, 4000, 2000, 4000, 2000, 4000])
    cv_decode = decode.std(ddof=1) / decode.mean()
    assert prefill.std() == 0
    assert load_margin(traded, traded[-1].t_end_s, 300.0, 1.0) == pytest.approx(1 + cv_decode, rel=1e-12)
    assert load_margin(traded, traded[-1].t_end_s, 300.0, 2.0) == pytest.approx(1 + 2 * cv_decode, rel=1e-12)
    assert load_margin(traded, traded[-1].t_end_s, 300.0, 0.0) == 1.0  # scaleDownDeviations 0: no margin
    # long prompts that come and go: the prefill work's spread counts
    prompts = windows([5] * 6, inputs=[3000, 3000, 3000, 3000, 3000, 6000])
    work = np.array([15_000] * 5 + [30_000])
    assert load_margin(prompts, prompts[-1].t_end_s, 300.0, 1.0) == pytest.approx(
        1 + work.std(ddof=1) / work.mean(), rel=1e-12)


def test_only_the_span_counts_and_a_short_history_gives_no_margin():
    old_swing_then_steady = windows([40, 5, 40, 5, 10, 10, 10, 10, 10])  # 30 s windows
    now = old_swing_then_steady[-1].t_end_s
    assert load_margin(old_swing_then_steady, now, 120.0, 1.0) == 1.0  # the last five windows
    assert load_margin(old_swing_then_steady, now, 300.0, 1.0) > 1.5
    few = windows([5, 40, 5])
    assert load_margin(few, few[-1].t_end_s, 300.0, 1.0) == 1.0
