"""A thin fault-injecting reverse proxy in front of the real kube-apiserver.

A real apiserver does not answer a 500 on cue, nor refuse one patch the way an admission webhook
would. `FaultProxy` listens on loopback (TLS, with the apiserver's own serving pair, so a client
trusts it with the plane's CA) and forwards every request to the real apiserver as it came: the
client's ``Authorization`` header passes through (use a token-authenticated client: the apiserver
sees the client's own identity, its RBAC and its audit user), and responses, watches included,
are streamed back chunk by chunk. A rule table answers chosen requests with a Kubernetes
``Status`` instead, as `FaultProxy.fault` and `FaultProxy.arm` describe.

It runs its own event loop in a thread, so a sync test and an async operator (KopfRunner, or
`kneecap run` through `write_kubeconfig`) can both use it.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import aiohttp.web
import yaml

from tests.support.control_plane import ControlPlane, free_port

# RFC 7230 §6.1 hop-by-hop headers, and those aiohttp sets itself for the hop it makes
HOP_HEADERS = frozenset(h.lower() for h in (
    "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer",
    "Transfer-Encoding", "Upgrade", "Host", "Content-Length"))
# metav1.StatusReason for the codes a test injects (k8s.io/apimachinery/pkg/apis/meta/v1/types.go)
REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 409: "Conflict",
           410: "Expired", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
           503: "ServiceUnavailable", 504: "Timeout"}


@dataclass(frozen=True)
class Match:
    """A request: its method, a regex searched in its path, and a substring of its body (None: any)."""

    method: str
    path: str
    body: str | None = None

    def __call__(self, method: str, path: str, body: str) -> bool:
        return (method == self.method and re.search(self.path, path) is not None
                and (self.body is None or self.body in body))


@dataclass
class Rule:
    """Answer `code` with `message` to requests matching `match`, `times` more times (None: always)."""

    match: Match
    code: int
    message: str
    times: int | None = 1


@dataclass(frozen=True)
class Seen:
    """A request the proxy handled: forwarded (``code`` the apiserver's) or faulted."""

    method: str
    path: str
    query: str
    code: int
    faulted: bool


class FaultProxy:
    """A reverse proxy to the plane's kube-apiserver with a rule table (see the module doc)."""

    def __init__(self, plane: ControlPlane, host: str = "127.0.0.1"):
        self.plane, self.host, self.port = plane, host, free_port()
        self.url = f"https://{host}:{self.port}"
        self._rules: list[Rule] = []
        self._armed: list[tuple[Match, list[Rule]]] = []
        self._lock = threading.Lock()
        self.seen: list[Seen] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: aiohttp.web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    # ------------------------------------------------------------------ rules

    def fault(self, method: str, path: str, code: int, message: str, body: str | None = None,
              times: int | None = 1) -> Rule:
        """Answer the next `times` requests (None: every one) matching method, path regex and body
        substring with `code` and a Status carrying `message`."""
        rule = Rule(Match(method, path, body), code, message, times)
        with self._lock:
            self._rules.append(rule)
        return rule

    def arm(self, method: str, path: str, rules: list[Rule], body: str | None = None) -> None:
        """Add `rules` once a request matching method, path regex and body substring has passed
        (a fault that follows an event: the status write after a Deployment patch). The
        triggering request itself is forwarded."""
        with self._lock:
            self._armed.append((Match(method, path, body), list(rules)))

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()
            self._armed.clear()

    def faulted(self, method: str | None = None, path: str | None = None) -> list[Seen]:
        """The requests answered by a rule (of `method`, with `path` searched in theirs)."""
        with self._lock:
            return [s for s in self.seen if s.faulted and (method is None or s.method == method)
                    and (path is None or re.search(path, s.path))]

    def _decide(self, method: str, path: str, body: str) -> Rule | None:
        with self._lock:
            for rule in self._rules:
                if rule.match(method, path, body):
                    if rule.times is not None:
                        rule.times -= 1
                        if rule.times <= 0:
                            self._rules.remove(rule)
                    return rule
            for armed in list(self._armed):
                if armed[0](method, path, body):
                    self._armed.remove(armed)
                    self._rules.extend(armed[1])
            return None

    # ------------------------------------------------------------------ proxying

    async def _handle(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        data = await request.read()
        rule = self._decide(request.method, request.path, data.decode(errors="replace"))
        if rule is not None:
            self._record(request, rule.code, True)
            return aiohttp.web.json_response(
                {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                 "message": rule.message, "reason": REASONS.get(rule.code, ""), "code": rule.code},
                status=rule.code)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        async with self._session.request(request.method, self.plane.url + request.rel_url.raw_path_qs,
                                         headers=headers, data=data or None, allow_redirects=False) as upstream:
            response = aiohttp.web.StreamResponse(status=upstream.status, reason=upstream.reason, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS})
            self._record(request, upstream.status, False)
            await response.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            except (ConnectionResetError, aiohttp.ClientConnectionError):
                return response  # the client or the apiserver hung up mid-stream (a watch closed)
            await response.write_eof()
            return response

    def _record(self, request: aiohttp.web.Request, code: int, faulted: bool) -> None:
        with self._lock:
            self.seen.append(Seen(request.method, request.path, request.query_string, code, faulted))

    # ------------------------------------------------------------------ lifecycle

    async def _start(self) -> None:
        upstream_ssl = ssl.create_default_context(cafile=str(self.plane.pki.ca))
        # auto_decompress off: a gzip body from the apiserver passes through with its Content-Encoding
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=upstream_ssl, limit=0), auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), skip_auto_headers=("User-Agent",
                                                                                          "Accept-Encoding"))
        serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        serving.load_cert_chain(str(self.plane.pki.serving[0]), str(self.plane.pki.serving[1]))
        app = aiohttp.web.Application(client_max_size=64 * 1024 ** 2)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = aiohttp.web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=5)
        await self._runner.setup()
        await aiohttp.web.TCPSite(self._runner, self.host, self.port, ssl_context=serving).start()

    async def _stop(self) -> None:
        # the upstream session first: a watch still streaming through ends (its handler returns),
        # so the server has no open request to wait for
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def start(self) -> "FaultProxy":
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self._loop = None

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def write_kubeconfig(self, path: Path, token: str, user: str = "proxied") -> Path:
        """A kubeconfig for this proxy that authenticates with `token` (forwarded as it is)."""
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "kneecap-proxy",
            "clusters": [{"name": "kneecap-proxy",
                          "cluster": {"server": self.url, "certificate-authority": str(self.plane.pki.ca)}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "kneecap-proxy", "context": {"cluster": "kneecap-proxy", "user": user}}]}))
        return path
