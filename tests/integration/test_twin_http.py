"""`kneecap twin` serving: the HTTP layer answers like vLLM's OpenAI server (served in process on
a loopback port by aiohttp's TestServer), and the command as a process prints only JSON lines
and stops on SIGTERM. Its command line: tests/unit/test_twin_cli.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kneecap.cli import build_parser
from kneecap.commands.twin import build_server
from tests.support.vllm_server import free_port


def parse(argv: list[str]):
    return build_parser("twin").parse_args(["twin", *argv])


@pytest.fixture
async def client():
    server = build_server(parse(["opt-125m", "--max-num-seqs", "4", "--time-scale", "1000",
                                 "--max-model-len", "1024", "--gpu", "l4"]))
    async with TestClient(TestServer(server.app())) as c:
        yield c


async def test_completion_usage_and_models(client):
    models = await (await client.get("/v1/models")).json()
    assert models["data"][0]["id"] == "opt-125m" and models["data"][0]["max_model_len"] == 1024
    resp = await client.post("/v1/completions", json={"model": "opt-125m", "prompt": "one two three",
                                                      "max_tokens": 7, "ignore_eos": True})
    body = await resp.json()
    assert resp.status == 200
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10,
                             "prompt_tokens_details": None}
    assert body["choices"][0]["finish_reason"] == "length" and len(body["choices"][0]["text"].split()) == 7
    assert (await client.get("/health")).status == 200


async def test_stream_sends_one_chunk_per_token_then_usage(client):
    resp = await client.post("/v1/completions", json={"prompt": [5, 6, 7, 8], "max_tokens": 5, "stream": True,
                                                      "stream_options": {"include_usage": True}})
    events = [line[6:] for line in (await resp.text()).splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [c["choices"][0] for c in chunks if c["choices"]]
    assert len(texts) == 5 and texts[-1]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["prompt_tokens"] == 4 and chunks[-1]["usage"]["completion_tokens"] == 5


async def test_bad_requests_get_vllm_style_errors(client):
    cases = [({"prompt": "", "max_tokens": 3}, 400, "prompt"),
             ({"prompt": "x", "max_tokens": 5000}, 400, "max_tokens"),
             ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
             ({"prompt": ["a", "b"]}, 400, "prompt"),
             ({"model": "other", "prompt": "x"}, 404, "model")]
    for body, status, param in cases:
        resp = await client.post("/v1/completions", json=body)
        err = (await resp.json())["error"]
        assert resp.status == status and err["param"] == param and err["code"] == status


async def test_concurrent_requests_share_the_batch(client):
    async def one():
        r = await client.post("/v1/completions", json={"prompt": "a b", "max_tokens": 20})
        return (await r.json())["usage"]["completion_tokens"]

    assert await asyncio.gather(*(one() for _ in range(10))) == [20] * 10
    text = await (await client.get("/metrics")).text()
    assert 'vllm:request_success_total{engine="0",finished_reason="length",model_name="opt-125m"} 10.0' in text
    assert 'vllm:generation_tokens_total{engine="0",model_name="opt-125m"} 200.0' in text


async def test_an_engine_failure_answers_500_instead_of_hanging():
    server = build_server(parse(["opt-125m", "--time-scale", "1000", "--gpu", "l4", "--max-model-len", "1024"]))

    def broken_step():
        raise RuntimeError("scheduler made no progress")

    server.engine.step = broken_step  # no real input reaches this state; the guard must still hold
    async with TestClient(TestServer(server.app())) as c:
        resp = await asyncio.wait_for(c.post("/v1/completions", json={"prompt": "a", "max_tokens": 2}), 5)
        assert resp.status == 500 and "no progress" in (await resp.json())["error"]["message"]
        assert (await c.get("/health")).status == 500


def test_twin_json_lines_startup_and_stop(tmp_path):
    """`kneecap twin --json`: stdout carries only JSON lines: the vLLM flags it ignores, then where
    it serves and the engine's shape; after SIGTERM, that it stopped."""
    root, port = Path(__file__).resolve().parents[2], free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kneecap", "twin", "meta-llama/Llama-3.1-8B-Instruct", "--json",
                             "--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", "32",
                             "--enable-prefix-caching"],
                            cwd=root, env=dict(os.environ, PYTHONPATH=str(root / "operator")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ignored = json.loads(proc.stdout.readline())
        serving = json.loads(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=30)
    assert ignored == {"event": "ignoredFlags", "flags": ["--enable-prefix-caching"]}
    assert serving["event"] == "serving" and serving["url"] == f"http://127.0.0.1:{port}"
    assert serving["arch"] == "llama-3.1-8b" and serving["max_num_seqs"] == 32 and serving["num_gpu_blocks"] > 0
    assert [json.loads(x) for x in rest.splitlines()] == [{"event": "stopped"}]
    assert proc.returncode == 0, err
