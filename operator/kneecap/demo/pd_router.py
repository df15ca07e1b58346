"""The request path of a disaggregated deployment: prefill first, then decode with its KV.

One URL in front of a prefill pool and a decode pool (each a :class:`Router`: round robin over
Ready endpoints, waiting while none is). A completion goes to a prefill twin with
``max_tokens: 1`` and ``kv_transfer_params: {"do_remote_decode": true}``; its answer's
``kv_transfer_params`` name the KV it keeps; the original request, with them, goes to a decode
twin, which reads that KV and streams the answer back unchanged. This is what vLLM's
disaggregated-serving proxy example (examples/online_serving/disaggregated_serving) and llm-d's
routing sidecar do in a cluster (docs/operations.md, "Disaggregated request path").
"""

from __future__ import annotations

import aiohttp
from aiohttp import web

from kneecap.demo.router import HOP_HEADERS, Front, Router
from kneecap.errors import InputError
from kneecap.sim import kv_transfer as kvt
from kneecap.sim.server import SIM_TIME_HEADER


class PDRouter(Front):
    def __init__(self, clock=None, wait_for_endpoint_s: float = 120.0):
        super().__init__()
        self.clock = clock
        self.prefill = Router(wait_for_endpoint_s=wait_for_endpoint_s)
        self.decode = Router(wait_for_endpoint_s=wait_for_endpoint_s)
        self.routed: list[tuple[str, str]] = []  # (prefill URL, decode URL) per request

    def pool(self, role: str) -> Router:
        return {"prefill": self.prefill, "decode": self.decode}[role]

    @property
    def endpoints(self) -> list[str]:
        """Every Ready endpoint once both pools have one (before that the path is not whole)."""
        both = self.prefill.endpoints and self.decode.endpoints
        return [*self.prefill.endpoints, *self.decode.endpoints] if both else []

    async def drain(self, url: str) -> None:
        """Wait for a retiring endpoint's requests, in whichever pool it serves."""
        for pool in (self.prefill, self.decode):
            await pool.drain(url)

    def on_endpoints(self, deployment: str, urls: list[str]) -> None:
        """The kubelet's endpoint callback: `<name>-prefill` and `<name>-decode` pools (manifests.pool_name)."""
        for role in ("prefill", "decode"):
            if deployment.endswith(f"-{role}"):
                self.pool(role).set_endpoints(urls)

    async def _prefill(self, body: dict, headers: dict) -> tuple[str, dict]:
        url = await self.prefill._endpoint()
        self.prefill.inflight[url] = self.prefill.inflight.get(url, 0) + 1
        try:
            async with self._session.post(url + "/v1/completions", json=kvt.prefill_request(body),
                                          headers=headers) as up:
                answer = await up.json(content_type=None)
                if up.status != 200:
                    raise web.HTTPBadGateway(text=f"prefill {url}: {up.status} {answer}")
        finally:
            self.prefill.inflight[url] -= 1
        return url, answer

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS | {"content-type"}}
        try:
            p_url, prefilled = await self._prefill(body, headers)
            decode_body = kvt.decode_request(body, prefilled)
        except (aiohttp.ClientError, InputError) as exc:
            return web.json_response({"error": {"message": f"prefill: {exc}", "code": 502}}, status=502)
        d_url = await self.decode._endpoint()
        self.routed.append((p_url, d_url))
        return await self.decode.forward(self._session, request, d_url, "POST", "/v1/completions", "decode",
                                         json=decode_body, headers=headers)

    async def _models(self, request: web.Request) -> web.Response:
        url = await self.decode._endpoint()
        async with self._session.get(url + "/v1/models") as up:
            return web.json_response(await up.json(content_type=None), status=up.status)

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(headers={SIM_TIME_HEADER: repr(self.clock())} if self.clock is not None else {})

    async def start(self, port: int | None = None) -> "PDRouter":
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        await self._serve(app, port)
        return self
