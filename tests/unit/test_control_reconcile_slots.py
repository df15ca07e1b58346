"""The operator's reconcile slots (`kneecap run --max-concurrent-reconciles`): at most N
LLMDeployments tick at once, the others wait their turn, and every one still ticks.

On the real control plane at 1,000 LLMDeployments x 8 pods in two shards, every resource's
control timer ran its tick at once; the one-thread event loop spent seconds in other ticks'
plans between a request and its reply, and thousands of API requests per interval timed out
(status writes, reads, spec reconciles), each failure a retry and a Warning Event. Here each
resource lives in a namespace of its own, so the namespace of each API call says which tick
made it: a tick is "open" from its first call to its status patch.
"""

from __future__ import annotations

import asyncio
import copy
import logging

import kopf
import pytest

from kneecap.control import handlers
from kneecap.control.metrics import OperatorMetrics
from tests.support.handler_harness import RoundTripClient, handler, running
from tests.support.specs import llmd


class NamespaceLog(RoundTripClient):
    """RoundTripClient that records the namespace of every call, in call order."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, str]] = []  # (namespace, what)

    def _note(self, path: str, what: str) -> None:
        parts = path.split("/")
        self.calls.append((parts[parts.index("namespaces") + 1], what))

    async def get(self, path):
        self._note(path, "read")
        return await super().get(path)

    async def list(self, path, label_selector=None):
        self._note(path, "read")
        return await super().list(path, label_selector)

    async def create(self, path, obj):
        self._note(path, "write")
        return await super().create(path, obj)

    async def patch(self, path, patch, content_type=""):
        self._note(path, "write")
        return await super().patch(path, patch, content_type)

    async def patch_status(self, path, status):
        self._note(path, "status")
        return await super().patch_status(path, status)


def tick_all_at_once(resources: int, slots: int | None) -> NamespaceLog:
    """Every resource's first control tick started together, as kopf's timers start them."""
    config = handlers.OperatorConfig(tick_s=0.5, scrape_timeout_s=0.1, max_concurrent_reconciles=slots)
    control = handler(handlers.build_registry(config), "control")
    kube = NamespaceLog()
    memo = kopf.Memo(kube=kube, metrics=OperatorMetrics())
    if slots:
        memo.reconcile_slots = asyncio.Semaphore(slots)  # what the startup handler makes of the config
    bodies = []
    for i in range(resources):
        body = llmd("llm")
        body["metadata"].update(namespace=f"ns-{i}", uid=f"uid-{i}", generation=1, resourceVersion="1")
        bodies.append(body)

    async def together():
        await asyncio.gather(*[
            control(body=kopf.Body(copy.deepcopy(b)), patch=kopf.Patch(), memo=kopf.Memo(memo), logger=logging.getLogger("t"),
                    stopped=running()) for b in bodies])

    asyncio.run(together())
    return kube


def most_open(calls: list[tuple[str, str]]) -> int:
    """The most ticks open at once: begun (any call) and not yet ended (their status patch)."""
    open_now: set[str] = set()
    most = 0
    for ns, what in calls:
        open_now.add(ns)
        most = max(most, len(open_now))
        if what == "status":
            open_now.discard(ns)
    return most


@pytest.mark.parametrize("slots", [1, 3])
def test_at_most_the_slots_tick_at_once_and_every_resource_ticks(no_kopf_events, slots):
    kube = tick_all_at_once(8, slots)
    assert most_open(kube.calls) == slots
    assert sorted(ns for ns, what in kube.calls if what == "status") == sorted(f"ns-{i}" for i in range(8))


def test_without_slots_every_tick_runs_at_once(no_kopf_events):
    """What the slots bound: unbounded, all eight ticks have requests in flight together."""
    kube = tick_all_at_once(8, None)
    assert most_open(kube.calls) == 8
