"""The tick's I/O half: on real vLLM pages (tests/fixtures/vllm-metrics) each pod's scrapes are
kept to one window, whatever another pod does, and a broken page closes its window as
MetricsUnusable, naming why (a status write that fails, reported and merged into the next one:
tests/kube/test_operator_faults.py)."""

from __future__ import annotations

import asyncio
import re

from kneecap.control import loop, plan, tick
from kneecap.control.metrics import OperatorMetrics
from kneecap.observe.scrape import ScrapeHTTPError, parse_metrics
from tests.support.data import read_capture
from tests.support.plan_inputs import OWNER, SPEC, live_pool

GOOD = ("http://10.0.0.1:8000/metrics", "http://10.0.0.2:8000/metrics")
BAD = "http://10.0.0.3:8000/metrics"


def page() -> str:
    return read_capture("vllm-0.32-cpu-20req.txt")


def context(pages: dict[str, str | None], clock: list[float]) -> loop.LoopContext:
    async def scrape(url: str):
        text = pages[url]
        if text is None:
            raise ScrapeHTTPError(url, 500)
        return parse_metrics(text, url=url, t_s=clock[0], keep=loop.WINDOW_FAMILIES)
    return loop.LoopContext(kube=None, metrics=OperatorMetrics(), event=lambda *a: None, scrape=scrape)


def test_one_pod_failing_for_1000_ticks_keeps_the_others_scrapes_to_one_window():
    text = page()
    clock = [1000.0]
    ctx = context({GOOD[0]: text, GOOD[1]: text, BAD: None}, clock)
    mem, state = loop.LoopMemory(), live_pool()
    per_window = int(SPEC.control.window_s / SPEC.control.interval_s) + 1  # 60 s window, 30 s ticks: 3
    most = 0
    for _ in range(1000):
        w = asyncio.run(loop.observe_window(ctx, mem, SPEC, state, [*GOOD, BAD]))
        assert w.outcome == tick.SCRAPE_FAILED and w.scrape_errors == 1 and BAD in w.message
        most = max(most, *(len(mem.snapshots["server"][u]) for u in GOOD))
        clock[0] += SPEC.control.interval_s
    assert most == per_window and BAD not in mem.snapshots["server"]
    # the failing pod goes away: it is forgotten and the others' window (still one window long) closes
    w = asyncio.run(loop.observe_window(ctx, mem, SPEC, state, list(GOOD)))
    assert set(mem.snapshots["server"]) == set(GOOD)
    assert w.outcome == plan.IDLE  # the same page twice: nothing ran in between
    assert all(len(mem.snapshots["server"][u]) == 1 for u in GOOD)  # the next window opens


def test_a_garbage_page_closes_its_window_as_unusable_naming_what():
    text = page()
    clock = [1000.0]
    pages = {GOOD[0]: text}
    ctx = context(pages, clock)
    mem, state = loop.LoopMemory(), live_pool()
    assert asyncio.run(loop.observe_window(ctx, mem, SPEC, state, [GOOD[0]])).outcome == tick.OPEN  # priming
    clock[0] += 60.0
    pages[GOOD[0]] = re.sub(r"^(vllm:num_requests_running\{.*\}) \S+$", r"\1 NaN", text, flags=re.M)
    w = asyncio.run(loop.observe_window(ctx, mem, SPEC, state, [GOOD[0]]))
    assert w.outcome == plan.UNUSABLE and w.message == f"{GOOD[0]}: invalid_value:vllm:num_requests_running"
    clock[0] += 60.0
    pages[GOOD[0]] = text[: text.index("vllm:e2e_request_latency_seconds_bucket") + 60]  # cut mid-family
    w = asyncio.run(loop.observe_window(ctx, mem, SPEC, state, [GOOD[0]]))
    assert (w.outcome, w.message) == (plan.UNUSABLE, f"{GOOD[0]}: truncated:vllm:e2e_request_latency_seconds_count")


class _ReadsFailingOnce:
    """Deployment reads that fail once (the reconcile) and then answer (the read-only fallback)."""

    def __init__(self, deploy: dict):
        self.deploy, self.calls = deploy, 0

    async def hpas(self, ns):
        return []

    async def pods(self, ns, instance, role):
        return []

    async def deployment(self, ns, name):
        self.calls += 1
        if self.calls == 1:
            from kneecap.control.kube import ApiError
            raise ApiError(503, {"message": "etcd timeout"}, f"GET deployments/{name}")
        return self.deploy


def test_after_a_failed_reconcile_only_a_deployment_kneecap_owns_is_observed():
    ours = live_pool().deployment
    theirs = {**ours, "metadata": {**ours["metadata"], "ownerReferences": [], "labels": {"app": "payments"}}}
    for deploy, pools in ((ours, 1), (theirs, 0)):
        ctx = loop.LoopContext(kube=None, metrics=OperatorMetrics(), event=lambda *a: None,
                               reads=_ReadsFailingOnce(deploy), scrape=lambda url: None)
        g, _ = asyncio.run(loop.gather(ctx, {**OWNER, "spec": {}}, SPEC, loop.LoopMemory()))
        assert g.reconcile_failed and g.api_failures and g.api_failures[0].code == 503
        assert len(g.pools) == pools  # the foreign one is neither scraped nor planned for
