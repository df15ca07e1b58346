"""The SLO's error budget (kneecap.control.slo_budget) and the scale-up it holds (plan)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from kneecap.control import plan, slo_budget, status as status_helpers
from kneecap.control.spec import parse_spec
from kneecap.emulation.merge_patch import merge_patch
from tests.support.plan_inputs import NOW, RAW, gathered, live_pool, ring_status
from tests.support.profile_observations import observation


def test_the_budget_counts_requests_not_windows_and_old_ones_fade():
    b = slo_budget.updated(slo_budget.Budget(), 20.0, 0.1, 1000.0, interval_s=30.0, window_s=60.0)
    assert (b.requests, b.missed, b.time_s) == (600.0, 60.0, 1000.0)  # the first interval: 20 req/s × 30 s
    # 30 s later: the old counts decay by e^(-30/3600) and 30 s of the new window's rate join them
    c = slo_budget.updated(b, 10.0, 0.0, 1030.0, interval_s=30.0, window_s=60.0)
    keep = math.exp(-30.0 / slo_budget.PERIOD_S)
    assert c.requests == pytest.approx(600.0 * keep + 300.0) and c.missed == pytest.approx(60.0 * keep)
    # a tick after a long gap adds one window's requests, not the gap's (the rate is the window's)
    d = slo_budget.updated(c, 10.0, 0.5, 1030.0 + 3600.0, interval_s=30.0, window_s=60.0)
    assert d.requests == pytest.approx(c.requests / math.e + 600.0) and d.missed == pytest.approx(c.missed / math.e + 300.0)
    # the same instant again, a NaN rate or share: nothing is added, nothing is lost
    assert slo_budget.updated(d, 10.0, 0.5, d.time_s, 30.0, 60.0) == d
    assert slo_budget.updated(d, float("nan"), 0.5, d.time_s + 30, 30.0, 60.0) == d
    assert slo_budget.updated(d, 10.0, float("nan"), d.time_s + 30, 30.0, 60.0).missed == pytest.approx(
        d.missed * math.exp(-30.0 / slo_budget.PERIOD_S))


def test_the_budget_survives_a_status_round_trip_and_garbage_reads_as_empty():
    b = slo_budget.Budget(1234.5, 12.25, NOW)
    assert slo_budget.from_status(b.to_status()) == slo_budget.Budget(1234.5, 12.2, NOW)  # (rounded to 0.1)
    for garbage in (None, {}, {"requests": "x", "missedRequests": 1, "time": "2027-01-15T08:00:00Z"},
                    {"requests": 10, "missedRequests": 11, "time": "2027-01-15T08:00:00Z"},  # more missed than sent
                    {"requests": float("inf"), "missedRequests": 1, "time": "2027-01-15T08:00:00Z"},
                    {"requests": 10, "missedRequests": 1, "time": "yesterday"}):
        assert slo_budget.from_status(garbage) == slo_budget.Budget()


def test_room_to_hold_is_what_the_quantile_allows_of_all_the_requests_then():
    b = slo_budget.Budget(10_000.0, 200.0, NOW)  # 2% surely missed of 10,000 (p95 allows 500)
    # 100 s at 20 req/s missing 10%: 200 + 200 ≤ 5% of 12,000 = 600
    assert slo_budget.room_to_hold(b, 0.95, 20.0, 0.10, 100.0)
    # missing 25%: 200 + 500 > 600
    assert not slo_budget.room_to_hold(b, 0.95, 20.0, 0.25, 100.0)
    # a p99 allows a fifth of that: 200 + 200 > 120
    assert not slo_budget.room_to_hold(b, 0.99, 20.0, 0.10, 100.0)
    # an empty budget (the first windows) or an unknown share holds nothing
    assert not slo_budget.room_to_hold(slo_budget.Budget(), 0.95, 20.0, 0.0, 100.0)
    assert not slo_budget.room_to_hold(b, 0.95, 20.0, None, 100.0)


def _tail_window(curve, ttft_p95_s: float, longer: float = 1.0):
    """A window at 50 req/s, more than GAUSS lets one pod serve at the SLO, whose TPOT tail
    surely missed for 8% of its requests; its prompts ``longer`` times the ring's."""
    o = observation(curve[32])
    return replace(o, t_end_s=NOW, request_rate_rps=50.0, ttft_p95_s=ttft_p95_s, tpot_p95_s=0.08,
                   tpot_p95_floor_s=0.075, slo_missed_fraction=0.08, input_len_mean=o.input_len_mean * longer)


SLO_SPEC = parse_spec({**RAW, "topology": {"replicas": {"min": 1, "max": 4}},
                       "slo": {"ttftSeconds": 1.0, "tpotSeconds": 0.05}})


@pytest.mark.parametrize("budget, ttft_p95_s, longer, held", [
    ({"requests": 100_000.0, "missedRequests": 500.0}, 0.4, 1.0, True),  # 0.5% spent of 5%: the tail is absorbed
    ({"requests": 100_000.0, "missedRequests": 4_900.0}, 0.4, 1.0, False),  # spent: the pod is added
    ({"requests": 100_000.0, "missedRequests": 500.0}, 1.5, 1.0, False),  # the queue builds (TTFT p95 past its SLO)
    ({"requests": 100_000.0, "missedRequests": 500.0}, 0.4, 2.0, False),  # prompts the pool never served: no tail
    (None, 0.4, 1.0, False),  # no budget counted yet
])
def test_a_scale_up_of_a_stable_pool_waits_while_the_error_budget_absorbs_its_tail(curve, budget, ttft_p95_s, longer,
                                                                                   held):
    status, ring = ring_status(curve)
    if budget is not None:
        status["sloBudget"] = {**budget, "time": status_helpers.iso(NOW - 30.0)}
    obs = _tail_window(curve, ttft_p95_s, longer)
    # the cap applied a minute ago: the flags wait out the cooldown, the replicas are sized at the live cap
    applied = {"maxNumSeqs": 32, "gpuMemoryUtilization": 0.9, "replicas": 1, "time": status_helpers.iso(NOW - 60),
               "reason": "Recommended", "restart": True}
    p = plan.plan(gathered(plan.PoolWindow("server", live_pool(applied), plan.OBSERVED, observation=obs), ring),
                  status, SLO_SPEC, NOW)
    alloc, counted = p.status["allocation"], p.status["sloBudget"]
    # this window's requests were counted: 30 s at 50 req/s, 8% of them surely missed
    before = budget or {"requests": 0.0, "missedRequests": 0.0}
    keep = math.exp(-30.0 / slo_budget.PERIOD_S)
    assert counted["requests"] == pytest.approx(before["requests"] * keep + 1500.0, abs=0.1)
    assert counted["missedRequests"] == pytest.approx(before["missedRequests"] * keep + 120.0, abs=0.1)
    replicas = p.status["lastDecision"]["target"]["replicas"]
    if held:
        assert replicas == 1 and p.patches == () and "errorBudgetHold" in alloc
        assert "replicas 1->" in alloc["errorBudgetHold"] and "TTFT p95 0.4s ≤ 1s" in alloc["errorBudgetHold"]
    else:
        assert replicas > 1 and "errorBudgetHold" not in alloc
    assert (alloc["servedRequestsPerSecondPerReplica"] is None) == (longer > 1)


def test_a_status_patch_clears_the_hold_and_the_fields_a_tick_no_longer_sets():
    """A merge patch (RFC 7386, as the apiserver applies it) keeps what it does not name; the
    patch a tick writes replaces each object it writes, so a hold that ended leaves the status,
    at any depth, while the objects it does not write (another writer's) stay."""
    before = {"allocation": {"replicas": 4, "errorBudgetHold": "replicas 4->5 held: ...",
                             "binding": {"decode": "tbt_slo", "prefill": "ttft"}},
              "workload": {"pool": "server", "ttftP95Seconds": 0.7, "tpotP95Seconds": 0.04},
              "placement": {"node": "a"}, "observations": [{"t": 1}, {"t": 2}]}
    after = {"allocation": {"replicas": 5, "binding": {"decode": "served"}},
             "workload": {"pool": "server", "tpotP95Seconds": 0.05}, "observations": [{"t": 2}]}
    patch = status_helpers.replacing(before, after)
    assert patch["allocation"]["errorBudgetHold"] is None and patch["workload"]["ttftP95Seconds"] is None
    assert merge_patch(before, patch) == {**after, "placement": {"node": "a"}}
    assert status_helpers.replacing({}, after) == after  # nothing to clear on a first write
