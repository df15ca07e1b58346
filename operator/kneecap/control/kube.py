"""A small async Kubernetes API client for the objects the operator owns.

kopf talks to the API for the LLMDeployment itself; owned Deployments, Services and Pods go
through this client. It authenticates with the operator's `Credentials` (kneecap.control.auth:
the `kubernetes` package's Configuration, the same one kopf logs in with), asking for the
Authorization header on every request, and reloads them once and retries after a 401; or with
a fixed `kopf.ConnectionInfo` (the tests' and the demo's emulated API).
"""

from __future__ import annotations

import base64
import ssl
import tempfile
import urllib.parse
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

import aiohttp
import orjson

from kneecap.control.auth import Credentials

MERGE = "application/merge-patch+json"
FIELD_MANAGER = "kneecap"


class ApiError(Exception):
    def __init__(self, status: int, body: Any, what: str):
        self.status = status
        self.body = body
        self.what = what  # "<VERB> <path>"
        msg = body.get("message") if isinstance(body, dict) else body
        self.api_message = str(msg)
        super().__init__(f"{what}: HTTP {status}: {msg}")


@dataclass(frozen=True)
class ApiFailure:
    """A write (or read) the API refused or never answered: what was tried, on what, and why.
    ``code`` is the HTTP status (0: no answer, e.g. a connection error or a timeout)."""

    verb: str  # the API verb: create | patch | delete | get | list
    resource: str  # the plural, with a subresource: "deployments", "llmdeployments/status"
    name: str
    code: int
    message: str

    @classmethod
    def of(cls, exc: BaseException) -> "ApiFailure":
        if isinstance(exc, ApiError):
            verb, _, path = exc.what.partition(" ")
            resource, name = _resource_of(path)
            return cls("create" if verb == "POST" else verb.lower(), resource, name, exc.status,
                       exc.api_message[:500])
        return cls("request", "", "", 0, f"{type(exc).__name__}: {exc}"[:500])

    def __str__(self) -> str:
        return (f"{self.verb} {self.resource}{' ' + self.name if self.name else ''}: "
                f"HTTP {self.code or '(no answer)'}: {self.message}")


def _resource_of(path: str) -> tuple[str, str]:
    """(plural[/subresource], name) of an API path (see resource_path)."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    if "namespaces" in parts and parts.index("namespaces") + 2 < len(parts):
        parts = parts[parts.index("namespaces") + 2:]
    else:
        parts = parts[2:] if parts[:1] == ["api"] else parts[3:]
    plural, name, sub = (parts + ["", "", ""])[:3]
    return plural + (f"/{sub}" if sub else ""), urllib.parse.unquote(name)


def _decode(raw: bytes) -> Any:
    """A response body: JSON, else its text (an error page)."""
    try:
        return orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", "replace")


def resource_path(api_version: str, plural: str, namespace: str | None = None, name: str | None = None,
                  sub: str | None = None) -> str:
    base = f"/api/{api_version}" if api_version == "v1" else f"/apis/{api_version}"
    p = base + (f"/namespaces/{namespace}" if namespace else "") + f"/{plural}"
    return p + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


def selector_matches(selector: str | None, labels: dict | None) -> bool:
    """Equality-based label selectors: k=v, k==v, k!=v, k, !k (comma = and)."""
    labels = labels or {}
    for term in filter(None, (t.strip() for t in (selector or "").split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def deployments_path(ns: str, name: str | None = None) -> str:
    return resource_path("apps/v1", "deployments", ns, name)


def services_path(ns: str, name: str | None = None) -> str:
    return resource_path("v1", "services", ns, name)


def replicasets_path(ns: str, name: str | None = None) -> str:
    return resource_path("apps/v1", "replicasets", ns, name)


def configmaps_path(ns: str, name: str | None = None) -> str:
    return resource_path("v1", "configmaps", ns, name)


def pods_path(ns: str, name: str | None = None) -> str:
    return resource_path("v1", "pods", ns, name)


def hpas_path(ns: str) -> str:
    return resource_path("autoscaling/v2", "horizontalpodautoscalers", ns)


def _ssl_context(info) -> ssl.SSLContext | bool | None:
    if getattr(info, "insecure", False):
        return False
    ca_path, ca_data = getattr(info, "ca_path", None), getattr(info, "ca_data", None)
    cert_path, cert_data = getattr(info, "certificate_path", None), getattr(info, "certificate_data", None)
    key_path, key_data = getattr(info, "private_key_path", None), getattr(info, "private_key_data", None)
    if not (ca_path or ca_data or cert_path or cert_data):
        return None
    ctx = ssl.create_default_context(cafile=ca_path) if ca_path else ssl.create_default_context()
    if ca_data:
        data = ca_data.decode() if isinstance(ca_data, bytes) else ca_data
        if "BEGIN CERTIFICATE" not in data:
            data = base64.b64decode(data).decode()
        ctx.load_verify_locations(cadata=data)
    if cert_path or cert_data:
        def _file(path, data):
            if path:
                return path
            f = tempfile.NamedTemporaryFile(delete=False, suffix=".pem")
            raw = data if isinstance(data, bytes) else data.encode()
            if b"BEGIN" not in raw:
                raw = base64.b64decode(raw)
            f.write(raw)
            f.close()
            return f.name
        ctx.load_cert_chain(_file(cert_path, cert_data), _file(key_path, key_data))
    return ctx


class KubeClient:
    """JSON over HTTP to one API server. Methods raise ApiError on non-2xx (404 -> None for get)."""

    def __init__(self, server: str | None = None, token: str | None = None, scheme: str | None = None,
                 ssl_context=None, timeout_s: float = 15.0, username: str | None = None,
                 password: str | None = None, credentials: Credentials | None = None):
        """A fixed server and token, or `credentials` (server, TLS and a per-request token from them)."""
        self._credentials = credentials
        self._auth: str | None = None  # the fixed Authorization header
        if credentials is not None:
            self.server = credentials.server
            ssl_context = _ssl_context(credentials.connection_info())
        else:
            self.server = (server or "").rstrip("/")
            if token:
                self._auth = f"{scheme or 'Bearer'} {token}"
            elif username and password:
                self._auth = aiohttp.BasicAuth(username, password).encode()
        self._ssl = ssl_context
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_connection_info(cls, info) -> "KubeClient":
        return cls(info.server, token=getattr(info, "token", None), scheme=getattr(info, "scheme", None),
                   ssl_context=_ssl_context(info), username=getattr(info, "username", None),
                   password=getattr(info, "password", None))

    def _auth_headers(self) -> tuple[int, dict]:
        """(credentials generation, the Authorization header to send)."""
        if self._credentials is None:
            return 0, {"Authorization": self._auth} if self._auth else {}
        header = self._credentials.authorization()
        return self._credentials.generation, {"Authorization": header} if header else {}

    async def _reauthenticate(self, generation: int) -> bool:
        """After a 401: reload the credentials (once for concurrent 401s). False: fixed ones."""
        if self._credentials is None:
            return False
        await self._credentials.reload(generation)
        self._ssl = _ssl_context(self._credentials.connection_info())  # an exec plugin may issue certificates
        return True

    async def _sess(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers={"Accept": "application/json"}, timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                      params: dict | None = None, read_body: bool = True) -> tuple[int, Any]:
        """(HTTP status, decoded JSON or text). ``read_body=False``: a 2xx body is not decoded
        (None): a status write does not need the whole object back."""
        sess = await self._sess()
        kw: dict = {"params": params or None}
        if body is not None:  # orjson: a status patch every tick per resource (json.dumps is ~8x slower)
            kw["data"] = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)

        async def send() -> tuple[int, int, bytes]:
            generation, headers = self._auth_headers()
            if body is not None:
                headers["Content-Type"] = content_type
            if self._ssl is not None:
                kw["ssl"] = self._ssl
            async with sess.request(method, self.server + path, headers=headers, **kw) as resp:
                return generation, resp.status, await resp.read()

        generation, status, raw = await send()
        if status == 401 and await self._reauthenticate(generation):
            _, status, raw = await send()
        if not read_body and status < 300:
            return status, None
        return status, _decode(raw)

    async def get(self, path: str) -> dict | None:
        status, body = await self.request("GET", path)
        if status == 404:
            return None
        if status >= 300:
            raise ApiError(status, body, f"GET {path}")
        return body

    async def list(self, path: str, label_selector: str | None = None) -> list[dict]:
        return (await self.list_versioned(path, label_selector))[0]

    async def list_versioned(self, path: str, label_selector: str | None = None) -> tuple[list[dict], str | None]:
        """(items, the list's resourceVersion): where a watch of the same collection starts."""
        params = {"labelSelector": label_selector} if label_selector else None
        status, body = await self.request("GET", path, params=params)
        if status >= 300:
            raise ApiError(status, body, f"LIST {path}")
        return list(body.get("items") or []), (body.get("metadata") or {}).get("resourceVersion")

    async def watch(self, path: str, label_selector: str | None = None, resource_version: str | None = None,
                    timeout_s: float = 300.0, opened: Callable[[], None] | None = None) -> AsyncIterator[dict]:
        """The watch events of a collection from `resource_version` (ADDED, MODIFIED, DELETED,
        BOOKMARK, ERROR), one dict each, until the server ends the stream after `timeout_s`
        (a stream silent for longer than that, bookmarks included, ends here too). Raises
        ApiError when the watch cannot start; `opened` is called once the server accepted it."""
        params = {"watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": str(int(timeout_s))}
        if label_selector:
            params["labelSelector"] = label_selector
        if resource_version:
            params["resourceVersion"] = resource_version
        sess = await self._sess()
        kw: dict = {"params": params, "timeout": aiohttp.ClientTimeout(total=None, sock_connect=self._timeout.total,
                                                                       sock_read=1.1 * timeout_s + 1)}
        generation, kw["headers"] = self._auth_headers()
        if self._ssl is not None:
            kw["ssl"] = self._ssl
        async with sess.get(self.server + path, **kw) as resp:
            if resp.status >= 300:
                error = ApiError(resp.status, _decode(await resp.read()), f"WATCH {path}")
                if resp.status == 401:
                    await self._reauthenticate(generation)  # the caller's next watch sends the new token
                raise error
            if opened is not None:
                opened()
            buf = b""  # events are JSON lines; a line can outgrow aiohttp's readline limit (64 KiB)
            try:
                async for chunk in resp.content.iter_any():
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        if line.strip():
                            yield orjson.loads(line)
            except aiohttp.ServerTimeoutError:
                return  # silent past the server's own timeout: this stream is over, watch again
            if buf.strip():
                yield orjson.loads(buf)

    async def create(self, path: str, obj: dict) -> tuple[dict, bool]:
        """(object, created). An existing object (409) is fetched and returned with created=False."""
        status, body = await self.request("POST", path, obj, params={"fieldManager": FIELD_MANAGER})
        if status == 409:
            name = obj["metadata"]["name"]
            existing = await self.get(f"{path}/{urllib.parse.quote(name)}")
            if existing is not None:
                return existing, False
        if status >= 300:
            raise ApiError(status, body, f"POST {path}")
        return body, True

    async def patch(self, path: str, patch: Any, content_type: str = MERGE) -> dict:
        status, body = await self.request("PATCH", path, patch, content_type=content_type,
                                          params={"fieldManager": FIELD_MANAGER})
        if status >= 300:
            raise ApiError(status, body, f"PATCH {path}")
        return body

    async def patch_status(self, path: str, status: dict) -> None:
        """Merge-patch ``status`` into the object at ``path`` through its status subresource."""
        code, body = await self.request("PATCH", path + "/status", {"status": status}, content_type=MERGE,
                                        params={"fieldManager": FIELD_MANAGER}, read_body=False)
        if code >= 300:
            raise ApiError(code, body, f"PATCH {path}/status")

    async def delete(self, path: str) -> bool:
        status, body = await self.request("DELETE", path)
        if status == 404:
            return False
        if status >= 300:
            raise ApiError(status, body, f"DELETE {path}")
        return True
