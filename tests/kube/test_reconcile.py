"""Reconcile's merge patches on the real kube-apiserver, as the chart's ServiceAccount: a spec
change patches the pool's Deployment once and keeps the control loop's `kneecap.io/applied`
record; pod-shaping fields the spec drops leave the live template (sent once as nulls); a light
pass reads and writes Deployments only, a full one recreates a Service and prunes dropped pools."""

from __future__ import annotations

import copy
import ssl

import pytest

from kneecap.control import reconcile
from kneecap.control.kube import KubeClient
from kneecap.control.spec import parse_spec
from tests.kube.conftest import OPERATOR_USER, RELEASE_NS, SERVICE_ACCOUNT
from tests.support.control_plane import ControlPlane, audit_writes
from tests.support.examples import ROOT, llmdeployment

LLMD = "kneecap.io/v1alpha1/llmdeployments"
DEPLOY = "apps/v1/deployments"
SERVICE = "v1/services"
NS = "reconcile"


@pytest.fixture()
async def client(control_plane: ControlPlane, chart_installed: dict, ns: str):
    ctx = ssl.create_default_context(cafile=str(control_plane.pki.ca))
    kube = KubeClient(control_plane.url, token=control_plane.token(RELEASE_NS, SERVICE_ACCOUNT), ssl_context=ctx)
    yield kube
    await kube.close()


def _created(plane: ControlPlane, example: str, name: str) -> dict:
    doc = copy.deepcopy(llmdeployment(ROOT / "examples" / example))
    doc["metadata"] = {"name": name, "namespace": NS}
    return plane.admin.create(LLMD, doc)


def _deployment_writes(plane: ControlPlane, since: int) -> list[tuple[str, str]]:
    return [(e["verb"], e["objectRef"].get("name")) for e in plane.audit(OPERATOR_USER, since_line=since)
            if e["objectRef"].get("resource") == "deployments" and e["verb"] in ("create", "patch", "update")]


async def test_a_spec_change_patches_once_and_keeps_the_applied_record(control_plane, client):
    owner = _created(control_plane, "colocated.yaml", "spec-change")
    (pool,) = (await reconcile.reconcile(client, owner, parse_spec(owner["spec"]))).pools
    name = pool.pool.name
    record = '{"maxNumSeqs":256,"gpuMemoryUtilization":0.9}'
    control_plane.admin.patch(DEPLOY, NS, name, {"metadata": {"annotations": {"kneecap.io/applied": record}}})
    mark = control_plane.audit_mark()
    changed = parse_spec({**owner["spec"], "engine": {**owner["spec"]["engine"], "extraArgs": ["--max-model-len=4096"]}})
    res = await reconcile.reconcile(client, owner, changed)
    again = await reconcile.reconcile(client, owner, changed)
    assert [p.patched for p in res.pools] == [True] and not again.changed
    assert _deployment_writes(control_plane, mark) == [("patch", name)]
    live = control_plane.admin.get(DEPLOY, NS, name)
    assert live["metadata"]["annotations"]["kneecap.io/applied"] == record
    assert "--max-model-len=4096" in live["spec"]["template"]["spec"]["containers"][0]["args"]


async def test_dropping_pod_shaping_fields_removes_them_from_the_live_template(control_plane, client):
    owner = _created(control_plane, "shaped-pods.yaml", "unshaped")
    (pool,) = (await reconcile.reconcile(client, owner, parse_spec(owner["spec"]))).pools
    name = pool.pool.name
    stored = control_plane.admin.get(DEPLOY, NS, name)["spec"]["template"]["spec"]
    assert stored["serviceAccount"] == stored["serviceAccountName"] == "vllm"  # the API's mirror
    engine = {k: v for k, v in owner["spec"]["engine"].items() if k not in ("envFrom", "volumeMounts")}
    engine["podTemplate"] = {"spec": {"runtimeClassName": "nvidia"}}
    plain = parse_spec({**owner["spec"], "engine": engine})
    mark = control_plane.audit_mark()
    res = await reconcile.reconcile(client, owner, plain)
    again = await reconcile.reconcile(client, owner, plain)
    assert [p.patched for p in res.pools] == [True] and not again.changed
    assert _deployment_writes(control_plane, mark) == [("patch", name)]
    pod = control_plane.admin.get(DEPLOY, NS, name)["spec"]["template"]["spec"]
    gone = ("tolerations", "nodeSelector", "affinity", "imagePullSecrets", "serviceAccountName", "serviceAccount",
            "priorityClassName")
    assert [k for k in gone if k in pod] == [] and pod["runtimeClassName"] == "nvidia"
    (c,) = pod["containers"]
    assert "envFrom" not in c and [v["name"] for v in pod["volumes"]] == ["home", "dshm", "model-cache"]


async def test_a_light_pass_checks_deployments_only_and_a_full_pass_repairs_the_rest(control_plane, client):
    """Ticks between full passes touch Deployments only; a full pass recreates a deleted Service
    and prunes a pool the spec dropped (the spec handlers and every FULL_RECONCILE_TICKS-th tick)."""
    admin = control_plane.admin
    owner = _created(control_plane, "colocated.yaml", "passes")
    spec = parse_spec(owner["spec"])
    first = await reconcile.reconcile(client, owner, spec)
    assert [p.created for p in first.pools] == [True] and admin.get(SERVICE, NS, "passes")
    assert admin.delete(SERVICE, NS, "passes") == 200
    mark = control_plane.audit_mark()
    light = await reconcile.reconcile(client, owner, spec, full=False)
    assert not light.changed and admin.get(SERVICE, NS, "passes") is None
    # (and the HPAs: who owns the replicas) but no Service, neither read nor written
    assert {e["objectRef"]["resource"] for e in control_plane.audit(OPERATOR_USER, since_line=mark)
            if e["objectRef"].get("namespace") == NS} == {
        "deployments", "horizontalpodautoscalers"}
    full = await reconcile.reconcile(client, owner, spec)
    assert not full.changed and admin.get(SERVICE, NS, "passes") is not None  # the Service recreated
    # a pool the spec no longer has is pruned by a full pass only
    disagg = parse_spec({**owner["spec"], "topology": {"mode": "disaggregated", "kvTransfer": {}}})
    await reconcile.reconcile(client, owner, disagg)
    assert admin.get(DEPLOY, NS, "passes-decode") and admin.get(DEPLOY, NS, "passes") is None
    mark = control_plane.audit_mark()
    await reconcile.reconcile(client, owner, spec, full=False)
    assert admin.get(DEPLOY, NS, "passes-decode") is not None  # a light pass deletes nothing
    assert [e for e in audit_writes(control_plane.audit(OPERATOR_USER, since_line=mark))
            if e["verb"] == "delete" and e["objectRef"].get("namespace") == NS] == []
    gone = await reconcile.reconcile(client, owner, spec)
    assert sorted(gone.deleted) == ["Deployment/passes-decode", "Deployment/passes-prefill",
                                    "Service/passes-decode", "Service/passes-prefill"]
    assert [admin.get(r, NS, n) for r in (DEPLOY, SERVICE) for n in ("passes-decode", "passes-prefill")] == [None] * 4
    admin.delete(LLMD, NS, "passes")  # not left for another module's operator to reconcile
