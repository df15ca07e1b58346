"""Fixtures of the tests that run on the real control plane (tests/support/control_plane.py).

One control plane per test session: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok with two fake GPU nodes, the CRD applied, and the chart installed with
helm (default values, the operator's Deployment scaled to 0: its pod would never run here, so the
tests run `kneecap run` out of process with the same flags, as the chart's ServiceAccount).
Missing binaries are a failure, not a skip: CI builds them (scripts/setup-kube.sh).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.support.control_plane import (ApiError, ControlPlane, ControlPlaneUnavailable, KubeClient, audit_time,
                                         free_port, token_credential_id)
from tests.support.tools import tool
from tests.support.sim_operator import SCALE as SIM_SCALE
from tests.support.twins import Twin, TwinTime

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kneecap"
CRD_FILE = ROOT / "crds" / "llmdeployment.yaml"
RELEASE = "kneecap"
LLMD = "kneecap.io/v1alpha1/llmdeployments"
CRD_NAME = "llmdeployments.kneecap.io"
RELEASE_NS = "kneecap-system"
SERVICE_ACCOUNT = "kneecap"  # the chart's fullname for release "kneecap"
# four tainted 8-GPU H100 nodes (a pod needs the GPU toleration) and one untainted pool
GPU_NODES = (("gpu-node-a", 8, True), ("gpu-node-b", 8, True), ("gpu-node-d", 8, True), ("gpu-node-e", 8, True),
             ("gpu-node-c", 32, False))
H100_NODES = tuple(n for n, _, tainted in GPU_NODES if tainted)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory):
    try:
        plane = ControlPlane(tmp_path_factory.mktemp("control-plane")).start()
    except ControlPlaneUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        for node, gpus, tainted in GPU_NODES:
            plane.add_gpu_node(node, gpus=gpus, taint=tainted,
                               gpu_product="NVIDIA-H100-80GB-HBM3" if tainted else "NVIDIA-L40S")
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def admin(control_plane: ControlPlane) -> KubeClient:
    return control_plane.admin


@pytest.fixture(scope="module")
def ns(admin: KubeClient, crd_applied: dict, request: pytest.FixtureRequest):
    """The test module's namespace (its ``NS``), created once the CRD is there, and emptied of
    LLMDeployments, Deployments and pods after the module."""
    admin.add_namespace(request.module.NS)
    return request.module.NS


@pytest.fixture(scope="module", autouse=True)
def _module_namespace_cleared(request: pytest.FixtureRequest):
    """After each module, its namespace (``NS``) emptied (`clear_namespace`)."""
    namespace = getattr(request.module, "NS", None)
    admin = request.getfixturevalue("admin") if namespace else None  # (before the module: pytest's rule)
    yield
    if namespace:
        if admin.get("v1/namespaces", None, namespace) and admin.get(
                "apiextensions.k8s.io/v1/customresourcedefinitions", None, CRD_NAME):
            clear_namespace(admin, namespace)


def clear_namespace(admin: KubeClient, namespace: str, timeout_s: float = 120.0) -> None:
    """Deletes the LLMDeployments (their finalizer dropped: no operator may be running now), the
    Deployments and the pods of `namespace`, and waits until its pods are gone: every pod asks for GPUs, and the
    fake nodes' GPUs are shared by the whole session."""
    for obj in admin.list(LLMD, namespace):
        name = obj["metadata"]["name"]
        admin.request("PATCH", admin.path(LLMD, namespace, name), {"metadata": {"finalizers": None}})
        admin.request("DELETE", admin.path(LLMD, namespace, name))
    admin.request("DELETE", admin.path("apps/v1/deployments", namespace) + "?propagationPolicy=Background")
    admin.request("DELETE", admin.path("v1/pods", namespace))  # pods a test made itself, owned by no Deployment
    ControlPlane.wait_for(lambda: not admin.list("v1/pods", namespace), timeout_s,
                          f"the pods of {namespace} gone after its module")


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

    def established():
        crd = control_plane.admin.get("apiextensions.k8s.io/v1/customresourcedefinitions", None,
                                      "llmdeployments.kneecap.io")
        conditions = (crd.get("status") or {}).get("conditions") or []
        return crd if any(c["type"] == "Established" and c["status"] == "True" for c in conditions) else None

    crd = control_plane.wait_for(established, 60, "the LLMDeployment CRD Established")

    def served():  # (Established comes before its storage: a list answers 429 "storage is (re)initializing")
        try:
            return control_plane.admin.list_version(LLMD, "default")
        except ApiError:
            return None

    control_plane.wait_for(served, 60, "a list of LLMDeployments answered")
    return crd


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


class OperatorProcess:
    """`kneecap run ARGS` out of process (as the chart's container runs it), logging to a file.

    `stop()` sends SIGTERM (kopf releases its peering and exits); `kill()` sends SIGKILL, the
    leader dying without a word."""

    def __init__(self, args: list[str], kubeconfig: Path, log: Path, pod_id: str):
        self.args, self.log, self.pod_id = args, log, pod_id
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "POD_ID": pod_id}
        self.process = subprocess.Popen([sys.executable, "-m", "kneecap", *args], env=env,
                                        stdout=log.open("ab"), stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)

    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, grace_s: float = 20.0) -> None:
        if self.alive():
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        if self.alive():
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)


def with_ports(args: list[str], liveness: int, metrics: int) -> list[str]:
    """The chart's `kneecap run` arguments with this machine's free ports (several operators
    run side by side on one loopback)."""
    out = []
    for a in args:
        if a.startswith("--liveness="):
            a = f"--liveness={liveness}"
        elif a.startswith("--metrics-port="):
            a = f"--metrics-port={metrics}"
        out.append(a)
    return out


@pytest.fixture(scope="session")
def operator_kubeconfig(control_plane: ControlPlane, chart_installed: dict,
                        tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kubeconfig that authenticates as the chart's ServiceAccount (a TokenRequest token)."""
    client = control_plane.client_as(RELEASE_NS, SERVICE_ACCOUNT)
    return client.write_kubeconfig(tmp_path_factory.mktemp("operator") / "operator.kubeconfig")


OPERATOR_USER = f"system:serviceaccount:{RELEASE_NS}:{SERVICE_ACCOUNT}"


def tick_writes(events: list[dict], namespace: str, name: str, after_s: float | None = None) -> list[dict]:
    """The audit `events` that are a tick of LLMDeployment namespace/name: a status write that
    succeeded (every tick writes the status: its window, its decision's time), after `after_s`."""
    return [e for e in events if e["objectRef"].get("resource") == "llmdeployments"
            and e["objectRef"].get("subresource") == "status" and e["objectRef"].get("namespace") == namespace
            and e["objectRef"].get("name") == name and e["responseStatus"]["code"] < 300
            and (after_s is None or audit_time(e) > after_s)]


def wait_ticks(plane: ControlPlane, since_line: int, n: int, resources: list[tuple[str, str]], *,
               timeout_s: float = 60.0, every_s: float = 0.2, user: str = OPERATOR_USER) -> None:
    """Wait until each (namespace, name) of `resources` has ticked `n` times as `user` since the
    audit mark: a test proves the operator ran before it asserts that nothing happened."""
    def done() -> bool:
        events = plane.audit(user, since_line=since_line)
        return all(len(tick_writes(events, ns, name)) >= n for ns, name in resources)
    plane.wait_for(done, timeout_s, f"{n} ticks of {', '.join(f'{ns}/{name}' for ns, name in resources)}", every_s)


@pytest.fixture(scope="module")
def operator(control_plane: ControlPlane, chart_installed: dict, operator_kubeconfig: Path,
             tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    """One `kneecap run` with the chart's arguments (and a 0.25 s tick) as the chart's
    ServiceAccount, for the test module; its namespace (``NS``) created."""
    from tests.support.control_plane import free_port

    control_plane.admin.add_namespace(request.module.NS)
    args = with_ports(chart_operator_args(chart_installed), free_port(), free_port()) + ["--tick", "0.25"]
    op = OperatorProcess(args, operator_kubeconfig, tmp_path_factory.mktemp("operator") / "operator.log",
                         pod_id=f"kneecap-{request.module.NS}")
    yield op
    op.stop()


# ------------------------------------------------------------------ several operators, pods with metrics


def service_account_kubeconfig(plane: ControlPlane, path: Path, namespace: str = RELEASE_NS,
                               service_account: str = SERVICE_ACCOUNT) -> tuple[Path, str]:
    """A kubeconfig with a token of its own (TokenRequest) for the service account, and the
    credential id the audit log records for that token (`token_credential_id`): operators
    that run as one service account, each with its own token, are told apart in the audit log."""
    client = plane.client_as(namespace, service_account)
    return client.write_kubeconfig(path), token_credential_id(client.token)


def healthy(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
        return resp.status == 200


def start_chart_operator(plane: ControlPlane, chart: dict, kubeconfig: Path, log: Path, pod_id: str,
                         extra_args: tuple[str, ...] = (), timeout_s: float = 90) -> OperatorProcess:
    """`kneecap run` with the chart's arguments (free ports, then `extra_args`), up once its
    /healthz answers. The process carries its ports as ``liveness`` and ``metrics_port``."""
    liveness, metrics = free_port(), free_port()
    op = OperatorProcess([*with_ports(chart_operator_args(chart), liveness, metrics), *extra_args], kubeconfig,
                         log, pod_id=pod_id)
    op.liveness, op.metrics_port = liveness, metrics
    try:
        plane.wait_for(lambda: op.alive() and healthy(liveness), timeout_s, f"{pod_id}'s /healthz")
    except Exception:
        op.stop()
        raise AssertionError(f"operator {pod_id} did not come up; its log:\n{op.tail()}") from None
    return op


def metric_sum(port: int, family: str) -> float:
    """The sum of a family's samples on the /metrics page at 127.0.0.1:port (0 when absent)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(float(v) for v in re.findall(rf"^{re.escape(family)}(?:{{[^}}]*}})? (\S+)$", text, flags=re.M))


class PodTwins:
    """A `kneecap twin` on each Running pod's own IP and engine port (kwok gives pods IPs in
    the plane's pod_cidr and runs nothing): the operator scrapes the pods exactly as in a cluster.
    `sync()` starts a twin for each Running pod with an IP that has none and stops those whose
    pod is gone; it returns the twins by pod name."""

    def __init__(self, admin: KubeClient, namespace: str, selector: str, port: int, *, model: str, arch: str,
                 gpu: str, max_num_seqs: int):
        self.admin, self.namespace, self.selector, self.port = admin, namespace, selector, port
        self.model, self.arch, self.gpu, self.max_num_seqs = model, arch, gpu, max_num_seqs
        self.twins: dict[str, Twin] = {}

    def sync(self) -> dict[str, Twin]:
        pods = self.admin.list("v1/pods", self.namespace, selector=self.selector)
        running = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods
                   if p.get("status", {}).get("phase") == "Running" and p["status"].get("podIP")
                   and not p["metadata"].get("deletionTimestamp")}
        for name in set(self.twins) - set(running):
            self.twins.pop(name).stop()
        for name, ip in running.items():
            if name not in self.twins:
                self.twins[name] = Twin(self.model, self.arch, self.gpu, self.max_num_seqs, time_scale=1.0,
                                        host=ip, port=self.port).start()
        return dict(self.twins)

    def stop(self) -> None:
        for twin in self.twins.values():
            twin.stop()
        self.twins.clear()


@pytest.fixture()
def fault_proxy(control_plane: ControlPlane):
    """A `FaultProxy` in front of the real apiserver (tests/support/fault_proxy.py), for one test."""
    from tests.support.fault_proxy import FaultProxy

    with FaultProxy(control_plane) as proxy:
        yield proxy


@pytest.fixture()
def sim():
    """The twins' clock (tests/support/twins.TwinTime) the in-process operator tests run on."""
    clock = TwinTime(SIM_SCALE)
    yield clock
    clock.close()


@pytest.fixture()
def token(control_plane: ControlPlane, chart_installed: dict, ns: str) -> str:
    """A TokenRequest token of the chart's ServiceAccount, once the module's namespace exists."""
    return control_plane.token(RELEASE_NS, SERVICE_ACCOUNT)
