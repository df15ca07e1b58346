"""A small async Kubernetes API client for the objects the operator owns.

kopf talks to the API for the LLMDeployment itself; owned Deployments, Services and Pods go
through this client, built from the same `kopf.ConnectionInfo` the operator logged in with
(so in-cluster service accounts, kubeconfigs and the tests' emulated API all work alike).
"""

from __future__ import annotations

import base64
import ssl
import tempfile
import urllib.parse
from typing import Any, AsyncIterator

import aiohttp
import orjson

MERGE = "application/merge-patch+json"
FIELD_MANAGER = "kneecap"


class ApiError(Exception):
    def __init__(self, status: int, body: Any, what: str):
        self.status = status
        self.body = body
        msg = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"{what}: HTTP {status}: {msg}")


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


def replicasets_path(ns: str) -> str:
    return resource_path("apps/v1", "replicasets", ns)


def pods_path(ns: str) -> str:
    return resource_path("v1", "pods", ns)


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

    def __init__(self, server: str, token: str | None = None, scheme: str | None = None, ssl_context=None,
                 timeout_s: float = 15.0, username: str | None = None, password: str | None = None):
        self.server = server.rstrip("/")
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"{scheme or 'Bearer'} {token}"
        elif username and password:
            self._headers["Authorization"] = aiohttp.BasicAuth(username, password).encode()
        self._ssl = ssl_context
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_connection_info(cls, info) -> "KubeClient":
        return cls(info.server, token=getattr(info, "token", None), scheme=getattr(info, "scheme", None),
                   ssl_context=_ssl_context(info), username=getattr(info, "username", None),
                   password=getattr(info, "password", None))

    async def _sess(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout)
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
        if self._ssl is not None:
            kw["ssl"] = self._ssl
        if body is not None:  # orjson: a status patch every tick per resource (json.dumps is ~8x slower)
            kw["data"] = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
            kw["headers"] = {"Content-Type": content_type}
        async with sess.request(method, self.server + path, **kw) as resp:
            raw = await resp.read()
            if not read_body and resp.status < 300:
                return resp.status, None
            return resp.status, _decode(raw)

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
                    timeout_s: float = 300.0) -> AsyncIterator[dict]:
        """The watch events of a collection from `resource_version` (ADDED, MODIFIED, DELETED,
        BOOKMARK, ERROR), one dict each, until the server ends the stream after `timeout_s`
        (a stream silent for longer than that, bookmarks included, ends here too). Raises
        ApiError when the watch cannot start."""
        params = {"watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": str(int(timeout_s))}
        if label_selector:
            params["labelSelector"] = label_selector
        if resource_version:
            params["resourceVersion"] = resource_version
        sess = await self._sess()
        kw: dict = {"params": params, "timeout": aiohttp.ClientTimeout(total=None, sock_connect=self._timeout.total,
                                                                       sock_read=1.1 * timeout_s + 1)}
        if self._ssl is not None:
            kw["ssl"] = self._ssl
        async with sess.get(self.server + path, **kw) as resp:
            if resp.status >= 300:
                raise ApiError(resp.status, _decode(await resp.read()), f"WATCH {path}")
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
