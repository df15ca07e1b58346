"""Least-privilege RBAC judged by the real authoriser: the chart grants exactly what the operator uses.

The chart is installed twice: with its default values (all namespaces: ClusterRoles) and, as a
second release, with ``operator.watchNamespaces`` (one Role in the watched namespace). Each time
the operator runs out of process as that release's ServiceAccount, with that release's own
`kneecap run` arguments, through a representative workload: a pool created, its spec changed
(Deployment and Service patched), its model shape read from a ConfigMap, switched to
disaggregated (the old pool deleted), an adopted Deployment tuned by a ``targetRef``, both
LLMDeployments deleted. Then:

- the audit log has no 403 for the operator's user;
- what the real authoriser grants the ServiceAccount (`kubectl auth can-i --list --as=...`, less
  what any ServiceAccount without bindings gets) is, verb by resource, exactly what the
  operator's requests in the audit log used: nothing granted that is not needed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.kube.conftest import (CHART, OPERATOR_USER, RELEASE_NS, helm, kubectl,
                                 service_account_kubeconfig, start_chart_operator)
from tests.support.control_plane import ControlPlane

LLMD = "kneecap.io/v1alpha1/llmdeployments"
DEPLOY = "apps/v1/deployments"
WIDE_NS = "rbac-wide"
SCOPED_NS = "rbac-scoped"
SCOPED_RELEASE = "kneecap-scoped"  # its fullname and ServiceAccount (the name contains "kneecap")
SCOPED_RELEASE_NS = "kneecap-scoped-system"
UNBOUND_SA = "rbac-nobody"  # a ServiceAccount with no bindings: what every ServiceAccount may do
# Not a request but an admission check: an ownerReference with blockOwnerDeletion (the operator
# sets it on what it owns) needs `update` on the owner's finalizers where the
# OwnerReferencesPermissionEnforcement plugin is on; it is off by default, so no request uses it.
ADMISSION_ONLY = {("kneecap.io", "llmdeployments/finalizers", "update")}
LLAMA_CONFIG = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
                "max_position_embeddings": 131072, "torch_dtype": "bfloat16", "tie_word_embeddings": False}
CAN_I_ROW = re.compile(r"^(\S+)\s+\[(.*?)\]\s+\[(.*?)\]\s+\[(.*?)\]\s*$")

Grant = tuple[str, str, str]  # (API group, resource[/subresource], verb)


def can_i(plane: ControlPlane, user: str, namespace: str) -> set[Grant]:
    """The real authoriser's view of ``user`` in ``namespace`` (cluster-wide grants included):
    `kubectl auth can-i --list`, resource rules without resourceNames, one per verb."""
    out = kubectl(plane, "auth", "can-i", "--list", "--no-headers", f"--as={user}", "-n", namespace).stdout
    grants: set[Grant] = set()
    for line in out.splitlines():
        m = CAN_I_ROW.match(line.strip())
        if not m or m.group(3):  # a non-resource URL row, or one limited to named objects
            continue
        resource, _, sub = m.group(1).partition("/")
        name, _, group = resource.partition(".")
        grants |= {(group, name + (f"/{sub}" if sub else ""), v) for v in m.group(4).split()}
    return grants


def used(plane: ControlPlane, user: str, since_line: int, namespaces: set[str | None]) -> set[tuple[Grant, str | None]]:
    """(grant, namespace) of every request of ``user`` in the audit log (watches from the moment
    they started), in ``namespaces`` (None: cluster-scoped or all namespaces)."""
    out = set()
    for e in plane.audit(user, since_line=since_line, stages=("ResponseStarted", "ResponseComplete")):
        ref = e["objectRef"]
        if "resource" not in ref or ref.get("namespace") not in namespaces:
            continue
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        out.add(((ref.get("apiGroup", ""), resource, e["verb"]), ref.get("namespace")))
    return out


def refused(plane: ControlPlane, user: str, since_line: int) -> list[tuple[str, str]]:
    return [(e["verb"], e["requestURI"]) for e in plane.audit(user, since_line=since_line)
            if e["responseStatus"]["code"] == 403]


def llmd(ns: str, name: str, **spec_over) -> dict:
    spec = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "accelerator": {"type": "h100-80gb"},
            "engine": {"image": "vllm/vllm-openai:v0.11.0"}, "control": {"interval": "1s"}}
    spec.update(spec_over)
    return {"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}


def adopted_deployment(ns: str, name: str) -> dict:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {"containers": [{
                         "name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                         "command": ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--port", "8000",
                                     "--max-num-seqs", "128"]}]}}}}


def workload(plane: ControlPlane, ns: str, op) -> dict:
    """An LLMDeployment's life and an adoption in ``ns``; the pool's stored Deployment."""
    admin = plane.admin

    def wait(fn, what: str, timeout_s: float = 120):
        try:
            return plane.wait_for(fn, timeout_s, what)
        except AssertionError:
            raise AssertionError(f"timed out waiting for {what}; operator log:\n{op.tail()}") from None

    def status(name: str) -> dict:
        return (admin.get(LLMD, ns, name) or {}).get("status") or {}

    def container(name: str) -> dict:
        return admin.get(DEPLOY, ns, name)["spec"]["template"]["spec"]["containers"][0]

    admin.create(LLMD, llmd(ns, "llama"))
    owned = wait(lambda: admin.get(DEPLOY, ns, "llama"), "the pool's Deployment")
    wait(lambda: admin.get("v1/services", ns, "llama"), "the pool's Service")
    first = wait(lambda: status("llama").get("lastDecision"), "a tick")
    # later ticks read the watch-backed caches (pods, ReplicaSets, HPAs)
    wait(lambda: status("llama")["lastDecision"]["time"] != first["time"], "a second tick")
    # a spec change the pool follows: the Deployment and the Service patched
    admin.patch(LLMD, ns, "llama", {"spec": {"engine": {"port": 8001, "extraArgs": ["--max-model-len=4096"]}}})
    wait(lambda: "--max-model-len=4096" in container("llama")["args"], "the patched Deployment")
    wait(lambda: admin.get("v1/services", ns, "llama")["spec"]["ports"][0]["port"] == 8001, "the patched Service")
    # the model's shape from a ConfigMap's config.json
    admin.create("v1/configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                   "metadata": {"name": "llama-config", "namespace": ns},
                                   "data": {"config.json": json.dumps(LLAMA_CONFIG)}})
    gen = admin.patch(LLMD, ns, "llama", {"spec": {"model": {"configMapRef": {"name": "llama-config"}}}}
                      )["metadata"]["generation"]
    wait(lambda: status("llama").get("observedGeneration") == gen and not any(
        c["type"] == "Ready" and c.get("reason") == "InvalidSpec" for c in status("llama").get("conditions", [])),
        "the spec with a configMapRef handled")
    # colocated -> disaggregated: the old pool deleted
    admin.patch(LLMD, ns, "llama", {"spec": {"topology": {"mode": "disaggregated",
                                                          "kvTransfer": {"connector": "NixlConnector"}}}})
    wait(lambda: admin.get(DEPLOY, ns, "llama") is None and admin.get(DEPLOY, ns, "llama-decode")
         and admin.get("v1/services", ns, "llama") is None, "the disaggregated pools")
    # adoption: a Deployment kneecap did not make, named by targetRef
    admin.create(DEPLOY, adopted_deployment(ns, "vllm-own"))
    adopter = llmd(ns, "adopter", targetRef={"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm-own",
                                             "container": "vllm"})
    del adopter["spec"]["engine"]  # the target's own container runs vLLM
    adopter = admin.create(LLMD, adopter)
    wait(lambda: status("adopter").get("observedGeneration") == adopter["metadata"]["generation"]
         and status("adopter").get("lastDecision"), "the adopted Deployment's first tick")
    for name in ("llama", "adopter"):
        admin.delete(LLMD, ns, name)
    # kopf sees the deletions on its watch and removes its finalizer
    wait(lambda: not admin.list(LLMD, ns), "the finalizers removed", timeout_s=180)
    return owned


def assert_exactly_used(granted: set[Grant], uses: set[Grant], where: str) -> None:
    assert uses - granted == set(), f"{where}: used but not granted: {sorted(uses - granted)}"
    unused = granted - uses - ADMISSION_ONLY
    assert unused == set(), f"{where}: granted but never used: {sorted(unused)}"


@pytest.fixture(scope="module")
def baseline(control_plane: ControlPlane, chart_installed: dict) -> dict[str, set[Grant]]:
    """What a ServiceAccount without bindings may do, in each namespace the tests look at."""
    admin = control_plane.admin
    for ns in (WIDE_NS, SCOPED_NS, SCOPED_RELEASE_NS):
        admin.add_namespace(ns)
    admin.create("v1/serviceaccounts", {"apiVersion": "v1", "kind": "ServiceAccount",
                                        "metadata": {"name": UNBOUND_SA, "namespace": RELEASE_NS}})
    user = f"system:serviceaccount:{RELEASE_NS}:{UNBOUND_SA}"
    return {ns: can_i(control_plane, user, ns) for ns in (WIDE_NS, SCOPED_NS)}


def test_cluster_wide_rbac_is_exactly_what_the_operator_uses(control_plane: ControlPlane, chart_installed: dict,
                                                             operator_kubeconfig: Path, baseline, tmp_path: Path):
    mark = control_plane.audit_mark()
    op = start_chart_operator(control_plane, chart_installed, operator_kubeconfig, tmp_path / "operator.log",
                              pod_id="kneecap-rbac-wide")
    try:
        owned = workload(control_plane, WIDE_NS, op)
    finally:
        op.stop()
    assert refused(control_plane, OPERATOR_USER, mark) == []
    uses = {g for g, _ in used(control_plane, OPERATOR_USER, mark, {None, WIDE_NS})}
    granted = can_i(control_plane, OPERATOR_USER, WIDE_NS) - baseline[WIDE_NS]
    assert ("apps", "deployments", "patch") in granted and ("kopf.dev", "clusterkopfpeerings", "patch") in granted
    assert_exactly_used(granted, uses, "cluster-wide")
    # why the admission-only grant is needed: what the operator owns blocks its owner's deletion
    (ref,) = owned["metadata"]["ownerReferences"]
    assert ref["kind"] == "LLMDeployment" and ref["blockOwnerDeletion"] is True
    assert ADMISSION_ONLY <= granted


@pytest.fixture(scope="module")
def scoped_release(control_plane: ControlPlane, chart_installed: dict, baseline) -> dict:
    """A second release of the chart that watches SCOPED_NS only (its Deployment scaled to 0)."""
    helm(control_plane, "install", SCOPED_RELEASE, str(CHART), "-n", SCOPED_RELEASE_NS, "--wait=false",
         "--set", f"operator.watchNamespaces={{{SCOPED_NS}}}")
    manifest = helm(control_plane, "get", "manifest", SCOPED_RELEASE, "-n", SCOPED_RELEASE_NS).stdout
    kubectl(control_plane, "-n", SCOPED_RELEASE_NS, "scale", "deployment", SCOPED_RELEASE, "--replicas=0")
    return {"documents": [d for d in yaml.safe_load_all(manifest) if d]}


def test_namespaced_rbac_is_exactly_what_the_operator_uses(control_plane: ControlPlane, scoped_release: dict,
                                                           baseline, tmp_path: Path):
    kinds = sorted((d["kind"], d["metadata"].get("namespace", "")) for d in scoped_release["documents"]
                   if d["kind"] in ("Role", "RoleBinding"))
    assert kinds == [("Role", SCOPED_NS), ("RoleBinding", SCOPED_NS)]
    user = f"system:serviceaccount:{SCOPED_RELEASE_NS}:{SCOPED_RELEASE}"
    kubeconfig, _ = service_account_kubeconfig(control_plane, tmp_path / "scoped.kubeconfig", SCOPED_RELEASE_NS,
                                               SCOPED_RELEASE)
    mark = control_plane.audit_mark()
    op = start_chart_operator(control_plane, scoped_release, kubeconfig, tmp_path / "operator.log",
                              pod_id="kneecap-rbac-scoped")
    assert f"--namespace={SCOPED_NS}" in op.args
    try:
        workload(control_plane, SCOPED_NS, op)
    finally:
        op.stop()
    assert refused(control_plane, user, mark) == []
    uses = used(control_plane, user, mark, {None, SCOPED_NS, WIDE_NS})
    # it never reached outside its namespace; the real authoriser would not have let it
    assert {ns for _, ns in uses} <= {None, SCOPED_NS}
    in_ns = can_i(control_plane, user, SCOPED_NS) - baseline[SCOPED_NS]
    cluster = can_i(control_plane, user, WIDE_NS) - baseline[WIDE_NS]  # the ClusterRole alone
    assert ("apps", "deployments", "list") in in_ns - cluster
    assert_exactly_used(in_ns - cluster, {g for g, ns in uses if ns == SCOPED_NS}, "the Role")
    assert_exactly_used(cluster, {g for g, ns in uses if ns is None}, "the ClusterRole")
