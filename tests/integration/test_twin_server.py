"""`kneecap twin` as a real process: load from `kneecap load`'s library, /metrics checked exactly.

The twin starts the way the operator would start vLLM (vLLM flags, unknown ones included) on a
free port, at a high time scale so a GPU-minute of traffic takes seconds. Its /metrics are
parsed with prometheus-client's parser and with kneecap.observe, and must count exactly what
the load generator sent.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kneecap.observe import Observation, observe, scrape
from kneecap.observe.observation import OBSERVATION_FIELDS
from kneecap.sim.loadgen import run_load
from tests.support.twins import free_port

MAX_NUM_SEQS = 8


class Twin:
    def __init__(self, *flags: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kneecap", "twin", "meta-llama/Llama-3.1-8B-Instruct", "--host", "127.0.0.1",
             "--port", str(self.port), "--enforce-eager", "--dtype", "bfloat16", "--gpu", "h100-80gb", *flags],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"twin exited: {self.proc.stdout.read()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise AssertionError("twin did not start in 60 s")

    def stop(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -9


@pytest.fixture(scope="module")
def twin():
    t = Twin("--max-num-seqs", str(MAX_NUM_SEQS), "--time-scale", "50", "--max-model-len", "4096")
    yield t
    assert t.stop() == 0  # SIGTERM is a clean shutdown


@pytest.fixture(scope="module")
def small_kv_twin():
    t = Twin("--max-num-seqs", str(MAX_NUM_SEQS), "--time-scale", "50", "--num-gpu-blocks-override", "24",
             "--max-model-len", "2048")
    yield t
    t.stop()


def metric(text: str, name: str, **labels) -> float:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise KeyError(name)


async def load_with_scrapes(url: str, **load):
    """Scrape, run the load while scraping every 50 ms, scrape again."""
    async with aiohttp.ClientSession() as session:
        prev = await scrape(url + "/metrics", session=session)
        between = []
        stop = asyncio.Event()

        async def sample():
            while not stop.is_set():
                between.append(await scrape(url + "/metrics", session=session))
                await asyncio.sleep(0.05)

        sampler = asyncio.create_task(sample())
        report = await run_load(url, session=session, **load)
        stop.set()
        await sampler
        async with session.get(url + "/metrics") as resp:
            text = await resp.text()
        cur = await scrape(url + "/metrics", session=session)
    return report, prev, between, cur, text


async def test_metrics_count_exactly_what_was_sent(twin):
    report, prev, between, cur, text = await load_with_scrapes(
        twin.url, rate_rps=25.0, duration_s=2.0, input_mean=300, input_cv=0.6, output_mean=60, output_cv=0.5, seed=11)
    sent = report.records
    prompt_total = sum(r.prompt_tokens for r in sent)
    gen_total = sum(r.max_tokens for r in sent)
    assert report.failed == 0 and report.completed == len(sent) > 25
    assert report.prompt_tokens_total == prompt_total and report.completion_tokens_total == gen_total
    labels = {"model_name": "meta-llama/Llama-3.1-8B-Instruct", "engine": "0"}
    assert metric(text, "vllm:request_success_total", finished_reason="length", **labels) == len(sent)
    assert metric(text, "vllm:prompt_tokens_total", **labels) == prompt_total
    assert metric(text, "vllm:generation_tokens_total", **labels) == gen_total
    assert metric(text, "vllm:request_prompt_tokens_sum", **labels) == prompt_total
    assert metric(text, "vllm:request_generation_tokens_count", **labels) == len(sent)
    assert metric(text, "vllm:e2e_request_latency_seconds_count", **labels) == len(sent)

    obs = observe(prev, cur, between, {"ttft": 1.0, "tpot": 0.05, "e2e": None})
    assert isinstance(obs, Observation), obs
    assert obs.finished_requests == len(sent)
    assert obs.prompt_tokens == prompt_total and obs.generation_tokens == gen_total
    assert obs.input_len_mean == pytest.approx(prompt_total / len(sent))
    assert obs.output_len_mean == pytest.approx(gen_total / len(sent))
    assert obs.max_batch <= MAX_NUM_SEQS and obs.mean_batch > 0
    assert obs.gpu_memory_utilization == pytest.approx(0.9)
    info = next(f.samples[0].labels for f in text_string_to_metric_families(text) if f.name == "vllm:cache_config_info")
    assert obs.kv_capacity_tokens == int(info["num_gpu_blocks"]) * 16 == int(info["kv_cache_size_tokens"])
    assert obs.ttft_mean_s > 0 and obs.e2e_mean_s > obs.ttft_mean_s
    # the twin exports every metric vLLM 0.32 does that kneecap reads: no field is left unknown
    assert [f for f in OBSERVATION_FIELDS if getattr(obs, f) is None] == []


async def test_full_kv_cache_preempts_and_shows_usage(small_kv_twin):
    # 24 blocks x 16 = 384 tokens; requests grow to 250 tokens, so two cannot run together. The
    # usage gauge is sampled every 50 ms: a slow machine can miss the fullest moments, so the load
    # is sent again (at most 3 rounds) until a sample caught the cache past 60%.
    for seed in (3, 4, 5):
        report, prev, between, cur, text = await load_with_scrapes(
            small_kv_twin.url, rate_rps=40.0, duration_s=0.5, input_mean=150, output_mean=100, seed=seed)
        assert report.failed == 0
        obs = observe(prev, cur, between)
        assert isinstance(obs, Observation), obs
        sampled = [s.value("vllm:kv_cache_usage_perc") for s in [prev, *between, cur]]
        assert obs.kv_usage_max == pytest.approx(max(v for v in sampled if v is not None))
        if obs.kv_usage_max > 0.6:
            break
    assert obs.preemptions > 0
    assert obs.kv_usage_max > 0.6
    assert obs.kv_capacity_tokens == 384
    assert obs.generation_tokens == report.completion_tokens_total == 100 * report.sent
