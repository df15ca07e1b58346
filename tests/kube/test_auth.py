"""Authentication as managed clusters do it, on the real kube-apiserver: credentials that rotate.

Every token here is a TokenRequest token of the chart's ServiceAccount bound to a Secret of its
own (``boundObjectRef``): deleting the Secret revokes the token, and kube-apiserver then answers
401 to it. A kubeconfig's user is an exec plugin (``users[].user.exec``, as EKS/GKE/AKS write
them) printing the token in a file, a ``tokenFile``, or the in-cluster layout (the token and
ca.crt files, KUBERNETES_SERVICE_HOST/PORT). kneecap's client (KubeClient) and kopf both log in
through `kneecap.control.auth.Credentials` and must present the new token once the old one is
refused, or once the credential expires. Which token a request carried is in the audit log
(`control_plane.credential_id`); a refused request is audited without a user, at
ResponseStarted, with its user agent.
"""

from __future__ import annotations

import asyncio
import copy
import sys
import textwrap

import kopf
import pytest
import yaml
from kopf.testing import KopfRunner

from kneecap.control import auth
from kneecap.control.auth import Credentials
from kneecap.control.handlers import OperatorConfig, build_registry
from kneecap.control.kube import ApiError, KubeClient, deployments_path, pods_path
from tests.kube.conftest import OPERATOR_USER, RELEASE_NS, SERVICE_ACCOUNT
from tests.support.control_plane import ControlPlane, KubeClient as AdminClient, credential_id, token_credential_id
from tests.support.examples import ROOT, llmdeployment

NS = "auth"
LLMD = "kneecap.io/v1alpha1/llmdeployments"
DEPLOY = "apps/v1/deployments"

PLUGIN = textwrap.dedent('''\
    """An exec credential plugin: prints the token in TOKEN_FILE, with an optional expiry."""
    import datetime, json, os, sys
    with open(os.environ["PLUGIN_LOG"], "a") as log:
        log.write("run\\n")
    status = {"token": open(os.environ["TOKEN_FILE"]).read().strip()}
    ttl = os.environ.get("TTL_S")
    if ttl:
        at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=float(ttl))
        status["expirationTimestamp"] = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    json.dump({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "status": status},
              sys.stdout)
''')


class BoundTokens:
    """Tokens of the chart's ServiceAccount, each bound to a Secret made for it."""

    def __init__(self, plane: ControlPlane, prefix: str):
        self.plane, self.prefix = plane, prefix
        self.secrets: dict[str, str] = {}  # token -> its Secret's name

    def issue(self) -> str:
        admin = self.plane.admin
        name = f"{self.prefix}-{len(self.secrets)}"
        secret = admin.create("v1/secrets", {"metadata": {"name": name, "namespace": RELEASE_NS}})
        code, body = admin.request("POST", admin.path("v1/serviceaccounts", RELEASE_NS, SERVICE_ACCOUNT, "token"), {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600, "boundObjectRef": {
                "kind": "Secret", "apiVersion": "v1", "name": name, "uid": secret["metadata"]["uid"]}}})
        assert code == 201, body
        token = body["status"]["token"]
        self.secrets[token] = name
        assert self.accepted(token)
        return token

    def accepted(self, token: str) -> bool:
        probe = AdminClient(self.plane.url, self.plane.pki.ca, token=token)
        code, _ = probe.request("GET", probe.path("v1/pods", NS))
        assert code in (200, 401), code
        return code == 200

    def revoke(self, token: str) -> None:
        """Delete the token's Secret; back once the apiserver refuses the token."""
        assert self.plane.admin.delete("v1/secrets", RELEASE_NS, self.secrets[token]) == 200
        self.plane.wait_for(lambda: not self.accepted(token), 30, "the revoked token refused")

    def cleanup(self) -> None:
        for name in self.secrets.values():
            self.plane.admin.delete("v1/secrets", RELEASE_NS, name)


@pytest.fixture()
def tokens(control_plane, chart_installed, ns, request):
    t = BoundTokens(control_plane, f"auth-{request.node.name[5:40].replace('_', '-')}")
    yield t
    t.cleanup()


class ExecUser:
    """A kubeconfig whose user is the exec plugin above, and the plugin's token file."""

    def __init__(self, dir, plane: ControlPlane, token: str, ttl_s: float | None = None):
        dir.mkdir(parents=True, exist_ok=True)
        self.token_file, self.log = dir / "token", dir / "plugin.log"
        self.log.write_text("")
        self.rotate(token)
        (dir / "plugin.py").write_text(PLUGIN)
        env = [{"name": "TOKEN_FILE", "value": str(self.token_file)}, {"name": "PLUGIN_LOG", "value": str(self.log)}]
        if ttl_s is not None:
            env.append({"name": "TTL_S", "value": str(ttl_s)})
        self.kubeconfig = dir / "kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "eks",
            "clusters": [{"name": "eks", "cluster": {"server": plane.url, "certificate-authority": str(plane.pki.ca)}}],
            "users": [{"name": "iam", "user": {"exec": {
                "apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable,
                "args": [str(dir / "plugin.py")], "env": env, "interactiveMode": "Never"}}}],
            "contexts": [{"name": "eks", "context": {"cluster": "eks", "user": "iam"}}]}))

    def rotate(self, token: str) -> None:
        self.token_file.write_text(token)

    @property
    def runs(self) -> int:
        return self.log.read_text().count("run")


KOPF, AIOHTTP = "kopf/", "Python/"  # the user agents of kopf's requests and of KubeClient's (aiohttp)


def accepted_by(plane: ControlPlane, since: int, agent: str = "") -> list[str]:
    """The credential of each request of the operator's user in NS since ``since`` (audit log),
    in order, watches aside (one is audited when it ends, maybe long after it was let in), the
    tests' own probes (urllib) too; ``agent``: only requests whose user agent starts so."""
    return [credential_id(e) for e in plane.audit(OPERATOR_USER, since_line=since)
            if e["objectRef"].get("namespace") == NS and e["verb"] != "watch"
            and not e.get("userAgent", "").startswith("Python-urllib") and e.get("userAgent", "").startswith(agent)]


def refused(plane: ControlPlane, since: int, agent: str = "") -> list[dict]:
    """The requests refused 401 since ``since``, the tests' own probes (urllib) left out."""
    return [e for e in plane.audit(since_line=since, stages=("ResponseStarted",))
            if e["responseStatus"]["code"] == 401 and not e.get("userAgent", "").startswith("Python-urllib")
            and e.get("userAgent", "").startswith(agent)]


async def test_exec_plugin_token_and_its_rotation_after_a_401(control_plane, tokens, tmp_path):
    plane = control_plane
    t1 = tokens.issue()
    user = ExecUser(tmp_path, plane, t1)
    client = KubeClient(credentials=Credentials.from_kubeconfig(str(user.kubeconfig)))
    try:
        mark = plane.audit_mark()
        assert client.server == plane.url and user.runs == 1
        assert await client.list(pods_path(NS)) == []
        assert await client.list(pods_path(NS)) == []
        assert user.runs == 1  # a token without expiry is reused, not fetched per request
        assert accepted_by(plane, mark) == [token_credential_id(t1)] * 2

        # the credential rotates: the plugin hands out t2, and t1 is revoked
        t2 = tokens.issue()
        user.rotate(t2)
        tokens.revoke(t1)
        mark = plane.audit_mark()
        assert await client.list(pods_path(NS)) == []
        assert len(refused(plane, mark)) == 1 and accepted_by(plane, mark) == [token_credential_id(t2)]
        assert user.runs == 2

        # concurrent requests refused together reload once (one plugin run), then all succeed
        t3 = tokens.issue()
        user.rotate(t3)
        tokens.revoke(t2)
        mark = plane.audit_mark()
        got = await asyncio.gather(*(client.list(deployments_path(NS)) for _ in range(5)))
        assert got == [[]] * 5 and user.runs == 3
        assert accepted_by(plane, mark) == [token_credential_id(t3)] * 5

        # a plugin that keeps handing out a revoked token: the 401 reaches the caller after one retry
        tokens.revoke(t3)
        mark = plane.audit_mark()
        with pytest.raises(ApiError) as err:
            await client.list(pods_path(NS))
        assert err.value.status == 401 and len(refused(plane, mark)) == 2 and user.runs == 4
    finally:
        await client.close()


async def test_expiring_exec_credential_is_renewed_before_it_is_refused(control_plane, tokens, tmp_path,
                                                                        monkeypatch):
    # the kubernetes package treats a credential as expired 5 minutes before its expirationTimestamp:
    # a 60 s lifetime is always due, a 1 h one never is during this test. The header is read anew
    # per request here (in service, reused for a second: far inside those 5 minutes).
    plane = control_plane
    monkeypatch.setattr(auth, "HEADER_REUSE_S", 0.0)
    t1 = tokens.issue()
    user = ExecUser(tmp_path / "a", plane, t1, ttl_s=60)
    creds = Credentials.from_kubeconfig(str(user.kubeconfig))
    client = KubeClient(credentials=creds)
    try:
        assert creds.expiration is not None and creds.connection_info().expiration == creds.expiration
        t2 = tokens.issue()
        user.rotate(t2)
        tokens.revoke(t1)
        mark = plane.audit_mark()
        assert await client.list(pods_path(NS)) == []
        assert accepted_by(plane, mark) == [token_credential_id(t2)] and refused(plane, mark) == []  # no 401
        assert user.runs >= 2
    finally:
        await client.close()

    long_lived = ExecUser(tmp_path / "b", plane, t2, ttl_s=3600)
    client = KubeClient(credentials=Credentials.from_kubeconfig(str(long_lived.kubeconfig)))
    try:
        for _ in range(3):
            assert await client.list(pods_path(NS)) == []
        assert long_lived.runs == 1
    finally:
        await client.close()


async def test_rotated_token_file_is_reread_after_a_401(control_plane, tokens, tmp_path):
    """A kubeconfig `tokenFile` (what a projected service-account token looks like from outside)."""
    plane = control_plane
    t1 = tokens.issue()
    token = tmp_path / "sa-token"
    token.write_text(t1)
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": plane.url, "certificate-authority": str(plane.pki.ca)}}],
        "users": [{"name": "sa", "user": {"tokenFile": str(token)}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "sa"}}]}))
    client = KubeClient(credentials=Credentials.from_kubeconfig(str(cfg)))
    try:
        mark = plane.audit_mark()
        assert await client.list(pods_path(NS)) == []
        t2 = tokens.issue()
        token.write_text(t2)
        tokens.revoke(t1)
        middle = plane.audit_mark()
        assert await client.list(pods_path(NS)) == []
        assert accepted_by(plane, mark) == [token_credential_id(t1), token_credential_id(t2)]
        assert len(refused(plane, middle)) == 1
    finally:
        await client.close()


async def test_in_cluster_service_account_token_rotation(control_plane, tokens, tmp_path):
    """The pod's layout: KUBERNETES_SERVICE_HOST/PORT and the token and ca.crt files of
    /var/run/secrets/kubernetes.io/serviceaccount (here a directory `in_cluster` is pointed at).
    The projected token is rotated in place; the next request after the old one is refused
    re-reads it."""
    plane = control_plane
    t1 = tokens.issue()
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(t1 + "\n")
    (account / "ca.crt").write_bytes(plane.pki.ca.read_bytes())
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(plane.port)}
    creds = Credentials.in_cluster(str(account / "token"), str(account / "ca.crt"), environ=env)
    assert creds.server == plane.url
    info = creds.connection_info()
    assert (info.scheme, info.token, info.ca_path) == ("bearer", t1, str(account / "ca.crt"))
    client = KubeClient(credentials=creds)
    try:
        mark = plane.audit_mark()
        assert await client.list(pods_path(NS)) == []
        t2 = tokens.issue()
        (account / "token").write_text(t2 + "\n")
        tokens.revoke(t1)
        generation = creds.generation
        middle = plane.audit_mark()
        assert await client.list(pods_path(NS)) == []
        assert creds.generation == generation + 1 and len(refused(plane, middle)) == 1
        assert accepted_by(plane, mark) == [token_credential_id(t1), token_credential_id(t2)]
    finally:
        await client.close()


def test_kopf_and_the_owned_object_client_log_in_again_after_rotation(control_plane, tokens, tmp_path):
    """The operator in process (kopf + KubeClient) with exec-plugin credentials: the token is
    revoked while it runs; kopf (its status patch after a spec change) and KubeClient (the
    ticks' status writes) are refused, log in again through the plugin, and carry on."""
    plane, admin = control_plane, control_plane.admin
    t1 = tokens.issue()
    user = ExecUser(tmp_path, plane, t1)
    config = OperatorConfig(credentials=Credentials.from_kubeconfig(str(user.kubeconfig)), tick_s=0.25)
    settings = kopf.OperatorSettings()
    settings.watching.server_timeout = 10
    doc = copy.deepcopy(llmdeployment(ROOT / "examples" / "colocated.yaml"))
    doc["metadata"] = {"name": "rotated", "namespace": NS}
    doc["spec"]["control"].update(interval="1s", window="1s")
    status = lambda: (admin.get(LLMD, NS, "rotated") or {}).get("status") or {}  # noqa: E731
    mark = plane.audit_mark()
    runner = KopfRunner(["run", "--standalone", "--namespace", NS, "--verbose"],
                        registry=build_registry(config), settings=settings, timeout=120)
    with runner:
        try:
            admin.create(LLMD, doc)
            plane.wait_for(lambda: admin.get(DEPLOY, NS, "rotated"), 60, "the Deployment")
            plane.wait_for(lambda: status().get("observedGeneration") == 1, 60, "status of generation 1")
            plane.wait_for(lambda: status().get("lastDecision"), 60, "a tick")
            t2 = tokens.issue()
            user.rotate(t2)
            revoking, runs = plane.audit_mark(), user.runs
            tokens.revoke(t1)  # (either may be refused already while this waits for the refusal)
            rotated = plane.audit_mark()
            admin.patch(LLMD, NS, "rotated", {"spec": {"control": {"interval": "2s"}}})
            plane.wait_for(lambda: status().get("observedGeneration") == 2, 60,
                           "status of generation 2 (kopf's patch with the new token)")
            plane.wait_for(lambda: token_credential_id(t2) in accepted_by(plane, rotated, AIOHTTP), 60,
                           "the owned-object client's requests with the new token")
            admin.delete(LLMD, NS, "rotated")
            plane.wait_for(lambda: admin.get(LLMD, NS, "rotated") is None, 60, "deleted (finalizer removed)")
        except Exception as exc:
            raise AssertionError(f"{exc}\noperator output:\n{runner.output[-4000:]}") from None
    assert runner.exit_code == 0, runner.output[-4000:]
    t1_id, t2_id = token_credential_id(t1), token_credential_id(t2)
    for agent in (KOPF, AIOHTTP):  # kopf's own requests, and KubeClient's
        every, later = accepted_by(plane, mark, agent), accepted_by(plane, revoking, agent)
        before, after = every[:len(every) - len(later)], accepted_by(plane, rotated, agent)
        assert before and set(before) == {t1_id}, (agent, before)
        assert after and set(after) == {t2_id}, (agent, after)
    assert refused(plane, revoking, KOPF)  # kopf was refused, and logged in again
    assert user.runs > runs
