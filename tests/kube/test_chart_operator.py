"""`helm install charts/kneecap` (default values) on the real API, then the operator run as the
chart's ServiceAccount with the chart's own `kneecap run` arguments: it reconciles a shipped
example with exactly the RBAC the chart grants, and none of its requests is refused."""

from __future__ import annotations

import ipaddress

import pytest

from tests.kube.conftest import (OPERATOR_USER, RELEASE_NS, SERVICE_ACCOUNT, OperatorProcess, chart_operator_args,
                                 kubectl, with_ports)
from tests.support.control_plane import ControlPlane, free_port
from tests.support.examples import ROOT, llmdeployment

LLMD = "kneecap.io/v1alpha1/llmdeployments"
EXAMPLE = ROOT / "examples" / "colocated.yaml"


@pytest.fixture(scope="module")
def chart_operator(control_plane: ControlPlane, chart_installed: dict, operator_kubeconfig, tmp_path_factory):
    liveness = free_port()
    args = with_ports(chart_operator_args(chart_installed), liveness, free_port())
    op = OperatorProcess(args, operator_kubeconfig, tmp_path_factory.mktemp("chart-operator") / "operator.log",
                         pod_id="kneecap-chart-test")
    try:
        control_plane.wait_for(lambda: op.alive() and _healthy(liveness), 60, "the operator's /healthz")
    except Exception:
        op.stop()
        raise AssertionError(f"the operator did not come up; its log:\n{op.tail()}") from None
    yield op
    op.stop()


def _healthy(port: int) -> bool:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
        return resp.status == 200


def test_chart_installs_with_its_default_values(chart_installed: dict):
    assert chart_installed["status"]["info"]["status"] == "deployed"
    kinds = sorted({d["kind"] for d in chart_installed["documents"]})
    # no prometheus-operator API here: the ServiceMonitors and the PrometheusRule are left out (auto)
    assert kinds == ["ClusterKopfPeering", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment",
                     "Service", "ServiceAccount"], kinds
    assert chart_operator_args(chart_installed)[:3] == ["run", "--all-namespaces", "--peering=kneecap"]


def test_operator_as_the_chart_service_account_reconciles_an_example(control_plane: ControlPlane, chart_operator):
    admin = control_plane.admin
    mark = control_plane.audit_mark()
    obj = llmdeployment(EXAMPLE)
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    admin.add_namespace(ns)
    kubectl(control_plane, "apply", "--server-side", "-f", str(EXAMPLE))
    stored = admin.get(LLMD, ns, name)

    deployment = control_plane.wait_for(lambda: admin.get("apps/v1/deployments", ns, name), 60,
                                        f"Deployment {ns}/{name} made by the operator")
    (owner,) = deployment["metadata"]["ownerReferences"]
    assert owner["uid"] == stored["metadata"]["uid"] and owner["kind"] == "LLMDeployment" and owner["controller"]
    service = control_plane.wait_for(lambda: admin.get("v1/services", ns, name), 60,
                                     f"Service {ns}/{name} made by the operator (its create follows the Deployment's)")
    assert service["metadata"]["ownerReferences"][0]["uid"] == stored["metadata"]["uid"]

    def ready():
        st = (admin.get(LLMD, ns, name) or {}).get("status") or {}
        cond = next((c for c in st.get("conditions") or [] if c["type"] == "Ready"), {})
        return st if cond.get("status") == "True" else None

    try:
        status = control_plane.wait_for(ready, 120, f"{name} Ready")
    except Exception:
        raise AssertionError(f"not Ready; status {admin.get(LLMD, ns, name).get('status')}\n"
                             f"operator log:\n{chart_operator.tail()}") from None
    assert status["observedGeneration"] == stored["metadata"]["generation"]
    # the pods the real controller-manager made, placed by the real scheduler, Running under kwok
    pods = admin.list("v1/pods", ns, selector=f"app.kubernetes.io/instance={name}")
    assert pods and all(p["spec"]["nodeName"] == "gpu-node-c" and p["status"]["phase"] == "Running" for p in pods)
    assert all(ipaddress.ip_address(p["status"]["podIP"]) in ipaddress.ip_network(control_plane.pod_cidr)
               for p in pods)

    events = control_plane.audit(OPERATOR_USER, since_line=mark)
    refused = [(e["verb"], e["requestURI"], e["responseStatus"]["code"]) for e in events
               if e["responseStatus"]["code"] == 403]
    assert not refused, f"requests the chart's RBAC refuses: {refused}"
    creates = {(e["objectRef"]["resource"], e["objectRef"].get("name")) for e in events
               if e["verb"] == "create" and e["responseStatus"]["code"] == 201}
    assert {("deployments", name), ("services", name)} <= creates, creates
    # kopf's leader election through the chart's ClusterKopfPeering, as this ServiceAccount
    peering = admin.get("kopf.dev/v1/clusterkopfpeerings", None, SERVICE_ACCOUNT)
    assert "kneecap-chart-test" in (peering.get("status") or {}), peering
    assert RELEASE_NS == "kneecap-system"
