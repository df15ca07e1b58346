"""The demo's emulated Kubernetes API: kmock 0.8's HTTP server in front of the emulation's store.

kmock (==0.8, by kopf's author) serves HTTP, discovery and the watch streams' buses; the objects
live in :class:`kneecap.emulation.store.Store` (identity, ``resourceVersion``, ``generation``, the
status subresource, stale-``resourceVersion`` conflicts, finalizers, the garbage collector, each
object's history), the store virtual time runs on in process. What this front end adds, as
kube-apiserver answers where the operator depends on it (the pure rules are in
kneecap.emulation.admission and kneecap.control.validation):

* LLMDeployments are pruned, defaulted and validated against the CRD's structural schema and its
  CEL rules (the file in crds/); failures are a 422 Invalid Status with ``details.causes`` worded
  like kube-apiserver's; unknown fields come back as ``Warning`` headers (the default field
  validation, Warn); ``/status`` writes are checked against the status schema;
* names are validated per kind (DNS-1035 label for Services and their 63 characters, DNS-1123
  subdomain for the rest), label keys and values too;
* Deployments, Pods and Services get the server's defaults, canonical resource quantities
  (``0.5`` -> ``500m``) and their empty maps and lists dropped; a Deployment's selector must
  select its template and never changes;
* ``managedFields`` record the last writer of each field (``fieldManager``, else the
  User-Agent's product), which is how the operator finds who owns ``spec.replicas``;
* POST answers 201 (409 AlreadyExists on a live name); ``generateName`` is honoured;
* PATCH honours the content type: JSON patch (add, remove, replace, test; a failed test is 422),
  merge patch (RFC 7386) and strategic merge patch (lists merged by their keys: containers and
  env by ``name``, ports by ``containerPort``..., ``$patch: delete``; 415 on custom resources);
* PUT replaces an object (keeping identity fields);
* LIST honours ``labelSelector`` (``k=v``, ``k!=v``, ``k``, ``!k``, comma-joined) and namespaces;
* ``/api/v1/namespaces`` lists instead of 500 (declared like any resource);
* Deployments roll out instantly unless ``instant_rollouts=False`` (their status is written as
  if every pod were ready; the demo's kubelet runs the emulation's controllers instead).

Deliberate simplifications: ``status`` given on create is kept (tests write pods' IPs that way);
watches ignore ``labelSelector`` and ``resourceVersion``; managedFields treat lists as single
fields; no server-side apply (415) and no strict field validation (the operator uses neither);
user reactions (``kmock[...] << ...``) do not see the requests this class serves itself.

`KubeAPIThread` runs the emulator in a background thread with its own event loop, so a sync
test can run the operator with `kopf.testing.KopfRunner` and talk to the API like kubectl.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from typing import Any

import aiohttp.web
import attrs
import kmock
import multidict
from kmock._internal import enums, rendering
from kmock._internal.k8s import KubernetesError, KubernetesObjectNotFoundError

from kneecap.control import manifests
from kneecap.control import spec as crd
from kneecap.control import validation
from kneecap.control.kube import ApiError, resource_path
from kneecap.emulation import admission
from kneecap.emulation.merge_patch import merge_patch
from kneecap.emulation.store import Key, Store
from kneecap.emulation.workloads import controller_ref, replicaset_for

assert kmock.__version__.startswith("0.8"), f"kneecap.emulation.kubeapi is pinned to kmock 0.8, found {kmock.__version__}"

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
DEPLOY = "apps/v1/deployments"
REPLICASETS = "apps/v1/replicasets"
PODS = "v1/pods"
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


def _manager(request) -> str:
    """fieldManager, else the User-Agent up to its first '/', as the API server defaults it."""
    agent = request.headers.get("User-Agent") or request.headers.get("user-agent") or "unknown"
    return request.params.get("fieldManager") or agent.split("/", 1)[0][:128]


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
    store: Store = attrs.field(init=False)
    _warnings: list[str] = attrs.field(factory=list, init=False)  # of the request being served
    _events: list = attrs.field(factory=list, init=False)  # (resource, watch event) of the request being served

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for key, (kind, namespaced, subs) in CORE_RESOURCES.items():
            self.resources[key] = kmock.ResourceInfo(kind=kind, namespaced=namespaced, verbs=VERBS,
                                                     subresources=subs)
        self.resources[LLMD] = kmock.ResourceInfo(kind="LLMDeployment", singular="llmdeployment",
                                                  namespaced=True, verbs=VERBS, shortnames={"llmd"},
                                                  subresources={"status"})
        self.store = Store(time.time, keep_history=True)
        self.store.observers.append(self._observe)

    # ------------------------------------------------------------ helpers

    def _observe(self, event: str, key: Key, obj: dict) -> None:
        group, _, version = key[0].rpartition("/")
        self._events.append((kmock.resource(group, version, key[1]), {"type": event, "object": copy.deepcopy(obj)}))

    @staticmethod
    def _path(request, *, collection: bool = False) -> str:
        res = request.resource
        api_version = f"{res.group}/{res.version}" if res.group else res.version
        if collection:
            return resource_path(api_version, res.plural, request.namespace)
        return resource_path(api_version, res.plural, request.namespace, request.name, request.subresource)

    def _rollout(self, resource, obj: dict) -> None:
        if self.instant_rollouts and resource.plural == "deployments" and resource.group == "apps":
            n = int(obj.get("spec", {}).get("replicas", 1))
            obj["status"] = {"observedGeneration": obj["metadata"].get("generation", 1), "replicas": n,
                             "updatedReplicas": n, "readyReplicas": n, "availableReplicas": n}

    async def _publish(self) -> None:
        events, self._events = self._events, []
        for resource, event in events:
            await self._buses[resource].put(event)

    # ------------------------------------------------------------ request handling

    async def __call__(self, raw_request):
        # kmock 0.8's path parser raises on the cluster-scoped namespaces collection
        # ("/api/v1/namespaces" -> 500), which kopf lists and watches: serve it here.
        if raw_request.path.rstrip("/") == "/api/v1/namespaces":
            return await self._namespaces(raw_request)
        return await super().__call__(raw_request)

    async def _namespaces(self, raw_request):
        res = kmock.resource("", "v1", "namespaces")
        path = "/api/v1/namespaces"
        if raw_request.method == "POST":
            obj = await raw_request.json()

            def admit(old, new):
                causes = admission.name_causes("Namespace", new["metadata"]["name"])
                if causes:
                    raise invalid_error("Namespace", "", new["metadata"]["name"], causes)
                return new

            try:
                async with self._lock:
                    created = self.store.create_now(path, obj, admit)
            except (ApiError, KubernetesError) as exc:
                self._events = []
                return await self._render_error(self._kube_error(exc))
            await self._publish()
            return aiohttp.web.json_response(created, status=201)
        async with self._lock:
            items = self.store.list_now(path)
        if raw_request.query.get("watch") != "true":
            return aiohttp.web.json_response({"apiVersion": "v1", "kind": "NamespaceList",
                                              "metadata": {"resourceVersion": self.store.resource_version},
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

    async def _serve_watch(self, request: rendering.Request):
        """Every object there is, then what happens to them (kmock's own watch reads its own objects)."""
        yield b""
        async with self._lock:
            items = [o for o in self.store.list_now(self._path(request, collection=True))
                     if request.name is None or o["metadata"]["name"] == request.name]
        for obj in items:
            yield {"type": "ADDED", "object": obj}
        async for event in self._buses[request.resource]:
            meta = event.get("object", {}).get("metadata", {})
            if ((request.namespace is None or meta.get("namespace") == request.namespace)
                    and (request.name is None or meta.get("name") == request.name)):
                yield event

    def _kube_error(self, exc: Exception, request=None) -> KubernetesError:
        """The store's ApiError as the Status kube-apiserver answers."""
        if isinstance(exc, KubernetesError):
            return exc
        body = exc.body if isinstance(exc.body, dict) else {"message": str(exc.body)}
        if request is not None and exc.status == 404:
            return not_found(request.resource, request.name)
        if request is not None and exc.status == 409 and body.get("reason") == "Conflict":
            return conflict_error(request.resource.plural, request.resource.group, request.name)
        return KubernetesError(status=exc.status, reason=body.get("reason", ""), message=body.get("message", ""),
                               details=body.get("details") or {})

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        res = request.resource
        if (res is None or not res.plural or request.subresource not in (None, "status")
                or request.action == enums.action.WATCH):
            return await super()._handle(request)
        method = str(request.method.value).upper()
        try:
            async with self._lock:
                self._warnings, self._events = [], []
                if request.action == enums.action.LIST:
                    payload, status = self._list(request), 200
                elif request.action == enums.action.FETCH and request.subresource is None:
                    payload, status = self._fetch(request), 200
                elif request.action == enums.action.CREATE:
                    payload, status = self._create(request), 201
                elif request.action == enums.action.UPDATE or (method == "PUT" and request.name):
                    payload, status = self._update(request, replace=method == "PUT"), 200
                elif request.action == enums.action.DELETE:
                    payload, status = self.store.delete_object_now(self._path(request)), 200
                    if payload is None:
                        raise not_found(res, request.name)
                else:
                    payload = None
        except (ApiError, KubernetesError) as exc:
            self._events = []
            return await self._render_error(self._kube_error(exc, request))
        if payload is None:
            return await super()._handle(request)
        await self._publish()
        headers = multidict.CIMultiDict(("Warning", f"299 - {json.dumps(w)}") for w in self._warnings)
        return aiohttp.web.json_response(payload, status=status, headers=headers)

    def _list(self, request) -> dict:
        if request.resource not in self._get_resources():
            raise kmock.KubernetesResourceNotFoundError()
        items = self.store.list_now(self._path(request, collection=True), request.params.get("labelSelector"),
                                    copy_items=False)
        return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": self.store.resource_version},
                "items": items}

    def _fetch(self, request) -> dict:
        obj = self.store.peek(self._path(request))
        if obj is None:
            raise not_found(request.resource, request.name)
        return obj

    def _create(self, request) -> dict:
        kind = self.resources[request.resource].kind

        def admit(old, obj):
            name = obj["metadata"].get("name")
            causes = admission.name_causes(kind, name)
            if causes:
                raise invalid_error(kind, request.resource.group, str(name or ""), causes)
            obj = self._admit(request, None, obj)
            admission.record_managed_fields(None, obj, _manager(request), None, "Update")
            self._rollout(request.resource, obj)
            return obj

        obj = copy.deepcopy(request.data or {})
        obj.setdefault("metadata", {}).pop("resourceVersion", None)
        try:
            return self.store.create_now(self._path(request, collection=True), obj, admit)
        except ApiError as exc:
            if exc.status == 409:
                raise KubernetesError(status=409, reason="AlreadyExists", message=(
                    f'{request.resource.plural} "{obj["metadata"].get("name")}" already exists')) from None
            raise

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
        if request.params.get("fieldValidation", "Warn") == "Warn":
            self._warnings += [f'unknown field "{u}"' for u in unknown]
        return out, causes if old is None else validation.ratchet(causes, old, out)

    def _update(self, request, replace: bool) -> dict:
        ctype = (request.headers.get("Content-Type") or request.headers.get("content-type") or "").split(";")[0]
        is_llmd = self.resources[request.resource].kind == "LLMDeployment"
        if ctype == "application/apply-patch+yaml" or (ctype == "application/strategic-merge-patch+json" and is_llmd):
            raise UnprocessableEntity(status=415, reason="UnsupportedMediaType",
                                      message="the body of the request was in an unknown format - accepted "
                                      "media types include: application/json-patch+json, "
                                      "application/merge-patch+json"
                                      + ("" if is_llmd else ", application/strategic-merge-patch+json"))
        data = request.data

        def change(live: dict) -> dict:
            if replace:
                new = copy.deepcopy(data)
                meta = new.setdefault("metadata", {})
                if "managedFields" not in meta and "managedFields" in live["metadata"]:
                    meta["managedFields"] = live["metadata"]["managedFields"]
                return new
            if ctype == "application/json-patch+json":
                return json_patch(live, data)
            if ctype == "application/strategic-merge-patch+json":
                return admission.strategic_merge(live, data)
            return merge_patch(live, data)  # merge-patch+json or unspecified

        def admit(old: dict, new: dict) -> dict:
            new = self._admit(request, old, copy.deepcopy(new))  # (a status write shares the live spec)
            if request.subresource is None:
                generation = admission.next_generation(old, new)
                if generation != int(old["metadata"].get("generation", 1)):
                    new["metadata"]["generation"] = generation
                    self._rollout(request.resource, new)
            admission.record_managed_fields(old, new, _manager(request), request.subresource, "Update")
            return new

        return self.store.update_now(self._path(request), change, admit)


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
        """``group/version/plural`` (``v1/pods``, ``apps/v1/deployments``) to its REST path."""
        gv, plural = resource.rsplit("/", 1)
        return resource_path(gv, plural, namespace, name, sub)

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
        if self.api is None:
            return []
        return copy.deepcopy(self.api.store.history.get((gv, plural, namespace, name), []))

    def add_namespace(self, name: str) -> dict:
        code, body = self.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                                  "metadata": {"name": name}})
        assert code in (201, 409), (code, body)
        return body


class HttpStore:
    """The synchronous verbs of :class:`kneecap.emulation.store.Store` over the emulated HTTP API,
    so the emulation's controllers run on the demo's API as they run on virtual time's store."""

    def __init__(self, kube: KubeAPIThread):
        self.kube = kube

    def _call(self, method: str, path: str, body=None, content_type: str = "application/merge-patch+json"):
        code, answer = self.kube.request(method, path, body, content_type)
        if code >= 300:
            raise ApiError(code, answer, f"{method} {path}")
        return answer

    def list_now(self, path: str, label_selector: str | None = None, *, copy_items: bool = True) -> list[dict]:
        query = f"?labelSelector={urllib.parse.quote(label_selector)}" if label_selector else ""
        return self._call("GET", path + query)["items"]

    def peek(self, path: str) -> dict | None:
        code, answer = self.kube.request("GET", path)
        return answer if code == 200 else None

    get_now = peek

    def create_now(self, path: str, obj: dict) -> dict:
        return self._call("POST", path, obj)

    def patch_now(self, path: str, patch: dict) -> dict:
        return self._call("PATCH", path, patch)

    def delete_now(self, path: str) -> bool:
        code, answer = self.kube.request("DELETE", path)
        if code not in (200, 404):
            raise ApiError(code, answer, f"DELETE {path}")
        return code == 200


def replicaset_of(kube: KubeAPIThread, deploy: dict) -> dict:
    """The Deployment's ReplicaSet for its current pod template, created as the Deployment
    controller does (``<deployment>-<pod-template-hash>``, controlled by the Deployment)."""
    body = replicaset_for(deploy, int(deploy["spec"].get("replicas", 1)))
    ns = deploy["metadata"]["namespace"]
    body["metadata"]["namespace"] = ns
    return kube.get(REPLICASETS, ns, body["metadata"]["name"]) or kube.create(REPLICASETS, body)


def add_owned_pod(kube: KubeAPIThread, deploy: dict | str, name: str, ip: str = "127.0.0.1", port: int = 8000,
                  annotations: dict | None = None, ready: bool = True, namespace: str | None = None,
                  timeout_s: float = 15.0) -> dict:
    """A running pod of a Deployment's current ReplicaSet, as a kubelet reports it. `deploy`: the
    Deployment, or its name in `namespace` (waited for up to `timeout_s`: the operator makes it)."""
    if isinstance(deploy, str):
        deadline = time.monotonic() + timeout_s
        while (found := kube.get(DEPLOY, namespace, deploy)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no Deployment {namespace}/{deploy} after {timeout_s} s")
            time.sleep(0.05)
        deploy = found
    rs = replicaset_of(kube, deploy)
    return kube.create(PODS, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": rs["metadata"]["namespace"], "labels": rs["metadata"]["labels"],
                     "annotations": annotations or {}, "ownerReferences": [controller_ref(rs)]},
        "spec": {"containers": [{"name": manifests.CONTAINER, "image": "x", "ports": [{"containerPort": port}]}]},
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    })
