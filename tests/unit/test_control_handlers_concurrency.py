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
import itertools
import logging

import kopf
import pytest

from kneecap.control import handlers as H
from kneecap.control.kube import selector_matches
from kneecap.control.metrics import OperatorMetrics
from tests.support.specs import llmd


class RoundTripClient:
    """The KubeClient calls reconcile and a tick make, each awaiting one round trip, answered
    from a dict of objects by path; every write is recorded as (verb, collection)."""

    def __init__(self, rtt_s: float = 0.005):
        self.rtt_s, self.objects, self.writes = rtt_s, {}, []
        self.statuses: list[tuple[str, dict]] = []  # (path, status) of each status patch
        self._versions = itertools.count(1)

    async def _trip(self) -> None:
        await asyncio.sleep(self.rtt_s)

    async def get(self, path: str) -> dict | None:
        await self._trip()
        return copy.deepcopy(self.objects.get(path))

    async def list(self, path: str, label_selector: str | None = None) -> list[dict]:
        await self._trip()
        return [copy.deepcopy(o) for p, o in self.objects.items() if p.rsplit("/", 1)[0] == path
                and selector_matches(label_selector, o["metadata"].get("labels"))]

    async def create(self, path: str, obj: dict) -> tuple[dict, bool]:
        self.writes.append(("create", path))
        await self._trip()
        key = f"{path}/{obj['metadata']['name']}"
        if key in self.objects:  # 409, then the existing object (as KubeClient.create)
            return copy.deepcopy(self.objects[key]), False
        n = next(self._versions)
        obj = copy.deepcopy(obj)
        obj["metadata"].update(uid=f"uid-{n}", resourceVersion=str(n), generation=1)
        self.objects[key] = obj
        return copy.deepcopy(obj), True

    async def patch(self, path: str, patch, content_type: str = "") -> dict:
        self.writes.append(("patch", path))
        await self._trip()
        return copy.deepcopy(self.objects[path])

    async def patch_status(self, path: str, status: dict) -> None:
        self.writes.append(("patch", path + "/status"))
        self.statuses.append((path + "/status", copy.deepcopy(status)))
        await self._trip()

    async def delete(self, path: str) -> bool:
        self.writes.append(("delete", path))
        await self._trip()
        return self.objects.pop(path, None) is not None


def handler(registry: kopf.OperatorRegistry, handler_id: str):
    found = [h.fn for r in (registry._changing, registry._spawning) for h in r.get_all_handlers()
             if h.id == handler_id]
    return found[0]


@pytest.fixture()
def no_kopf_events(monkeypatch):
    posted = []
    monkeypatch.setattr(kopf, "event", lambda body, **kw: posted.append(kw))
    monkeypatch.setattr(kopf, "warn", lambda body, **kw: posted.append(kw))
    return posted


def create_and_tick_at_once() -> tuple[RoundTripClient, kopf.Memo]:
    """The create handler and the control timer's first tick of a new LLMDeployment, together."""
    registry = H.build_registry(H.OperatorConfig(tick_s=0.5, scrape_timeout_s=0.1))
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
            control(body=kopf.Body(copy.deepcopy(body)), patch=kopf.Patch(), memo=memo, logger=logger))

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
    monkeypatch.setattr(H, "reconcile_lock", lambda memo: asyncio.Lock())
    kube, _ = create_and_tick_at_once()
    assert [w for w in kube.writes if w[0] == "create"].count(("create", DEPLOYMENTS)) == 2
