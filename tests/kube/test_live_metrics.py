"""The chart's operator command, live on the real control plane, and the metric names the
dashboard and alerts query.

`kneecap run` with exactly the chart's arguments (ports swapped for free ones) logs in as the
chart's ServiceAccount, serves kopf's /healthz where the chart's probes look and reconciles an
LLMDeployment: the real controller-manager makes its pod, kwok runs it on an IP of
the control plane's loopback pod range, and a `kneecap twin` (vLLM's metric names) listens on that IP and the engine port
under load, so the operator scrapes the pod as in a cluster. Every name the dashboard and the
alerts query is then served by the operator's or the twin's /metrics (or is Prometheus' own).
"""

from __future__ import annotations

import ipaddress
import re
import urllib.request

import pytest

from tests.kube.conftest import PodTwins, chart_operator_args, start_chart_operator
from tests.support.control_plane import ControlPlane
from tests.support.dashboard import dashboard, dashboard_queries
from tests.support.observability import PROMETHEUS_SYNTHETIC, alert_rules, assert_old_names_only_as_fallback
from tests.support.twins import load

LLMD = "kneecap.io/v1alpha1/llmdeployments"
NS = "live-metrics"
NAME = "llama"
MODEL, ARCH, GPU = "meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b", "h100-80gb"
ENGINE_PORT, MAX_NUM_SEQS = 8000, 8


def http_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200, url
        return resp.read().decode()


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


def sample(text: str, family: str, name: str) -> float | None:
    """The value of ``family``'s sample for LLMDeployment ``name`` (its pool label aside), if any."""
    m = re.search(rf'^{re.escape(family)}{{[^}}]*name="{re.escape(name)}"[^}}]*}} (\S+)$', text, flags=re.M)
    return float(m.group(1)) if m else None


@pytest.fixture(scope="module")
def live(control_plane: ControlPlane, chart_installed: dict, operator_kubeconfig, tmp_path_factory):
    """The chart's operator, the LLMDeployment's pod served by a twin on its IP, load on it."""
    admin = control_plane.admin
    admin.add_namespace(NS)
    op = start_chart_operator(control_plane, chart_installed, operator_kubeconfig,
                              tmp_path_factory.mktemp("live-metrics") / "operator.log", pod_id="kneecap-live-metrics",
                              extra_args=("--tick", "0.25"))
    twins = PodTwins(admin, NS, f"app.kubernetes.io/instance={NAME}", ENGINE_PORT, model=MODEL, arch=ARCH, gpu=GPU,
                     max_num_seqs=MAX_NUM_SEQS)
    loads = []
    try:
        admin.create(LLMD, {"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment",
                            "metadata": {"name": NAME, "namespace": NS},
                            "spec": {"model": {"name": MODEL, "architecture": ARCH}, "accelerator": {"type": GPU},
                                     "engine": {"image": "kneecap-twin", "port": ENGINE_PORT,
                                                "maxNumSeqs": MAX_NUM_SEQS},
                                     "control": {"interval": "2s", "window": "2s"}}})
        running = control_plane.wait_for(lambda: twins.sync(), 120, f"{NS}/{NAME}'s pod Running with an IP")
        loads = [load(t.url, rate=5.0, duration_s=600, input_mean=128, output_mean=100, seed=3)
                 for t in running.values()]
        yield op, running
    finally:
        for proc in loads:
            if proc.poll() is None:
                proc.terminate()
            proc.wait(10)
        twins.stop()
        op.stop()


def test_chart_operator_command_logs_in_serves_probes_and_reconciles(control_plane: ControlPlane,
                                                                      chart_installed: dict, live):
    op, twins = live
    assert chart_operator_args(chart_installed)[:2] == ["run", "--all-namespaces"]
    assert http_text(f"http://127.0.0.1:{op.liveness}/healthz")  # the chart's probes' endpoint
    deployment = control_plane.admin.get("apps/v1/deployments", NS, NAME)
    assert f"--max-num-seqs={MAX_NUM_SEQS}" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    (twin,) = twins.values()
    assert ipaddress.ip_address(twin.host) in ipaddress.ip_network(control_plane.pod_cidr) and twin.port == ENGINE_PORT


def test_dashboard_and_alerts_query_what_a_live_operator_and_twin_serve(control_plane: ControlPlane, live):
    op, twins = live
    (twin,) = twins.values()

    def scraped() -> str | None:
        # the operator measured the twin's tokens through the pod's IP: its per-pool series are live
        text = http_text(f"http://127.0.0.1:{op.metrics_port}/metrics")
        return text if (sample(text, "kneecap_observed_throughput_tokens_per_second", NAME) or 0) > 0 else None

    try:
        op_text = control_plane.wait_for(scraped, 120, "the operator's observed throughput from the twin")
    except Exception:
        status = control_plane.admin.get(LLMD, NS, NAME).get("status")
        raise AssertionError(f"no throughput observed; status {status}\noperator log:\n{op.tail()}") from None
    assert sample(op_text, "kneecap_applied_max_num_seqs", NAME) == MAX_NUM_SEQS
    def histograms() -> str | None:
        text = http_text(twin.url + "/metrics")
        return text if "vllm:time_to_first_token_seconds_bucket{" in text else None

    twin_text = control_plane.wait_for(histograms, 60, "the twin's latency histograms")

    served = {"operator": exposition_names(op_text), "twin": exposition_names(twin_text),
              "prometheus": PROMETHEUS_SYNTHETIC}
    assert {"kneecap_applied_max_num_seqs", "kneecap_decisions_total"} <= served["operator"]
    allowed = set().union(*served.values())
    seen: set[str] = set()
    queries = [(f"dashboard {where}", expr) for where, expr in dashboard_queries(dashboard())]
    queries += [(f"alert {name}", rule["expr"]) for name, rule in alert_rules().items()]
    assert len(queries) > 10
    for where, expr in queries:
        names = assert_old_names_only_as_fallback(where, expr, {"vllm": served["twin"]})
        assert names <= allowed, f"{where}: {names - allowed} not served by the operator or the twin"
        seen |= names
    assert seen & served["operator"] and seen & served["twin"]
