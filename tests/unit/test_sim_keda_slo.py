"""llm-d's SLO-aware KEDA recipe as a replay baseline: the control law's cases as the recipe
states them, its signal from the window's requests, the HPA's behavior block (a scale-down of
one pod per 120 s), and a replay in which it adds pods when the pool misses its SLO."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from kneecap.control.kube import deployments_path
from kneecap.emulation.store import Store
from kneecap.errors import InputError
from kneecap.sim import keda_slo
from kneecap.sim.cluster import Requests
from kneecap.sim.hpa import HPASpec
from kneecap.sim.replay import ReplayConfig, run_policy, score
from kneecap.sim.trace import read_trace
from tests.support.replay_traces import write_trace

SPEC = keda_slo.KedaSLOSpec()


@pytest.mark.parametrize("s, n, ready, expected", [
    (0.0, 4, 4, 0),            # idle: n − ⌊n⌋
    (0.2, 4, 4, 2),            # below θ_dn 0.40: 4 − ⌊4 × 0.5⌋
    (0.5, 4, 4, 4),            # in the band: hold
    (1.1, 4, 4, 8),            # above θ_up 0.55: 4 + ⌈4 × (2 − 1)⌉
    (1.1, 4, 2, 4),            # credited by r/n = 0.5 while two pods warm: 4 + ⌈4 × (1 − 1)⌉
    (0.2, 4, 2, 2),            # a scale-down is not credited
])
def test_the_formula_gives_the_recipes_replicas(s, n, ready, expected):
    assert keda_slo.desired_replicas(SPEC, s, n, ready) == expected


def _requests(arrival_s, first_s, finish_s, outputs) -> Requests:
    rq = Requests(np.asarray(arrival_s, float), np.full(len(arrival_s), 100), np.asarray(outputs))
    rq.first_token_s[:] = first_s
    rq.finish_s[:] = finish_s
    return rq


def test_the_signal_is_the_worst_quantile_over_its_slo_in_the_last_minute():
    # ten requests in the last minute: TTFT 0.1 … 1.0 s, TPOT 10 ms; one older with a 9 s TTFT
    arrival = np.r_[np.arange(10) + 100.0, 0.0]
    ttft = np.r_[np.arange(1, 11) / 10.0, 9.0]
    first = arrival + ttft
    finish = first + 0.01 * 99
    rq = _requests(arrival, first, finish, np.full(11, 100))
    s = keda_slo.saturation(rq, 120.0, 60.0, 0.9, slo_ttft_s=2.0, slo_tpot_s=0.05)
    assert s == pytest.approx(float(np.quantile(ttft[:10], 0.9)) / 2.0)
    assert keda_slo.saturation(rq, 120.0, 60.0, 0.9, slo_ttft_s=20.0, slo_tpot_s=0.005) == pytest.approx(2.0)  # TPOT
    assert keda_slo.saturation(rq, 500.0, 60.0, 0.9, slo_ttft_s=2.0, slo_tpot_s=0.05) == 0.0  # no traffic


@dataclass
class Pod:
    ready: bool = True
    terminating_since_s: float | None = None
    failed: str | None = None


def test_an_idle_pool_drains_one_pod_per_two_minutes_after_the_stabilisation_window():
    api = Store(lambda: 0.0)
    api.create_now(deployments_path("ns"), {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                                            "spec": {"replicas": 4, "template": {}}})
    scaler = keda_slo.KedaSLOAutoscaler(SPEC, HPASpec(min_replicas=1, max_replicas=8), api, "ns", "d",
                                        quantile=0.95, slo_ttft_s=1.0, slo_tpot_s=0.05, steady_at=(0.0, 4))
    idle = _requests([], [], [], [])
    t = 15.0
    while t <= 600.0:
        scaler.sync(t, idle, [Pod() for _ in range(api.peek(deployments_path("ns", "d"))["spec"]["replicas"])])
        t += 15.0
    # the recommendation of 4 at t=0 holds the pool until it leaves the 180 s window; then 1 per 120 s
    assert [(e["t_s"], e["from"], e["to"]) for e in scaler.scales] == [(195.0, 4, 3), (315.0, 3, 2), (435.0, 2, 1)]


def test_a_bad_recipe_is_refused_naming_the_field():
    with pytest.raises(InputError) as err:
        keda_slo.KedaSLOSpec(theta_up=0.3, theta_down=0.4).check()
    assert err.value.field == "keda.theta"


def test_a_pool_that_misses_its_slo_is_scaled_up_by_the_recipe(tmp_path):
    """One pod of the defaults cannot hold 1 s p95 TTFT at this rate; the recipe adds pods."""
    trace = read_trace(write_trace(tmp_path, 14.0, 400.0))
    cfg = ReplayConfig(min_replicas=1, max_replicas=6, start_replicas=1)
    run = run_policy(trace, cfg, "keda-slo", start_replicas=1)
    assert run.decisions and run.decisions[0]["from"] == 1 and run.decisions[0]["to"] > 1
    assert max(e["to"] for e in run.decisions) <= 6
    s = score(cfg, run, trace.span_s)
    assert s["completed"] + s["lost"] + s["rejected"] == s["requests"] and math.isfinite(s["mean_replicas"])
    assert s["mean_replicas"] > 1.0
