"""The autoscaling-oracle bound of benchmarks/trace_replay.py: the cheapest replica schedule that
covers each window's need under a model-load cost and a scale-down cooldown."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.trace_replay import _cheapest_schedule

WIDTHS = np.full(8, 60.0)
NEED = [3, 4, 2, 2, 2, 2, 2, 2]


def test_without_cooldown_the_schedule_is_the_need_plus_one_load():
    plan, gpu_s = _cheapest_schedule(NEED, WIDTHS, 37.0, 0.0, 8)
    assert plan == NEED
    assert gpu_s == pytest.approx(sum(NEED) * 60.0 + 37.0)


def test_cooldown_forbids_the_quick_scale_down_and_the_oracle_starts_high_instead():
    # 3 → 4 at 60 s would hold 4 until 360 s (1657 GPU-s); starting at 4 lets it drop to 2 at 120 s
    plan, gpu_s = _cheapest_schedule(NEED, WIDTHS, 37.0, 300.0, 8)
    assert plan == [4, 4, 2, 2, 2, 2, 2, 2]
    assert gpu_s == pytest.approx(4 * 60.0 * 2 + 2 * 60.0 * 6)


def test_scale_downs_one_after_another_do_not_wait_only_a_scale_up_starts_the_cooldown():
    need = [5, 4, 3, 2, 2, 2, 2, 2]
    plan, gpu_s = _cheapest_schedule(need, WIDTHS, 37.0, 300.0, 8)
    assert plan == need
    assert gpu_s == pytest.approx(sum(need) * 60.0)
    plan, _ = _cheapest_schedule([2, 5, 2, 2, 2, 2, 2, 2], WIDTHS, 37.0, 300.0, 8)
    assert plan == [5, 5, 2, 2, 2, 2, 2, 2]  # starting at the peak is cheaper than loading 3 pods and holding 300 s


def test_every_window_gets_at_least_its_need():
    rng = np.random.default_rng(1)
    need = list(rng.integers(1, 6, 12))
    plan, gpu_s = _cheapest_schedule(need, np.full(12, 60.0), 37.0, 300.0, 8)
    assert all(p >= n for p, n in zip(plan, need))
    assert gpu_s >= sum(need) * 60.0
