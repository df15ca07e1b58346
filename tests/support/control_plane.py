"""A real Kubernetes control plane for the cluster tests, envtest-style: it sits beside the operator.

`ControlPlane.start()` runs, from the binaries `scripts/setup-kube.sh` builds into
``.tools/kube/bin``, on loopback only:

* etcd (one member, a fresh data dir, no fsync: test data is thrown away);
* kube-apiserver with a self-signed CA, a serving certificate for 127.0.0.1/localhost, client
  certificates for the admin (``system:masters``), the controller-manager and the scheduler, a
  static token file, RBAC (and Node) authorization, service-account signing keys (so the
  TokenRequest API issues tokens) and an audit log of every request at Metadata level;
* kube-controller-manager (Deployment/ReplicaSet rollouts, the garbage collector, service
  accounts, the root-CA ConfigMap; each controller with its own service-account credentials);
* kube-scheduler;
* kwok, which keeps the fake GPU nodes it manages Ready (leases, heartbeats) and moves pods bound to
  them to Running with a pod IP from a loopback /16 of its own (``pod_cidr``, 127.X.0.0/16, so
  that control planes side by side on one machine give no two pods one address): a process a
  test starts for a pod can listen on that pod's own IP and port, and the operator scrapes it
  exactly as in a cluster.

Every process runs in its own session and is stopped by process id (SIGTERM, then SIGKILL).
`stop_apiserver` / `start_apiserver` restart kube-apiserver alone (same etcd, same port).
`KubeClient` is a small kubectl-like client (the admin's, or one with a service-account token
from `token`) whose methods the tests use to read what the API stored.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import os
import random
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

ROOT = Path(__file__).resolve().parents[2]
KUBE_BIN = Path(os.environ.get("KNEECAP_KUBE_DIR", ROOT / ".tools" / "kube")) / "bin"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
KWOK_STAGES = Path(__file__).resolve().parent / "kwok" / "stages.yaml"
SERVICE_CIDR = "10.96.0.0/16"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
ADMIN_TOKEN = "kneecap-test-admin-token"
UNCACHED_WATCHES = "podtemplates"  # watched straight from etcd (see start_apiserver)

AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
"""


class ControlPlaneUnavailable(RuntimeError):
    """The binaries are missing or a component did not come up: the message says which and why."""


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for outbound connections' local ports (Linux's default where unreadable)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A loopback port free now, outside the ephemeral range: a port the kernel hands out for
    bind(0) can be taken as an outbound connection's local port before the component that was
    told to listen on it binds it (etcd failed so: "bind: address already in use")."""
    low, high = _ephemeral_ports()
    candidates = [port for port in range(10000, 65536) if not low <= port <= high]
    for port in random.sample(candidates, 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise ControlPlaneUnavailable(f"no free loopback port among 200 tried outside {low}-{high}")


def pod_cidr() -> str:
    """A loopback /16 for kwok's pod IPs that no address of it is listened on yet (127.2-254.x)."""
    with open("/proc/net/tcp") as fh:  # local addresses as little-endian hex IPv4
        busy = {(int(line.split()[1].split(":")[0], 16) >> 8) & 0xFF for line in fh.readlines()[1:]}
    free = [x for x in range(2, 255) if x not in busy]
    return f"127.{random.choice(free)}.0.0/16"


# ------------------------------------------------------------------------------------ certificates


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def _cert(subject: x509.Name, key, issuer: x509.Name, issuer_key, *, ca: bool = False,
          sans: list[x509.GeneralName] | None = None, client: bool = False) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
            decipher_only=False), critical=True)
    else:
        usage = x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH if client else x509.oid.ExtendedKeyUsageOID.SERVER_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


@dataclass
class Pki:
    """The CA, the apiserver's serving pair, client pairs by user, and the service-account keys."""

    dir: Path
    clients: dict[str, tuple[Path, Path]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        ca_key = _key()
        ca_name = _name("kneecap-test-ca")
        self._ca = (ca_name, ca_key)
        self.ca = self._write("ca", _cert(ca_name, ca_key, ca_name, ca_key, ca=True), ca_key)[0]
        key = _key()
        sans = [x509.DNSName("localhost"), x509.DNSName("kubernetes"), x509.DNSName("kubernetes.default.svc"),
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.IPAddress(ipaddress.ip_address("10.96.0.1"))]
        self.serving = self._write("apiserver", _cert(_name("kube-apiserver"), key, ca_name, ca_key, sans=sans), key)
        for user, group in (("kneecap-admin", "system:masters"), ("system:kube-controller-manager", None),
                            ("system:kube-scheduler", None), ("kwok-controller", "system:masters")):
            key = _key()
            self.clients[user] = self._write(user.replace(":", "-"),
                                             _cert(_name(user, group), key, ca_name, ca_key, client=True), key)
        sa_key = _key()
        self.sa_key = self.dir / "sa.key"
        self.sa_key.write_bytes(_pem_key(sa_key))
        self.sa_pub = self.dir / "sa.pub"
        self.sa_pub.write_bytes(sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))

    def _write(self, stem: str, cert: x509.Certificate, key) -> tuple[Path, Path]:
        crt, pem = self.dir / f"{stem}.crt", self.dir / f"{stem}.key"
        crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pem.write_bytes(_pem_key(key))
        return crt, pem


# ------------------------------------------------------------------------------------------ client


class ApiError(AssertionError):
    def __init__(self, code: int, body: Any, what: str):
        self.code, self.body = code, body
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"{what}: HTTP {code}: {message}")


def _body(raw: bytes) -> Any:
    """A response body: JSON, else its text (/readyz, /healthz answer ``ok``)."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


class KubeClient:
    """A kubectl-like client of the real API (admin certificate, or a bearer token)."""

    def __init__(self, url: str, ca: Path, *, cert: tuple[Path, Path] | None = None, token: str | None = None,
                 user: str = "admin"):
        self.url, self.ca, self.cert, self.token, self.user = url, ca, cert, token, user
        self._ssl = ssl.create_default_context(cafile=str(ca))
        if cert:
            self._ssl.load_cert_chain(str(cert[0]), str(cert[1]))

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/merge-patch+json", timeout_s: float = 30) -> tuple[int, Any]:
        if body is None:
            data = None
        elif isinstance(body, (bytes, str)):
            data = body.encode() if isinstance(body, str) else body
        else:
            data = json.dumps(body).encode()
        headers = {"Content-Type": content_type if method == "PATCH" else "application/json",
                   "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s, context=self._ssl) as resp:
                return resp.status, _body(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, _body(exc.read())

    @staticmethod
    def path(resource: str, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        """``group/version/plural`` (``v1/pods``, ``apps/v1/deployments``) to its REST path."""
        gv, plural = resource.rsplit("/", 1)
        base = f"/api/{gv}" if gv == "v1" else f"/apis/{gv}"
        p = base + (f"/namespaces/{namespace}" if namespace else "") + f"/{plural}"
        return p + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

    def create(self, resource: str, obj: dict, namespace: str | None = None) -> dict:
        ns = namespace or obj.get("metadata", {}).get("namespace")
        code, body = self.request("POST", self.path(resource, ns), obj)
        if code != 201:
            raise ApiError(code, body, f"create {resource} {obj.get('metadata', {}).get('name')}")
        return body

    def get(self, resource: str, namespace: str | None, name: str) -> dict | None:
        code, body = self.request("GET", self.path(resource, namespace, name))
        if code == 404:
            return None
        if code != 200:
            raise ApiError(code, body, f"get {resource} {namespace}/{name}")
        return body

    def list(self, resource: str, namespace: str | None = None, selector: str | None = None) -> list[dict]:
        q = f"?labelSelector={urllib.parse.quote(selector)}" if selector else ""
        code, body = self.request("GET", self.path(resource, namespace) + q)
        if code != 200:
            raise ApiError(code, body, f"list {resource} in {namespace or 'all namespaces'}")
        return body["items"]

    def patch(self, resource: str, namespace: str | None, name: str, patch: Any, sub: str | None = None,
              content_type: str = "application/merge-patch+json") -> dict:
        code, body = self.request("PATCH", self.path(resource, namespace, name, sub), patch, content_type)
        if code != 200:
            raise ApiError(code, body, f"patch {resource} {namespace}/{name}")
        return body

    def delete(self, resource: str, namespace: str | None, name: str, propagation: str | None = None) -> int:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation} if propagation else None
        return self.request("DELETE", self.path(resource, namespace, name), body)[0]

    def watch(self, resource: str, namespace: str | None, selector: str | None = None,
              resource_version: str | None = None, timeout_s: int = 60):
        """The watch stream of ``resource`` as (type, object) pairs, from `resource_version` on,
        until the server closes it after `timeout_s`."""
        q = {"watch": "1", "timeoutSeconds": str(timeout_s), "allowWatchBookmarks": "false"}
        if selector:
            q["labelSelector"] = selector
        if resource_version:
            q["resourceVersion"] = resource_version
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url + self.path(resource, namespace) + "?" + urllib.parse.urlencode(q),
                                     headers=headers)
        with urllib.request.urlopen(req, timeout=timeout_s + 10, context=self._ssl) as resp:
            for line in resp:
                if line.strip():
                    event = json.loads(line)
                    yield event["type"], event["object"]

    def list_version(self, resource: str, namespace: str | None = None, selector: str | None = None) -> str:
        """The resourceVersion of a list: a watch from it misses nothing after the list."""
        q = f"?labelSelector={urllib.parse.quote(selector)}" if selector else ""
        code, body = self.request("GET", self.path(resource, namespace) + q)
        if code != 200:
            raise ApiError(code, body, f"list {resource}")
        return body["metadata"]["resourceVersion"]

    def add_namespace(self, name: str) -> dict:
        code, body = self.request("POST", "/api/v1/namespaces",
                                  {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        if code not in (201, 409):
            raise ApiError(code, body, f"create namespace {name}")
        return body

    def write_kubeconfig(self, path: Path, namespace: str | None = None) -> Path:
        user: dict = {}
        if self.token:
            user["token"] = self.token
        if self.cert:
            user["client-certificate"], user["client-key"] = str(self.cert[0]), str(self.cert[1])
        context = {"cluster": "kneecap-test", "user": self.user, **({"namespace": namespace} if namespace else {})}
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "kneecap-test",
            "clusters": [{"name": "kneecap-test", "cluster": {"server": self.url, "certificate-authority": str(self.ca)}}],
            "users": [{"name": self.user, "user": user}],
            "contexts": [{"name": "kneecap-test", "context": context}]}))
        return path


# ------------------------------------------------------------------------------------ control plane


@dataclass
class Component:
    name: str
    argv: list[str]
    log: Path
    process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(self.argv, stdout=self.log.open("ab"), stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace_s: float = 10.0) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(grace_s)
        self.process = None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok, on loopback."""

    def __init__(self, workdir: Path, bin_dir: Path = KUBE_BIN, apiserver: Path | None = None):
        """`apiserver`: another kube-apiserver binary (an older release) for `start(api_only=True)`."""
        self.apiserver_bin = apiserver or bin_dir / "kube-apiserver"
        needed = BINARIES if apiserver is None else ("etcd",)
        missing = [b for b in needed if not (bin_dir / b).is_file()] + (
            [str(apiserver)] if apiserver is not None and not apiserver.is_file() else [])
        if missing:
            raise ControlPlaneUnavailable(
                f"{', '.join(missing)} not in {bin_dir}: run scripts/setup-kube.sh (builds the control plane from "
                "the Go module proxy)")
        self.dir = workdir
        self.bin = bin_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pki = Pki(self.dir / "pki")
        ports: list[int] = []
        while len(ports) < 3:  # three distinct ports (each was free when picked)
            port = free_port()
            ports += [] if port in ports else [port]
        self.etcd_port, self.etcd_peer_port, self.port = ports
        self.url = f"https://127.0.0.1:{self.port}"
        self.pod_cidr = pod_cidr()
        self.audit_log = self.dir / "audit.log"
        (self.dir / "audit-policy.yaml").write_text(AUDIT_POLICY)
        (self.dir / "tokens.csv").write_text(f'{ADMIN_TOKEN},kneecap-admin,kneecap-admin,"system:masters"\n')
        self.admin = KubeClient(self.url, self.pki.ca, cert=self.pki.clients["kneecap-admin"], user="kneecap-admin")
        self.kubeconfig = self.admin.write_kubeconfig(self.dir / "admin.kubeconfig")
        self.components: dict[str, Component] = {}
        for user, stem in (("system:kube-controller-manager", "controller-manager"),
                           ("system:kube-scheduler", "scheduler"), ("kwok-controller", "kwok")):
            KubeClient(self.url, self.pki.ca, cert=self.pki.clients[user], user=user).write_kubeconfig(
                self.dir / f"{stem}.kubeconfig")

    # ------------------------------------------------------------------ processes

    def _component(self, name: str, argv: list[str]) -> Component:
        binary = self.apiserver_bin if name == "kube-apiserver" else self.bin / name
        comp = Component(name, [str(binary), *argv], self.dir / f"{name}.log")
        self.components[name] = comp
        return comp

    def start(self, timeout_s: float = 120.0, api_only: bool = False) -> "ControlPlane":
        """Everything, or with `api_only` etcd and kube-apiserver alone (admission checks)."""
        try:
            self._start_etcd(timeout_s)
            self.start_apiserver(timeout_s)
            if api_only:
                return self
            self._start_controllers()
            self.wait_for(lambda: self._default_service_account(), timeout_s, "the default service account")
        except BaseException:
            self.stop()
            raise
        return self

    def _start_etcd(self, timeout_s: float) -> None:
        data = self.dir / "etcd-data"
        comp = self._component("etcd", [
            f"--data-dir={data}", "--name=kneecap-test",
            f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{self.etcd_peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{self.etcd_peer_port}",
            f"--initial-cluster=kneecap-test=http://127.0.0.1:{self.etcd_peer_port}",
            "--unsafe-no-fsync", "--quota-backend-bytes=4294967296", "--log-level=warn"])
        comp.start()
        self.wait_for(lambda: self._http_ok(f"http://127.0.0.1:{self.etcd_port}/health", comp), timeout_s, "etcd")

    def start_apiserver(self, timeout_s: float = 120.0) -> None:
        pki = self.pki
        comp = self._component("kube-apiserver", [
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
            f"--tls-cert-file={pki.serving[0]}", f"--tls-private-key-file={pki.serving[1]}",
            f"--client-ca-file={pki.ca}", f"--token-auth-file={self.dir / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC", "--anonymous-auth=false",
            f"--service-account-key-file={pki.sa_pub}", f"--service-account-signing-key-file={pki.sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--api-audiences=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--allow-privileged=true",
            # PodTemplates (no test's object otherwise) bypass the watch cache: their watches go to
            # etcd, so a watch from a compacted revision is answered 410 Gone (tests/kube/test_informer.py)
            f"--watch-cache-sizes={UNCACHED_WATCHES}#0",
            f"--audit-policy-file={self.dir / 'audit-policy.yaml'}", f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json", "--audit-log-mode=blocking-strict", "--audit-log-maxsize=0",
            "--endpoint-reconciler-type=none", "--profiling=false", "--v=1"])
        comp.start()
        self.wait_for(lambda: self._ready(comp), timeout_s, "kube-apiserver /readyz")

    def stop_apiserver(self) -> None:
        self.components["kube-apiserver"].stop()

    def _start_controllers(self) -> None:
        pki = self.pki
        self._component("kube-controller-manager", [
            f"--kubeconfig={self.dir / 'controller-manager.kubeconfig'}",
            f"--authentication-kubeconfig={self.dir / 'controller-manager.kubeconfig'}",
            f"--authorization-kubeconfig={self.dir / 'controller-manager.kubeconfig'}",
            "--bind-address=127.0.0.1", "--secure-port=0", "--leader-elect=false",
            "--use-service-account-credentials=true", f"--service-account-private-key-file={pki.sa_key}",
            f"--root-ca-file={pki.ca}", f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--controllers=*,-nodeipam",
            "--concurrent-deployment-syncs=5", "--concurrent-gc-syncs=20", "--v=1"]).start()
        self._component("kube-scheduler", [
            f"--kubeconfig={self.dir / 'scheduler.kubeconfig'}",
            f"--authentication-kubeconfig={self.dir / 'scheduler.kubeconfig'}",
            f"--authorization-kubeconfig={self.dir / 'scheduler.kubeconfig'}",
            "--bind-address=127.0.0.1", "--secure-port=0", "--leader-elect=false", "--v=1"]).start()
        self._component("kwok", [
            f"--kubeconfig={self.dir / 'kwok.kubeconfig'}", f"--config={KWOK_STAGES}",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
            f"--cidr={self.pod_cidr}", "--node-ip=127.0.0.1", "--server-address=",
            "--node-lease-duration-seconds=40"]).start()

    def stop(self) -> None:
        for name in ("kwok", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            comp = self.components.get(name)
            if comp is not None:
                comp.stop()

    def __enter__(self) -> "ControlPlane":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ probes

    @staticmethod
    def wait_for(fn, timeout_s: float, what: str, every_s: float = 0.2):
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = fn()
            except ControlPlaneUnavailable:
                raise
            except Exception as exc:  # noqa: BLE001 - a component still starting answers with anything
                last = exc
            else:
                if last:
                    return last
            time.sleep(every_s)
        raise ControlPlaneUnavailable(f"timed out after {timeout_s:.0f} s waiting for {what}; last: {last!r}")

    @staticmethod
    def _check_alive(comp: Component) -> None:
        if not comp.alive():
            raise ControlPlaneUnavailable(f"{comp.name} exited ({comp.process and comp.process.returncode}); "
                                          f"log {comp.log}:\n{comp.tail()}")

    def _http_ok(self, url: str, comp: Component) -> bool:
        self._check_alive(comp)
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200

    def _ready(self, comp: Component) -> bool:
        self._check_alive(comp)
        code, _ = self.admin.request("GET", "/readyz", timeout_s=5)
        return code == 200

    def _default_service_account(self) -> bool:
        for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
            self._check_alive(self.components[name])
        return self.admin.get("v1/serviceaccounts", "default", "default") is not None

    # ------------------------------------------------------------------ etcd

    def etcd(self, call: str, body: dict) -> dict:
        """A call of etcd's v3 JSON gateway (``kv/range``, ``kv/compaction``, ...)."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.etcd_port}/v3/{call}", data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision (what kube-apiserver does every
        --etcd-compaction-interval); returns that revision: a watch from an older
        resourceVersion, not served by the watch cache, is answered 410 Gone."""
        key = base64.b64encode(b"/registry/").decode()
        revision = int(self.etcd("kv/range", {"key": key, "limit": 1})["header"]["revision"])
        self.etcd("kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    # ------------------------------------------------------------------ cluster objects

    def add_gpu_node(self, name: str, gpus: int = 8, gpu_product: str = "NVIDIA-H100-80GB-HBM3",
                     labels: dict | None = None, taint: bool = True) -> dict:
        """A fake GPU node kwok keeps Ready: ``nvidia.com/gpu`` capacity, the GPU taint, GFD-style labels."""
        node_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok",
                       "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": gpu_product,
                       "nvidia.com/gpu.count": str(gpus), **(labels or {})}
        body = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": node_labels, "annotations": {KWOK_ANNOTATION: "fake"}},
                "spec": {"taints": [GPU_TAINT] if taint else []}}
        self.admin.create("v1/nodes", body)
        resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
        self.admin.patch("v1/nodes", None, name, {"status": {"capacity": resources, "allocatable": resources}},
                         sub="status", content_type="application/strategic-merge-patch+json")
        return self.wait_for(lambda: self._node_ready(name), 60, f"node {name} Ready")

    def _node_ready(self, name: str) -> dict | None:
        node = self.admin.get("v1/nodes", None, name)
        conditions = (node or {}).get("status", {}).get("conditions") or []
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        gpus = (node or {}).get("status", {}).get("allocatable", {}).get("nvidia.com/gpu")
        return node if ready and gpus else None

    def token(self, namespace: str, service_account: str, expiration_s: int = 3600) -> str:
        """A bound token for ``namespace/service_account`` from the TokenRequest API."""
        code, body = self.admin.request(
            "POST", self.admin.path("v1/serviceaccounts", namespace, service_account, "token"),
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"expirationSeconds": expiration_s}})
        if code != 201:
            raise ApiError(code, body, f"TokenRequest for {namespace}/{service_account}")
        return body["status"]["token"]

    def client_as(self, namespace: str, service_account: str) -> KubeClient:
        """A client that authenticates as the service account (its RBAC, not the admin's)."""
        return KubeClient(self.url, self.pki.ca, token=self.token(namespace, service_account),
                          user=f"system:serviceaccount:{namespace}:{service_account}")

    # ------------------------------------------------------------------ audit log

    def audit(self, user: str | None = None, since_line: int = 0,
              stages: tuple[str, ...] = ("ResponseComplete", "Panic")) -> list[dict]:
        """The audit events of ``stages`` from line ``since_line`` on (a watch logs
        ResponseStarted when it starts and ResponseComplete only when it ends)."""
        events = []
        with self.audit_log.open() as fh:
            for i, line in enumerate(fh):
                if i < since_line or not line.strip():
                    continue
                try:
                    ev = json.loads(line)
                except ValueError:  # the line the apiserver is writing right now
                    continue
                if ev.get("stage") not in stages:
                    continue
                ev.setdefault("objectRef", {})  # (non-resource requests: /readyz, /version)
                ev.setdefault("responseStatus", {"code": 0})
                if user is None or ev.get("user", {}).get("username") == user:
                    events.append(ev)
        return events

    def audit_mark(self) -> int:
        """The audit log's current line count, for `audit(since_line=...)`."""
        with self.audit_log.open() as fh:
            return sum(1 for _ in fh)


def jwt_claims(token: str) -> dict:
    """The claims of a service-account token (no signature check: the test made the token)."""
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def decode_jwt_subject(token: str) -> str:
    """The ``sub`` claim of a service-account token."""
    return jwt_claims(token)["sub"]


CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"


def token_credential_id(token: str) -> str:
    """What the apiserver records as a request's credential when it carries this bound
    service-account token: ``JTI=<the token's jti claim>`` (in the audit event's
    ``user.extra["authentication.kubernetes.io/credential-id"]``)."""
    return f"JTI={jwt_claims(token)['jti']}"


def credential_id(event: dict) -> str | None:
    """The credential an audit event's request authenticated with (see token_credential_id)."""
    ids = ((event.get("user") or {}).get("extra") or {}).get(CREDENTIAL_ID) or []
    return ids[0] if len(ids) == 1 else None


def audit_time(event: dict, stamp: str = "requestReceivedTimestamp") -> float:
    """An audit event's timestamp (microseconds, UTC) as Unix seconds."""
    return datetime.datetime.fromisoformat(event[stamp].replace("Z", "+00:00")).timestamp()


WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")


def audit_writes(events: list[dict], *, exclude: tuple[str, ...] = ()) -> list[dict]:
    """The events of write requests, those on a resource in ``exclude`` left out."""
    return [e for e in events if e.get("verb") in WRITE_VERBS
            and (e.get("objectRef") or {}).get("resource") not in exclude]
