"""An in-memory Kubernetes API with the methods of :class:`kneecap.control.kube.KubeClient`.

The store of the emulated cluster, with verbs on the REST paths the client builds: virtual time
(:mod:`kneecap.sim.cluster`) runs the operator, the controllers (:mod:`kneecap.emulation.controllers`)
and its kubelet on it in process. No sockets, no threads, no wall clock.
What it keeps of the real API server's behaviour:

* objects addressed by the same REST paths the client builds (``/api/v1/namespaces/ns/pods``,
  ``/apis/apps/v1/namespaces/ns/deployments/name[/status]``);
* ``metadata.uid`` (deterministic), ``resourceVersion`` (one counter for the whole store, bumped
  on every change and never on a no-op), ``generation`` (bumped when ``spec`` changes:
  :func:`kneecap.emulation.admission.next_generation`, the demo's API's rule too),
  ``creationTimestamp`` from the virtual clock;
* JSON merge patch (RFC 7386); the status subresource: a write to ``.../status`` changes only
  ``status``, a write to the object ignores ``status`` (``subresources.status`` of Deployments
  and of the LLMDeployment CRD);
* create of an existing name: HTTP 409 (the client's ``create`` then returns the live object);
  a write carrying a stale ``metadata.resourceVersion``: 409 Conflict;
* equality-based label selectors on lists;
* deletion of an object with finalizers only sets ``deletionTimestamp``; it goes when a write
  leaves it none; deletion garbage-collects dependents through ``ownerReferences`` (background
  cascade).

Reads return deep copies, so a caller's mutation never reaches the store. Every change is told to
``observers`` (the demo's HTTP front end, :mod:`kneecap.emulation.kubeapi`, feeds its watches from
them) and, given ``keep_history``, kept per object. A write's ``admit`` hook (the front end's
admission: :mod:`kneecap.emulation.admission`) sees the object before it is stored.
"""

from __future__ import annotations

import copy
import datetime as _dt
import uuid
from typing import Any, Callable

from kneecap.control.kube import ApiError, selector_matches
from kneecap.emulation.admission import next_generation
from kneecap.emulation.merge_patch import merge_patch

Key = tuple[str, str, str, str]  # (group/version, plural, namespace, name)
Admit = Callable[[dict | None, dict], dict]  # (live or None, proposed) -> what is stored
# the resources whose status is not a subresource: a write to the object sets it
NO_STATUS_SUBRESOURCE = frozenset({"events", "configmaps", "leases", "kopfpeerings", "clusterkopfpeerings"})
IDENTITY = ("uid", "resourceVersion", "generation", "creationTimestamp", "name", "namespace", "deletionTimestamp")


def conflict(key: Key, what: str) -> ApiError:
    return ApiError(409, {"message": f'Operation cannot be fulfilled on {key[1]} "{key[3]}": the object has been '
                          "modified; please apply your changes to the latest version and try again",
                          "reason": "Conflict", "details": {"name": key[3], "kind": key[1]}}, what)


def parse_path(path: str) -> tuple[str, str, str | None, str | None, str | None]:
    """(group/version, plural, namespace, name, subresource) of a REST path."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 2:
        gv, rest = parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        gv, rest = f"{parts[1]}/{parts[2]}", parts[3:]
    else:
        raise ApiError(404, {"message": f"no such path {path}"}, path)
    ns = None
    if gv == "v1" and len(rest) == 2 and rest[0] == "namespaces":  # a Namespace (cluster-scoped)
        return gv, "namespaces", None, rest[1], None
    if len(rest) >= 2 and rest[0] == "namespaces":
        ns, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        raise ApiError(404, {"message": f"no such path {path}"}, path)
    plural, name, sub = rest[0], rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None
    return gv, plural, ns, name, sub


class Store:
    """The objects and the API verbs (module docstring). ``now_s``: the virtual clock (epoch seconds)."""

    def __init__(self, now_s: Callable[[], float], *, keep_history: bool = False):
        self.now_s = now_s
        self.objects: dict[Key, dict] = {}
        self._rv = 0
        self._uids = 0
        self.writes = 0  # successful writes (create, patch, delete)
        self.observers: list[Callable[[str, Key, dict], None]] = []  # (ADDED|MODIFIED|DELETED, key, object)
        self.history: dict[Key, list[dict | None]] | None = {} if keep_history else None

    @property
    def resource_version(self) -> str:
        return str(self._rv)

    def _emit(self, event: str, key: Key, obj: dict) -> None:
        if self.history is not None:
            self.history.setdefault(key, []).append(None if event == "DELETED" else copy.deepcopy(obj))
        for observer in self.observers:
            observer(event, key, obj)

    # ------------------------------------------------------------ helpers
    def _bump(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _key(self, path: str) -> tuple[Key, str | None]:
        gv, plural, ns, name, sub = parse_path(path)
        if name is None:
            raise ApiError(405, {"message": "a collection path needs a name here"}, path)
        return (gv, plural, ns or "", name), sub

    def _iso(self) -> str:
        return _dt.datetime.fromtimestamp(self.now_s(), _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    # ------------------------------------------------------------ synchronous verbs (in-process callers)
    def get_now(self, path: str) -> dict | None:
        key, _ = self._key(path)
        obj = self.objects.get(key)
        return copy.deepcopy(obj) if obj is not None else None

    def peek(self, path: str) -> dict | None:
        """The stored object itself (no copy): for in-process controllers that only read."""
        key, _ = self._key(path)
        return self.objects.get(key)

    def list_now(self, path: str, label_selector: str | None = None, *, copy_items: bool = True) -> list[dict]:
        gv, plural, ns, name, _ = parse_path(path)
        if name is not None:
            raise ApiError(405, {"message": "a list path has no name"}, path)
        out = [o for (g, p, n, _), o in sorted(self.objects.items(), key=lambda kv: kv[0])
               if g == gv and p == plural and (ns is None or n == ns)
               and selector_matches(label_selector, o["metadata"].get("labels"))]
        return [copy.deepcopy(o) for o in out] if copy_items else out

    def create_now(self, path: str, obj: dict, admit: Admit | None = None) -> dict:
        gv, plural, ns, name, _ = parse_path(path)
        if name is not None:
            raise ApiError(405, {"message": "POST to a named path"}, path)
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(422, {"message": "metadata.name: Required value"}, f"POST {path}")
            self._uids += 1
            meta["name"] = f"{meta['generateName']}{self._uids:05x}"
        key = (gv, plural, ns or "", meta["name"])
        if key in self.objects:
            raise ApiError(409, {"message": f"{plural} \"{meta['name']}\" already exists", "reason": "AlreadyExists"},
                           f"POST {path}")
        if ns is not None:
            meta["namespace"] = ns
        meta.pop("deletionTimestamp", None)
        if admit is not None:
            obj = admit(None, obj)
            meta = obj["metadata"]
        self._uids += 1
        meta["uid"] = str(uuid.UUID(int=self._uids))
        meta["generation"] = 1
        meta["creationTimestamp"] = self._iso()
        meta["resourceVersion"] = self._bump()
        self.objects[key] = obj
        self.writes += 1
        self._emit("ADDED", key, obj)
        return copy.deepcopy(obj)

    def patch_now(self, path: str, patch: dict) -> dict:
        """A JSON merge patch (RFC 7386) of the object or its ``/status``."""
        if not isinstance(patch, dict):
            raise ApiError(422, {"message": "a merge patch must be a JSON object"}, f"PATCH {path}")
        return self.update_now(path, lambda live: merge_patch(live, patch))

    def update_now(self, path: str, change: Callable[[dict], dict], admit: Admit | None = None) -> dict:
        """Write what ``change`` makes of the live object (a fresh object, the live one untouched):
        to ``/status`` only its status counts; to the object, never its identity (``IDENTITY``)
        nor, for resources with a status subresource, its status. No change: nothing is written."""
        key, sub = self._key(path)
        live = self.objects.get(key)
        if live is None:
            raise ApiError(404, {"message": f"{key[1]} \"{key[3]}\" not found", "reason": "NotFound"}, f"PATCH {path}")
        if sub not in (None, "status"):
            raise ApiError(404, {"message": f"no subresource {sub}"}, f"PATCH {path}")
        proposed = change(live)
        version = (proposed.get("metadata") or {}).get("resourceVersion")
        if version and version != live["metadata"].get("resourceVersion"):
            raise conflict(key, f"PATCH {path}")
        if sub == "status":
            new = dict(live)
            if proposed.get("status") is None:
                new.pop("status", None)
            else:
                new["status"] = proposed["status"]
        else:
            new = proposed
            meta = new.setdefault("metadata", {})
            for k in IDENTITY:
                if k in live["metadata"]:
                    meta[k] = live["metadata"][k]
                else:
                    meta.pop(k, None)
            if key[1] not in NO_STATUS_SUBRESOURCE:
                if "status" in live:
                    new["status"] = live["status"]
                else:
                    new.pop("status", None)
        if admit is not None:
            new = admit(live, new)
        if sub is None:
            new["metadata"]["generation"] = next_generation(live, new)
        if new != live:
            new["metadata"]["resourceVersion"] = self._bump()
            self.objects[key] = new
            self.writes += 1
            self._emit("MODIFIED", key, new)
            if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
                self._remove(key)
        return copy.deepcopy(new)

    def delete_now(self, path: str) -> bool:
        return self.delete_object_now(path) is not None

    def delete_object_now(self, path: str) -> dict | None:
        """Delete (module docstring); the object as it was, or as it now waits for its finalizers."""
        key, _ = self._key(path)
        obj = self._delete(key)
        return None if obj is None else copy.deepcopy(obj)

    def _delete(self, key: Key) -> dict | None:
        obj = self.objects.get(key)
        if obj is None:
            return None
        meta = obj["metadata"]
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return obj
            new = copy.deepcopy(obj)
            new["metadata"].update(deletionTimestamp=self._iso(), deletionGracePeriodSeconds=0,
                                   generation=int(meta.get("generation", 1)) + 1,
                                   resourceVersion=self._bump())
            self.objects[key] = new
            self.writes += 1
            self._emit("MODIFIED", key, new)
            return new
        self._remove(key)
        return obj

    def _remove(self, key: Key) -> None:
        """Delete for real, then the dependents (the garbage collector's job)."""
        obj = self.objects.pop(key)
        self._bump()
        self.writes += 1
        self._emit("DELETED", key, obj)
        self._collect(obj["metadata"]["uid"])

    def _collect(self, owner_uid: str) -> None:
        """Garbage-collect the dependents of a deleted owner (and theirs)."""
        for key, o in list(self.objects.items()):
            if key in self.objects and any(r.get("uid") == owner_uid
                                           for r in o["metadata"].get("ownerReferences") or []):
                self._delete(key)

    # ------------------------------------------------------------ KubeClient's methods
    async def get(self, path: str) -> dict | None:
        return self.get_now(path)

    async def list(self, path: str, label_selector: str | None = None) -> list[dict]:
        return self.list_now(path, label_selector)

    async def list_versioned(self, path: str, label_selector: str | None = None) -> tuple[list[dict], str | None]:
        return self.list_now(path, label_selector), str(self._rv)

    async def create(self, path: str, obj: dict) -> tuple[dict, bool]:
        try:
            return self.create_now(path, obj), True
        except ApiError as exc:
            if exc.status != 409:
                raise
            return self.get_now(f"{path}/{obj['metadata']['name']}"), False

    async def patch(self, path: str, patch: Any, content_type: str = "application/merge-patch+json") -> dict:
        if content_type != "application/merge-patch+json":
            raise ApiError(415, {"message": f"only merge patches are supported, got {content_type}"}, f"PATCH {path}")
        return self.patch_now(path, patch)

    async def patch_status(self, path: str, status: dict) -> None:
        self.patch_now(path + "/status", {"status": status})

    async def delete(self, path: str) -> bool:
        return self.delete_now(path)

    async def close(self) -> None:
        pass
