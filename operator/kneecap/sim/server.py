"""The twin's HTTP face: vLLM's OpenAI-compatible server over :class:`kneecap.sim.engine.Engine`.

Endpoints: ``POST /v1/completions`` (OpenAI shape with ``usage``; ``stream`` as server-sent
events, ``stream_options.include_usage``), ``GET /v1/models``, ``/health``, ``/version``,
``/metrics`` (vLLM names, see :mod:`kneecap.sim.metrics`).

Time: one driver task steps the engine and sleeps until the twin's clock reaches each step's
end; a step that starts late runs at once, so the engine catches up. The clock runs
``time_scale`` times faster than the wall clock, but never more than ``CATCH_UP_WALL_S`` (wall
seconds, × time_scale) ahead of a busy engine: when the CPU cannot keep up (steps take longer
to compute than they model) the clock waits for the engine, so the twin runs slower than asked
yet stays self-consistent: arrivals, latencies and counters are all on its clock. Every latency the twin reports is in simulated
seconds. The clock is exported: the gauge ``kneecap_twin_sim_time_seconds`` on /metrics (read
in the same render as the counters, so Δcounter/Δgauge is a rate on the twin's clock),
``kneecap_twin_behind_seconds`` (what it has lost against ``time_scale`` × the wall clock), and
the header ``X-Kneecap-Sim-Time`` on every response. Its origin is the unix time at start, or
``sim_clock_anchor`` = (wall unix seconds, simulated seconds): the clock that read the second
at the first and runs ``time_scale`` times faster (the demo puts every twin on its own clock).

Tokens: a string prompt has one token per whitespace-separated word; a list of token ids has
one per id. The twin has no EOS: every request generates exactly ``max_tokens`` tokens
(``finish_reason`` "length"), as a real server does with ``ignore_eos``.

Disaggregated serving: with a ``kv_role`` (vLLM's ``--kv-transfer-config``) the twin takes
``kv_transfer_params`` as vLLM's NixlConnector does (:mod:`kneecap.sim.kv_transfer`); such
responses also carry ``kneecap_timing`` (arrival, scheduled, first token, finish on the exported
clock, and for a decode the remote prefill's finish).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid

from aiohttp import web

from kneecap.errors import InputError
from kneecap.model.arch import GIB
from kneecap.sim import kv_transfer as kvt
from kneecap.model.memory import block_round_tokens
from kneecap.sim.engine import Engine, EngineConfig, SimRequest
from kneecap.sim.metrics import VLLM_VERSION, TwinMetrics

SIM_TIME_HEADER = "X-Kneecap-Sim-Time"
CATCH_UP_WALL_S = 0.02  # how far a busy engine may trail its clock (timer jitter) before the clock waits

DEFAULT_MAX_TOKENS = 16  # vLLM's default for /v1/completions
WORDS = ("the", "knee", "of", "a", "curve", "is", "where", "batching", "stops", "paying", "off", "and",
         "memory", "waits", "for", "tokens")


def count_prompt_tokens(prompt) -> int:
    """Deterministic tokenisation (module docstring). Raises InputError for what vLLM would refuse."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        n = len(prompt.split())
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
        n = len(prompt)
    elif isinstance(prompt, list):
        raise InputError("prompt", "batched prompts are not supported by the twin; send one string or one list of "
                                   "token ids per request")
    else:
        raise InputError("prompt", f"expected a string or a list of token ids, got {type(prompt).__name__}")
    if n == 0:
        raise InputError("prompt", "prompt cannot be empty")
    return n


def _error(status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": status}},
                             status=status)


class TwinServer:
    """Engine + metrics + pacing; ``app()`` gives the aiohttp application."""

    def __init__(self, config: EngineConfig, served_model_names: list[str], time_scale: float = 1.0,
                 seed: int = 0, root_model: str | None = None,
                 sim_clock_anchor: tuple[float, float] | None = None, kv_role: str | None = None,
                 kv_transfer_gib_s: float = 25.0):
        if not (isinstance(time_scale, (int, float)) and time_scale > 0):
            raise InputError("time_scale", f"expected a positive number, got {time_scale!r}")
        if not served_model_names:
            raise InputError("served_model_name", "expected at least one name")
        self.config = config
        self.names = list(served_model_names)
        self.root_model = root_model or self.names[0]
        self.time_scale = float(time_scale)
        self.seed = int(seed)
        self.engine = Engine(config)
        self.metrics = TwinMetrics(self.names[0], config)
        self.created = int(time.time())
        self._streams: dict[SimRequest, asyncio.Queue] = {}
        self._token_streams: set[SimRequest] = set()  # streaming requests: each token is sent on
        self._wake: asyncio.Event | None = None
        self._driver: asyncio.Task | None = None
        self._wall0 = 0.0
        self._anchor_sim_s = self._anchor_wall_s = 0.0  # the clock ran on time from here
        self.sim_clock_anchor = sim_clock_anchor
        self.sim_origin_s = 0.0  # kneecap_twin_sim_time_seconds at sim_now() == 0
        self.failed: str | None = None  # why the engine stopped, if it did
        self.kv_role = kv_role  # None | kv_producer | kv_consumer | kv_both
        self.kv_transfer_gib_s = float(kv_transfer_gib_s)
        self.engine_id = uuid.uuid4().hex
        self._hold_kv: set[SimRequest] = set()  # prefills whose KV waits for a remote decode
        self.held_kv: dict[str, kvt.HeldKV] = {}
        self._session = None  # aiohttp.ClientSession reading remote KV (decode)

    # ------------------------------------------------------------------ time
    def sim_now(self) -> float:
        """Simulated seconds since start: time_scale × the wall clock since the last anchor, held
        CATCH_UP_WALL_S × time_scale past a busy engine that trails it (module docstring)."""
        wall = asyncio.get_running_loop().time()
        sim = self._anchor_sim_s + (wall - self._anchor_wall_s) * self.time_scale
        engine = self.engine
        held = engine.now_s + CATCH_UP_WALL_S * self.time_scale
        if (engine.running or engine.waiting) and held < sim:
            self._anchor_sim_s, self._anchor_wall_s = held, wall
            return held
        return sim

    def sim_time_s(self) -> float:
        """The exported clock: ``sim_origin_s`` + simulated seconds since start."""
        return self.sim_origin_s + self.sim_now()

    def behind_s(self) -> float:
        """Simulated seconds lost against time_scale × the wall clock since start."""
        return (asyncio.get_running_loop().time() - self._wall0) * self.time_scale - self.sim_now()

    async def _drive(self) -> None:
        try:
            await self._drive_steps()
        except Exception as exc:  # a twin bug must not leave clients hanging
            self.failed = f"{type(exc).__name__}: {exc}"
            print(f"ERROR: kneecap twin engine stopped: {self.failed}", file=sys.stderr, flush=True)
            for q in self._streams.values():
                q.put_nowait(("done", "error"))

    async def _drive_steps(self) -> None:
        engine = self.engine
        while True:
            if not engine.has_work():
                self._wake.clear()
                await self._wake.wait()
                continue
            result = engine.step()
            if result is None:
                continue
            delay = (result.end_s - self.sim_now()) / self.time_scale
            await asyncio.sleep(max(delay, 0.0))
            self.metrics.on_step(result)
            for req, _first, _itl in result.tokens:
                if req in self._token_streams:
                    self._streams[req].put_nowait(("token", req.output_tokens))
            for req in result.finished:
                if req in self._hold_kv:
                    self._hold(req)
                q = self._streams.get(req)
                if q is not None:
                    q.put_nowait(("done", req.finished_reason))

    def _hold(self, req: SimRequest) -> None:
        """Keep a finished prefill's prompt blocks for the decode instance (they were freed in
        this very step, so they are free now); drop holds past their timeout."""
        self._hold_kv.discard(req)
        engine = self.engine
        for rid, held in list(self.held_kv.items()):
            if held.held_until_s < engine.now_s:
                self._release(rid)
        blocks = int(block_round_tokens(req.prompt_tokens, self.config.block_size)) // self.config.block_size
        engine.free_blocks -= blocks
        self.held_kv[req.request_id] = kvt.HeldKV(req.request_id, req.prompt_tokens, blocks,
                                                  self.sim_origin_s + req.finish_s, req.finish_s + kvt.HOLD_TIMEOUT_S)

    def _release(self, request_id: str) -> kvt.HeldKV | None:
        held = self.held_kv.pop(request_id, None)
        if held is not None:
            self.engine.free_blocks += held.blocks
            if self._wake is not None:
                self._wake.set()
        return held

    async def _startup(self, app: web.Application) -> None:
        self._wake = asyncio.Event()
        self._wall0 = self._anchor_wall_s = asyncio.get_running_loop().time()
        now_unix = time.time()
        if self.sim_clock_anchor is None:
            self.sim_origin_s = now_unix
        else:
            wall_s, sim_s = self.sim_clock_anchor
            self.sim_origin_s = sim_s + (now_unix - wall_s) * self.time_scale
        self._driver = asyncio.create_task(self._drive())

    async def _stamp(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers[SIM_TIME_HEADER] = repr(self.sim_time_s())

    async def _cleanup(self, app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()
        if self._driver:
            self._driver.cancel()
            try:
                await self._driver
            except asyncio.CancelledError:
                pass

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/ping", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/metrics", self.metrics_handler)
        app.router.add_get(kvt.KV_PATH + "{request_id}", self.read_kv)
        app.on_startup.append(self._startup)
        app.on_cleanup.append(self._cleanup)
        app.on_response_prepare.append(self._stamp)
        return app

    # ------------------------------------------------------------------ handlers
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=500 if self.failed else 200)

    async def read_kv(self, request: web.Request) -> web.Response:
        """A decode instance reads a held prefill's KV (NIXL's read, emulated): the blocks are freed."""
        held = self._release(request.match_info["request_id"])
        if held is None:
            return _error(404, f"no KV held for request {request.match_info['request_id']}", "NotFoundError")
        return web.json_response({"request_id": held.request_id, "prompt_tokens": held.prompt_tokens,
                                  "blocks": held.blocks, "finish_s": held.finish_s})

    async def _read_remote_kv(self, params: dict, prompt_tokens: int) -> dict:
        import aiohttp

        url = kvt.remote_source(params)
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        try:
            async with self._session.get(url) as resp:
                kv = await resp.json(content_type=None)
                if resp.status != 200:
                    raise InputError("kv_transfer_params", f"no KV at {url}: {resp.status} {kv}")
        except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as exc:
            raise InputError("kv_transfer_params", f"cannot read KV from {url}: {exc}") from None
        if kv.get("prompt_tokens") != prompt_tokens:
            raise InputError("kv_transfer_params", f"the remote KV holds {kv.get('prompt_tokens')} prompt tokens, "
                                                   f"the request has {prompt_tokens}")
        return kv

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    async def models(self, request: web.Request) -> web.Response:
        data = [{"id": n, "object": "model", "created": self.created, "owned_by": "vllm", "root": self.root_model,
                 "parent": None, "max_model_len": self.config.max_model_len} for n in self.names]
        return web.json_response({"object": "list", "data": data})

    async def metrics_handler(self, request: web.Request) -> web.Response:
        self.metrics.sim_time.set(self.sim_time_s())
        self.metrics.behind.set(self.behind_s())
        body = self.metrics.render(self.engine)
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    def _text(self, req: SimRequest, k: int) -> str:
        return " " + WORDS[(self.seed + 7 * k) % len(WORDS)]

    async def completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "request body is not valid JSON")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        if self.failed:
            return _error(500, f"engine stopped: {self.failed}", "InternalServerError")
        model = body.get("model")
        if model is not None and model not in self.names:
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        if body.get("n", 1) != 1:
            return _error(400, "the twin supports n=1 only", param="n")
        max_tokens = body.get("max_tokens", DEFAULT_MAX_TOKENS)
        if max_tokens is None:
            max_tokens = DEFAULT_MAX_TOKENS
        params = body.get("kv_transfer_params")
        params = params if isinstance(params, dict) else {}
        timing: dict | None = None
        try:
            prompt_tokens = count_prompt_tokens(body.get("prompt"))
            if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
                raise InputError("max_tokens", f"expected a positive integer, got {max_tokens!r}")
            arrival_s, prefilled = self.sim_now(), 0
            if params.get("do_remote_prefill"):
                if self.kv_role not in ("kv_consumer", "kv_both"):
                    raise InputError("kv_transfer_params", f"do_remote_prefill needs a kv_consumer (kv_role {self.kv_role})")
                kv = await self._read_remote_kv(params, prompt_tokens)
                # the prompt's KV arrives over the KV link once it exists (never before the remote
                # prefill finished, whatever this twin's clock says); the last prompt token is recomputed
                ready_s = max(self.sim_now(), kv["finish_s"] - self.sim_origin_s)
                arrival_s = ready_s + prompt_tokens * self.config.arch.kv_bytes_per_token / (
                    self.kv_transfer_gib_s * GIB)
                prefilled, timing = prompt_tokens - 1, {"remote_prefill_finish_s": kv["finish_s"]}
            elif params.get("do_remote_decode"):
                if self.kv_role not in ("kv_producer", "kv_both"):
                    raise InputError("kv_transfer_params", f"do_remote_decode needs a kv_producer (kv_role {self.kv_role})")
                timing = {}
            req = self.engine.add_request(prompt_tokens, max_tokens, arrival_s=arrival_s,
                                          request_id=f"cmpl-{uuid.uuid4().hex}", prefilled_tokens=prefilled)
        except InputError as exc:
            return _error(400, str(exc), param=exc.field)
        if params.get("do_remote_decode"):
            self._hold_kv.add(req)
        self.metrics.on_request(req)
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[req] = queue
        self._wake.set()
        stream = bool(body.get("stream", False))
        if stream:
            self._token_streams.add(req)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage", False))
        name = model or self.names[0]
        try:
            if stream:
                return await self._stream(request, req, queue, name, include_usage)
            return await self._complete(req, queue, name, request if timing is not None else None, timing)
        except (asyncio.CancelledError, ConnectionResetError):
            if req.state != "finished":
                self.engine.abort(req)
                self.metrics.on_finish(req)
            raise
        finally:
            self._streams.pop(req, None)
            self._token_streams.discard(req)

    def _usage(self, req: SimRequest) -> dict:
        return {"prompt_tokens": req.prompt_tokens, "total_tokens": req.prompt_tokens + req.output_tokens,
                "completion_tokens": req.output_tokens, "prompt_tokens_details": None}

    async def _complete(self, req: SimRequest, queue: asyncio.Queue, name: str,
                        request: web.Request | None = None, timing: dict | None = None) -> web.Response:
        while True:
            kind, value = await queue.get()
            if kind == "done":
                break
        if value == "error":
            return _error(500, f"engine stopped: {self.failed}", "InternalServerError")
        text = "".join(self._text(req, k) for k in range(req.output_tokens))
        out = {
            "id": req.request_id, "object": "text_completion", "created": int(time.time()), "model": name,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": value, "stop_reason": None,
                         "prompt_logprobs": None}],
            "usage": self._usage(req),
        }
        if timing is not None:  # a disaggregated request: when each phase ran, on the exported clock
            o = self.sim_origin_s
            out["kneecap_timing"] = {**timing, "arrival_s": o + req.arrival_s, "scheduled_s": o + req.scheduled_s,
                                     "first_token_s": o + req.first_token_s, "finish_s": o + req.finish_s}
        held = self.held_kv.get(req.request_id)
        if held is not None and request is not None:
            out["kv_transfer_params"] = {
                "do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": self.engine_id,
                "remote_block_ids": list(range(held.blocks)), "remote_host": request.url.host,
                "remote_port": request.url.port, "remote_request_id": req.request_id, "tp_size": 1}
        return web.json_response(out)

    async def _stream(self, request: web.Request, req: SimRequest, queue: asyncio.Queue, name: str,
                      include_usage: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        created = int(time.time())

        def chunk(choices, usage=None) -> bytes:
            obj = {"id": req.request_id, "object": "text_completion", "created": created, "model": name,
                   "choices": choices}
            if usage is not None:
                obj["usage"] = usage
            return f"data: {json.dumps(obj)}\n\n".encode()

        while True:
            kind, value = await queue.get()
            if kind == "token":
                last = req.state == "finished" and value == req.output_tokens
                await resp.write(chunk([{"index": 0, "text": self._text(req, value - 1), "logprobs": None,
                                         "finish_reason": req.finished_reason if last else None,
                                         "stop_reason": None}]))
            else:
                break
        if include_usage:
            await resp.write(chunk([], self._usage(req)))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


async def serve(server: TwinServer, host: str, port: int, ready_message: bool = True, json_lines: bool = False) -> None:
    """Run until cancelled. The ready message: a line on stderr, or (`json_lines`) a JSON object
    ``{"event": "serving", ...}`` on stdout."""
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    cfg = server.config
    if json_lines:
        print(json.dumps({"event": "serving", "model": server.names[0], "arch": cfg.arch.key, "gpu": cfg.gpu.key,
                          "max_num_seqs": cfg.max_num_seqs, "num_gpu_blocks": cfg.num_gpu_blocks,
                          "tensor_parallel_size": cfg.tensor_parallel_size, "time_scale": server.time_scale, "url": f"http://{host}:{port}"}), flush=True)
    elif ready_message:
        print(f"INFO: kneecap twin serving {server.names[0]} ({cfg.arch.key} on {cfg.gpu.key}, "
              f"max_num_seqs={cfg.max_num_seqs}, num_gpu_blocks={cfg.num_gpu_blocks}, "
              f"tensor_parallel_size={cfg.tensor_parallel_size}, "
              f"time_scale={server.time_scale}) on http://{host}:{port}", file=sys.stderr, flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
