"""The operator's Kubernetes credentials, loaded by the `kubernetes` package.

`kubernetes.config` reads the in-cluster service account, else the kubeconfig ($KUBECONFIG or
~/.kube/config) with everything clusters use to log in: tokens, token files, client
certificates and exec plugins (`users[].user.exec`: EKS, GKE, AKS). It fills one
`kubernetes.client.Configuration`; kopf's login (`connection_info`) and the owned-object client
(`KubeClient`, which asks `authorization()` per request) both read that Configuration, so
credentials that expire are renewed the same way for both:

* its refresh hook re-runs an exec plugin once the credential's expirationTimestamp has passed
  and re-reads the service-account token file after a minute (a rotated projected token);
* a 401 reloads the whole Configuration (`reload`): the plugin runs again, token files are
  re-read. kopf re-runs its login handler after a 401 or when `expiration` passes.

An exec plugin runs synchronously inside the refresh hook (the kubernetes package's design):
the event loop waits for it once per credential lifetime. A reload runs in a thread.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import time
from typing import TYPE_CHECKING, Callable

from kneecap.errors import InputError

if TYPE_CHECKING:
    import kopf

# How long a header is reused before the Configuration's refresh hook runs again. The hook costs
# ~0.1 ms (it re-applies the whole kubeconfig); the operator sends a request per resource and tick.
HEADER_REUSE_S = 1.0


class CredentialsError(InputError):
    """No usable Kubernetes credentials (not in a cluster, no usable kubeconfig)."""

    def __init__(self, message: str):
        self.detail = message
        super().__init__("credentials", message)


class Credentials:
    """A reloadable `kubernetes.client.Configuration` and what kopf and KubeClient need from it."""

    def __init__(self, load: Callable[[], tuple[object, datetime.datetime | None]]):
        """`load` returns (Configuration, expiry of its credential or None); it is called now
        and on every reload."""
        self._load = load
        self.config, self.expiration = load()
        self.generation = 0  # bumped by every reload: a 401 of an older generation reloads no more
        self._lock: asyncio.Lock | None = None
        self._header: str | None = None
        self._header_until_s = 0.0  # monotonic; 0: run the refresh hook on the next request

    # ------------------------------------------------------------ sources

    @classmethod
    def from_environment(cls, kubeconfig: str | None = None, context: str | None = None) -> "Credentials":
        """In-cluster when the pod's service account is there, else the kubeconfig."""
        from kubernetes.config import ConfigException

        try:
            return cls.in_cluster()
        except ConfigException as in_cluster:
            try:
                return cls.from_kubeconfig(kubeconfig, context)
            except CredentialsError as exc:
                raise CredentialsError(f"not in a cluster ({in_cluster}) and {exc.detail}") from None

    @classmethod
    def in_cluster(cls, token_path: str | None = None, ca_path: str | None = None,
                   environ: dict | None = None) -> "Credentials":
        """The service account of the pod (KUBERNETES_SERVICE_HOST/PORT, its token and CA files)."""
        from kubernetes.client import Configuration
        from kubernetes.config import incluster_config

        def load():
            config = Configuration()
            loader = incluster_config.InClusterConfigLoader(
                token_filename=token_path or incluster_config.SERVICE_TOKEN_FILENAME,
                cert_filename=ca_path or incluster_config.SERVICE_CERT_FILENAME,
                environ=os.environ if environ is None else environ)
            loader.load_and_set(config)
            return config, None

        return cls(load)

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, context: str | None = None) -> "Credentials":
        """A kubeconfig file (default $KUBECONFIG, else ~/.kube/config; colon-separated lists merge)."""
        from kubernetes.client import Configuration
        from kubernetes.config import ConfigException
        from kubernetes.config import kube_config

        where = path or os.environ.get("KUBECONFIG") or "~/.kube/config"

        def load():
            try:
                merged = kube_config.KubeConfigMerger(where).config
                if merged is None:
                    raise ConfigException("no kubeconfig found")
                loader = kube_config.KubeConfigLoader(config_dict=merged, active_context=context,
                                                      config_base_path=None)
                config = Configuration()
                loader.load_and_set(config)
            except (ConfigException, KeyError, ValueError, OSError) as exc:
                raise CredentialsError(f"kubeconfig {where}: {exc}") from None
            return config, getattr(loader, "expiry", None)

        return cls(load)

    # ------------------------------------------------------------ use

    @property
    def server(self) -> str:
        return self.config.host.rstrip("/")

    def authorization(self) -> str | None:
        """The Authorization header for the next request. The Configuration's refresh hook runs
        here (at most every HEADER_REUSE_S): an expired exec credential is renewed, an old
        service-account token re-read."""
        now_s = time.monotonic()
        if now_s >= self._header_until_s:
            self._header, self._header_until_s = self._read_header(), now_s + HEADER_REUSE_S
        return self._header

    def _read_header(self) -> str | None:
        header = self.config.get_api_key_with_prefix("BearerToken")
        if header:
            return header.strip()  # the in-cluster loader keeps a token file's trailing newline
        if self.config.username and self.config.password:
            return self.config.get_basic_auth_token()
        return None

    def connection_info(self, priority: int = 0) -> "kopf.ConnectionInfo":
        """kopf's view of the same credentials (as kopf.login_via_client builds it, but from this
        Configuration rather than the package's global default)."""
        import kopf

        header = self.authorization()
        scheme, token = (header.split(" ", 1) if header and " " in header else (None, header))
        config = self.config
        return kopf.ConnectionInfo(
            server=self.server, ca_path=config.ssl_ca_cert, insecure=not config.verify_ssl,
            username=config.username or None, password=config.password or None, scheme=scheme, token=token,
            certificate_path=config.cert_file, private_key_path=config.key_file,
            priority=priority, expiration=self.expiration)

    async def reload(self, generation: int | None = None) -> None:
        """Load the credentials anew: after a 401 of a request sent with `generation` (concurrent
        401s of the same generation reload once), or unconditionally (`generation=None`)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if generation is not None and generation != self.generation:
                return  # another request already reloaded
            self.config, self.expiration = await asyncio.to_thread(self._load)
            self.generation += 1
            self._header_until_s = 0.0
