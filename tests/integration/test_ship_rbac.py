"""Least-privilege RBAC: the chart grants exactly the API calls the operator makes.

The real operator (kopf + kneecap.control handlers) runs against the emulated API
(tests/support/kmock_api.py) through an LLMDeployment's life: create, spec change (patch of the
pool), switch to disaggregated (delete of the old pool), delete. Every HTTP request is recorded
and turned into the (API group, resource, verb) an API server would authorise. The test fails if
the chart's rendered ClusterRole/Role rules miss one (the operator would be forbidden) or grant
one the operator never uses (more privilege than needed). Both watch scopes are checked: all
namespaces (ClusterRole) and a namespace list (Roles).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import parse_qs

import attrs
import kmock
import kopf
import pytest
import yaml
from kopf.testing import KopfRunner

from kneecap.control.handlers import OperatorConfig, build_registry
from kneecap.demo.kubelet import add_owned_pod
from tests.support import kmock_api
from tests.support.kmock_api import LLMD, KubeAPI, KubeAPIThread

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kneecap"
NS = "serving"
DEPLOY = "apps/v1/deployments"
CRDS = "apiextensions.k8s.io/v1/customresourcedefinitions"
PEERINGS = "kopf.dev/v1/clusterkopfpeerings"


@attrs.define(kw_only=True)
class RecordingKubeAPI(KubeAPI):
    """The emulated API, recording (method, path, query) of every request the operator sends.

    The test's own kubectl-like requests (urllib) are not the operator's and are not recorded; the
    operator's come from kopf's and kneecap's aiohttp clients.
    """

    recorded: list = attrs.field(factory=list)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # A real API server advertises apiextensions.k8s.io; kopf then watches CRDs (its
        # resource_observer). Advertise it so that request is made, and recorded, here too.
        self.resources[CRDS] = kmock.ResourceInfo(kind="CustomResourceDefinition", namespaced=False,
                                                  verbs=kmock_api.VERBS, subresources={"status"})

    async def __call__(self, raw_request):
        if not raw_request.headers.get("User-Agent", "").startswith("Python-urllib"):
            self.recorded.append((raw_request.method, raw_request.path, dict(parse_qs(raw_request.query_string))))
        return await super().__call__(raw_request)


def authorisation(method: str, path: str, query: dict) -> tuple[str, str, str, str | None] | None:
    """(group, resource[/subresource], verb, namespace) the API server would check; None for discovery."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if not rest:
        return None  # discovery: /api, /api/v1, /apis, /apis/<group>/<version>
    ns = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        ns, rest = rest[1], rest[2:]
    resource, name, sub = rest[0], rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None
    watch = query.get("watch", ["false"])[0] in ("true", "1")
    verb = {"GET": "watch" if watch else ("get" if name else "list"), "POST": "create", "PATCH": "patch",
            "PUT": "update", "DELETE": "delete" if name else "deletecollection"}[method]
    return group, resource + (f"/{sub}" if sub else ""), verb, ns


def test_authorisation_mapping():
    assert authorisation("GET", "/apis/kneecap.io/v1alpha1/llmdeployments", {"watch": ["true"]}) == (
        "kneecap.io", "llmdeployments", "watch", None)
    assert authorisation("PATCH", "/apis/kneecap.io/v1alpha1/namespaces/s/llmdeployments/x/status", {}) == (
        "kneecap.io", "llmdeployments/status", "patch", "s")
    assert authorisation("GET", "/api/v1/namespaces/s/pods", {"labelSelector": ["a=b"]}) == ("", "pods", "list", "s")
    assert authorisation("POST", "/api/v1/namespaces/s/events", {}) == ("", "events", "create", "s")
    assert authorisation("GET", "/apis", {}) is None


def grants(rules: list[dict]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def helm_rbac(*args: str) -> dict[str, list[dict]]:
    helm = ROOT / ".tools" / "bin" / "helm"
    exe = str(helm) if helm.exists() else shutil.which("helm")
    if not exe:
        pytest.fail("`helm` not found in .tools/bin or on PATH: run `bash scripts/setup-tools.sh`")
    p = subprocess.run([exe, "template", "kc", str(CHART), "-n", "kneecap-system", "--show-only",
                        "templates/rbac.yaml", *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    out: dict[str, list[dict]] = {}
    for d in yaml.safe_load_all(p.stdout):
        if d:
            out.setdefault(d["kind"], []).append(d)
    return out


LLAMA_CONFIG = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
                "max_position_embeddings": 131072, "torch_dtype": "bfloat16", "tie_word_embeddings": False}


def llmd(name: str, **spec_over) -> dict:
    spec = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "accelerator": {"type": "h100-80gb"},
            "engine": {"image": "vllm/vllm-openai:v0.11.0"}, "control": {"interval": "1s"}}
    spec.update(spec_over)
    return {"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}


def wait_for(fn, timeout_s: float = 15.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def operator_lifecycle(monkeypatch, scope: list[str]) -> set[tuple[str, str, str, str | None]]:
    """Run the operator through an LLMDeployment's life; the authorisations its requests need."""
    monkeypatch.setattr(kmock_api, "KubeAPI", RecordingKubeAPI)
    with KubeAPIThread() as kube:
        kube.add_namespace(NS)
        config = OperatorConfig(connection=kopf.ConnectionInfo(server=kube.url), tick_s=0.2)
        settings = kopf.OperatorSettings()
        settings.watching.server_timeout = 10
        # as the chart runs it: leader election in the chart's ClusterKopfPeering
        kube.create(PEERINGS, {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering",
                               "metadata": {"name": "kc-kneecap"}})
        with KopfRunner(["run", "--peering", "kc-kneecap", *scope], registry=build_registry(config),
                        settings=settings, timeout=60) as runner:
            kube.create(LLMD, llmd("llama"))
            wait_for(lambda: kube.get(DEPLOY, NS, "llama"), what="deployment")
            wait_for(lambda: kube.get("v1/services", NS, "llama"), what="service")
            first = wait_for(lambda: (kube.get(LLMD, NS, "llama").get("status") or {}).get("lastDecision"),
                             what="a tick")
            # a second tick: the first after a spec change reads the API, later ones the watch-backed caches
            wait_for(lambda: kube.get(LLMD, NS, "llama")["status"]["lastDecision"]["time"] != first["time"],
                     what="a second tick")
            add_owned_pod(kube, "llama", "llama-0", namespace=NS, port=1)  # a ready pod nobody listens for: the tick lists and scrapes it
            # a spec change the pool must follow -> PATCH of the Deployment and the Service
            kube.patch(LLMD, NS, "llama", {"spec": {"engine": {"port": 8001, "extraArgs": ["--max-model-len=4096"]}}})
            wait_for(lambda: "--max-model-len=4096" in kube.get(DEPLOY, NS, "llama")["spec"]["template"]["spec"]
                     ["containers"][0]["args"], what="patched deployment")
            wait_for(lambda: kube.get("v1/services", NS, "llama")["spec"]["ports"][0]["port"] == 8001,
                     what="patched service")
            # the model's shape from its config.json in a ConfigMap -> GET of the ConfigMap
            kube.create("v1/configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                          "metadata": {"name": "llama-config", "namespace": NS},
                                          "data": {"config.json": json.dumps(LLAMA_CONFIG)}})
            kube.patch(LLMD, NS, "llama", {"spec": {"model": {"configMapRef": {"name": "llama-config"}}}})
            wait_for(lambda: "--max-model-len=4096" in kube.get(DEPLOY, NS, "llama")["spec"]["template"]["spec"]
                     ["containers"][0]["args"] and any(
                         c["type"] == "Ready" and c["reason"] != "InvalidSpec"
                         for c in kube.get(LLMD, NS, "llama")["status"]["conditions"])
                     and kube.get(LLMD, NS, "llama")["status"].get("observedGeneration")
                     == kube.get(LLMD, NS, "llama")["metadata"]["generation"], what="spec with configMapRef handled")
            # colocated -> disaggregated: the old pool is deleted
            kube.patch(LLMD, NS, "llama", {"spec": {"topology": {"mode": "disaggregated",
                                                                  "kvTransfer": {"connector": "NixlConnector"}}}})
            wait_for(lambda: kube.get(DEPLOY, NS, "llama") is None and kube.get(DEPLOY, NS, "llama-decode"),
                     what="disaggregated pools")
            kube.delete(LLMD, NS, "llama")
            # 120 s only bounds a hang: kopf sees the deletion on its watch, which reconnects every
            # 10 s here (server_timeout), and stops the resource's timer before the delete handler
            # (beside two CPU burners 45 s once ran out)
            wait_for(lambda: kube.get(LLMD, NS, "llama") is None, timeout_s=120.0, what="finalizer removed")
            time.sleep(0.5)
        assert runner.exit_code == 0, runner.output
        calls = {a for a in (authorisation(*r) for r in kube.api.recorded) if a is not None}
    assert calls, "no API requests recorded"
    # Not a request but an admission check: an ownerReference with blockOwnerDeletion to an
    # LLMDeployment needs `update` on its finalizers subresource (OwnerReferencesPermissionEnforcement)
    owned = {(ns, r) for g, r, v, ns in calls if r in ("deployments", "services") and v in ("create", "patch")}
    assert owned, "the operator created no owned object"
    calls |= {("kneecap.io", "llmdeployments/finalizers", "update", ns) for ns, _ in owned}
    return calls


def test_cluster_wide_rbac_is_exactly_what_the_operator_uses(monkeypatch):
    calls = operator_lifecycle(monkeypatch, ["--all-namespaces"])
    used = {(g, r, v) for g, r, v, _ in calls}
    rbac = helm_rbac()
    assert "Role" not in rbac
    granted = set().union(*(grants(cr["rules"]) for cr in rbac["ClusterRole"]))
    bound = {b["roleRef"]["name"] for b in rbac["ClusterRoleBinding"]}
    assert bound == {cr["metadata"]["name"] for cr in rbac["ClusterRole"]}
    assert all(s["name"] == "kc-kneecap" for b in rbac["ClusterRoleBinding"] for s in b["subjects"])
    assert used - granted == set(), f"the operator would be forbidden: {sorted(used - granted)}"
    assert granted - used == set(), f"granted but never used: {sorted(granted - used)}"


def test_namespaced_rbac_is_exactly_what_the_operator_uses(monkeypatch):
    calls = operator_lifecycle(monkeypatch, ["--namespace", NS])
    rbac = helm_rbac("--set", f"operator.watchNamespaces={{{NS}}}")
    (role,) = rbac["Role"]
    assert role["metadata"]["namespace"] == NS
    (cluster,) = rbac["ClusterRole"]
    ns_granted = grants(role["rules"])
    cluster_granted = grants(cluster["rules"])
    # a request in the namespace may use the Role; anything else needs the ClusterRole
    for g, r, v, ns in calls:
        ok = (g, r, v) in cluster_granted or (ns == NS and (g, r, v) in ns_granted)
        assert ok, f"forbidden in namespaced mode: {(g, r, v, ns)}"
    used_ns = {(g, r, v) for g, r, v, ns in calls if ns == NS}
    used_cluster = {(g, r, v) for g, r, v, ns in calls if ns is None}
    assert ns_granted - used_ns == set(), f"Role grants unused: {sorted(ns_granted - used_ns)}"
    assert cluster_granted - used_cluster == set(), f"ClusterRole grants unused: {sorted(cluster_granted - used_cluster)}"
