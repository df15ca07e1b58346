"""Authentication the way managed clusters do it, against the emulated API made to check tokens.

The API answers 401 unless the request carries `Authorization: Bearer <a token it accepts>`. A
kubeconfig's user is an exec plugin (`users[].user.exec`, as EKS/GKE/AKS write them): a small
script printing an ExecCredential with the token in a file, so the test rotates the credential
by rewriting the file and moving the API's accepted token. kneecap's client (KubeClient) and
kopf both log in through `kneecap.control.auth.Credentials` (the `kubernetes` package's loading)
and must pick up the new token after the old one is refused, or once the credential expires.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap

import attrs
import kopf
import pytest
import yaml
from kopf.testing import KopfRunner

from kneecap.control import auth
from kneecap.control.auth import Credentials, CredentialsError
from kneecap.control.handlers import OperatorConfig, build_registry
from kneecap.control.kube import ApiError, KubeClient, deployments_path, pods_path
from tests.support.kmock_api import LLMD, KubeAPI, KubeAPIThread
from tests.support.operator_harness import DEPLOY, NS, llmd, wait_for


@attrs.define(kw_only=True)
class TokenCheckingKubeAPI(KubeAPI):
    """The emulated API with bearer-token authentication. The test's own kubectl-like helper
    (urllib) is let through: it stands for an administrator, not for the operator."""

    accepted: set = attrs.field(factory=set)
    seen: list = attrs.field(factory=list)  # (user agent, Authorization, status) of checked requests

    async def __call__(self, raw_request):
        agent = raw_request.headers.get("User-Agent", "")
        if agent.startswith("Python-urllib"):
            return await super().__call__(raw_request)
        auth = raw_request.headers.get("Authorization", "")
        ok = auth.startswith("Bearer ") and auth.removeprefix("Bearer ") in self.accepted
        self.seen.append((agent, auth, 200 if ok else 401))
        if not ok:
            import aiohttp.web

            return aiohttp.web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                              "message": "Unauthorized", "reason": "Unauthorized", "code": 401},
                                             status=401)
        return await super().__call__(raw_request)


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


class ExecUser:
    """A kubeconfig whose user is the exec plugin above, and the plugin's token file."""

    def __init__(self, tmp_path, server: str, token: str, ttl_s: float | None = None):
        self.token_file = tmp_path / "token"
        self.log = tmp_path / "plugin.log"
        self.log.write_text("")
        self.rotate(token)
        (tmp_path / "plugin.py").write_text(PLUGIN)
        env = [{"name": "TOKEN_FILE", "value": str(self.token_file)}, {"name": "PLUGIN_LOG", "value": str(self.log)}]
        if ttl_s is not None:
            env.append({"name": "TTL_S", "value": str(ttl_s)})
        self.kubeconfig = tmp_path / "kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "eks",
            "clusters": [{"name": "eks", "cluster": {"server": server}}],
            "users": [{"name": "iam", "user": {"exec": {
                "apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable,
                "args": [str(tmp_path / "plugin.py")], "env": env, "interactiveMode": "Never"}}}],
            "contexts": [{"name": "eks", "context": {"cluster": "eks", "user": "iam"}}]}))

    def rotate(self, token: str) -> None:
        self.token_file.write_text(token)

    @property
    def runs(self) -> int:
        return self.log.read_text().count("run")


@pytest.fixture()
def kube():
    with KubeAPIThread(api_class=TokenCheckingKubeAPI) as k:
        k.add_namespace(NS)
        k.api.accepted = {"tok-1"}
        yield k


def _checked(kube, agent_prefix: str) -> list[tuple[str, int]]:
    return [(auth, status) for agent, auth, status in kube.api.seen if agent.startswith(agent_prefix)]


async def test_exec_plugin_token_and_its_rotation_after_a_401(kube, tmp_path):
    user = ExecUser(tmp_path, kube.url, "tok-1")
    creds = Credentials.from_kubeconfig(str(user.kubeconfig))
    client = KubeClient(credentials=creds)
    try:
        assert client.server == kube.url and user.runs == 1
        assert await client.list(pods_path(NS)) == []
        assert user.runs == 1  # a token without expiry is reused, not fetched per request

        # the cluster rotates the credential: the old token is refused from now on
        user.rotate("tok-2")
        kube.api.accepted = {"tok-2"}
        kube.api.seen.clear()
        assert await client.list(pods_path(NS)) == []
        assert [(a, s) for _, a, s in kube.api.seen] == [("Bearer tok-1", 401), ("Bearer tok-2", 200)]
        assert user.runs == 2

        # concurrent requests refused together reload once (one plugin run), then all succeed
        user.rotate("tok-3")
        kube.api.accepted = {"tok-3"}
        got = await asyncio.gather(*(client.list(deployments_path(NS)) for _ in range(5)))
        assert got == [[]] * 5 and user.runs == 3

        # a plugin that keeps handing out a refused token: the error reaches the caller, one retry
        kube.api.accepted = {"tok-4"}
        kube.api.seen.clear()
        with pytest.raises(ApiError) as err:
            await client.list(pods_path(NS))
        assert err.value.status == 401 and [s for _, _, s in kube.api.seen] == [401, 401]
    finally:
        await client.close()


async def test_expiring_exec_credential_is_renewed_before_it_is_refused(kube, tmp_path, monkeypatch):
    # the kubernetes package treats a credential as expired 5 minutes before its expirationTimestamp:
    # a 60 s lifetime is always due, a 1 h one never is during this test. The header is read anew
    # per request here (in service, reused for a second: far inside those 5 minutes).
    monkeypatch.setattr(auth, "HEADER_REUSE_S", 0.0)
    user = ExecUser(tmp_path, kube.url, "tok-1", ttl_s=60)
    creds = Credentials.from_kubeconfig(str(user.kubeconfig))
    client = KubeClient(credentials=creds)
    try:
        assert creds.expiration is not None and creds.connection_info().expiration == creds.expiration
        user.rotate("tok-2")
        kube.api.accepted = {"tok-2"}
        assert await client.list(pods_path(NS)) == []
        assert [(a, s) for _, a, s in kube.api.seen] == [("Bearer tok-2", 200)]  # no 401 on the way
        assert user.runs >= 2
    finally:
        await client.close()

    (tmp_path / "b").mkdir()
    long_lived = ExecUser(tmp_path / "b", kube.url, "tok-2", ttl_s=3600)
    client = KubeClient(credentials=Credentials.from_kubeconfig(str(long_lived.kubeconfig)))
    try:
        for _ in range(3):
            assert await client.list(pods_path(NS)) == []
        assert long_lived.runs == 1
    finally:
        await client.close()


async def test_rotated_token_file_is_reread_after_a_401(kube, tmp_path):
    """A kubeconfig `tokenFile` (what a projected service-account token looks like from outside)."""
    token = tmp_path / "sa-token"
    token.write_text("tok-1")
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": kube.url}}],
        "users": [{"name": "sa", "user": {"tokenFile": str(token)}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "sa"}}]}))
    client = KubeClient(credentials=Credentials.from_kubeconfig(str(cfg)))
    try:
        assert await client.list(pods_path(NS)) == []
        token.write_text("tok-2")
        kube.api.accepted = {"tok-2"}
        assert await client.list(pods_path(NS)) == []
        assert [a for _, a, _ in kube.api.seen] == ["Bearer tok-1", "Bearer tok-1", "Bearer tok-2"]
    finally:
        await client.close()


async def test_in_cluster_service_account_token_rotation(tmp_path):
    """The pod's projected token is re-read on reload (a 401) and by the kubernetes package's
    own minute-old check; the server and CA come from the service account."""
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("sa-1\n")
    ca.write_text("not parsed here")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    creds = Credentials.in_cluster(str(token), str(ca), environ=env)
    assert creds.server == "https://10.96.0.1:443"
    assert creds.authorization() == "bearer sa-1"
    info = creds.connection_info()
    assert (info.scheme, info.token, info.ca_path) == ("bearer", "sa-1", str(ca))
    token.write_text("sa-2\n")
    assert creds.authorization() == "bearer sa-1"  # cached within the minute
    generation = creds.generation
    await creds.reload(generation)
    await creds.reload(generation)  # a second 401 of the same generation does not reload again
    assert creds.authorization() == "bearer sa-2" and creds.generation == generation + 1


def test_no_credentials_is_a_clear_error(tmp_path, monkeypatch):
    for var in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(CredentialsError) as err:
        Credentials.from_environment(kubeconfig=str(tmp_path / "missing"))
    assert "not in a cluster" in str(err.value) and "missing" in str(err.value)
    bad = tmp_path / "kubeconfig"
    bad.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": "nope",
                                   "clusters": [], "users": [], "contexts": []}))
    with pytest.raises(CredentialsError) as err:
        Credentials.from_kubeconfig(str(bad))
    assert "nope" in str(err.value)


def test_kopf_and_the_owned_object_client_log_in_again_after_rotation(kube, tmp_path):
    """The operator (kopf + KubeClient) with exec-plugin credentials: the token rotates while it
    runs; kopf (its status patch after the spec change) and KubeClient (the reconcile's and the
    ticks' reads and writes) are refused, log in again through the plugin, and carry on."""
    user = ExecUser(tmp_path, kube.url, "tok-1")
    config = OperatorConfig(credentials=Credentials.from_kubeconfig(str(user.kubeconfig)), tick_s=0.2)
    settings = kopf.OperatorSettings()
    settings.watching.server_timeout = 10
    runner = KopfRunner(["run", "--standalone", "--namespace", NS, "--verbose"],
                        registry=build_registry(config), settings=settings, timeout=60)
    with runner:
        kube.create(LLMD, llmd("llama"))
        wait_for(lambda: kube.get(DEPLOY, NS, "llama"), what="deployment")
        wait_for(lambda: (kube.get(LLMD, NS, "llama").get("status") or {}).get("observedGeneration") == 1,
                 what="status of generation 1")
        user.rotate("tok-2")
        kube.api.accepted = {"tok-2"}
        kube.patch(LLMD, NS, "llama", {"spec": {"control": {"interval": "2s"}}})
        wait_for(lambda: (kube.get(LLMD, NS, "llama").get("status") or {}).get("observedGeneration") == 2,
                 what="status of generation 2 (kopf's patch with the new token)")
        wait_for(lambda: ("Bearer tok-2", 200) in _checked(kube, "Python"),
                 what="the owned-object client's requests with the new token")
    assert runner.exit_code == 0, runner.output
    kopf_reqs, ours = _checked(kube, "kopf"), _checked(kube, "Python")
    for reqs in (kopf_reqs, ours):
        statuses = [(a, s) for a, s in reqs]
        assert ("Bearer tok-1", 200) in statuses and ("Bearer tok-2", 200) in statuses
        assert ("Bearer tok-2", 401) not in statuses
    assert ("Bearer tok-1", 401) in kopf_reqs  # kopf was refused, and logged in again
    assert user.runs >= 2
