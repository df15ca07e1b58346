"""HPA semantics: tolerance, ⌈current × ratio⌉, unready pods, stabilisation windows, rate limit."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kneecap.control.kube import deployments_path
from kneecap.errors import InputError
from kneecap.sim.hpa import HorizontalPodAutoscaler, HPASpec, desired_replicas
from kneecap.emulation.store import Store

SPEC = HPASpec(metric="kv", target=0.5, min_replicas=1, max_replicas=20)


def test_within_tolerance_nothing_moves():
    assert desired_replicas(SPEC, 4, [0.54, 0.54, 0.54, 0.54], 0) == 4  # ratio 1.08 ≤ 1.1
    assert desired_replicas(SPEC, 4, [0.46] * 4, 0) == 4  # ratio 0.92


def test_desired_is_ceil_of_current_times_ratio():
    assert desired_replicas(SPEC, 3, [0.9, 0.9, 0.9], 0) == 6  # ⌈3 × 1.8⌉
    assert desired_replicas(SPEC, 3, [0.6, 0.6, 0.61], 0) == 4  # ⌈3 × 1.2067⌉
    assert desired_replicas(SPEC, 4, [0.1] * 4, 0) == 1  # ⌈4 × 0.2⌉


def test_unready_pods_count_as_zero_up_and_as_target_down():
    # two ready at 0.9, one loading: (1.8 + 0) / (3 × 0.5) = 1.2 -> ⌈3.6⌉
    assert desired_replicas(SPEC, 3, [0.9, 0.9], 1) == 4
    # one ready at 0.6 (ratio 1.2) but two loading at 0: 0.6/1.5 = 0.4 reverses direction -> hold
    assert desired_replicas(SPEC, 3, [0.6], 2) == 3
    # scale-down: ready at 0.1, the loading pod counts at the target: (0.1 + 0.5) / 1.0 = 0.6 -> ⌈1.2⌉
    assert desired_replicas(SPEC, 2, [0.1], 1) == 2


@dataclass
class FakeEngine:
    kv_usage: float
    waiting: tuple = ()


@dataclass
class Pod:
    engine: FakeEngine
    ready: bool = True
    terminating_since_s: float | None = None
    failed: str | None = None


def _hpa(replicas: int, spec: HPASpec = SPEC):
    api = Store(lambda: 0.0)
    api.create_now(deployments_path("ns"), {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                                            "spec": {"replicas": replicas, "template": {}}})
    return api, HorizontalPodAutoscaler(spec, api, "ns", "d")


def _replicas(api) -> int:
    return api.peek(deployments_path("ns", "d"))["spec"]["replicas"]


def test_scale_up_at_once_scale_down_after_the_window():
    api, hpa = _hpa(2)
    assert hpa.sync(0.0, [Pod(FakeEngine(1.0)), Pod(FakeEngine(1.0))]) == 4  # up: no window
    assert _replicas(api) == 4
    low = [Pod(FakeEngine(0.1)) for _ in range(4)]
    t = 15.0
    while t < 300.0:  # the 4 of t=0 stays in the 300 s window: no scale-down yet
        assert hpa.sync(t, low) is None
        t += 15.0
    assert hpa.sync(300.0, low) is None and _replicas(api) == 4  # t=0 still inside [0, 300]
    assert hpa.sync(315.0, low) == 1  # the window only holds recommendations of 1 now
    assert hpa.scales == [{"t_s": 0.0, "from": 2, "to": 4}, {"t_s": 315.0, "from": 4, "to": 1}]


def test_scale_up_rate_limit_and_bounds():
    api, hpa = _hpa(1, HPASpec(target=0.05, max_replicas=100))
    assert hpa.sync(0.0, [Pod(FakeEngine(1.0))]) == 5  # ⌈1 × 20⌉ = 20, limited to max(2×1, 1+4)
    api, hpa = _hpa(1, HPASpec(target=0.05, max_replicas=3))
    assert hpa.sync(0.0, [Pod(FakeEngine(1.0))]) == 3


def test_waiting_metric_and_bad_specs():
    api, hpa = _hpa(1, HPASpec(metric="waiting", target=5))
    assert hpa.sync(0.0, [Pod(FakeEngine(0.0, waiting=tuple(range(12))))]) == 3  # ⌈12 / 5⌉
    with pytest.raises(InputError) as e:
        HPASpec(metric="cpu").check()
    assert e.value.field == "hpa.metric"
    with pytest.raises(InputError):
        HPASpec(target=0).check()
