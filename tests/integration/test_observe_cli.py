"""`kneecap observe` against local servers replaying the vLLM captures."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest
from aiohttp import web

from tests.support.capture_windows import zeroed
from tests.support.data import read_capture


async def _serve(texts: list[str]):
    """A /metrics that answers texts[0] first, then texts[1] for ever."""
    calls = {"n": 0}

    async def metrics(request):
        i = min(calls["n"], len(texts) - 1)
        calls["n"] += 1
        return web.Response(text=texts[i], content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


async def _cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kneecap", "observe", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    return proc.returncode, out.decode(), err.decode()


async def test_json_lines_per_window_and_pool():
    a_text = read_capture("vllm-0.32-cpu-20req.txt")
    b_text = read_capture("vllm-0.32-cpu-run4.txt")
    ra, a = await _serve([zeroed(a_text), a_text])
    rb, b = await _serve([zeroed(b_text), b_text])
    try:
        rc, out, err = await _cli(a, b + "/metrics", "--interval", "0.3", "--count", "2", "--json")
    finally:
        await ra.cleanup()
        await rb.cleanup()
    assert rc == 0, err
    lines = [json.loads(x) for x in out.splitlines()]
    assert [x["url"] for x in lines] == [a + "/metrics", b + "/metrics", "pool"] * 2
    first, second, pool = lines[:3]
    assert first["finished_requests"] == 20 and first["prompt_tokens"] == 372
    assert second["finished_requests"] == 44 and second["generation_tokens"] == 10448
    assert pool["finished_requests"] == 64 and pool["pods"] == 2
    # the second window sees no change: idle, for each pod and the pool
    assert [x["reason"] for x in lines[3:]] == ["idle"] * 3


async def test_text_line_and_scrape_error():
    text = read_capture("vllm-0.32-cpu-20req.txt")
    runner, url = await _serve([zeroed(text), text])
    try:
        rc, out, err = await _cli(url, "http://127.0.0.1:9/metrics", "--interval", "0.2", "--count", "1", "--timeout", "1")
    finally:
        await runner.cleanup()
    assert rc == 0, err
    lines = out.splitlines()
    first = " ".join(lines[0].split())
    assert first.startswith(url + "/metrics")
    assert "in 18.6 out 42.4 tok" in first and "ttft p95 0.469s" in first and "preempt 0" in first
    assert lines[1].startswith("http://127.0.0.1:9/metrics  no observation: scrape_error:connection")


@pytest.mark.parametrize(
    "args, field",
    [
        (["ftp://x/metrics"], "URL"),
        (["http://127.0.0.1:1", "--interval", "0"], "interval"),
        (["http://127.0.0.1:1", "--count", "-1"], "count"),
    ],
)
async def test_bad_input_exits_2_naming_the_field(args, field):
    rc, out, err = await _cli(*args, "--json")
    assert rc == 2
    assert json.loads(err.splitlines()[0])["field"] == field


async def test_every_scrape_failing_exits_1():
    """Nothing answered (port 9: discard, closed here): the windows are printed as scrape errors
    and the exit code says the command observed nothing."""
    rc, out, err = await _cli("http://127.0.0.1:9", "--interval", "0.2", "--count", "2", "--timeout", "1", "--json")
    assert rc == 1, err
    lines = [json.loads(x) for x in out.splitlines()]
    assert len(lines) == 2 and all(x["reason"].startswith("scrape_error:connection") for x in lines)
    rc, out, err = await _cli("http://127.0.0.1:9", "--interval", "0.2", "--count", "1", "--timeout", "1")
    assert rc == 1 and "every scrape of http://127.0.0.1:9/metrics failed" in err
