"""Level-triggered reconcile of the objects an LLMDeployment owns.

Observe what is live, compare with what the spec asks for, and send only the difference:
reconciling twice changes nothing (compared semantically, as a real API server stores objects:
`drift`). Only objects kneecap made are touched: a Deployment or Service of the same name
without kneecap's label and an ownerReference to this LLMDeployment's uid is someone else's,
and is reported as a `Conflict`, never patched, adopted or deleted. The values the control loop manages (--max-num-seqs, the
memory flag, replicas) are read back from the live Deployment, so a spec reconcile never undoes
a decision; everything else in the pod template follows the spec.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Container, Iterable
from dataclasses import dataclass, field

from kneecap.control import manifests, target
from kneecap.control.drift import in_sync
from kneecap.control.informer import ApiReads
from kneecap.control.kube import FIELD_MANAGER, KubeClient, deployments_path, services_path
from kneecap.control.spec import LLMDeploymentSpec

log = logging.getLogger("kneecap.reconcile")


@dataclass(frozen=True)
class Conflict:
    """An object kneecap would own that exists and belongs to someone else (left alone; its
    pool is not reconciled)."""

    kind: str  # "Deployment" | "Service"
    name: str
    message: str


def owns(owner: dict, obj: dict) -> bool:
    """kneecap made `obj` for `owner`: kneecap's managed-by label and an ownerReference to its uid."""
    meta, uid = obj.get("metadata") or {}, owner["metadata"].get("uid")
    return ((meta.get("labels") or {}).get(manifests.MANAGER_LABEL) == manifests.MANAGER
            and any(r.get("uid") == uid for r in meta.get("ownerReferences") or []))


def _conflict(owner: dict, kind: str, obj: dict) -> Conflict:
    meta = obj["metadata"]
    why = ("no ownerReference to uid " + str(owner["metadata"].get("uid"))
           if (meta.get("labels") or {}).get(manifests.MANAGER_LABEL) == manifests.MANAGER else
           f"no {manifests.MANAGER_LABEL}={manifests.MANAGER} label")
    return Conflict(kind, meta["name"], f"{kind} {meta.get('namespace', owner['metadata']['namespace'])}/"
                                        f"{meta['name']} exists and is not owned by this LLMDeployment "
                                        f"({why}); kneecap changes nothing")


@dataclass(frozen=True)
class Ownership:
    """Who owns a pool's `replicas`: kneecap, or someone it must not fight (HPA, a person)."""

    replicas_owner: str  # "kneecap" | "spec" | "hpa/<name>" | "manager/<field manager>"

    @property
    def external(self) -> bool:
        return self.replicas_owner != "kneecap"


def replicas_owner(spec: LLMDeploymentSpec, deploy: dict | None, hpas: list[dict]) -> Ownership:
    """Declared in spec, an HPA targeting the Deployment, or another field manager of spec.replicas."""
    if spec.topology.replicas_managed_by == "external":
        return Ownership("spec")
    if deploy is None:
        return Ownership("kneecap")
    name = deploy["metadata"]["name"]
    for h in hpas:
        ref = h.get("spec", {}).get("scaleTargetRef", {})
        if ref.get("kind") == "Deployment" and ref.get("name") == name:
            return Ownership(f"hpa/{h['metadata']['name']}")
    for mf in deploy["metadata"].get("managedFields") or []:
        fields = (mf.get("fieldsV1") or {}).get("f:spec") or {}
        manager = mf.get("manager", "")
        if "f:replicas" in fields and manager not in (FIELD_MANAGER, "kube-controller-manager", ""):
            return Ownership(f"manager/{manager}")
    return Ownership("kneecap")


@dataclass
class PoolState:
    pool: manifests.Pool
    deployment: dict
    settings: manifests.EngineSettings
    ownership: Ownership
    created: bool = False
    patched: bool = False
    adoption: target.Adoption | None = None  # spec.targetRef: the user's Deployment (None: kneecap's own)
    rollout_pending: bool = False  # a planned patch changes its spec: a rollout starts once it is sent

    @property
    def engine_container(self) -> dict:
        """The live vLLM container: the adopted one by name, else kneecap's (manifests.vllm_container)."""
        found = target.find_container(self.deployment, self.adoption.container) if self.adoption is not None else None
        return found or manifests.vllm_container(self.deployment)

    @property
    def rollout_in_progress(self) -> bool:
        """Deployment controller has not caught up, or not all replicas run the new template (or a
    patch about to be sent changes its spec)."""
        if self.rollout_pending:
            return True
        d, st = self.deployment, self.deployment.get("status") or {}
        if not st:
            return False
        if int(st.get("observedGeneration", 0)) < int(d["metadata"].get("generation", 0)):
            return True
        want = int(d["spec"].get("replicas", 1))
        return int(st.get("updatedReplicas", want)) < want or int(st.get("unavailableReplicas", 0)) > 0


@dataclass(frozen=True)
class ObjectWrite:
    """One write reconcile decided: create, patch or delete an owned Deployment or Service."""

    verb: str  # create | patch | delete
    kind: str  # Deployment | Service
    name: str
    path: str  # the collection's path for create, the object's otherwise
    body: dict | None = None  # the object (create) or the merge patch (patch)

    @property
    def change(self) -> str:
        """What it does, for the Reconciled Event: "llm created" (a pool's Deployment), "Service/llm
        patched", "Deployment/llm-old deleted"."""
        what = self.name if self.kind == "Deployment" and self.verb != "delete" else f"{self.kind}/{self.name}"
        return f"{what} {dict(create='created', patch='patched', delete='deleted')[self.verb]}"


@dataclass(frozen=True)
class LiveObjects:
    """What reconcile reads of one LLMDeployment's owned (or adopted) objects; read only."""

    hpas: tuple[dict, ...]
    deployments: dict[str, dict | None]  # pool Deployment name -> live object (None: absent)
    services: dict[str, dict | None] | None = None  # pool Service name -> live object; a full pass only
    owned: tuple[tuple[str, dict], ...] | None = None  # (kind, object) kneecap made for the owner; a full pass only

    @property
    def full(self) -> bool:
        return self.owned is not None


@dataclass
class ReconcileResult:
    pools: list[PoolState] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)  # their pools are left out of `pools`
    missing: list[str] = field(default_factory=list)  # spec.targetRef Deployments (or containers) not found
    writes: list[ObjectWrite] = field(default_factory=list)  # what brings the live objects to the spec, in order
    found_in_sync: list[tuple] = field(default_factory=list)  # InSyncCache keys of the Deployments compared equal

    @property
    def changed(self) -> bool:
        return bool(self.deleted) or any(p.created or p.patched for p in self.pools)


async def _hpas(reads: ApiReads, ns: str) -> list[dict]:
    try:
        return await reads.hpas(ns)
    except Exception:  # noqa: BLE001 - no HPA API is the same as no HPA
        return []


async def read_live(kube: KubeClient, owner: dict, spec: LLMDeploymentSpec, *, full: bool = True,
                    reads: ApiReads | None = None) -> LiveObjects:
    """Read what reconcile compares: the pools' Deployments and the namespace's HPAs (from
    ``reads``: the API by default, the ticks' watch-backed caches), and on a full pass the
    Services and every object kneecap made for ``owner`` (from the API). Writes nothing."""
    ns, name = owner["metadata"]["namespace"], owner["metadata"]["name"]
    reads = reads or ApiReads(kube)
    pools = manifests.pools(name, spec)
    hpas = tuple(await _hpas(reads, ns))
    deployments = {pool.name: await reads.deployment(ns, pool.name) for pool in pools}
    if spec.adopted or not full:
        return LiveObjects(hpas, deployments)
    services = {pool.name: await kube.get(services_path(ns, pool.name)) for pool in pools}
    owned = tuple((_KIND[path_fn], obj) for path_fn, obj in await _owned(kube, owner))
    return LiveObjects(hpas, deployments, services, owned)


def plan_reconcile(owner: dict, spec: LLMDeploymentSpec, live: LiveObjects,
                   known_in_sync: Container[tuple] = ()) -> ReconcileResult:
    """Compare the live objects with what the spec asks for (pure): each pool's state as it will
    be, the conflicts, and the writes that create what is missing, patch what drifted and (a full
    pass) delete the pools the spec dropped. A pool to be created is represented by the object to
    be created (``created``); one to be patched by its live object (``patched``: its rollout
    starts with the patch, so the loop holds its decisions until the next tick).

    ``known_in_sync`` (an :class:`InSyncCache`, read only here): a Deployment whose key it holds is
    not compared again; the keys of those compared equal come back in ``found_in_sync``."""
    ns, name = owner["metadata"]["namespace"], owner["metadata"]["name"]
    result = ReconcileResult()
    pools = manifests.pools(name, spec)
    if spec.adopted:
        for pool, ref in zip(pools, spec.targets):
            state = adopted_pool(ns, spec, pool, ref.container, live, result)
            if state is not None:
                result.pools.append(state)
        return result
    for pool in pools:
        state = _plan_pool(owner, spec, pool, live, result, known_in_sync)
        if state is None:
            continue  # the Deployment is someone else's: nothing is made for this pool
        result.pools.append(state)
        if live.services is not None:
            _plan_service(owner, spec, pool, live.services.get(pool.name), result)
    if live.owned is None:
        return result
    keep = {p.name for p in pools}
    for kind, obj in live.owned:
        n = obj["metadata"]["name"]
        if n not in keep:
            path_fn = deployments_path if kind == "Deployment" else services_path
            result.writes.append(ObjectWrite("delete", kind, n, path_fn(ns, n)))
            result.deleted.append(f"{kind}/{n}")  # (a real API's list items carry no kind)
    return result


async def write(kube: KubeClient, w: ObjectWrite) -> tuple[dict | None, bool]:
    """Send one write: (the object the API returned, whether it changed anything: a create that
    found the object already there (409) did not)."""
    if w.verb == "create":
        return await kube.create(w.path, w.body)
    if w.verb == "patch":
        return await kube.patch(w.path, w.body), True
    return None, await kube.delete(w.path)


async def reconcile(kube: KubeClient, owner: dict, spec: LLMDeploymentSpec, *, full: bool = True,
                    reads: ApiReads | None = None, sync_cache: InSyncCache | None = None) -> ReconcileResult:
    """Create what is missing, patch what drifted from the spec, delete pools the spec dropped
    (:func:`read_live`, :func:`plan_reconcile`, then the writes in order; the spec handlers'
    pass, the control loop's ticks send the same writes as actions of their plan).

    ``full=False`` (the control loop's ticks between full passes): Deployments only, no
    Service check and no pruning; what a spec change adds or drops is handled by the spec
    handlers, which always run a full pass. A write that fails raises (ApiError)."""
    result = plan_reconcile(owner, spec, await read_live(kube, owner, spec, full=full, reads=reads),
                            () if sync_cache is None else sync_cache)
    if sync_cache is not None:
        sync_cache.record(result.found_in_sync)
    written: dict[str, dict] = {}
    for w in result.writes:
        obj, changed = await write(kube, w)
        if w.kind == "Deployment" and obj is not None:
            written[w.name] = obj
        if w.verb == "create" and not changed and not owns(owner, obj):  # someone else's, made a moment before
            result.conflicts.append(_conflict(owner, w.kind, obj))
            result.pools = [p for p in result.pools if p.pool.name != w.name or w.kind != "Deployment"]
    for p in result.pools:
        if p.pool.name in written:
            p.deployment, p.rollout_pending = written[p.pool.name], False
            p.settings = manifests.live_settings(p.deployment, manifests.initial_settings(spec, p.pool.role))
    return result


def adopted_pool(ns: str, spec: LLMDeploymentSpec, pool: manifests.Pool, container: str | None,
                 live: LiveObjects, result: ReconcileResult) -> PoolState | None:
    """A spec.targetRef Deployment as it is live, read only: kneecap creates, repairs and owns
    nothing of it. None (and `result.missing` says why) when it or its container is absent."""
    deploy = live.deployments.get(pool.name)
    if deploy is None:
        result.missing.append(f"Deployment {ns}/{pool.name} (spec.targetRef, {pool.role}) not found; "
                              "kneecap creates nothing for it")
        return None
    c = target.find_container(deploy, container)
    if c is None:
        result.missing.append(f"Deployment {ns}/{pool.name} has no container {container!r} "
                              "(spec.targetRef.container)")
        return None
    adoption = target.adoption(deploy, c)
    start = manifests.initial_settings(spec, pool.role)
    try:
        settings = manifests.live_settings(deploy, start, c)
    except ValueError as exc:  # e.g. --max-num-seqs=$(SEQS): a value only the kubelet expands
        settings = manifests.EngineSettings(start.max_num_seqs, start.gpu_memory_utilization, None,
                                            int(deploy["spec"].get("replicas", 1)))
        adoption = target.Adoption(adoption.container, adoption.port, adoption.controller,
                                   f"a managed flag's value in its argv is not a number ({exc}): kneecap advises only",
                                   adoption.tensor_parallel_size)
    return PoolState(pool, deploy, settings, replicas_owner(spec, deploy, list(live.hpas)), adoption=adoption)


def _plan_pool(owner: dict, spec: LLMDeploymentSpec, pool: manifests.Pool, live: LiveObjects,
               result: ReconcileResult, known_in_sync: Container[tuple]) -> PoolState | None:
    """One pool's Deployment: created when missing, patched when it drifted; None (and a
    Conflict) when it is not kneecap's."""
    ns = owner["metadata"]["namespace"]
    deploy = live.deployments.get(pool.name)
    start = manifests.initial_settings(spec, pool.role)
    hpas = list(live.hpas)
    if deploy is None:
        desired = manifests.deployment(owner, spec, pool, start)
        result.writes.append(ObjectWrite("create", "Deployment", pool.name, deployments_path(ns), desired))
        return PoolState(pool, desired, manifests.live_settings(desired, start), replicas_owner(spec, desired, hpas),
                         created=True)
    if not owns(owner, deploy):
        result.conflicts.append(_conflict(owner, "Deployment", deploy))
        return None
    ownership = replicas_owner(spec, deploy, hpas)
    settings = manifests.live_settings(deploy, start)
    if not ownership.external:
        bounds = manifests.pool_bounds(spec, pool.role)
        settings = manifests.EngineSettings(settings.max_num_seqs, settings.gpu_memory_utilization,
                                            settings.kv_cache_memory_bytes, bounds.clamp(settings.replicas))
    key = _sync_key(owner, deploy, pool, settings, ownership.external, spec.shared_gpu_share)
    patched = rollout_pending = False
    if key is None or key not in known_in_sync:
        desired = manifests.deployment(owner, spec, pool, settings)
        # labels, the owner reference and the pod template (replicas unless an HPA or a person
        # owns them); other metadata (the loop's kneecap.io/applied annotation) is left as it is
        want = {"metadata": {"labels": desired["metadata"]["labels"],
                             "ownerReferences": desired["metadata"]["ownerReferences"]},
                "spec": {"template": desired["spec"]["template"]}}
        if not ownership.external:
            want["spec"]["replicas"] = desired["spec"]["replicas"]
        removed = manifests.removed_template_fields(desired, deploy)
        patched = not in_sync(want, deploy) or bool(removed)
        if patched:
            if removed:  # what the spec dropped (a toleration list, a nodeSelector) leaves the live template too
                want["spec"]["template"] = {**want["spec"]["template"],
                                            "spec": {**want["spec"]["template"]["spec"], **removed}}
            result.writes.append(ObjectWrite("patch", "Deployment", pool.name, deployments_path(ns, pool.name), want))
            rollout_pending = bool(removed) or not in_sync({"spec": want["spec"]}, deploy)
        elif key is not None:
            result.found_in_sync.append(key)
    return PoolState(pool, deploy, settings, ownership, patched=patched, rollout_pending=rollout_pending)


class InSyncCache:
    """Deployments found in sync with what the builder makes, keyed by everything the builder and
    the comparison read (the owner's generation for its spec, the live object's resourceVersion):
    a steady pool is compared once, not on every tick (the semantic diff walks the whole
    Deployment). One per operator process (``LoopContext.sync_cache``); bounded: full, it starts over."""

    def __init__(self, max_entries: int = 8192):
        self.max_entries = max_entries
        self._keys: dict[tuple, None] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def record(self, keys: Iterable[tuple]) -> None:
        for key in keys:
            if len(self._keys) >= self.max_entries:
                self._keys.clear()
            self._keys[key] = None


def _sync_key(owner: dict, live: dict, pool: manifests.Pool, settings: manifests.EngineSettings,
              external: bool, shared_gpu_share: float | None = None) -> tuple | None:
    """The owner's generation stands for its spec, with the shared GPU's share the fleet advice
    set (status.placement; None: an API without generations, or without resourceVersions:
    compare every time)."""
    meta, lmeta = owner["metadata"], live.get("metadata") or {}
    if not lmeta.get("resourceVersion") or meta.get("generation") is None:
        return None
    return (meta.get("namespace"), meta.get("name"), meta.get("uid"), meta["generation"], lmeta.get("uid"),
            lmeta["resourceVersion"], pool, settings, external, shared_gpu_share)


def _plan_service(owner: dict, spec: LLMDeploymentSpec, pool: manifests.Pool, live: dict | None,
                  result: ReconcileResult) -> None:
    """One pool's Service: created when missing, patched when it drifted; a Conflict when it is
    not kneecap's."""
    ns = owner["metadata"]["namespace"]
    svc = manifests.service(owner, spec, pool)
    if live is None:
        result.writes.append(ObjectWrite("create", "Service", pool.name, services_path(ns), svc))
        return
    if not owns(owner, live):
        result.conflicts.append(_conflict(owner, "Service", live))
        return
    want = {"metadata": {"labels": svc["metadata"]["labels"]}, "spec": svc["spec"]}
    if not in_sync(want, live):
        result.writes.append(ObjectWrite("patch", "Service", pool.name, services_path(ns, pool.name), want))


_KIND = {deployments_path: "Deployment", services_path: "Service"}


async def _owned(kube: KubeClient, owner: dict) -> list[tuple]:
    """(path function, object) of the Deployments and Services kneecap made for `owner`
    (its labels and an ownerReference to its uid), read from the API."""
    ns, name = owner["metadata"]["namespace"], owner["metadata"]["name"]
    return [(path_fn, obj) for path_fn in (deployments_path, services_path)
            for obj in await kube.list(path_fn(ns), manifests.owned_selector(name)) if owns(owner, obj)]


async def delete_owned(kube: KubeClient, owner: dict) -> list[str]:
    """Explicit cleanup of owned objects (clusters garbage-collect by ownerReferences anyway)."""
    ns = owner["metadata"]["namespace"]
    return [obj["metadata"]["name"] for path_fn, obj in await _owned(kube, owner)
            if await kube.delete(path_fn(ns, obj["metadata"]["name"]))]


def ready(pods: list[dict]) -> list[dict]:
    """The pods that are Running, Ready and not being deleted."""
    out = []
    for p in pods:
        st = p.get("status") or {}
        is_ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
        if is_ready and st.get("phase", "Running") == "Running" and not p["metadata"].get("deletionTimestamp"):
            out.append(p)
    return out


def unschedulable(pods: list[dict]) -> str:
    """Why the scheduler cannot place the pool's pods (its PodScheduled=False/Unschedulable
    message for the first such pod), or "" when none waits for that."""
    for p in pods:
        for c in (p.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
                return f"pod {p['metadata'].get('name')} cannot be scheduled: {c.get('message') or 'no reason given'}"
    return ""


def ignored_metrics_url(pods: list[dict]) -> str:
    """The pods whose `kneecap.io/metrics-url` annotation names a host other than their own IP
    (kneecap scrapes the pod's IP instead), for a Warning condition; "" when none."""
    out = []
    for p in pods:
        ann = (p["metadata"].get("annotations") or {}).get(manifests.METRICS_URL_ANNOTATION)
        if ann and not _points_at(ann, (p.get("status") or {}).get("podIP")):
            out.append(f"pod {p['metadata'].get('name')}: {manifests.METRICS_URL_ANNOTATION}={ann!r}")
    return "; ".join(out)


def metrics_url(pod: dict, port: int) -> str | None:
    """http://<podIP>:<port>/metrics, or the `kneecap.io/metrics-url` annotation when it points
    at the pod itself (its host is the pod's IP; any port and path). An annotation naming any
    other host is ignored (logged): a pod's annotations must not make the operator fetch
    arbitrary URLs (cloud metadata endpoints, internal services)."""
    ip = (pod.get("status") or {}).get("podIP")
    ann = (pod["metadata"].get("annotations") or {}).get(manifests.METRICS_URL_ANNOTATION)
    if ann:
        if _points_at(ann, ip):
            return ann
        log.warning("pod %s/%s: %s=%r ignored: its host must be the pod's IP %s",
                    pod["metadata"].get("namespace"), pod["metadata"].get("name"), manifests.METRICS_URL_ANNOTATION,
                    ann, ip)
    if not ip:
        return None
    return f"http://[{ip}]:{port}/metrics" if ":" in ip else f"http://{ip}:{port}/metrics"


def _points_at(url: str, ip: str | None) -> bool:
    try:
        u = urllib.parse.urlsplit(url)
        u.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        return False
    return bool(ip) and u.scheme in ("http", "https") and u.hostname == ip.lower() and not u.username
