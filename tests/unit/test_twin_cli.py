"""`kneecap twin` takes vLLM's command line; the HTTP layer answers like vLLM's OpenAI server."""

from __future__ import annotations

import argparse
import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kneecap.cli import build_parser, main
from kneecap.commands.twin import build_server, human_int, split_unknown
from kneecap.errors import InputError


def parse(argv: list[str]):
    return build_parser("twin").parse_args(["twin", *argv])


def test_vllm_command_line_with_unknown_flags_and_equals_forms():
    args = parse(["facebook/opt-1.3b", "--enforce-eager", "--dtype", "half", "--max-num-seqs=48",
                  "--gpu-memory-utilization", "0.5", "--max-model-len=2k", "--no-enable-chunked-prefill",
                  "--port=8123", "--tensor-parallel-size=1", "--trust-remote-code", "--gpu", "h100-64gb"])
    assert args.tensor_parallel_size == 1  # modelled (kneecap.model.parallel), not ignored
    assert args.model_pos == "facebook/opt-1.3b"
    assert args.max_num_seqs == 48 and args.gpu_memory_utilization == 0.5 and args.max_model_len == 2000
    assert args.enable_chunked_prefill is False and args.port == 8123
    assert args.ignored_flags == ["--enforce-eager", "--dtype", "half", "--trust-remote-code"]
    server = build_server(args)
    cfg = server.config
    assert (cfg.arch.key, cfg.gpu.key, cfg.max_num_seqs, cfg.max_model_len) == ("opt-1.3b", "h100-64gb", 48, 2000)
    assert cfg.max_num_batched_tokens == 2048 and not cfg.enable_chunked_prefill
    assert server.names == ["facebook/opt-1.3b"]


def test_model_flag_served_names_and_kv_bytes():
    args = parse(["--model", "my-model", "--arch", "llama-3.1-8b", "--served-model-name", "a", "b",
                  "--kv-cache-memory-bytes", "2G", "--enable-chunked-prefill=true", "--max-num-batched-tokens", "1024"])
    server = build_server(args)
    assert server.names == ["a", "b"] and server.root_model == "my-model"
    assert server.config.num_gpu_blocks == 2 * 2**30 // (131072 * 16)
    assert server.config.enable_chunked_prefill and server.config.max_num_batched_tokens == 1024


def test_unknown_model_without_arch_is_a_clear_error():
    with pytest.raises(InputError) as err:
        build_server(parse(["some/unknown-model"]))
    assert err.value.field == "arch" and "--arch" in str(err.value)
    assert main(["twin", "some/unknown-model"]) == 2


def test_split_unknown_and_human_int():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port")
    kept, ignored = split_unknown(parser, ["m", "--swap-space", "4", "--port", "1", "--enforce-eager", "x"])
    assert kept == ["m", "--port", "1", "x"] and ignored == ["--swap-space", "4", "--enforce-eager"]
    assert human_int("4096") == 4096 and human_int("1K") == 1024 and human_int("8G") == 8 * 2**30
    with pytest.raises(argparse.ArgumentTypeError):
        human_int("lots")


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
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from tests.support.vllm_server import free_port

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


def test_tensor_parallel_flag_splits_the_twin_engine():
    """`vllm serve` spells it --tensor-parallel-size or -tp; the twin's KV cache is one rank's."""
    from kneecap.model.arch import get_arch
    from kneecap.model.hardware import get_gpu
    from kneecap.model.memory import memory_split

    for flag in (["--tensor-parallel-size", "4"], ["-tp", "4"], ["--tensor-parallel-size=4"]):
        cfg = build_server(parse(["meta-llama/Llama-3.1-70B", *flag])).config
        assert cfg.tensor_parallel_size == 4
        assert cfg.num_gpu_blocks == memory_split(get_arch("llama-3.1-70b"), get_gpu("h100-80gb"), 0.9, cfg.max_num_seqs,
                                                  cfg.max_num_batched_tokens, tensor_parallel_size=4).num_gpu_blocks
    with pytest.raises(InputError, match="leaves no KV cache"):  # 141 GB of weights on one 80 GB GPU
        build_server(parse(["meta-llama/Llama-3.1-70B"]))
    with pytest.raises(InputError, match="does not divide the 64 attention heads") as exc:
        build_server(parse(["meta-llama/Llama-3.1-70B", "-tp", "3"]))
    assert exc.value.field == "--tensor-parallel-size"
