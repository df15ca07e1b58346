"""An emulated Kubernetes API (kmock 0.8) that answers like kube-apiserver where the operator depends on it.

kmock (==0.8, by kopf's author) serves discovery, lists, watches and fetches from memory. Its
gaps (DESIGN §7) are filled here, and every write is admitted as a real API server admits it
(the pure rules are in kneecap.emulation.admission and kneecap.control.validation):

* objects get ``uid``, ``creationTimestamp``, ``resourceVersion`` (a global counter) and
  ``generation`` (bumped when ``spec`` changes), so kopf's JSON-patch ``test`` ops work; a PUT or
  patch carrying a stale ``metadata.resourceVersion`` is a 409 Conflict;
* LLMDeployments are pruned, defaulted and validated against the CRD's structural schema and its
  CEL rules (the file in crds/); failures are a 422 Invalid Status with ``details.causes`` worded
  like kube-apiserver's; ``fieldValidation=Strict`` turns unknown fields into a 400, the default
  (Warn) into ``Warning`` headers; ``/status`` writes are checked against the status schema;
* names are validated per kind (DNS-1035 label for Services and their 63 characters, DNS-1123
  subdomain for the rest), label keys and values too;
* Deployments, Pods and Services get the server's defaults, canonical resource quantities
  (``0.5`` -> ``500m``) and their empty maps and lists dropped; a Deployment's selector must
  select its template and never changes;
* ``managedFields`` record the last writer of each field (``fieldManager``, else the
  User-Agent's product), which is how the operator finds who owns ``spec.replicas``;
* POST answers 201 (409 AlreadyExists on a live name); ``generateName`` is honoured;
* PATCH honours the content type: JSON patch (add, remove, replace, test; a failed test is 422),
  merge patch (RFC 7386), strategic merge patch (lists merged by their keys: containers and env
  by ``name``, ports by ``containerPort``..., ``$patch: delete``; 415 on custom resources) and
  server-side apply (``fieldManager`` required, 409 on fields another manager set differently
  unless ``force=true``); ``/status`` changes only ``status``; for resources declared with a
  status subresource the main endpoint ignores ``status``;
* PUT replaces an object (keeping identity fields);
* GET of one object is a dict lookup (kmock's fetch scans all objects: 0.17 s at 1000 objects);
* LIST honours ``labelSelector`` (``k=v``, ``k!=v``, ``k``, ``!k``, comma-joined) and namespaces;
* ``/api/v1/namespaces`` lists instead of 500 (declared like any resource);
* DELETE of an object without finalizers removes it and cascades to objects whose
  ``ownerReferences`` name its uid (the garbage collector a cluster runs, background
  propagation: no ``blockOwnerDeletion`` needed);
* Deployments roll out instantly (a minimal deployment controller writes ``status``).

Deliberate simplifications: ``status`` given on create is kept (tests write pods' IPs that way);
watches ignore ``labelSelector`` and ``resourceVersion``; managedFields treat lists as single
fields; user reactions (``kmock[...] << ...``) do not see mutating requests, which this class
serves itself.

`KubeAPIThread` runs the emulator in a background thread with its own event loop, so a sync
test can run the operator with `kopf.testing.KopfRunner` and talk to the API like kubectl.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import itertools
import json
import threading
import zlib
import urllib.error
import urllib.request
import uuid
from typing import Any

import aiohttp.web
import attrs
import kmock
import multidict
import yaml
from kmock._internal import enums, rendering
from kmock._internal.k8s import KubernetesError, KubernetesObjectConflictError, KubernetesObjectNotFoundError

from kneecap.control import spec as crd
from kneecap.control import validation
from kneecap.control.kube import selector_matches
from kneecap.emulation import admission
from kneecap.emulation.merge_patch import merge_patch

assert kmock.__version__.startswith("0.8"), f"kneecap.demo.kubeapi is pinned to kmock 0.8, found {kmock.__version__}"

# group/version/plural -> (kind, namespaced, subresources)
CORE_RESOURCES: dict[str, tuple[str, bool, set[str]]] = {
    "v1/namespaces": ("Namespace", False, {"status"}),
    "v1/pods": ("Pod", True, {"status"}),
    "v1/services": ("Service", True, {"status"}),
    "v1/events": ("Event", True, set()),
    "v1/configmaps": ("ConfigMap", True, set()),
    "apps/v1/deployments": ("Deployment", True, {"status", "scale"}),
    "apps/v1/replicasets": ("ReplicaSet", True, {"status", "scale"}),
    "coordination.k8s.io/v1/leases": ("Lease", True, set()),
    "kopf.dev/v1/clusterkopfpeerings": ("ClusterKopfPeering", False, set()),  # kopf's leader election
    "kopf.dev/v1/kopfpeerings": ("KopfPeering", True, set()),
    "autoscaling/v2/horizontalpodautoscalers": ("HorizontalPodAutoscaler", True, {"status"}),
}
LLMD = "kneecap.io/v1alpha1/llmdeployments"
APPLY = "application/apply-patch+yaml"
VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}


class UnprocessableEntity(KubernetesError):
    pass


def _qualified(kind: str, group: str) -> str:
    return f"{kind}.{group}" if group else kind


def invalid_error(kind: str, group: str, name: str, causes: list[validation.Cause]) -> UnprocessableEntity:
    """422 Invalid, worded like kube-apiserver's (apierrors.NewInvalid)."""
    bodies = [str(c) for c in causes]
    text = bodies[0] if len(bodies) == 1 else "[" + ", ".join(bodies) + "]"
    return UnprocessableEntity(
        status=422, reason="Invalid", message=f'{_qualified(kind, group)} "{name}" is invalid: {text}',
        details={**({"name": name} if name else {}), **({"group": group} if group else {}), "kind": kind,
                 "causes": [{"reason": c.reason, "message": c.message, "field": c.field} for c in causes]})


def conflict_error(plural: str, group: str, name: str) -> KubernetesError:
    """409 Conflict for a stale resourceVersion (apierrors.NewConflict)."""
    return KubernetesError(
        status=409, reason="Conflict",
        message=f'Operation cannot be fulfilled on {_qualified(plural, group)} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
        details={"name": name, "group": group, "kind": plural})


def not_found(resource, name: str) -> KubernetesObjectNotFoundError:
    """404 NotFound, worded like kube-apiserver's (apierrors.NewNotFound)."""
    qualified = f"{resource.plural}.{resource.group}" if resource.group else resource.plural
    return KubernetesObjectNotFoundError(reason="NotFound", message=f'{qualified} "{name}" not found', details={
        "name": name, **({"group": resource.group} if resource.group else {}), "kind": resource.plural})


def apply_conflict_error(conflicts, plural: str, group: str, name: str) -> KubernetesError:
    """409 of a server-side apply that would change fields other managers own."""
    by = {}
    for manager, api_version, field in conflicts:
        by.setdefault((manager, api_version), []).append(field)
    if len(conflicts) == 1:
        (manager, api_version, field), = conflicts
        text = f'Apply failed with 1 conflict: conflict with "{manager}" using {api_version}: {field}'
    else:
        text = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(
            f'conflicts with "{m}" using {v}:\n' + "\n".join(f"- {f}" for f in fs) for (m, v), fs in by.items())
    return KubernetesError(status=409, reason="Conflict", message=text, details={
        "causes": [{"reason": "FieldManagerConflict", "message": f'conflict with "{m}" using {v}', "field": f}
                   for m, v, f in conflicts]})


def _manager(request) -> str:
    """fieldManager, else the User-Agent up to its first '/', as the API server defaults it."""
    agent = request.headers.get("User-Agent") or request.headers.get("user-agent") or "unknown"
    return request.params.get("fieldManager") or agent.split("/", 1)[0][:128]


def _now() -> str:
    return datetime.datetime.now(tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    return [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]


# kube-apiserver's words for a failed JSON-patch `test` op (it names neither path nor values)
TEST_FAILED = "the server rejected our request due to an error in our request"


def json_patch(doc: Any, ops: list[dict]) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, test); a failed test raises UnprocessableEntity."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = _pointer(op["path"])
        if not parts:
            if op["op"] == "test":
                if doc != op.get("value"):
                    raise UnprocessableEntity(status=422, reason="Invalid", message=TEST_FAILED)
                continue
            doc = copy.deepcopy(op["value"])
            continue
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent.setdefault(p, {}) if op["op"] == "add" else parent[p]
        last = parts[-1]
        kind = op["op"]
        if kind == "test":
            try:
                cur = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            except (IndexError, ValueError):
                cur = None
            if cur != op.get("value"):
                raise UnprocessableEntity(status=422, reason="Invalid", message=TEST_FAILED)
        elif kind == "remove":
            if isinstance(parent, list):
                parent.pop(int(last))
            else:
                parent.pop(last, None)
        elif kind in ("add", "replace"):
            if isinstance(parent, list):
                if last == "-":
                    parent.append(copy.deepcopy(op["value"]))
                elif kind == "add":
                    parent.insert(int(last), copy.deepcopy(op["value"]))
                else:
                    parent[int(last)] = copy.deepcopy(op["value"])
            else:
                parent[last] = copy.deepcopy(op["value"])
        else:
            raise UnprocessableEntity(status=422, reason="Invalid", message=f"unsupported op {kind!r}")
    return doc


@attrs.define(kw_only=True)
class KubeAPI(kmock.KubernetesEmulator):
    """kmock's emulator with the fixes listed in the module docstring."""

    instant_rollouts: bool = True
    _rv: Any = attrs.field(factory=lambda: itertools.count(1), init=False)
    _warnings: list[str] = attrs.field(factory=list, init=False)  # of the request being served

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for key, (kind, namespaced, subs) in CORE_RESOURCES.items():
            self.resources[key] = kmock.ResourceInfo(kind=kind, namespaced=namespaced, verbs=VERBS,
                                                     subresources=subs)
        self.resources[LLMD] = kmock.ResourceInfo(kind="LLMDeployment", singular="llmdeployment",
                                                  namespaced=True, verbs=VERBS, shortnames={"llmd"},
                                                  subresources={"status"})

    # ------------------------------------------------------------ helpers

    def _has_status(self, resource) -> bool:
        try:
            return "status" in self.resources[resource].subresources
        except (KeyError, Exception):
            return False

    def _live(self, key):
        if key not in self._objects or self._objects[key].deleted:
            return None
        return self._objects[key]

    def _stamp(self, obj: dict) -> None:
        obj.setdefault("metadata", {})["resourceVersion"] = str(next(self._rv))

    def _rollout(self, resource, obj: dict) -> None:
        if self.instant_rollouts and resource.plural == "deployments" and resource.group == "apps":
            n = int(obj.get("spec", {}).get("replicas", 1))
            obj["status"] = {"observedGeneration": obj["metadata"].get("generation", 1), "replicas": n,
                             "updatedReplicas": n, "readyReplicas": n, "availableReplicas": n}

    # ------------------------------------------------------------ request handling

    async def __call__(self, raw_request):
        # kmock 0.8's path parser raises on the cluster-scoped namespaces collection
        # ("/api/v1/namespaces" -> 500), which kopf lists and watches: serve it here.
        if raw_request.path.rstrip("/") == "/api/v1/namespaces":
            return await self._namespaces(raw_request)
        return await super().__call__(raw_request)

    async def _namespaces(self, raw_request):
        res = kmock.resource("", "v1", "namespaces")
        if raw_request.method == "POST":
            obj = await raw_request.json()
            name = obj["metadata"]["name"]
            causes = admission.name_causes("Namespace", name)
            if causes:
                return await self._render_error(invalid_error("Namespace", "", name, causes))
            async with self._lock:
                if self._live((res, None, name)) is not None:
                    return await self._render_error(KubernetesObjectConflictError(reason="AlreadyExists"))
                obj["metadata"].update(uid=str(uuid.uuid4()), creationTimestamp=_now())
                self._stamp(obj)
                if (res, None, name) in self._objects:
                    self._objects[res, None, name].create(obj)
                else:
                    self._objects[res, None, name] = obj
            await self._buses[res].put({"type": "ADDED", "object": obj})
            return aiohttp.web.json_response(obj, status=201)
        async with self._lock:
            items = [obj.raw for (r, _, _), obj in self._objects.items() if r == res and not obj.deleted]
        if raw_request.query.get("watch") != "true":
            return aiohttp.web.json_response({"apiVersion": "v1", "kind": "NamespaceList",
                                              "metadata": {"resourceVersion": str(next(self._rv))},
                                              "items": items})
        resp = aiohttp.web.StreamResponse()
        await resp.prepare(raw_request)
        for obj in items:
            await resp.write(json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n")
        try:
            async with asyncio.timeout(float(raw_request.query.get("timeoutSeconds", 60))):
                async for event in self._buses[res]:
                    await resp.write(json.dumps(event).encode() + b"\n")
        except (TimeoutError, ConnectionError):
            pass
        await resp.write_eof()
        return resp

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        res = request.resource
        if res is None or not res.plural or request.subresource not in (None, "status"):
            return await super()._handle(request)
        method = str(request.method.value).upper()
        events: list[dict] = []
        try:
            async with self._lock:
                self._warnings = []
                if request.action == enums.action.LIST:
                    payload, status = self._list(request), 200
                elif request.action == enums.action.FETCH and request.subresource is None:
                    payload, status = self._fetch(request), 200
                elif request.action == enums.action.CREATE:
                    payload, status = self._create(request, events), 201
                elif request.action == enums.action.UPDATE or (method == "PUT" and request.name):
                    created = self._live((res, request.namespace, request.name)) is None  # by an apply
                    payload = self._update(request, events, replace=method == "PUT")
                    status = 201 if created else 200
                elif request.action == enums.action.DELETE:
                    payload, status = self._delete(res, request.namespace, request.name, events), 200
                else:
                    payload = None
        except KubernetesError as exc:
            return await self._render_error(exc)
        if payload is None:
            return await super()._handle(request)
        for resource, event in events:
            await self._buses[resource].put(event)
        headers = multidict.CIMultiDict(("Warning", f"299 - {json.dumps(w)}") for w in self._warnings)
        return aiohttp.web.json_response(payload, status=status, headers=headers)

    def _list(self, request) -> dict:
        if request.resource not in self._get_resources():
            raise kmock.KubernetesResourceNotFoundError()
        sel = request.params.get("labelSelector")
        items = [obj.raw for (r, ns, _), obj in self._objects.items()
                 if r == request.resource and not obj.deleted
                 and (request.namespace is None or ns == request.namespace)
                 and selector_matches(sel, obj.raw.get("metadata", {}).get("labels"))]
        return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": str(next(self._rv))},
                "items": items}

    def _fetch(self, request) -> dict:
        """GET one object by key (kmock's own fetch scans every object: slow with thousands)."""
        live = self._live((request.resource, request.namespace, request.name))
        if live is None:
            raise not_found(request.resource, request.name)
        return live.raw

    def _create(self, request, events, body: dict | None = None, operation: str = "Update") -> dict:
        obj = copy.deepcopy(body if body is not None else request.data or {})
        meta = obj.setdefault("metadata", {})
        if operation == "Apply":
            meta["name"] = request.name
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if request.namespace:
            meta["namespace"] = request.namespace
        kind = self.resources[request.resource].kind
        causes = admission.name_causes(kind, meta.get("name"))
        if causes:
            raise invalid_error(kind, request.resource.group, str(meta.get("name") or ""), causes)
        key = (request.resource, meta.get("namespace"), meta["name"])
        if self._live(key) is not None:
            raise KubernetesObjectConflictError(reason="AlreadyExists")
        obj = self._admit(request, None, obj)
        meta = obj["metadata"]
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        meta.pop("deletionTimestamp", None)
        meta.pop("resourceVersion", None)
        if operation == "Apply":  # the applied fields only, not the defaults
            meta["managedFields"] = admission.server_side_apply({}, body, _manager(request), force=True,
                                                                strategic=True)[1]
        else:
            admission.record_managed_fields(None, obj, _manager(request), None, operation)
        self._rollout(request.resource, obj)
        self._stamp(obj)
        if key in self._objects:
            self._objects[key].create(obj)
        else:
            self._objects[key] = obj
        events.append((request.resource, {"type": "ADDED", "object": obj}))
        return obj

    def _admit(self, request, old: dict | None, new: dict) -> dict:
        """Validate and default a write as the API server does; raises 422 (or 400 in strict mode)."""
        res = request.resource
        kind = self.resources[res].kind
        meta = new.setdefault("metadata", {})
        causes = admission.label_causes(meta.get("labels"))
        if kind == "LLMDeployment":
            new, more = self._custom(request, old, new)
            causes += more
        elif kind in ("Deployment", "Pod", "Service"):
            try:
                admission.server_defaults(kind, new, cluster_ip=self._cluster_ip(new))
            except admission.DecodeError as exc:
                raise KubernetesError(status=400, reason="BadRequest", message=f'{kind} in version "{res.version}" '
                                      f"cannot be handled as a {kind}: {exc}") from None
            if kind == "Deployment":
                causes += admission.deployment_causes(old, new)
            new = admission.drop_empty(new)
        new["metadata"] = admission.drop_empty(new.get("metadata") or {})
        if causes:
            raise invalid_error(kind, res.group, meta.get("name", ""), causes)
        return new

    def _cluster_ip(self, obj: dict) -> str:
        n = zlib.crc32((obj["metadata"].get("namespace", "") + "/" + obj["metadata"].get("name", "")).encode())
        return f"10.96.{n >> 8 & 0xFF}.{n & 0xFF or 1}"

    def _custom(self, request, old: dict | None, obj: dict) -> tuple[dict, list[validation.Cause]]:
        """An LLMDeployment pruned, defaulted and validated against the CRD's schema and CEL rules
        (on an update, only the fields it changed: ratcheting)."""
        schema = crd.resource_schema()
        if request.subresource == "status":
            if "status" not in obj:
                return obj, []
            obj["status"], causes, _ = validation.check(obj["status"], schema["properties"]["status"], "status")
            return obj, causes if old is None else validation.ratchet(causes, old, obj)
        out = {k: obj[k] for k in ("apiVersion", "kind", "metadata", "status") if k in obj}
        unknown = [k for k in obj if k not in schema["properties"]]
        causes = []
        if "spec" in obj:
            out["spec"], causes, unknown_spec = validation.check(obj["spec"], schema["properties"]["spec"], "spec")
            unknown += unknown_spec
        else:
            causes = [validation.Cause("spec", "FieldValueRequired", "Required value")]
        name = obj["metadata"].get("name")
        if isinstance(name, str):
            causes += validation.check(name, schema["properties"]["metadata"]["properties"]["name"], "metadata.name")[1]
        mode = request.params.get("fieldValidation", "Warn")
        if unknown and mode == "Strict":
            kind, version = obj.get("kind", ""), str(obj.get("apiVersion", "")).rpartition("/")[2]
            raise KubernetesError(status=400, reason="BadRequest", message=(
                f'{kind} in version "{version}" cannot be handled as a {kind}: strict decoding error: '
                + ", ".join(f'unknown field "{u}"' for u in unknown)))
        if mode == "Warn":
            self._warnings += [f'unknown field "{u}"' for u in unknown]
        return out, causes if old is None else validation.ratchet(causes, old, out)

    def _update(self, request, events, replace: bool) -> dict:
        key = (request.resource, request.namespace, request.name)
        live = self._live(key)
        ctype = (request.headers.get("Content-Type") or request.headers.get("content-type") or "").split(";")[0]
        apply = ctype == APPLY
        if apply and not request.params.get("fieldManager"):
            raise invalid_error("PatchOptions", "meta.k8s.io", "", [validation.Cause(
                "fieldManager", "FieldValueRequired", "Required value: is required for apply patch")])
        if not apply and "force" in request.params:
            raise invalid_error("PatchOptions", "meta.k8s.io", "", [validation.Cause(
                "force", "FieldValueForbidden", "Forbidden: may not be specified for non-apply patch")])
        data = yaml.safe_load(request.text or "") if apply else request.data
        if live is None:
            if apply and request.subresource is None:
                return self._create(request, events, data, operation="Apply")
            raise not_found(request.resource, request.name)
        old = live.raw
        on_status = request.subresource == "status"
        managed = None
        if apply:
            try:
                new, managed = admission.server_side_apply(
                    old, data, request.params["fieldManager"], force=request.params.get("force") == "true",
                    strategic=self.resources[request.resource].kind != "LLMDeployment")
            except admission.ApplyConflict as exc:
                raise apply_conflict_error(exc.conflicts, request.resource.plural, request.resource.group,
                                           request.name) from None
        elif replace:
            new = copy.deepcopy(data)
            meta = new.setdefault("metadata", {})
            for k in ("uid", "creationTimestamp", "generation", "deletionTimestamp"):
                if k in old["metadata"]:
                    meta[k] = old["metadata"][k]
            if "managedFields" not in meta and "managedFields" in old["metadata"]:
                meta["managedFields"] = old["metadata"]["managedFields"]
        elif ctype == "application/json-patch+json":
            new = json_patch(old, data)
        elif ctype == "application/strategic-merge-patch+json":
            if self.resources[request.resource].kind == "LLMDeployment":
                raise UnprocessableEntity(status=415, reason="UnsupportedMediaType",
                                          message="the body of the request was in an unknown format - accepted "
                                          "media types include: application/json-patch+json, "
                                          "application/merge-patch+json, application/apply-patch+yaml")
            new = admission.strategic_merge(old, data)
        else:  # merge-patch+json or unspecified
            new = merge_patch(old, data)
        rv = (new.get("metadata") or {}).get("resourceVersion")
        if rv and rv != old["metadata"].get("resourceVersion"):
            raise conflict_error(request.resource.plural, request.resource.group, request.name)
        for k in ("name", "namespace"):  # (cluster-scoped objects have no namespace)
            if k in old["metadata"]:
                new.setdefault("metadata", {})[k] = old["metadata"][k]
        if on_status:
            merged = copy.deepcopy(old)
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
            new = merged
        elif self._has_status(request.resource):
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            else:
                new.pop("status", None)
        new = self._admit(request, old, new)
        generation = admission.next_generation(old, new)
        if not on_status and generation != int(old["metadata"].get("generation", 1)):
            new["metadata"]["generation"] = generation
            self._rollout(request.resource, new)
        if managed is None:
            admission.record_managed_fields(old, new, _manager(request), request.subresource, "Update")
        else:
            new["metadata"]["managedFields"] = managed
        self._stamp(new)
        live.create(new)
        events.append((request.resource, {"type": "MODIFIED", "object": new}))
        meta = new.get("metadata", {})
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._remove(key, events)
        return new

    def _delete(self, resource, namespace, name, events) -> dict:
        key = (resource, namespace, name)
        live = self._live(key)
        if live is None:
            raise not_found(resource, name)
        obj = live.raw
        if obj["metadata"].get("finalizers"):
            if not obj["metadata"].get("deletionTimestamp"):
                new = copy.deepcopy(obj)
                new["metadata"].update(deletionTimestamp=_now(), deletionGracePeriodSeconds=0,
                                       generation=int(new["metadata"].get("generation", 1)) + 1)
                self._stamp(new)
                live.create(new)
                events.append((resource, {"type": "MODIFIED", "object": new}))
                return new
            return obj
        self._remove(key, events)
        return obj

    def _remove(self, key, events) -> None:
        """Delete for real, then cascade to dependents (the garbage collector's job)."""
        obj = self._objects[key].raw
        self._objects[key].delete()
        events.append((key[0], {"type": "DELETED", "object": obj}))
        uid = obj.get("metadata", {}).get("uid")
        if not uid:
            return
        for (r, ns, name), dep in list(self._objects.items()):
            if dep.deleted:
                continue
            refs = dep.raw.get("metadata", {}).get("ownerReferences") or []
            if any(ref.get("uid") == uid for ref in refs):
                try:
                    self._delete(r, ns, name, events)
                except KubernetesObjectNotFoundError:
                    pass


class KubeAPIThread:
    """The emulator in a background thread; sync, kubectl-like helpers for tests."""

    def __init__(self, api_class: type[KubeAPI] | None = None, **kwargs):
        self._api_class = api_class or KubeAPI  # (a test's subclass adds a server behaviour)
        self._kwargs = kwargs
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.api: KubeAPI | None = None
        self.url = ""
        self._thread = threading.Thread(target=self._main, daemon=True, name="kmock")
        self._error: BaseException | None = None

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        try:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            async with self._api_class(**self._kwargs) as api, kmock.Server(api) as server:
                self.api = api
                self.url = str(server.url).rstrip("/")
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:  # surfaced to the test by start()
            self._error = exc
            self._ready.set()

    def start(self) -> "KubeAPIThread":
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def write_kubeconfig(self, path, namespace: str | None = None, user: str = "kmock"):
        """A kubeconfig pointing at this API (any token passes), for `kneecap run` subprocesses."""
        import yaml

        context = {"cluster": "kmock", "user": user, **({"namespace": namespace} if namespace else {})}
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
            "users": [{"name": user, "user": {"token": "not-checked"}}],
            "contexts": [{"name": "kmock", "context": context}]}))
        return path

    # ------------------------------------------------------------ kubectl-like

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/merge-patch+json") -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type if method == "PATCH" else "application/json"}
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    @staticmethod
    def path(resource: str, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        gv, plural = resource.rsplit("/", 1)
        base = f"/api/{gv}" if gv == "v1" else f"/apis/{gv}"
        p = base + (f"/namespaces/{namespace}" if namespace else "") + f"/{plural}"
        return p + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

    def create(self, resource: str, obj: dict) -> dict:
        code, body = self.request("POST", self.path(resource, obj["metadata"].get("namespace")), obj)
        assert code == 201, (code, body)
        return body

    def get(self, resource: str, namespace: str, name: str) -> dict | None:
        code, body = self.request("GET", self.path(resource, namespace, name))
        return body if code == 200 else None

    def list(self, resource: str, namespace: str | None = None, selector: str | None = None) -> list[dict]:
        q = f"?labelSelector={urllib.request.quote(selector)}" if selector else ""
        code, body = self.request("GET", self.path(resource, namespace) + q)
        assert code == 200, (code, body)
        return body["items"]

    def patch(self, resource: str, namespace: str, name: str, patch: Any, sub: str | None = None,
              content_type: str = "application/merge-patch+json") -> dict:
        code, body = self.request("PATCH", self.path(resource, namespace, name, sub), patch, content_type)
        assert code == 200, (code, body)
        return body

    def delete(self, resource: str, namespace: str, name: str) -> int:
        return self.request("DELETE", self.path(resource, namespace, name))[0]

    def history(self, resource: str, namespace: str, name: str) -> list[dict]:
        """Every stored version of an object (None entries are deletions)."""
        gv, plural = resource.rsplit("/", 1)
        group, _, version = gv.rpartition("/")
        key = (kmock.resource(group, version, plural), namespace, name)
        if self.api is None or key not in self.api.objects:
            return []
        return [None if v is None else copy.deepcopy(v.raw) for v in self.api.objects[key].history]

    def add_namespace(self, name: str) -> dict:
        code, body = self.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                                  "metadata": {"name": name}})
        assert code in (201, 409), (code, body)
        return body
