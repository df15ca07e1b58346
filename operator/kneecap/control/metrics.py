"""The operator's own Prometheus metrics, one label set per LLMDeployment (namespace, name).

A private CollectorRegistry per OperatorMetrics keeps tests isolated; `kneecap run` serves it
with prometheus_client's HTTP server on --metrics-port.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, start_http_server

from kneecap.control.metric_series import Series

if TYPE_CHECKING:
    from kneecap.control.tick import MetricUpdate

LABELS = ("namespace", "name")
POOL_LABELS = ("namespace", "name", "pool")
SLO_LABELS = ("namespace", "name", "kind")  # kind: ttft | tpot | e2e
CURVE_LABELS = ("namespace", "name", "pool", "batch")
# Batch sizes at which the calibrated SLIM curve is exported (bounded cardinality: ≤ 11 per pool).
CURVE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class FleetGauges:
    """The fleet advice's totals (kneecap.control.fleet), one series each for the whole operator."""

    def __init__(self, r: CollectorRegistry):
        self.gpus_recommended = Gauge("kneecap_fleet_gpus_recommended",
                                      "GPUs the LLMDeployments in the fleet advice would hold packed", registry=r)
        self.gpus_current = Gauge("kneecap_fleet_gpus_current",
                                  "GPUs the LLMDeployments in the fleet advice hold today", registry=r)
        self.cost_recommended = Gauge("kneecap_fleet_cost_recommended_dollars_per_hour",
                                      "$/h of the GPUs the fleet advice's deployments would hold packed", registry=r)
        self.cost_current = Gauge("kneecap_fleet_cost_current_dollars_per_hour",
                                  "$/h of the GPUs the fleet advice's deployments hold today", registry=r)
        self.deployments = Gauge("kneecap_fleet_deployments",
                                 "LLMDeployments in the fleet advice (one-GPU engines with a workload)", registry=r)


class OperatorMetrics:
    """All kneecap_* series; `forget` drops a deleted resource's label sets."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.recommended_max_num_seqs = Gauge("kneecap_recommended_max_num_seqs",
                                              "BCA cap (--max-num-seqs) recommended", POOL_LABELS, registry=r)
        self.applied_max_num_seqs = Gauge("kneecap_applied_max_num_seqs", "--max-num-seqs live in the pool",
                                          POOL_LABELS, registry=r)
        self.recommended_gpu_memory_utilization = Gauge("kneecap_recommended_gpu_memory_utilization",
                                                        "--gpu-memory-utilization recommended", POOL_LABELS,
                                                        registry=r)
        self.applied_gpu_memory_utilization = Gauge("kneecap_applied_gpu_memory_utilization",
                                                    "--gpu-memory-utilization live in the pool", POOL_LABELS,
                                                    registry=r)
        self.memory_released_bytes = Gauge("kneecap_memory_released_bytes",
                                           "GPU memory per replica released versus the default reservation",
                                           POOL_LABELS, registry=r)
        self.knee_batch = Gauge("kneecap_knee_batch", "batch size at the knee of the throughput curve",
                                POOL_LABELS, registry=r)
        self.predicted_throughput = Gauge("kneecap_predicted_throughput_tokens_per_second",
                                          "SLIM token throughput per pod at the last window's batch and lengths",
                                          POOL_LABELS, registry=r)
        self.predicted_curve = Gauge("kneecap_predicted_curve_throughput_tokens_per_second",
                                     "calibrated SLIM token throughput per pod at batch size `batch` (powers of two "
                                     "up to spec.batching.maxMaxNumSeqs) and the last window's lengths",
                                     CURVE_LABELS, registry=r)
        self.knee_throughput = Gauge("kneecap_knee_throughput_tokens_per_second",
                                     "calibrated SLIM token throughput per pod at the knee batch (the knee's "
                                     "point on kneecap_predicted_curve_throughput_tokens_per_second)",
                                     POOL_LABELS, registry=r)
        self.batching_efficiency = Gauge("kneecap_batching_efficiency_ratio",
                                         "BCA batching efficiency T(B)/(B*T(1)) of the calibrated SLIM curve at the "
                                         "last window's mean running batch B (paper 000, eq. 13)",
                                         POOL_LABELS, registry=r)
        self.efficiency_floor = Gauge("kneecap_efficiency_floor_ratio",
                                      "spec.batching.efficiencyFloor: the efficiency below which a batch is past "
                                      "the knee (epsilon of eq. 13)", LABELS, registry=r)
        self.observed_throughput = Gauge("kneecap_observed_throughput_tokens_per_second",
                                         "measured token throughput per pod in the last window", POOL_LABELS,
                                         registry=r)
        self.recommended_throughput = Gauge("kneecap_recommended_throughput_tokens_per_second",
                                            "SLIM token throughput per pod at the recommended cap", POOL_LABELS,
                                            registry=r)
        self.calibration_error = Gauge("kneecap_calibration_error_ratio",
                                       "SLIM fit error (MAPE on throughput, 0-1)", LABELS, registry=r)
        self.calibration_timestamp = Gauge("kneecap_calibration_timestamp_seconds",
                                           "unix time of the last accepted SLIM fit", LABELS, registry=r)
        self.slo_attainment = Gauge("kneecap_slo_attainment_ratio",
                                    "fraction of the windows in the observation ring whose p95 TTFT/TPOT/E2E met "
                                    "every declared SLO (0-1)", LABELS, registry=r)
        self.slo_target = Gauge("kneecap_slo_target_seconds", "declared latency SLO (spec.slo) by kind",
                                SLO_LABELS, registry=r)
        self.slo_quantile = Gauge("kneecap_slo_quantile_ratio",
                                  "spec.slo.quantile: the share of requests (and windows) meant to meet the SLO",
                                  LABELS, registry=r)
        self.replicas = Gauge("kneecap_replicas", "replicas of the pool (live)", POOL_LABELS, registry=r)
        self.scrape_failures = Counter("kneecap_scrape_failures", "failed /metrics scrapes", LABELS, registry=r)
        self.decisions = Counter("kneecap_decisions", "control decisions by reason",
                                 ("namespace", "name", "reason"), registry=r)
        self.restarts = Counter("kneecap_restarts", "pod rollouts caused by the operator, by reason",
                                ("namespace", "name", "reason"), registry=r)
        self.observation_failures = Counter(
            "kneecap_observation_failures", "control ticks whose observation failed (a scrape failed, or a "
            "closed window was unusable: garbage, NaN, truncated, missing families, counter resets), by reason",
            ("namespace", "name", "reason"), registry=r)
        self.observation_consecutive_failures = Gauge(
            "kneecap_observation_consecutive_failures", "failed observations since the last usable window",
            LABELS, registry=r)
        self.observation_age = Gauge("kneecap_observation_age_seconds",
                                     "age of the last usable window (observed or idle) at the last tick",
                                     LABELS, registry=r)
        self.api_errors = Counter("kneecap_api_errors", "Kubernetes API calls of the operator that failed, by "
                                  "verb, resource and HTTP code (0: no answer)", ("verb", "resource", "code"),
                                  registry=r)
        self.fleet = FleetGauges(r)  # the fleet advice's (not per LLMDeployment: `forget` leaves them)
        self._unscoped = {self.api_errors}  # not per LLMDeployment: `forget` leaves them
        self._by_series = {series: getattr(self, series.attribute) for series in Series}
        for series, metric in self._by_series.items():
            if not isinstance(metric, Gauge if series.kind == "gauge" else Counter):
                raise TypeError(f"Series.{series.name} is a {series.kind}, OperatorMetrics.{series.attribute} is not")
        self._seen: dict[tuple[str, str], set[tuple]] = {}

    def _remember(self, metric, labels: tuple) -> None:
        if metric in self._unscoped:
            return
        self._seen.setdefault(labels[:2], set()).add((metric, labels))

    def set(self, metric: Gauge, value: float | None, *labels: str) -> None:
        if value is None:
            return
        metric.labels(*labels).set(float(value))
        self._remember(metric, labels)

    def drop(self, metric, *labels: str) -> None:
        """Remove one label set (a series whose source went away, e.g. an SLO no longer declared)."""
        try:
            metric.remove(*labels)
        except KeyError:
            pass
        self._seen.get(labels[:2], set()).discard((metric, labels))

    def inc(self, metric: Counter, *labels: str, amount: float = 1.0) -> None:
        metric.labels(*labels).inc(amount)
        self._remember(metric, labels)

    def update(self, update: MetricUpdate) -> None:
        """Apply one of a plan's MetricUpdates."""
        metric = self._by_series[update.series]
        if update.op == "set":
            self.set(metric, update.value, *update.labels)
        elif update.op == "inc":
            self.inc(metric, *update.labels, amount=update.value)
        else:
            self.drop(metric, *update.labels)

    def set_fleet(self, gpus_current: int, gpus_recommended: int, cost_current_per_hour: float,
                  cost_recommended_per_hour: float, deployments: int) -> None:
        """The fleet advice's totals (kneecap_fleet_*)."""
        f = self.fleet
        f.gpus_current.set(gpus_current)
        f.gpus_recommended.set(gpus_recommended)
        f.cost_current.set(cost_current_per_hour)
        f.cost_recommended.set(cost_recommended_per_hour)
        f.deployments.set(deployments)

    def forget(self, namespace: str, name: str) -> None:
        for metric, labels in self._seen.pop((namespace, name), set()):
            try:
                metric.remove(*labels)
            except KeyError:
                pass

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, port: int, addr: str = "0.0.0.0"):
        return start_http_server(port, addr=addr, registry=self.registry)
