"""A tick on a body the watch has not brought up to date keeps what the last ticks wrote.

The control timer starts from kopf's copy of the resource, which its watch keeps current. After
an apiserver restart kopf's watch reconnects with backoff, seconds after the API answers
writes again (tests/kube/test_leader_restart.py), and meanwhile each tick started from the
status as it was before the outage: a window written by one tick was dropped from the ring by
the next. The ring a tick writes now holds every window written before it while the body's
resourceVersion stands still (loop.pending_status), and the body again once it moves.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from dataclasses import replace

import kopf

from kneecap.control import handlers, loop, plan
from kneecap.control.metrics import OperatorMetrics
from tests.support.handler_harness import RoundTripClient, handler, running
from tests.support.profile_observations import observation
from tests.support.specs import llmd

STATUS = "/apis/kneecap.io/v1alpha1/namespaces/serving/llmdeployments/llm/status"


def test_ticks_on_a_body_that_stands_still_keep_every_window_they_wrote(curve, no_kopf_events, monkeypatch):
    clock = [1_800_000_000.0]
    windows = iter(replace(observation(curve[c]), t_end_s=1_800_000_000.0 + 2.0 * i, window_s=2.0)
                   for i, c in enumerate((8, 16, 32, 64, 128)))

    async def observe_pool(ctx, mem, ns, name, spec, state):  # one closed window a tick
        return plan.PoolWindow(state.pool.role, state, plan.OBSERVED, "", next(windows))

    monkeypatch.setattr(loop, "observe_pool", observe_pool)
    registry = handlers.build_registry(handlers.OperatorConfig(tick_s=0.5, now=lambda: clock[0]))
    control = handler(registry, "control")
    kube = RoundTripClient(rtt_s=0.0)
    memo = kopf.Memo(kube=kube, metrics=OperatorMetrics())
    body = llmd("llm", control={"interval": "2s", "window": "2s"})
    body["metadata"].update(uid="llm-uid", generation=1, resourceVersion="7")

    def tick(on: dict) -> dict:
        asyncio.run(control(body=kopf.Body(copy.deepcopy(on)), patch=kopf.Patch(), memo=memo,
                            logger=logging.getLogger("test"), stopped=running()))
        clock[0] += 2.0
        (path, status), = [w for w in kube.statuses[-1:]]
        assert path == STATUS
        return status

    def ends(status: dict) -> list[float]:
        return [e["windowEndUnixSeconds"] - 1_800_000_000.0 for e in status["observations"]]

    # the watch is down: the body stays at resourceVersion 7, with the ring as it was (empty)
    assert ends(tick(body)) == [0.0]
    assert ends(tick(body)) == [0.0, 2.0]
    third = tick(body)
    assert ends(third) == [0.0, 2.0, 4.0]  # (before the fix: [4.0], each window dropping the last)
    # the watch is back: the body has moved on, with what was written; the ticks follow it
    caught_up = {**body, "metadata": {**body["metadata"], "resourceVersion": "12"}, "status": third}
    assert ends(tick(caught_up)) == [0.0, 2.0, 4.0, 6.0]
    assert memo["loop"].written_over == "12"
    # a body that moved with a ring someone else wrote (another replica, a user) is taken as it is
    other = {**caught_up, "metadata": {**body["metadata"], "resourceVersion": "15"},
             "status": {"observations": third["observations"][:1]}}
    assert ends(tick(other)) == [0.0, 8.0]
