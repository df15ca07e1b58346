"""Reconcile's merge patches on the real kube-apiserver, as the chart's ServiceAccount: a spec
change patches the pool's Deployment once and keeps the control loop's `kneecap.io/applied`
record; pod-shaping fields the spec drops leave the live template (sent once as nulls)."""

from __future__ import annotations

import copy
import ssl

import pytest

from kneecap.control import reconcile as R
from kneecap.control.kube import KubeClient
from kneecap.control.spec import parse_spec
from tests.kube.conftest import OPERATOR_USER, RELEASE_NS, SERVICE_ACCOUNT
from tests.support.control_plane import ControlPlane
from tests.support.examples import ROOT, llmdeployment

LLMD = "kneecap.io/v1alpha1/llmdeployments"
DEPLOY = "apps/v1/deployments"
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
    (pool,) = (await R.reconcile(client, owner, parse_spec(owner["spec"]))).pools
    name = pool.pool.name
    record = '{"maxNumSeqs":256,"gpuMemoryUtilization":0.9}'
    control_plane.admin.patch(DEPLOY, NS, name, {"metadata": {"annotations": {"kneecap.io/applied": record}}})
    mark = control_plane.audit_mark()
    changed = parse_spec({**owner["spec"], "engine": {**owner["spec"]["engine"], "extraArgs": ["--max-model-len=4096"]}})
    res = await R.reconcile(client, owner, changed)
    again = await R.reconcile(client, owner, changed)
    assert [p.patched for p in res.pools] == [True] and not again.changed
    assert _deployment_writes(control_plane, mark) == [("patch", name)]
    live = control_plane.admin.get(DEPLOY, NS, name)
    assert live["metadata"]["annotations"]["kneecap.io/applied"] == record
    assert "--max-model-len=4096" in live["spec"]["template"]["spec"]["containers"][0]["args"]


async def test_dropping_pod_shaping_fields_removes_them_from_the_live_template(control_plane, client):
    owner = _created(control_plane, "shaped-pods.yaml", "unshaped")
    (pool,) = (await R.reconcile(client, owner, parse_spec(owner["spec"]))).pools
    name = pool.pool.name
    stored = control_plane.admin.get(DEPLOY, NS, name)["spec"]["template"]["spec"]
    assert stored["serviceAccount"] == stored["serviceAccountName"] == "vllm"  # the API's mirror
    engine = {k: v for k, v in owner["spec"]["engine"].items() if k not in ("envFrom", "volumeMounts")}
    engine["podTemplate"] = {"spec": {"runtimeClassName": "nvidia"}}
    plain = parse_spec({**owner["spec"], "engine": engine})
    mark = control_plane.audit_mark()
    res = await R.reconcile(client, owner, plain)
    again = await R.reconcile(client, owner, plain)
    assert [p.patched for p in res.pools] == [True] and not again.changed
    assert _deployment_writes(control_plane, mark) == [("patch", name)]
    pod = control_plane.admin.get(DEPLOY, NS, name)["spec"]["template"]["spec"]
    gone = ("tolerations", "nodeSelector", "affinity", "imagePullSecrets", "serviceAccountName", "serviceAccount",
            "priorityClassName")
    assert [k for k in gone if k in pod] == [] and pod["runtimeClassName"] == "nvidia"
    (c,) = pod["containers"]
    assert "envFrom" not in c and [v["name"] for v in pod["volumes"]] == ["home", "dshm", "model-cache"]
