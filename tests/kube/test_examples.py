"""Every shipped example on the real control plane, as a user applies it (`kubectl apply
--server-side`, with what its comments say to create first), under one operator run as the
chart's ServiceAccount: accepted, reconciled, Ready (pods placed by the real scheduler, Running
under kwok), children that the real API stored as valid; then 100 steady ticks each in which the
operator's user sends no POST/PATCH/PUT to Deployments or Services (the audit log) and posts no
new Event."""

from __future__ import annotations

import copy

import pytest
import yaml

from tests.kube.conftest import (H100_NODES, OPERATOR_USER, OperatorProcess, chart_operator_args, clear_namespace, kubectl,
                                 wait_ticks, with_ports)
from tests.support.control_plane import ControlPlane, free_port
from tests.support.examples import EXAMPLES, documents, llmdeployment

LLMD = "kneecap.io/v1alpha1/llmdeployments"
STEADY_TICKS = 100
INTERVAL = "1s"


def _referenced(value, key: str) -> set[str]:
    """Every ``key: {name: ...}`` / ``key: name`` reference in an example's documents."""
    found: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            if k == key:
                found.add(v if isinstance(v, str) else v["name"])
            else:
                found |= _referenced(v, key)
    elif isinstance(value, list):
        for v in value:
            found |= _referenced(v, key)
    return found


def _prerequisites(admin, path) -> None:
    """What an example needs to exist first, as its comments tell the user: the namespace, the
    Secrets and ConfigMaps it reads, the PVCs it mounts (bound to a PV by the real
    persistent-volume controller), and for the shaped pods their ServiceAccount, PriorityClass
    and RuntimeClass (the API's admission refuses a pod naming a missing one)."""
    ns = llmdeployment(path)["metadata"]["namespace"]
    admin.add_namespace(ns)
    docs = documents(path)
    for name in _referenced(docs, "secretRef") | _referenced(docs, "secretKeyRef"):
        admin.create("v1/secrets", {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": ns},
                                    "stringData": {"HF_TOKEN": "hf_test", "token": "hf_test"}})
    for name in _referenced(docs, "configMap"):
        admin.create("v1/configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                       "metadata": {"name": name, "namespace": ns}, "data": {"chat.jinja": "{{ m }}"}})
    for name in _referenced(docs, "claimName"):
        admin.create("v1/persistentvolumes", {
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{ns}-{name}"},
            "spec": {"capacity": {"storage": "200Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                     "hostPath": {"path": f"/models/{name}"}, "claimRef": {"namespace": ns, "name": name}}})
        admin.create("v1/persistentvolumeclaims", {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": ns},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": f"{ns}-{name}",
                     "resources": {"requests": {"storage": "200Gi"}}}})
    for name in _referenced(docs, "serviceAccountName"):
        admin.create("v1/serviceaccounts", {"apiVersion": "v1", "kind": "ServiceAccount",
                                            "metadata": {"name": name, "namespace": ns}})
    for name in _referenced(docs, "priorityClassName"):
        admin.create("scheduling.k8s.io/v1/priorityclasses", {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}, "value": 100000})
    for name in _referenced(docs, "runtimeClassName"):
        admin.create("node.k8s.io/v1/runtimeclasses", {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                                                       "metadata": {"name": name}, "handler": name})


def _fast(path) -> str:
    """The example with spec.control.interval 1s, so 100 ticks take ~100 s."""
    docs = documents(path)
    for d in docs:
        if d["kind"] == "LLMDeployment":
            d["spec"].setdefault("control", {})["interval"] = INTERVAL
    return yaml.safe_dump_all(docs)


def _ready(admin, ns: str, name: str) -> dict | None:
    st = (admin.get(LLMD, ns, name) or {}).get("status") or {}
    cond = next((c for c in st.get("conditions") or [] if c["type"] == "Ready"), {})
    return st if cond.get("status") == "True" else None


@pytest.fixture(scope="module")
def examples_running(control_plane: ControlPlane, chart_installed: dict, operator_kubeconfig, tmp_path_factory):
    admin = control_plane.admin
    args = with_ports(chart_operator_args(chart_installed), free_port(), free_port()) + ["--tick", "0.25"]
    op = OperatorProcess(args, operator_kubeconfig, tmp_path_factory.mktemp("examples") / "operator.log",
                         pod_id="kneecap-examples")
    try:
        for path in EXAMPLES:
            _prerequisites(admin, path)
            kubectl(control_plane, "apply", "--server-side", "-f", "-", input=_fast(path))
        keys = [(llmdeployment(p)["metadata"]["namespace"], llmdeployment(p)["metadata"]["name"]) for p in EXAMPLES]
        for ns, name in keys:
            try:
                control_plane.wait_for(lambda: _ready(admin, ns, name), 180, f"{ns}/{name} Ready")
            except Exception:
                st = (admin.get(LLMD, ns, name) or {}).get("status")
                raise AssertionError(f"{ns}/{name} not Ready: {st}\noperator log:\n{op.tail()}") from None
        yield op, keys
    finally:
        op.stop()
        for namespace in sorted({llmdeployment(p)["metadata"]["namespace"] for p in EXAMPLES}):
            clear_namespace(admin, namespace)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_reconciled_ready_with_valid_children(control_plane, examples_running, path):
    admin = control_plane.admin
    obj = llmdeployment(path)
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    stored = admin.get(LLMD, ns, name)
    status = _ready(admin, ns, name)
    assert status and status["observedGeneration"] == stored["metadata"]["generation"]
    adopted = "targetRef" in obj["spec"]
    deployments = ([admin.get("apps/v1/deployments", ns, d["metadata"]["name"]) for d in documents(path)
                    if d["kind"] == "Deployment"] if adopted else
                   admin.list("apps/v1/deployments", ns, selector=f"app.kubernetes.io/instance={name}"))
    assert deployments and all(deployments)
    for d in deployments:
        owners = [o["uid"] for o in d["metadata"].get("ownerReferences") or []]
        # kneecap owns what it made and never takes over what it adopted
        assert (stored["metadata"]["uid"] in owners) != adopted, (d["metadata"]["name"], owners)
        st = d.get("status") or {}
        assert st.get("observedGeneration") == d["metadata"]["generation"], st
        assert int(st.get("readyReplicas", 0)) >= 1, st
        pods = [p for p in admin.list("v1/pods", ns) if p["spec"]["containers"][0]["image"] ==
                d["spec"]["template"]["spec"]["containers"][0]["image"]
                and p["metadata"]["labels"].items() >= d["spec"]["selector"]["matchLabels"].items()]
        assert pods and all(p["status"]["phase"] == "Running" and p["spec"].get("nodeName") for p in pods)
        if not adopted:  # the vLLM container asks for what spec.engine.resources declares, and its GPUs
            declared = copy.deepcopy(obj["spec"]["engine"].get("resources") or {})
            if obj["spec"]["accelerator"].get("resourceName", "nvidia.com/gpu"):
                declared.setdefault("limits", {}).setdefault("nvidia.com/gpu", 1)
            live = d["spec"]["template"]["spec"]["containers"][0].get("resources") or {}
            assert {k: sorted(v) for k, v in live.items()} == {k: sorted(v) for k, v in declared.items()}, live
    if path.name == "adopt-pd-pair.yaml":  # the TP size read from each target's `--tensor-parallel-size 4`
        assert {role: o["target"]["tensorParallelSize"] for role, o in status["ownership"].items()} == \
            {"prefill": 4, "decode": 4}, status["ownership"]
    if path.name == "adopt-production-stack.yaml":  # no TP flag in its argv: vLLM's 1
        assert status["ownership"]["server"]["target"]["tensorParallelSize"] == 1, status["ownership"]
    if path.name == "llama-70b-tp2.yaml":
        # spec.engine.tensorParallelSize 2: the flag, 2 GPUs per pod, placed on an 8-GPU H100 node
        pods = admin.list("v1/pods", ns, selector=f"app.kubernetes.io/instance={name}")
        assert pods
        for pod in pods:
            (c,) = pod["spec"]["containers"]
            assert [a for a in c["args"] if "tensor" in a or a.startswith("-tp")] == ["--tensor-parallel-size=2"]
            assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
            assert c["resources"]["requests"]["nvidia.com/gpu"] == "2"  # the API server's default from the limit
            assert pod["spec"]["nodeName"] in H100_NODES, pod["spec"]["nodeName"]
            node = admin.get("v1/nodes", None, pod["spec"]["nodeName"])
            assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    if path.name == "shaped-pods.yaml":
        (pod,) = admin.list("v1/pods", ns, selector=f"app.kubernetes.io/instance={name}")
        # the toleration and the nodeSelector took it to a tainted H100 node
        assert pod["spec"]["nodeName"] in H100_NODES, pod["spec"]["nodeName"]
        assert pod["spec"]["priority"] == 100000 and pod["spec"]["runtimeClassName"] == "nvidia"


def test_steady_ticks_write_nothing_but_status(control_plane, examples_running):
    _, keys = examples_running
    mark = control_plane.audit_mark()

    wait_ticks(control_plane, mark, STEADY_TICKS, list(keys), timeout_s=600, every_s=2)
    events = control_plane.audit(OPERATOR_USER, since_line=mark)
    writes = [(e["verb"], e["requestURI"], e["responseStatus"]["code"]) for e in events
              if e["objectRef"].get("resource") in ("deployments", "services")
              and e["verb"] in ("create", "patch", "update")]
    assert writes == [], f"writes to Deployments/Services over {STEADY_TICKS} steady ticks: {writes[:10]}"
    posted = [e["requestURI"] for e in events if e["objectRef"].get("resource") == "events"]
    assert posted == [], f"Events posted over {STEADY_TICKS} steady ticks: {posted[:10]}"
    assert all(e["responseStatus"]["code"] < 400 for e in events), [
        (e["verb"], e["requestURI"], e["responseStatus"]["code"]) for e in events if e["responseStatus"]["code"] >= 400]
