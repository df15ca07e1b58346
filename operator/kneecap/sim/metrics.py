"""vLLM's Prometheus metrics for the twin: names, types, help, labels and buckets of vLLM 0.32.

Copied from real captures (tests/fixtures/vllm-metrics/, vLLM 0.32 V1 engine): every series
carries ``model_name`` and ``engine``; token-count histograms use vLLM's 1-2-5 buckets up to
``max_model_len``; latency histograms use the fixed boundaries below. Observations follow vLLM
V1's definitions (vllm/v1/metrics/stats.py): queue = scheduled − arrival, prefill = first token
− scheduled, decode = last token − first token, inference = last token − scheduled, TPOT =
decode / (generated − 1), prompt tokens counted once per request at its first token.
"""

from __future__ import annotations

import math

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kneecap.sim.engine import Engine, EngineConfig, SimRequest, StepResult

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
ITERATION_TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
PARAMS_N_BUCKETS = [1, 2, 5, 10, 20]
PREEMPTION_BUCKETS = [1, 2, 3, 4, 5, 10, 20]
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
VLLM_VERSION = "0.32.0"


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50, … up to ``max_value``."""
    out, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return out
            out.append(value)
        exponent += 1


def cache_config_labels(cfg: EngineConfig) -> dict[str, str]:
    """``vllm:cache_config_info`` labels, as vLLM 0.32 writes them (values from the twin's config)."""
    max_conc = cfg.kv_capacity_tokens / cfg.max_model_len
    return {
        "_block_size_resolved": "True", "block_size": str(cfg.block_size), "cache_dtype": "auto",
        "cache_hit_alignment_tokens": "None", "effective_attention_block_size": str(cfg.block_size),
        "enable_mamba_shared_prefix_checkpoint": "False", "enable_prefix_caching": "False",
        "gpu_memory_utilization": str(cfg.gpu_memory_utilization), "hash_block_size": "None",
        "is_attention_free": "False", "kv_cache_dtype_skip_layers": "[]", "kv_cache_layout": "None",
        "kv_cache_max_concurrency": str(round(max_conc, 2)), "kv_cache_memory_bytes": str(cfg.kv_cache_memory_bytes),
        "kv_cache_size_tokens": str(cfg.kv_capacity_tokens), "kv_offloading_backend": "native",
        "kv_offloading_size": "None", "kv_sharing_fast_prefill": "False", "mamba_block_size": "None",
        "mamba_cache_dtype": "auto", "mamba_cache_mode": "none", "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "float32", "num_cpu_blocks": "None", "num_gpu_blocks": str(cfg.num_gpu_blocks),
        "num_gpu_blocks_override": str(cfg.num_gpu_blocks_override), "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256", "prefix_match_unit": "None", "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None", "sliding_window": "None", "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False", "use_replayssm": "False", "user_specified_block_size": "False",
    }


class TwinMetrics:
    """The twin's ``/metrics``: a private registry updated from engine steps."""

    def __init__(self, model_name: str, cfg: EngineConfig, engine_index: str = "0"):
        self.registry = CollectorRegistry()
        self.cfg = cfg
        labels = {"engine": engine_index, "model_name": model_name}
        names = ["engine", "model_name"]
        reg = self.registry

        def gauge(name, doc, extra=()):
            return Gauge(name, doc, names + list(extra), registry=reg)

        def counter(name, doc, extra=()):
            return Counter(name, doc, names + list(extra), registry=reg)

        def hist(name, doc, buckets):
            return Histogram(name, doc, names, buckets=buckets, registry=reg).labels(**labels)

        tok_buckets = build_1_2_5_buckets(cfg.max_model_len)
        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.").labels(**labels)
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.").labels(**labels)
        by_reason = gauge("vllm:num_requests_waiting_by_reason",
                          "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling "
                          "capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked "
                          "status). Sum of all reasons equals vllm:num_requests_waiting.", ["reason"])
        self.waiting_capacity = by_reason.labels(reason="capacity", **labels)
        by_reason.labels(reason="deferred", **labels).set(0)
        sleep = gauge("vllm:engine_sleep_state",
                      "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
                      "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.", ["sleep_state"])
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            sleep.labels(sleep_state=state, **labels).set(value)
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.").labels(**labels)
        self.prefix_queries = counter("vllm:prefix_cache_queries",
                                      "Prefix cache queries, in terms of number of queried tokens.").labels(**labels)
        counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.").labels(**labels)
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.").labels(**labels)
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.").labels(**labels)
        by_source = counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ["source"])
        self.prompt_local = by_source.labels(source="local_compute", **labels)
        by_source.labels(source="local_cache_hit", **labels)
        self.prompt_external = by_source.labels(source="external_kv_transfer", **labels)
        counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).").labels(**labels)
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.").labels(**labels)
        success = counter("vllm:request_success", "Count of successfully processed requests.", ["finished_reason"])
        self.success = {r: success.labels(finished_reason=r, **labels) for r in FINISHED_REASONS}
        self.h_prompt = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tok_buckets)
        self.h_generation = hist("vllm:request_generation_tokens", "Number of generation tokens processed.", tok_buckets)
        self.h_iteration = hist("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                                ITERATION_TOKEN_BUCKETS)
        self.h_max_gen = hist("vllm:request_max_num_generation_tokens",
                              "Histogram of maximum number of requested generation tokens.", tok_buckets)
        self.h_params_n = hist("vllm:request_params_n", "Histogram of the n request parameter.", PARAMS_N_BUCKETS)
        self.h_params_max_tokens = hist("vllm:request_params_max_tokens",
                                        "Histogram of the max_tokens request parameter.", tok_buckets)
        self.h_ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                           TTFT_BUCKETS)
        self.h_itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                          ITL_BUCKETS)
        self.h_tpot = hist("vllm:request_time_per_output_token_seconds",
                           "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)
        self.h_e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                          REQUEST_LATENCY_BUCKETS)
        self.h_queue = hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                            REQUEST_LATENCY_BUCKETS)
        self.h_inference = hist("vllm:request_inference_time_seconds",
                                "Histogram of time spent in RUNNING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.h_prefill = hist("vllm:request_prefill_time_seconds",
                              "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS)
        self.h_decode = hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
                             REQUEST_LATENCY_BUCKETS)
        self.h_req_preempt = hist("vllm:request_num_preemptions",
                                  "Histogram of the number of times a request was preempted.", PREEMPTION_BUCKETS)
        self.h_prefill_kv = hist("vllm:request_prefill_kv_computed_tokens",
                                 "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
                                 tok_buckets)
        # the twin's own: its simulated clock (kneecap.sim.server), not a vLLM metric
        self.sim_time = Gauge("kneecap_twin_sim_time_seconds",
                              "The twin's simulated clock, seconds (unix time at start + simulated seconds since, or "
                              "the clock given by --sim-clock-anchor); it falls behind time_scale x the wall clock "
                              "when the CPU cannot keep up.", registry=reg)
        self.behind = Gauge("kneecap_twin_behind_seconds",
                            "Simulated seconds the twin's clock has lost against time_scale x the wall clock since "
                            "it started.", registry=reg)
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                     ["engine"] + sorted(cache_config_labels(cfg)), registry=reg)
        info.labels(engine=engine_index, **cache_config_labels(cfg)).set(1)

    def on_request(self, req: SimRequest) -> None:
        """A request was accepted (vLLM records its sampling parameters at arrival)."""
        self.h_params_n.observe(1)
        self.h_params_max_tokens.observe(req.max_tokens)

    def on_step(self, result: StepResult) -> None:
        self.h_iteration.observe(result.num_tokens)
        if result.preempted:
            self.preemptions.inc(len(result.preempted))
        if result.tokens:
            self.generation_tokens.inc(len(result.tokens))
        for req, first, interval in result.tokens:
            if first:
                self.prompt_tokens.inc(req.prompt_tokens)
                self.prompt_local.inc(req.prompt_tokens - req.external_tokens)
                if req.external_tokens:
                    self.prompt_external.inc(req.external_tokens)
                self.prefix_queries.inc(req.prompt_tokens)
                self.h_ttft.observe(req.first_token_s - req.arrival_s)
            else:
                self.h_itl.observe(interval)
        for req in result.finished:
            self.on_finish(req)

    def on_finish(self, req: SimRequest) -> None:
        self.success[req.finished_reason].inc()
        if req.first_token_s is None:  # aborted before its first token: no latency histograms
            return
        self.h_e2e.observe(req.finish_s - req.arrival_s)
        self.h_queue.observe(req.scheduled_s - req.arrival_s)
        self.h_prefill.observe(req.first_token_s - req.scheduled_s)
        self.h_decode.observe(req.last_token_s - req.first_token_s)
        self.h_inference.observe(req.last_token_s - req.scheduled_s)
        if req.output_tokens > 1:
            self.h_tpot.observe((req.last_token_s - req.first_token_s) / (req.output_tokens - 1))
        self.h_prompt.observe(req.prompt_tokens)
        self.h_generation.observe(req.output_tokens)
        self.h_max_gen.observe(req.max_tokens)
        self.h_req_preempt.observe(req.num_preemptions)
        self.h_prefill_kv.observe(req.prompt_tokens)

    def set_gauges(self, engine: Engine) -> None:
        self.running.set(len(engine.running))
        waiting = len(engine.waiting)
        self.waiting.set(waiting)
        self.waiting_capacity.set(waiting)
        self.kv_usage.set(engine.kv_usage)

    def render(self, engine: Engine) -> bytes:
        self.set_gauges(engine)
        return generate_latest(self.registry)


class BufferedHistogram:
    """Stands in for a prometheus_client histogram child that sees one observation per token:
    ``observe`` appends, ``flush`` adds them in bulk (same buckets: the first bound ≥ the value,
    as ``Histogram.observe`` does) before the page is rendered."""

    def __init__(self, child):
        self.child = child
        self.values: list[float] = []
        self.observe = self.values.append

    def flush(self) -> None:
        if not self.values:
            return
        v = np.asarray(self.values)
        idx = np.searchsorted(np.asarray(self.child._upper_bounds), v, side="left")
        for i, c in zip(*np.unique(idx, return_counts=True)):
            self.child._buckets[int(i)].inc(int(c))
        self.child._sum.inc(math.fsum(self.values))
        self.values.clear()


def buffered_metrics(metrics: TwinMetrics) -> TwinMetrics:
    """The twin's metrics with the inter-token-latency histogram buffered (see BufferedHistogram)."""
    metrics.h_itl = BufferedHistogram(metrics.h_itl)
    return metrics


def render_metrics(metrics: TwinMetrics, engine) -> str:
    if isinstance(metrics.h_itl, BufferedHistogram):
        metrics.h_itl.flush()
    return metrics.render(engine).decode()
