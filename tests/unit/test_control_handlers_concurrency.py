"""kopf runs one resource's spec handlers and its control timer concurrently; both reconcile.

On the real API (tests/kube/test_leader_restart.py) the create handler and the first tick of a
new LLMDeployment both read "no Deployment" and both POSTed it, 6 ms apart (the second refused
with 409 Conflict), and the Service likewise. They now reconcile one at a time under the
resource's lock (handlers.reconcile_lock): the later one reads what the earlier one made and
writes nothing. The handlers are called as kopf calls them, on a client whose every call is
one round trip (the event loop runs the other coroutine meanwhile).
"""

from __future__ import annotations

import asyncio
import copy
import logging

import kopf

from kneecap.control import handlers
from kneecap.control.metrics import OperatorMetrics
from tests.support.handler_harness import RoundTripClient, handler, running
from tests.support.specs import llmd


def create_and_tick_at_once() -> tuple[RoundTripClient, kopf.Memo]:
    """The create handler and the control timer's first tick of a new LLMDeployment, together."""
    registry = handlers.build_registry(handlers.OperatorConfig(tick_s=0.5, scrape_timeout_s=0.1))
    reconcile, control = handler(registry, "reconcile"), handler(registry, "control")
    kube = RoundTripClient()
    body = llmd("llm")
    body["metadata"].update(uid="llm-uid", generation=1, resourceVersion="1")
    memo = kopf.Memo(kube=kube, metrics=OperatorMetrics())  # (no caches: the tick reads the client)
    logger = logging.getLogger("test")

    async def both():
        await asyncio.gather(
            reconcile(body=kopf.Body(copy.deepcopy(body)), patch=kopf.Patch(), memo=memo, logger=logger,
                      reason="create"),
            control(body=kopf.Body(copy.deepcopy(body)), patch=kopf.Patch(), memo=memo, logger=logger,
                    stopped=running()))

    asyncio.run(both())
    return kube, memo


DEPLOYMENTS, SERVICES = "/apis/apps/v1/namespaces/serving/deployments", "/api/v1/namespaces/serving/services"


def test_the_create_handler_and_the_first_tick_reconcile_one_at_a_time(no_kopf_events):
    kube, memo = create_and_tick_at_once()
    assert [w for w in kube.writes if w[0] == "create"] == [("create", DEPLOYMENTS), ("create", SERVICES)]
    assert not [w for w in kube.writes if w[0] == "patch" and "/status" not in w[1]], kube.writes  # nothing re-applied
    assert ("patch", "/apis/kneecap.io/v1alpha1/namespaces/serving/llmdeployments/llm/status") in kube.writes
    assert isinstance(memo["reconcile_lock"], asyncio.Lock) and not memo["reconcile_lock"].locked()


def test_without_the_lock_both_create(no_kopf_events, monkeypatch):
    """The race the lock closes, on the same client: each reconcile with a lock of its own."""
    monkeypatch.setattr(handlers, "reconcile_lock", lambda memo: asyncio.Lock())
    kube, _ = create_and_tick_at_once()
    assert [w for w in kube.writes if w[0] == "create"].count(("create", DEPLOYMENTS)) == 2
