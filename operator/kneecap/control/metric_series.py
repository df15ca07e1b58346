"""The series of OperatorMetrics that a plan changes: a MetricUpdate names one by member, so a
misspelt series fails where it is written, not when the loop applies it."""

from __future__ import annotations

import enum


class Series(enum.Enum):
    """One OperatorMetrics series (the value is its attribute); its kind says which updates fit."""

    RECOMMENDED_MAX_NUM_SEQS = ("recommended_max_num_seqs", "gauge")
    APPLIED_MAX_NUM_SEQS = ("applied_max_num_seqs", "gauge")
    RECOMMENDED_GPU_MEMORY_UTILIZATION = ("recommended_gpu_memory_utilization", "gauge")
    APPLIED_GPU_MEMORY_UTILIZATION = ("applied_gpu_memory_utilization", "gauge")
    MEMORY_RELEASED_BYTES = ("memory_released_bytes", "gauge")
    KNEE_BATCH = ("knee_batch", "gauge")
    PREDICTED_THROUGHPUT = ("predicted_throughput", "gauge")
    PREDICTED_CURVE = ("predicted_curve", "gauge")
    KNEE_THROUGHPUT = ("knee_throughput", "gauge")
    BATCHING_EFFICIENCY = ("batching_efficiency", "gauge")
    EFFICIENCY_FLOOR = ("efficiency_floor", "gauge")
    OBSERVED_THROUGHPUT = ("observed_throughput", "gauge")
    RECOMMENDED_THROUGHPUT = ("recommended_throughput", "gauge")
    CALIBRATION_ERROR = ("calibration_error", "gauge")
    CALIBRATION_TIMESTAMP = ("calibration_timestamp", "gauge")
    SLO_ATTAINMENT = ("slo_attainment", "gauge")
    SLO_TARGET = ("slo_target", "gauge")
    SLO_QUANTILE = ("slo_quantile", "gauge")
    REPLICAS = ("replicas", "gauge")
    SCRAPE_FAILURES = ("scrape_failures", "counter")
    DECISIONS = ("decisions", "counter")
    RESTARTS = ("restarts", "counter")
    OBSERVATION_FAILURES = ("observation_failures", "counter")
    OBSERVATION_CONSECUTIVE_FAILURES = ("observation_consecutive_failures", "gauge")
    OBSERVATION_AGE = ("observation_age", "gauge")
    API_ERRORS = ("api_errors", "counter")

    @property
    def attribute(self) -> str:
        return self.value[0]

    @property
    def kind(self) -> str:
        """gauge (set, drop) or counter (inc, drop)."""
        return self.value[1]
