"""scrape() against real local HTTP servers on loopback: success, timeout, size cap, HTTP errors,
refused connections and bodies cut short. Its argument checks: tests/unit/test_observe_scrape.py."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import web

from kneecap.observe import (
    ScrapeConnectionError,
    ScrapeHTTPError,
    ScrapeTimeout,
    ScrapeTooLarge,
    parse_metrics,
    scrape,
)
from tests.support.data import read_capture


def reply(text: str, status: int = 200):
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=text, status=status, content_type="text/plain")

    return handler


@pytest.fixture
async def serve():
    """Start an aiohttp app on a free loopback port; yields a function app -> base URL."""
    runners = []

    async def start(app: web.Application) -> str:
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = site._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    yield start
    for r in runners:
        await r.cleanup()


async def test_scrape_parses_the_body(serve):
    text = read_capture("vllm-0.32-cpu-20req.txt")
    app = web.Application()
    app.router.add_get("/metrics", reply(text))
    base = await serve(app)
    snap = await scrape(base + "/metrics", timeout_s=5, max_bytes=1 << 20)
    ref = parse_metrics(text, t_s=snap.t_s, url=base + "/metrics")
    assert snap.series == ref.series
    assert snap.url == base + "/metrics" and snap.size_bytes == len(text.encode())
    assert snap.value("vllm:prompt_tokens_total") == 372.0
    assert not snap.truncated


async def test_timeout(serve):
    async def slow(request):
        await asyncio.sleep(2)
        return web.Response(text="x 1\n")

    app = web.Application()
    app.router.add_get("/metrics", slow)
    base = await serve(app)
    with pytest.raises(ScrapeTimeout) as ei:
        await scrape(base + "/metrics", timeout_s=0.2, max_bytes=1 << 20)
    assert ei.value.kind == "timeout" and "0.2 s" in str(ei.value)


async def test_size_cap_by_content_length_and_by_stream(serve):
    big = "vllm:x 1\n" * 20000

    async def chunked(request):
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for _ in range(200):
            await resp.write(b"vllm:x 1\n" * 100)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/metrics", reply(big))
    app.router.add_get("/chunked", chunked)
    base = await serve(app)
    with pytest.raises(ScrapeTooLarge, match="Content-Length"):
        await scrape(base + "/metrics", timeout_s=5, max_bytes=10_000)
    with pytest.raises(ScrapeTooLarge, match="exceeds max_bytes 10000"):
        await scrape(base + "/chunked", timeout_s=5, max_bytes=10_000)
    ok = await scrape(base + "/chunked", timeout_s=5, max_bytes=1 << 20)
    assert ok.value("vllm:x") == 1.0  # 20000 identical lines, one series


async def test_http_error_status(serve):
    app = web.Application()
    app.router.add_get("/metrics", reply("down", 503))
    base = await serve(app)
    with pytest.raises(ScrapeHTTPError) as ei:
        await scrape(base + "/metrics", timeout_s=5, max_bytes=1 << 20)
    assert ei.value.status == 503


async def test_a_redirect_is_a_scrape_error_and_is_not_followed(serve):
    hits = []

    async def target(request):
        hits.append(request.path)
        return web.Response(text="vllm:x 1\n")

    async def redirect(request):
        raise web.HTTPFound("/elsewhere")

    app = web.Application()
    app.router.add_get("/metrics", redirect)
    app.router.add_get("/elsewhere", target)
    base = await serve(app)
    with pytest.raises(ScrapeHTTPError, match="HTTP 302 \\(redirects are not followed\\)") as ei:
        await scrape(base + "/metrics", timeout_s=5, max_bytes=1 << 20)
    assert ei.value.status == 302 and hits == []


async def test_connection_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(ScrapeConnectionError):
        await scrape(f"http://127.0.0.1:{port}/metrics", timeout_s=2, max_bytes=1 << 20)


async def test_body_shorter_than_content_length():
    text = read_capture("vllm-0.32-cpu-20req.txt").encode()

    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(text))
        writer.write(text[: len(text) // 2])
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(ScrapeConnectionError, match="cut short"):
            await scrape(f"http://127.0.0.1:{port}/metrics", timeout_s=5, max_bytes=1 << 20)
    finally:
        server.close()
        await server.wait_closed()
