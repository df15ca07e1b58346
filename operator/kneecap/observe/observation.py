"""What a window of vLLM scrapes gives: an :class:`Observation`, or a :class:`NoObservation`
saying why not (a :class:`Reason`). Pure values: frozen dataclasses, no I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields


class Reason(str, enum.Enum):
    """Why a window gave no observation."""

    IDLE = "idle"  # nothing ran, nothing finished
    NO_FINISHED = "no_finished_requests"  # work ran but no request finished: no distributions
    COUNTER_RESET = "counter_reset"  # a counter went down or the process restarted
    SERIES_CHANGED = "series_changed"  # a series (e.g. an engine) appeared or vanished
    MISSING_METRIC = "missing_metric"
    INVALID_VALUE = "invalid_value"  # NaN/inf/garbage, or an inconsistent histogram
    TRUNCATED = "truncated"  # the body was cut inside a metric we need
    BAD_WINDOW = "bad_window"  # non-positive window length
    NO_PODS = "no_pods"


@dataclass(frozen=True)
class NoObservation:
    """A window that yields no observation, and why (``code`` is e.g. ``missing_metric:vllm:x``)."""

    reason: Reason
    detail: str = ""

    @property
    def code(self) -> str:
        return f"{self.reason.value}:{self.detail}" if self.detail else self.reason.value

    def __str__(self) -> str:
        return self.code


@dataclass(frozen=True)
class Observation:
    """One window of one pod (or of a pool, see :mod:`kneecap.observe.pool`).

    Counts and rates are window totals (pool: summed over pods). ``mean_batch``,
    ``max_batch``, ``kv_usage`` and the KV capacity/memory fields are per pod (pool: averaged
    over pods). Lengths are in tokens, times in seconds. ``None`` marks a metric this vLLM
    version does not export.
    """

    window_s: float
    t_end_s: float
    pods: int
    finished_requests: float
    request_rate_rps: float
    mean_batch: float
    max_batch: float
    batch_samples: int
    queue_len: float
    prompt_tokens: float
    generation_tokens: float
    prompt_tok_s: float
    generation_tok_s: float
    input_len_mean: float
    input_len_cv: float
    input_len_p95: float
    output_len_mean: float
    output_len_cv: float
    output_len_p95: float
    ttft_mean_s: float
    ttft_p95_s: float
    itl_mean_s: float
    itl_p95_s: float
    e2e_mean_s: float
    e2e_p95_s: float
    kv_usage: float
    kv_usage_max: float
    tpot_mean_s: float | None = None
    tpot_p95_s: float | None = None
    queue_time_mean_s: float | None = None
    queue_time_p95_s: float | None = None
    prefill_time_mean_s: float | None = None
    prefill_time_p95_s: float | None = None
    decode_time_mean_s: float | None = None
    decode_time_p95_s: float | None = None
    mean_batch_little: float | None = None  # Σ inference time / window (Little's law)
    preemptions: float | None = None
    kv_capacity_tokens: float | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: float | None = None
    # the least each p95 can be given the histogram's buckets (Histogram.quantile_floor): a p95
    # whose floor reaches a target surely missed it; one interpolated past it may not have
    ttft_p95_floor_s: float | None = None
    itl_p95_floor_s: float | None = None
    e2e_p95_floor_s: float | None = None
    tpot_p95_floor_s: float | None = None
    # the share of the window's finished requests that surely missed a declared latency SLO (a
    # lower bound from the buckets; None: observed without SLO targets, or none applies)
    slo_missed_fraction: float | None = None


OBSERVATION_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Observation))
