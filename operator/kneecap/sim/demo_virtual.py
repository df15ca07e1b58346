"""`kneecap demo`'s closed loop in virtual time: the same LLMDeployment, load and records as
:mod:`kneecap.demo.harness`, on :mod:`kneecap.sim.cluster` instead of twin processes paced by
the wall clock, so the result is the same on any machine.

The load is the demo's: a light warm-up (``warmup_rate_fraction`` of the rate for
``warmup_intervals``), then Poisson arrivals at ``rate_rps`` with log-normal lengths, the
clients keeping at most ``max_concurrency`` requests in flight. One `IntervalRow` is recorded
per control tick from the LLMDeployment's status and the Deployment, as the live demo does.
"""

from __future__ import annotations

import copy
import time
from typing import Callable

import numpy as np

from kneecap.control.kube import deployments_path
from kneecap.control.spec import parse_spec
from kneecap.demo.harness import NAME, DemoConfig, DemoResult, IntervalRow, _row, llmdeployment
from kneecap.model.arch import get_arch
from kneecap.model.hardware import get_gpu
from kneecap.sim.cluster import DONE, LOST, OperatorDriver, VirtualCluster, llmd_path
from kneecap.sim.engine_node import KubeletConfig
from kneecap.sim.loadgen import arrival_times, sample_lengths


def demo_load(cfg: DemoConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrival_s, input_tokens, output_tokens) of the warm-up and steady phases, seeded."""
    parts = []
    for seed, rate, start, length in ((cfg.seed, cfg.rate_rps * cfg.warmup_rate_fraction, 0.0, cfg.warmup_s),
                                      (cfg.seed + 1, cfg.rate_rps, cfg.warmup_s, cfg.duration_s - cfg.warmup_s)):
        rng = np.random.default_rng(seed)
        t = arrival_times(rng, rate, length)
        parts.append((start + t, sample_lengths(rng, t.size, cfg.input_mean, cfg.input_cv),
                      sample_lengths(rng, t.size, cfg.output_mean, cfg.output_cv)))
    return tuple(np.concatenate(x) for x in zip(*parts))


def run_demo_virtual(cfg: DemoConfig, on_row: Callable[[IntervalRow], None] = lambda row: None,
                     kubelet: KubeletConfig = KubeletConfig()) -> DemoResult:
    """The demo's closed loop (module docstring); ``wall_s`` is the CPU time it took."""
    cfg.check()
    cpu0 = time.process_time()
    spec = parse_spec(llmdeployment(cfg)["spec"])
    cluster = VirtualCluster(get_arch(spec.model.architecture), get_gpu(cfg.gpu), kubelet, with_metrics=True,
                             served_name=cfg.model, seed=cfg.seed)
    api, ns = cluster.api, cluster.namespace
    body = llmdeployment(cfg, NAME, ns)
    cluster.create(llmd_path(ns), body)
    op = OperatorDriver(cluster, NAME, tick_s=cfg.interval_s)
    op.created()
    cluster.prewarm()
    history = [copy.deepcopy(api.peek(deployments_path(ns, NAME)))]
    rows: list[IntervalRow] = []

    def control(t: float) -> None:
        op.tick(t)
        cluster.settle()
        dep = api.peek(deployments_path(ns, NAME))
        if dep["metadata"]["resourceVersion"] != history[-1]["metadata"]["resourceVersion"]:
            history.append(copy.deepcopy(dep))
        st = (api.peek(llmd_path(ns, NAME)) or {}).get("status") or {}
        if st.get("lastDecision"):
            row = _row(t, st, dep, cluster.node.stats.restarts, cfg.phase_of(t))
            rows.append(row)
            on_row(row)

    cluster.every(cfg.interval_s, control)
    arrival, inp, out = demo_load(cfg)
    try:
        rq = cluster.run(arrival, inp, out, drain_limit_s=max(cfg.duration_s - float(arrival[-1]), 1e-9),
                         max_in_flight=cfg.max_concurrency)
    finally:
        op.close()
    steady = rq.arrival_s >= cfg.warmup_s
    sent = rq.attempts > 0
    cut = (rq.state == LOST) & (rq.finish_s < cluster.t_s)  # lost to a pod stopping, not to the end of the run
    load = {"completed": int(np.sum(steady & (rq.state == DONE))), "failed": int(np.sum(steady & cut)),
            "in_flight_at_end": int(np.sum(sent & (rq.state == LOST) & ~cut)), "never_sent": int(np.sum(~sent)),
            "stopped": bool(np.any(sent & (rq.state == LOST) & ~cut) or np.any(~sent))}
    st = cluster.node.stats
    res = DemoResult(cfg, rows, api.get_now(llmd_path(ns, NAME)), api.get_now(deployments_path(ns, NAME)),
                     [v for v in history if v is not None], st.restarts, st.pods_started, copy.deepcopy(st.events),
                     load, time.process_time() - cpu0, op.metrics.exposition().decode(),
                     twin_time_ratio=1.0, twin_behind_s=0.0)  # one virtual clock: nothing falls behind
    from kneecap.demo.report import summarize

    res.summary = summarize(res)
    return res
