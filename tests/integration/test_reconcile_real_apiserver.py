"""Reconcile is idempotent against objects stored the way kube-apiserver stores them.

`StoringApi` is the emulated API plus what a real API server does to a written Deployment or
Service: quantities in canonical form (``nvidia.com/gpu: 1`` -> ``"1"``), empty fields dropped,
defaults filled in. With an exact comparison every pass would see drift and patch; for every
shipped example the count of PATCHes after creation must be zero over 100 passes.
"""

from __future__ import annotations

import copy

import pytest

from kneecap.control import manifests as M, reconcile as R
from kneecap.control.informer import CachedReads
from kneecap.control.kube import KubeClient
from kneecap.control.quantity import canonical_quantity
from kneecap.control.spec import parse_spec
from kneecap.demo.kubeapi import LLMD, KubeAPI, KubeAPIThread
from tests.support.examples import EXAMPLES, ROOT, llmdeployment, others
DEPLOY = "apps/v1/deployments"

CONTAINER_DEFAULTS = {"imagePullPolicy": "IfNotPresent", "terminationMessagePath": "/dev/termination-log",
                      "terminationMessagePolicy": "File"}
PROBE_DEFAULTS = {"timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3}
POD_DEFAULTS = {"restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
                "schedulerName": "default-scheduler"}
DEPLOY_DEFAULTS = {"revisionHistoryLimit": 10, "progressDeadlineSeconds": 600,
                   "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}}
SERVICE_DEFAULTS = {"type": "ClusterIP", "clusterIP": "10.96.0.17", "clusterIPs": ["10.96.0.17"],
                    "sessionAffinity": "None", "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                    "internalTrafficPolicy": "Cluster"}


def _drop_empty(x):
    if isinstance(x, dict):
        return {k: _drop_empty(v) for k, v in x.items() if v not in ({}, [], "", None) or k == "emptyDir"}
    if isinstance(x, list):
        return [_drop_empty(v) for v in x]
    return x


def stored(obj: dict) -> dict:
    """`obj` as kube-apiserver writes it to etcd (the parts a Deployment or Service uses)."""
    obj = _drop_empty(copy.deepcopy(obj))
    spec = obj.get("spec") or {}
    if obj.get("kind") == "Service":
        obj["spec"] = {**SERVICE_DEFAULTS, **spec}
        return obj
    if "template" not in spec:
        return obj
    obj["spec"] = {**DEPLOY_DEFAULTS, **spec}
    pod = spec["template"]["spec"]
    spec["template"]["spec"] = pod = {**POD_DEFAULTS, **pod}
    for c in pod.get("containers") or []:
        for k, v in CONTAINER_DEFAULTS.items():
            c.setdefault(k, v)
        for section in (c.get("resources") or {}).values():
            for k, v in section.items():
                section[k] = canonical_quantity(v)
        for probe in filter(None, (c.get(k) for k in ("readinessProbe", "startupProbe", "livenessProbe"))):
            probe.update({**PROBE_DEFAULTS, "periodSeconds": 10, **probe})
            probe.get("httpGet", {}).setdefault("scheme", "HTTP")
        for m in c.get("volumeMounts") or []:
            if m.get("readOnly") is False:
                del m["readOnly"]  # a non-pointer omitempty bool
    for v in pod.get("volumes") or []:
        for source in ("configMap", "secret"):
            if source in v:
                v[source].setdefault("defaultMode", 420)
        if "sizeLimit" in v.get("emptyDir", {}):
            v["emptyDir"]["sizeLimit"] = canonical_quantity(v["emptyDir"]["sizeLimit"])
        for p in c.get("ports") or []:
            p.setdefault("protocol", "TCP")
    obj["spec"] = {**obj["spec"], "template": spec["template"]}
    return obj


class StoringApi(KubeAPI):
    """The emulated API storing Deployments and Services as kube-apiserver does; counts writes."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.writes: list[tuple[str, str, str]] = []

    def _create(self, request, events):
        obj = super()._create(request, events)
        if request.resource.plural in ("deployments", "services"):
            self.writes.append(("POST", request.resource.plural, obj["metadata"]["name"]))
            self._objects[(request.resource, obj["metadata"]["namespace"], obj["metadata"]["name"])].create(
                {**stored(obj), "metadata": _drop_empty(obj["metadata"]), "status": obj.get("status", {})})
        return self._objects[(request.resource, obj["metadata"]["namespace"], obj["metadata"]["name"])].raw

    def _update(self, request, events, replace):
        obj = super()._update(request, events, replace)
        if request.resource.plural in ("deployments", "services") and request.subresource is None:
            self.writes.append(("PATCH", request.resource.plural, request.name))
            key = (request.resource, request.namespace, request.name)
            self._objects[key].create({**stored(obj), "metadata": _drop_empty(obj["metadata"]), "status": obj.get("status", {})})
        return self._objects[(request.resource, request.namespace, request.name)].raw


@pytest.fixture()
def kube():
    with KubeAPIThread(StoringApi) as k:
        yield k


def test_the_emulation_stores_what_the_apiserver_stores(kube):
    kube.add_namespace("ns")
    d = kube.create(DEPLOY, {"apiVersion": "apps/v1", "kind": "Deployment",
                             "metadata": {"name": "x", "namespace": "ns", "annotations": {}},
                             "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
                                 "metadata": {"labels": {"a": "b"}},
                                 "spec": {"containers": [{"name": "c", "image": "i", "env": [],
                                                          "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": 0.5}}}]}}}})
    got = kube.get(DEPLOY, "ns", "x")
    c = got["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": "1", "cpu": "500m"}} and "env" not in c
    assert "annotations" not in got["metadata"] and got["spec"]["revisionHistoryLimit"] == 10
    assert d["metadata"]["uid"] == got["metadata"]["uid"]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
async def test_every_example_is_patched_zero_times_over_100_passes(kube, example):
    doc = llmdeployment(example)
    ns = doc["metadata"]["namespace"]
    kube.add_namespace(ns)
    for obj in others(example):  # an adopt example's Deployments, applied by the user
        kube.create(DEPLOY, obj)
    users = len(kube.api.writes)
    owner = kube.create(LLMD, doc)
    spec = parse_spec(owner["spec"])
    client = KubeClient(kube.url)
    reads = CachedReads(client)
    api = kube.api
    try:
        first = await R.reconcile(client, owner, spec)
        assert not first.conflicts and not first.missing and len(first.pools) == len(M.pools("x", spec))
        created = list(api.writes)
        if spec.adopted:  # spec.targetRef: read, never written, nothing made
            assert created[users:] == [] and all(p.adoption and not p.created for p in first.pools)
        else:
            assert all(p.created for p in first.pools) and created and all(w[0] == "POST" for w in created)
        changed = 0
        for i in range(100):  # as the control loop: a full pass every 10th tick, cached reads
            res = await R.reconcile(client, owner, spec, full=i % 10 == 0, reads=reads)
            changed += res.changed
            assert not res.conflicts
        assert api.writes[len(created):] == [] and changed == 0  # no PATCH, no Reconciled Event
    finally:
        await reads.close()
        await client.close()


def _created(kube, example: str) -> dict:
    """An example's LLMDeployment, created in its namespace on the faithful API."""
    doc = llmdeployment(ROOT / "examples" / example)
    kube.add_namespace(doc["metadata"]["namespace"])
    return kube.create(LLMD, doc)


async def test_a_spec_change_patches_once_and_keeps_the_applied_record(kube):
    """The control loop's `kneecap.io/applied` annotation survives reconcile's merge patches."""
    owner = _created(kube, "colocated.yaml")
    ns = owner["metadata"]["namespace"]
    client = KubeClient(kube.url)
    try:
        spec = parse_spec(owner["spec"])
        (pool,) = (await R.reconcile(client, owner, spec)).pools
        name = pool.pool.name
        record = '{"maxNumSeqs":256,"gpuMemoryUtilization":0.9}'
        kube.patch(DEPLOY, ns, name, {"metadata": {"annotations": {"kneecap.io/applied": record}}})
        n = len(kube.api.writes)
        changed = parse_spec({**owner["spec"], "engine": {**owner["spec"]["engine"],
                                                          "extraArgs": ["--max-model-len=4096"]}})
        res = await R.reconcile(client, owner, changed)
        again = await R.reconcile(client, owner, changed)
        assert [p.patched for p in res.pools] == [True] and not again.changed
        assert kube.api.writes[n:] == [("PATCH", "deployments", name)]
        live = kube.get(DEPLOY, ns, name)
        assert live["metadata"]["annotations"]["kneecap.io/applied"] == record
        assert "--max-model-len=4096" in live["spec"]["template"]["spec"]["containers"][0]["args"]
    finally:
        await client.close()


async def test_dropping_pod_shaping_fields_removes_them_from_the_live_template(kube):
    """A merge patch keeps what it does not name: the tolerations, nodeSelector, service account...
    that the spec no longer has are sent as nulls, once, and the template is then in sync."""
    owner = _created(kube, "shaped-pods.yaml")
    ns = owner["metadata"]["namespace"]
    client = KubeClient(kube.url)
    try:
        (pool,) = (await R.reconcile(client, owner, parse_spec(owner["spec"]))).pools
        name = pool.pool.name
        engine = {k: v for k, v in owner["spec"]["engine"].items() if k not in ("envFrom", "volumeMounts")}
        engine["podTemplate"] = {"spec": {"runtimeClassName": "nvidia"}}
        plain = parse_spec({**owner["spec"], "engine": engine})
        n = len(kube.api.writes)
        res = await R.reconcile(client, owner, plain)
        again = await R.reconcile(client, owner, plain)
        assert [p.patched for p in res.pools] == [True] and not again.changed
        assert kube.api.writes[n:] == [("PATCH", "deployments", name)]
        pod = kube.get(DEPLOY, ns, name)["spec"]["template"]["spec"]
        gone = ("tolerations", "nodeSelector", "affinity", "imagePullSecrets", "serviceAccountName", "priorityClassName")
        assert [k for k in gone if k in pod] == [] and pod["runtimeClassName"] == "nvidia"
        (c,) = pod["containers"]
        assert "envFrom" not in c and [v["name"] for v in pod["volumes"]] == ["home", "dshm", "model-cache"]
    finally:
        await client.close()
