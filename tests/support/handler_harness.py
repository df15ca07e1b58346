"""Calling kneecap's kopf handlers as kopf calls them, without kopf or an API: a client whose
every call is one round trip answered from a dict of objects, and a handler found in a registry
by its id (shared by tests/unit/test_control_handlers_concurrency.py and test_control_stale_body.py)."""

from __future__ import annotations

import asyncio
import copy
import itertools

import kopf

from kneecap.control.kube import selector_matches


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


def running() -> asyncio.Event:
    """The ``stopped`` flag kopf passes a timer, not set: the operator runs on (a timer's
    handler reads only its ``is_set()``)."""
    return asyncio.Event()
