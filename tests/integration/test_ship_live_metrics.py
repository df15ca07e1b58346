"""The chart's operator command, run for real, and the metric names the dashboard and alerts use.

`kneecap run` starts with exactly the arguments the chart renders (ports swapped for free ones),
logs in through a kubeconfig to the emulated API (tests/support/kmock_api.py), serves kopf's
/healthz where the chart's probes look, and manages an LLMDeployment whose pod is a live
`kneecap twin` (a vLLM-compatible server emitting vLLM's metric names) under load. The names the
dashboard and alerts query are then checked against what the two processes actually serve on
/metrics (plus Prometheus' own `up`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from kneecap.demo.kubelet import add_owned_pod
from tests.support.kmock_api import LLMD, KubeAPIThread
from tests.support.twins import Twin, free_port, load
from tests.unit.test_ship_observability import (
    PROMETHEUS_SYNTHETIC, alert_rules, assert_old_names_only_as_fallback, dashboard, dashboard_queries,
)

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kneecap"
NS = "serving"
MODEL, ARCH, GPU = "meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b", "h100-80gb"


def chart_operator_args() -> list[str]:
    helm = ROOT / ".tools" / "bin" / "helm"
    exe = str(helm) if helm.exists() else shutil.which("helm")
    if not exe:
        pytest.fail("`helm` not found in .tools/bin or on PATH: run `bash scripts/setup-tools.sh`")
    p = subprocess.run([exe, "template", "kc", str(CHART), "--show-only", "templates/deployment.yaml"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    (c,) = yaml.safe_load(p.stdout)["spec"]["template"]["spec"]["containers"]
    return c["args"]


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except OSError as exc:
        return getattr(exc, "code", 0) or 0, ""


def exposition_names(text: str) -> set[str]:
    """Sample names a /metrics page can carry: samples present, and every declared family's series."""
    names = {re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
             for line in text.splitlines() if line and not line.startswith("#")}
    suffixes = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count", "_created"),
                "summary": ("", "_sum", "_count", "_created"), "info": ("_info",), "untyped": ("",)}
    for family, typ in re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.M):
        base = family[:-len("_total")] if typ == "counter" and family.endswith("_total") else family
        names |= {base + s for s in suffixes.get(typ, ("",))}
    return names


def wait_for(fn, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture()
def kube():
    with KubeAPIThread() as k:
        k.add_namespace(NS)
        yield k


@pytest.fixture()
def twin():
    t = Twin(MODEL, ARCH, GPU, max_num_seqs=8, time_scale=20.0).start()
    yield t
    t.stop()


def kubeconfig_for(kube, path: Path) -> Path:
    return kube.write_kubeconfig(path)


def llmd(name: str) -> dict:
    return {"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": name, "namespace": NS},
            "spec": {"model": {"name": MODEL, "architecture": ARCH}, "accelerator": {"type": GPU},
                     "engine": {"image": "kneecap-twin", "maxNumSeqs": 8}, "control": {"interval": "1s"}}}


def served_names_check(op_text: str, twin_text: str) -> None:
    served = {"operator": exposition_names(op_text), "twin": exposition_names(twin_text),
              "prometheus": PROMETHEUS_SYNTHETIC}
    assert {"kneecap_applied_max_num_seqs", "kneecap_decisions_total"} <= served["operator"]
    allowed = set().union(*served.values())
    seen = set()
    for where, expr in dashboard_queries(dashboard()):
        names = assert_old_names_only_as_fallback(f"dashboard {where}", expr, {"vllm": served["twin"]})
        assert names <= allowed, f"dashboard {where}: {names - allowed} not served by the operator or the twin"
        seen |= names
    for name, rule in alert_rules().items():
        names = assert_old_names_only_as_fallback(f"alert {name}", rule["expr"], {"vllm": served["twin"]})
        assert names <= allowed, f"alert {name}: {names - allowed} not served by the operator or the twin"
        seen |= names
    assert seen & served["operator"] and seen & served["twin"]


def test_dashboard_and_alerts_query_what_a_live_operator_and_twin_serve(kube, twin):
    """The operator in-process (its metrics served over HTTP as `kneecap run --metrics-port` does)."""
    import kopf
    from kopf.testing import KopfRunner

    from kneecap.control.handlers import OperatorConfig, build_registry
    from kneecap.control.metrics import OperatorMetrics

    port = free_port()
    metrics = OperatorMetrics()
    server, thread = metrics.serve(port, addr="127.0.0.1")
    config = OperatorConfig(connection=kopf.ConnectionInfo(server=kube.url), tick_s=0.2, metrics=metrics)
    settings = kopf.OperatorSettings()
    settings.watching.server_timeout = 10
    loader = None
    try:
        with KopfRunner(["run", "--standalone", "--all-namespaces"], registry=build_registry(config),
                        settings=settings, timeout=60) as runner:
            kube.create(LLMD, llmd("llama"))
            add_owned_pod(kube, "llama", "llama-0", namespace=NS,
                          annotations={"kneecap.io/metrics-url": twin.url + "/metrics"})
            loader = load(twin.url, rate=20, duration_s=8, seed=3)

            def operator_series():
                code, text = http_get(f"http://127.0.0.1:{port}/metrics")
                return text if code == 200 and re.search(r'^kneecap_applied_max_num_seqs\{.*name="llama"', text, re.M) else None

            op_text = wait_for(operator_series, 30, "the operator's per-LLMDeployment series")
            wait_for(lambda: "vllm:time_to_first_token_seconds_bucket{" in http_get(twin.url + "/metrics")[1], 20,
                     "twin latency histograms")
            twin_text = http_get(twin.url + "/metrics")[1]
        assert runner.exit_code == 0, runner.output
    finally:
        if loader is not None and loader.poll() is None:
            loader.terminate()
        server.shutdown()
    served_names_check(op_text, twin_text)


def test_chart_operator_command_logs_in_serves_probes_and_reconciles(kube, tmp_path):
    """`kneecap run` with exactly the chart's arguments, logging in through a kubeconfig."""
    liveness, metrics = free_port(), free_port()
    args = chart_operator_args()
    assert args[0] == "run" and "--all-namespaces" in args
    args = [a.replace("--liveness=8080", f"--liveness={liveness}").replace("--metrics-port=9100", f"--metrics-port={metrics}")
            for a in args] + ["--tick", "0.2"]
    env = dict(os.environ, KUBECONFIG=str(kubeconfig_for(kube, tmp_path / "kubeconfig")),
               PYTHONPATH=str(ROOT / "operator"))
    log_path = tmp_path / "operator.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "kneecap", *args], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            # the chart's probes: httpGet /healthz on the liveness port
            wait_for(lambda: http_get(f"http://127.0.0.1:{liveness}/healthz")[0] == 200 or proc.poll() is not None,
                     15, "kopf liveness endpoint")
            assert proc.poll() is None, log_path.read_text()[-3000:]
            # what the chart installs with it: the peering object its --peering names
            (peering,) = [a.split("=", 1)[1] for a in args if a.startswith("--peering=")]
            kube.create("kopf.dev/v1/clusterkopfpeerings", {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering",
                                                            "metadata": {"name": peering}})
            kube.create(LLMD, llmd("llama"))
            wait_for(lambda: kube.get("apps/v1/deployments", NS, "llama"), 15, "the pool's Deployment")
            code, text = http_get(f"http://127.0.0.1:{metrics}/metrics")
            assert code == 200 and "# TYPE kneecap_applied_max_num_seqs gauge" in text
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
