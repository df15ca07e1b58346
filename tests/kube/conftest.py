"""Fixtures of the tests that run on the real control plane (tests/support/control_plane.py).

One control plane per test session: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok with two fake GPU nodes, the CRD applied, and the chart installed with
helm (default values, the operator's Deployment scaled to 0: its pod would never run here, so the
tests run `kneecap run` out of process with the same flags, as the chart's ServiceAccount).
Missing binaries are a failure, not a skip: CI builds them (scripts/setup-kube.sh).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.control_plane import ControlPlane, ControlPlaneUnavailable, KubeClient
from tests.support.tools import tool

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kneecap"
CRD_FILE = ROOT / "crds" / "llmdeployment.yaml"
RELEASE = "kneecap"
RELEASE_NS = "kneecap-system"
SERVICE_ACCOUNT = "kneecap"  # the chart's fullname for release "kneecap"
GPU_NODES = ("gpu-node-a", "gpu-node-b")


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory):
    try:
        plane = ControlPlane(tmp_path_factory.mktemp("control-plane")).start()
    except ControlPlaneUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        for node in GPU_NODES:
            plane.add_gpu_node(node)
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def admin(control_plane: ControlPlane) -> KubeClient:
    return control_plane.admin


def kubectl(plane: ControlPlane, *args: str, input: str | None = None, check: bool = True,
            kubeconfig: Path | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([tool("kubectl"), f"--kubeconfig={kubeconfig or plane.kubeconfig}", *args],
                          input=input, capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}{proc.stdout}")
    return proc


def helm(plane: ControlPlane, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([tool("helm"), f"--kubeconfig={plane.kubeconfig}", *args],
                          capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}{proc.stdout}")
    return proc


@pytest.fixture(scope="session")
def crd_applied(control_plane: ControlPlane) -> dict:
    """crds/llmdeployment.yaml applied server-side and Established (structural, CEL compiled)."""
    kubectl(control_plane, "apply", "--server-side", "--field-manager=kneecap-test", "-f", str(CRD_FILE))
    kubectl(control_plane, "wait", "--for=condition=Established", "--timeout=60s",
            "crd/llmdeployments.kneecap.io")
    return control_plane.admin.get("apiextensions.k8s.io/v1/customresourcedefinitions", None,
                                   "llmdeployments.kneecap.io")


@pytest.fixture(scope="session")
def chart_installed(control_plane: ControlPlane, crd_applied: dict) -> dict:
    """`helm install kneecap charts/kneecap` with its default values (the CRD is already there:
    helm skips an existing one in crds/). Returns the release's manifest as parsed documents."""
    helm(control_plane, "install", RELEASE, str(CHART), "-n", RELEASE_NS, "--create-namespace", "--wait=false")
    manifest = helm(control_plane, "get", "manifest", RELEASE, "-n", RELEASE_NS).stdout
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    # the chart's pod cannot run on kwok's nodes (no image, no kubelet): the tests run its
    # command out of process instead
    kubectl(control_plane, "-n", RELEASE_NS, "scale", "deployment", SERVICE_ACCOUNT, "--replicas=0")
    return {"documents": docs, "status": json.loads(
        helm(control_plane, "status", RELEASE, "-n", RELEASE_NS, "-o", "json").stdout)}


def chart_operator_args(chart: dict) -> list[str]:
    """The arguments the chart's operator Deployment gives `kneecap` (``run ...``)."""
    deployment = next(d for d in chart["documents"] if d["kind"] == "Deployment")
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])
