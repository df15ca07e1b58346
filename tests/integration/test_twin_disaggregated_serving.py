"""Disaggregated serving with twins: the P/D router sends each request to a prefill twin
(max_tokens 1, kv_transfer_params as vLLM's proxy does), then to a decode twin with the KV it
names; the decode twin reads that KV (freeing it on the prefill twin) and never starts a request
before its prefill finished elsewhere. Twins and router on loopback ports (the proxy's bodies
alone: tests/unit/test_twin_disaggregated.py)."""

from __future__ import annotations

import time

import aiohttp
import pytest
from aiohttp import web

from kneecap.demo.pd_router import PDRouter
from kneecap.model.arch import GIB, get_arch
from kneecap.model.hardware import get_gpu
from kneecap.sim import kv_transfer as kvt
from kneecap.sim.engine import engine_config
from kneecap.sim.server import TwinServer
from tests.support.twins import free_port, post_completions

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PROMPT_TOKENS, MAX_TOKENS, N = 400, 12, 8


async def _twin(kv_role, anchor):
    cfg = engine_config(get_arch("llama-3.1-8b"), get_gpu("h100-80gb"), max_num_seqs=64)
    server = TwinServer(cfg, [MODEL], sim_clock_anchor=anchor, kv_role=kv_role)
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return server, runner, f"http://127.0.0.1:{port}"


@pytest.fixture()
async def pd():
    anchor = (time.time(), time.time())  # one clock for both twins (as the demo's)
    (p, p_run, p_url), (d, d_run, d_url) = await _twin("kv_producer", anchor), await _twin("kv_consumer", anchor)
    router = await PDRouter().start()
    router.prefill.set_endpoints([p_url])
    router.decode.set_endpoints([d_url])
    try:
        yield p, d, router, p_url, d_url
    finally:
        await router.stop()
        await p_run.cleanup()
        await d_run.cleanup()


async def test_prefill_then_kv_transfer_then_decode(pd):
    prefill, decode, router, p_url, d_url = pd
    body = {"model": MODEL, "prompt": " ".join(["knee"] * PROMPT_TOKENS), "max_tokens": MAX_TOKENS}
    answers = await post_completions(router.url, body, N)
    transfer_s = PROMPT_TOKENS * get_arch("llama-3.1-8b").kv_bytes_per_token / (25.0 * GIB)
    for a in answers:
        t = a["kneecap_timing"]
        # the decode twin admitted the request only after the prefill finished and its KV crossed the link
        assert t["arrival_s"] >= t["remote_prefill_finish_s"] + transfer_s - 1e-9
        assert t["remote_prefill_finish_s"] < t["scheduled_s"] <= t["first_token_s"] < t["finish_s"]
        assert a["usage"] == {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": MAX_TOKENS,
                              "total_tokens": PROMPT_TOKENS + MAX_TOKENS, "prompt_tokens_details": None}
        assert "kv_transfer_params" not in a  # a decode answer names no KV
    assert router.routed == [(p_url, d_url)] * N
    # every prefill made one token, kept its prompt's KV until the decode read it, then freed it
    assert prefill.held_kv == {} and prefill.engine.free_blocks == prefill.config.num_gpu_blocks
    value = lambda c: c._value.get()  # noqa: E731 - a prometheus_client counter's value
    assert value(prefill.metrics.generation_tokens) == N and value(decode.metrics.generation_tokens) == N * MAX_TOKENS
    # vLLM's prompt_tokens_by_source: the prefill twin computed the prompts; the decode twin
    # received them over the KV link and computed only the last token of each (to sample)
    assert value(prefill.metrics.prompt_local) == N * PROMPT_TOKENS and value(prefill.metrics.prompt_external) == 0
    assert value(decode.metrics.prompt_local) == N and value(decode.metrics.prompt_external) == N * (PROMPT_TOKENS - 1)


async def test_a_decode_without_remote_kv_is_refused(pd):
    prefill, decode, router, p_url, d_url = pd
    body = {"model": MODEL, "prompt": "the knee", "max_tokens": 4,
            "kv_transfer_params": {"do_remote_prefill": True, "remote_host": "127.0.0.1",
                                   "remote_port": int(p_url.rsplit(":", 1)[1]), "remote_request_id": "cmpl-none"}}
    async with aiohttp.ClientSession() as s:
        async with s.post(d_url + "/v1/completions", json=body) as r:
            err = (await r.json())["error"]
            assert r.status == 400 and err["param"] == "kv_transfer_params" and "404" in err["message"]
        # a prefill request on a twin that is not a kv_producer
        async with s.post(d_url + "/v1/completions", json=kvt.prefill_request(body)) as r:
            assert r.status == 400 and "needs a kv_producer" in (await r.json())["error"]["message"]
    assert decode.engine.num_steps == 0 and not decode.engine.has_work()


async def test_a_prefill_pool_is_observed_with_no_inter_token_interval(pd):
    """A prefill twin makes one token per request: its window has finished requests and no
    inter-token samples, which is an observation (ITL 0), not invalid metrics; the decode twin's
    window has real ITLs. (Before, the operator held every disaggregated deployment on
    `invalid_value:itl`.)"""
    from kneecap.observe import Observation, observe, parse_metrics

    prefill, decode, router, p_url, d_url = pd

    async def scrape(url):
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/metrics") as r:
                return parse_metrics(await r.text(), t_s=time.time())

    before = [await scrape(p_url), await scrape(d_url)]
    await post_completions(router.url, {"model": MODEL, "prompt": " ".join(["knee"] * 50), "max_tokens": 6}, N)
    pre, dec = [observe(b, await scrape(u)) for b, u in zip(before, (p_url, d_url))]
    assert isinstance(pre, Observation) and isinstance(dec, Observation)
    assert pre.finished_requests == N and pre.generation_tokens == N and pre.itl_p95_s == 0.0
    assert dec.finished_requests == N and dec.generation_tokens == 6 * N and dec.itl_p95_s > 0
