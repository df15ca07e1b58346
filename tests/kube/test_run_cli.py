"""`kneecap run` as a process on the real API, as the chart's ServiceAccount (its kubeconfig):
namespace-scoped and standalone, its liveness probe and metrics port, JSON logs, and a clean
exit on SIGTERM. (Bad flags, refused before any API is needed: tests/integration/test_run_flags.py.)"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import urllib.request

from tests.kube.conftest import OPERATOR_USER
from tests.support.control_plane import ControlPlane, free_port
from tests.support.examples import ROOT, llmdeployment

NS = "run-cli"
LLMD = "kneecap.io/v1alpha1/llmdeployments"
DEPLOY = "apps/v1/deployments"


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except OSError:
        return 0, ""


def _resource(name: str) -> dict:
    doc = copy.deepcopy(llmdeployment(ROOT / "examples" / "colocated.yaml"))
    doc["metadata"] = {"name": name, "namespace": NS}
    doc["spec"]["control"].update(interval="1s", window="1s")
    return doc


def _run(kubeconfig, *args: str, **popen) -> subprocess.Popen:
    env = dict(os.environ, KUBECONFIG=str(kubeconfig), PYTHONPATH=str(ROOT / "operator"))
    return subprocess.Popen([sys.executable, "-m", "kneecap", "run", "--namespace", NS, "--standalone",
                             "--tick", "0.25", *args], cwd=ROOT, env=env, **popen)


def _deleted(plane: ControlPlane, name: str) -> None:
    """Delete the LLMDeployment while its operator runs (it removes its finalizer)."""
    plane.admin.delete(LLMD, NS, name)
    plane.wait_for(lambda: plane.admin.get(LLMD, NS, name) is None, 60, f"{name} deleted")


def test_kneecap_run_process(control_plane: ControlPlane, ns, operator_kubeconfig, tmp_path):
    plane, admin = control_plane, control_plane.admin
    live, metrics = free_port(), free_port()
    mark = plane.audit_mark()
    log = tmp_path / "operator.log"
    proc = _run(operator_kubeconfig, "--liveness", str(live), "--metrics-port", str(metrics),
                stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        plane.wait_for(lambda: proc.poll() is None and _get(f"http://127.0.0.1:{live}/healthz")[0] == 200, 90,
                       "liveness")
        admin.create(LLMD, _resource("cli"))
        deploy = plane.wait_for(lambda: admin.get(DEPLOY, NS, "cli"), 60, "the Deployment from `kneecap run`")
        _, text = plane.wait_for(lambda: (lambda r: r if "kneecap_replicas{" in r[1] else None)(
            _get(f"http://127.0.0.1:{metrics}/metrics")), 60, "operator metrics")
        _deleted(plane, "cli")
    except Exception as exc:
        raise AssertionError(f"{exc}\n`kneecap run`'s log:\n{log.read_text()[-4000:]}") from None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert deploy["spec"]["replicas"] == 1
    assert f'kneecap_replicas{{name="cli",namespace="{NS}",pool="server"}} 1.0' in text
    # it logged in with the kubeconfig's token, as the chart's ServiceAccount; none refused (401/403)
    ours = [e for e in plane.audit(OPERATOR_USER, since_line=mark) if e["objectRef"].get("namespace") == NS]
    assert {("create", "deployments"), ("create", "services")} <= {(e["verb"], e["objectRef"].get("resource"))
                                                                  for e in ours}
    assert [e["responseStatus"]["code"] for e in ours if e["responseStatus"]["code"] in (401, 403)] == []


def test_kneecap_run_json_logs_one_object_per_line(control_plane: ControlPlane, ns, operator_kubeconfig, tmp_path):
    """`kneecap run --json`: every stdout line is a JSON log record (kopf's format: message,
    severity, and the object it is about); nothing else is printed there."""
    plane, admin = control_plane, control_plane.admin
    out_file, err_file = tmp_path / "stdout", tmp_path / "stderr"
    proc = _run(operator_kubeconfig, "--json", stdout=out_file.open("wb"), stderr=err_file.open("wb"))
    try:
        admin.create(LLMD, _resource("cli-json"))
        plane.wait_for(lambda: admin.get(DEPLOY, NS, "cli-json"), 120, "the Deployment from `kneecap run`")
        _deleted(plane, "cli-json")
    except Exception as exc:
        raise AssertionError(f"{exc}\n`kneecap run`'s stderr:\n{err_file.read_text()[-3000:]}") from None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    out = out_file.read_text()
    assert proc.returncode == 0, err_file.read_text()[-3000:]
    records = [json.loads(line) for line in out.splitlines()]
    assert records and all({"message", "severity", "timestamp"} <= set(r) for r in records)
    about = [r for r in records if (r.get("object") or {}).get("name") == "cli-json"]
    assert about, out[-2000:]
