"""The twin's /metrics speak vLLM 0.32: names, types, labels and buckets as in the real captures."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kneecap.model.arch import get_arch
from kneecap.model.hardware import get_gpu
from kneecap.sim.engine import Engine, engine_config
from kneecap.sim.metrics import TwinMetrics, build_1_2_5_buckets
from tests.support.data import read_capture

CAPTURES = ("vllm-0.32-cpu-20req.txt", "vllm-0.32-cpu-kv-saturated.txt", "vllm-0.32-cpu-run4.txt")
DESIGN_METRICS = {  # DESIGN.md §6
    "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
    "vllm:request_prompt_tokens": "histogram", "vllm:request_generation_tokens": "histogram",
    "vllm:time_to_first_token_seconds": "histogram", "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram", "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram", "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram", "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter", "vllm:request_success": "counter", "vllm:kv_cache_usage_perc": "gauge",
    "vllm:num_preemptions": "counter", "vllm:cache_config_info": "gauge",
}


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("vllm:")}


def shape(fam) -> tuple:
    """(type, label names, bucket bounds) of a family."""
    labels = sorted({k for s in fam.samples for k in s.labels if k != "le"})
    les = [s.labels["le"] for s in fam.samples if s.name.endswith("_bucket")]
    return fam.type, labels, les


@pytest.fixture(scope="module")
def capture():
    return families(read_capture(CAPTURES[0]))


def twin_text(max_model_len: int = 512, run: bool = True) -> tuple[str, Engine]:
    cfg = engine_config(get_arch("opt-125m"), get_gpu("l4"), max_num_seqs=4, max_model_len=max_model_len,
                        num_gpu_blocks_override=6)
    eng = Engine(cfg)
    metrics = TwinMetrics("tiny", cfg)
    if run:
        reqs = [eng.add_request(n, 30) for n in (5, 17, 40, 9, 33)]
        for r in reqs:
            metrics.on_request(r)
        while (res := eng.step()) is not None:
            metrics.on_step(res)
    return metrics.render(eng).decode(), eng


def test_1_2_5_buckets_match_vllm():
    assert build_1_2_5_buckets(512) == [1, 2, 5, 10, 20, 50, 100, 200, 500]
    assert build_1_2_5_buckets(2048) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]


def test_every_twin_family_has_the_real_name_type_labels_and_buckets(capture):
    text, _ = twin_text(max_model_len=512)  # the capture's server had 500 as its top token bucket
    twin = families(text)
    assert set(DESIGN_METRICS) <= set(twin)
    for name, fam in twin.items():
        assert name in capture, f"{name} is not a vLLM 0.32 metric"
        if name == "vllm:cache_config_info":
            assert fam.type == capture[name].type
            assert set(fam.samples[0].labels) == set(capture[name].samples[0].labels)
            continue
        assert shape(fam) == shape(capture[name]), name
    for name, kind in DESIGN_METRICS.items():
        assert twin[name].type == kind


def test_every_capture_parses_to_the_design_metrics():
    for cap in CAPTURES:
        fams = families(read_capture(cap))
        assert set(DESIGN_METRICS) <= set(fams), cap


def test_counters_and_histograms_count_what_ran():
    text, eng = twin_text()
    fams = families(text)

    def value(name, suffix="", **labels):
        for s in fams[name].samples:
            if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
        raise KeyError(name + suffix)

    assert value("vllm:prompt_tokens", "_total") == 5 + 17 + 40 + 9 + 33
    assert value("vllm:generation_tokens", "_total") == 5 * 30
    assert value("vllm:request_success", "_total", finished_reason="length") == 5
    assert value("vllm:request_prompt_tokens", "_sum") == 104
    assert value("vllm:request_generation_tokens", "_count") == 5
    assert value("vllm:time_to_first_token_seconds", "_count") == 5
    assert value("vllm:inter_token_latency_seconds", "_count") == 5 * 29
    # 6 blocks of 16 tokens cannot hold five requests of up to 70 tokens: the cache preempted
    assert value("vllm:num_preemptions", "_total") == eng.num_preemptions > 0
    assert value("vllm:request_num_preemptions", "_sum") == eng.num_preemptions
    assert value("vllm:num_requests_running") == 0 and value("vllm:kv_cache_usage_perc") == 0
    info = fams["vllm:cache_config_info"].samples[0].labels
    assert info["num_gpu_blocks"] == "6" and info["block_size"] == "16" and info["num_gpu_blocks_override"] == "6"
    assert info["kv_cache_size_tokens"] == "96"


def test_latency_sums_are_simulated_seconds():
    text, _ = twin_text()
    fams = families(text)
    e2e = {s.name: s.value for s in fams["vllm:e2e_request_latency_seconds"].samples}
    queue = {s.name: s.value for s in fams["vllm:request_queue_time_seconds"].samples}
    inference = {s.name: s.value for s in fams["vllm:request_inference_time_seconds"].samples}
    # every request arrived at t=0: e2e = queue + inference exactly
    assert e2e["vllm:e2e_request_latency_seconds_sum"] == pytest.approx(
        queue["vllm:request_queue_time_seconds_sum"] + inference["vllm:request_inference_time_seconds_sum"])
