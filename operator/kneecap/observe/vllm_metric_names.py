"""The vLLM metric names a window reads: pure tables, each metric's vLLM V1 name first and the
names older vLLMs export after it (:mod:`kneecap.observe.window` takes the first one a scrape
has).

``HISTOGRAMS``, ``COUNTERS``, ``GAUGES``: an observation field prefix -> (its names, whether a
window needs it); ``WINDOW_METRICS``: every name a window reads, the set a scrape must keep
(:func:`kneecap.observe.scrape.family_filter` turns it into the sample names to parse).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PREEMPTIONS = "vllm:num_preemptions_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
SUCCESS = "vllm:request_success_total"
CACHE_CONFIG = "vllm:cache_config_info"
PROCESS_START = "process_start_time_seconds"
SUCCESS_CREATED = "vllm:request_success_created"  # a new value means the counters restarted
PROMPT_TOKENS_CREATED = "vllm:prompt_tokens_created"

H_PROMPT = ("vllm:request_prompt_tokens",)
H_GENERATION = ("vllm:request_generation_tokens",)
H_TTFT = ("vllm:time_to_first_token_seconds",)
H_ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
H_TPOT = ("vllm:request_time_per_output_token_seconds",)
H_E2E = ("vllm:e2e_request_latency_seconds",)
H_QUEUE = ("vllm:request_queue_time_seconds",)
H_PREFILL = ("vllm:request_prefill_time_seconds",)
H_DECODE = ("vllm:request_decode_time_seconds",)
H_INFERENCE = ("vllm:request_inference_time_seconds",)

# field prefix -> (histogram names, required)
HISTOGRAMS: Mapping[str, tuple[tuple[str, ...], bool]] = MappingProxyType({
    "input_len": (H_PROMPT, True),
    "output_len": (H_GENERATION, True),
    "ttft": (H_TTFT, True),
    "itl": (H_ITL, True),
    "tpot": (H_TPOT, False),
    "e2e": (H_E2E, True),
    "queue_time": (H_QUEUE, False),
    "prefill_time": (H_PREFILL, False),
    "decode_time": (H_DECODE, False),
    "inference_time": (H_INFERENCE, False),
})
COUNTERS: Mapping[str, tuple[tuple[str, ...], bool]] = MappingProxyType({
    "finished": ((SUCCESS,), True),
    "prompt_tokens": ((PROMPT_TOKENS,), True),
    "generation_tokens": ((GENERATION_TOKENS,), True),
    "preemptions": ((PREEMPTIONS,), False),
})
GAUGES: Mapping[str, tuple[tuple[str, ...], bool]] = MappingProxyType({
    "running": ((RUNNING,), True),
    "waiting": ((WAITING,), True),
    "kv_usage": (KV_USAGE, True),
})

# Every name a window reads: the tables' (current and older), the KV cache config, the process
# start time and the counters' creation times (a new value of either means a restart).
WINDOW_METRICS: tuple[str, ...] = (
    *(n for table in (COUNTERS, HISTOGRAMS, GAUGES) for names, _ in table.values() for n in names),
    CACHE_CONFIG, PROCESS_START, SUCCESS_CREATED, PROMPT_TOKENS_CREATED,
)
