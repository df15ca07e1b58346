"""`kneecap run` as a process: kubeconfig login, liveness probe, metrics port, clean shutdown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request

import pytest

from tests.support.kmock_api import LLMD, KubeAPIThread
from tests.support.operator_harness import DEPLOY, NS, llmd, wait_for
from tests.support.twins import ROOT, free_port


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except OSError:
        return 0, ""


def test_kneecap_run_process(tmp_path):
    with KubeAPIThread() as kube:
        kube.add_namespace(NS)
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig", NS, user="tester")
        live, metrics = free_port(), free_port()
        env = dict(os.environ, KUBECONFIG=str(kubeconfig), PYTHONPATH=str(ROOT / "operator"))
        proc = subprocess.Popen([sys.executable, "-m", "kneecap", "run", "--namespace", NS, "--standalone",
                                 "--liveness", str(live), "--metrics-port", str(metrics), "--tick", "0.2"],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            kube.create(LLMD, llmd("cli"))
            wait_for(lambda: kube.get(DEPLOY, NS, "cli"), timeout_s=30, what="deployment from `kneecap run`")
            code, _ = wait_for(lambda: (lambda r: r if r[0] == 200 else None)(_get(f"http://127.0.0.1:{live}/healthz")),
                               timeout_s=10, what="liveness")
            _, text = wait_for(lambda: (lambda r: r if "kneecap_replicas{" in r[1] else None)(
                _get(f"http://127.0.0.1:{metrics}/metrics")), timeout_s=15, what="operator metrics")
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out.decode()[-3000:]
    assert 'kneecap_replicas{name="cli",namespace="serving",pool="server"} 1.0' in text


@pytest.mark.parametrize("argv,needle", [
    (["--metrics-port", "70000"], "--metrics-port"),
    (["--tick", "0"], "--tick"),
])
def test_kneecap_run_rejects_bad_flags(argv, needle):
    res = subprocess.run([sys.executable, "-m", "kneecap", "run", *argv], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT / "operator")), timeout=60)
    assert res.returncode == 2 and needle in res.stderr


def test_kneecap_run_json_logs_one_object_per_line(tmp_path):
    """`kneecap run --json`: every stdout line is a JSON log record (kopf's format: message,
    severity, and the object it is about); nothing else is printed there."""
    import json

    with KubeAPIThread() as kube:
        kube.add_namespace(NS)
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig", NS, user="tester")
        env = dict(os.environ, KUBECONFIG=str(kubeconfig), PYTHONPATH=str(ROOT / "operator"))
        proc = subprocess.Popen([sys.executable, "-m", "kneecap", "run", "--namespace", NS, "--standalone",
                                 "--tick", "0.2", "--json"],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            kube.create(LLMD, llmd("cli-json"))
            wait_for(lambda: kube.get(DEPLOY, NS, "cli-json"), timeout_s=30, what="deployment from `kneecap run`")
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err[-3000:]
    records = [json.loads(line) for line in out.splitlines()]
    assert records and all({"message", "severity", "timestamp"} <= set(r) for r in records)
    about = [r for r in records if (r.get("object") or {}).get("name") == "cli-json"]
    assert about, out[-2000:]
