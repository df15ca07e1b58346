"""A Service-like router: one URL in front of a pool's Ready twins (round robin).

Requests go to a Ready endpoint; while none is Ready (a pod is starting) they wait for one, as
clients of a Service retry until an endpoint appears. A retiring endpoint gets no new requests
and `drain(url)` waits until its in-flight requests have finished (graceful termination).
Responses stream through unchanged, so `run_load` measures TTFT and E2E through the router.
Given the demo's clock, the router answers `GET /health` itself with it in the
`X-Kneecap-Sim-Time` header (what `kneecap load --sim-clock` paces on).
"""

from __future__ import annotations

import asyncio
import itertools

import aiohttp
from aiohttp import web

from kneecap.demo.clock import free_port
from kneecap.sim.server import SIM_TIME_HEADER

HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "host"}


class Front:
    """An HTTP front on 127.0.0.1 with one upstream session (no connection limit, no total
    timeout: responses stream for as long as generation takes)."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self, app: web.Application, port: int | None) -> None:
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                              timeout=aiohttp.ClientTimeout(total=None))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        self.port = port or free_port()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()


class Router(Front):
    def __init__(self, wait_for_endpoint_s: float = 120.0, drain_timeout_s: float = 60.0, clock=None):
        super().__init__()
        self.clock = clock
        self.endpoints: list[str] = []
        self.inflight: dict[str, int] = {}
        self.forwarded = 0
        self.wait_for_endpoint_s = wait_for_endpoint_s
        self.drain_timeout_s = drain_timeout_s
        self._rr = itertools.count()
        self._changed = asyncio.Event()

    def set_endpoints(self, urls: list[str]) -> None:
        self.endpoints = list(urls)
        self._changed.set()
        self._changed = asyncio.Event()

    async def drain(self, url: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout_s
        while self.inflight.get(url, 0) > 0 and loop.time() < deadline:
            await asyncio.sleep(0.05)

    async def _endpoint(self) -> str:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_for_endpoint_s
        while not self.endpoints:
            left = deadline - loop.time()
            if left <= 0:
                raise web.HTTPServiceUnavailable(text="no ready endpoint")
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except asyncio.TimeoutError:
                pass
        return self.endpoints[next(self._rr) % len(self.endpoints)]

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        url = await self._endpoint()
        body = await request.read()
        self.forwarded += 1
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        return await self.forward(self._session, request, url, request.method, request.path_qs, data=body,
                                  headers=headers)

    async def forward(self, session: aiohttp.ClientSession, request: web.Request, url: str, method: str, path: str,
                      what: str = "upstream", **kwargs) -> web.StreamResponse:
        """Send the request on to endpoint `url` (counted in flight for `drain`) and stream its
        answer back unchanged; a 502 naming `what` when the endpoint cannot be reached."""
        self.inflight[url] = self.inflight.get(url, 0) + 1
        try:
            async with session.request(method, url + path, **kwargs) as up:
                resp = web.StreamResponse(status=up.status, headers={
                    k: v for k, v in up.headers.items() if k.lower() not in HOP_HEADERS})
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        except aiohttp.ClientError as exc:
            return web.json_response({"error": {"message": f"{what} {url}: {exc}", "code": 502}}, status=502)
        finally:
            self.inflight[url] -= 1

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(headers={SIM_TIME_HEADER: repr(self.clock())})

    async def start(self, port: int | None = None) -> "Router":
        app = web.Application(client_max_size=64 * 1024 * 1024)
        if self.clock is not None:
            app.router.add_get("/health", self._health)
        app.router.add_route("*", "/{tail:.*}", self._proxy)
        await self._serve(app, port)
        return self
