"""Window observations, pure: what a vLLM pod did between two scrapes (DESIGN.md §4 step 2, §6).

Means are Δsum/Δcount of histograms, rates Δcounter/Δt, percentiles are interpolated from
histogram bucket deltas (as Prometheus' ``histogram_quantile``), the batch and queue are the
average of the gauge samples available in the window. Series of several ``engine`` label
values are summed. Every failure mode answers with a typed :class:`NoObservation`, never a
wrong number: counter resets, series appearing or vanishing, missing or renamed metrics,
NaN/garbage values, truncated bodies, idle windows.

:func:`window_deltas` reads one pod's window, :func:`combine` turns pods' deltas into one
observation, :func:`observe` does both for one pod. The metric names it reads are in
:mod:`kneecap.observe.vllm_metric_names`, the histogram maths in :mod:`kneecap.observe.histogram`,
the result types in :mod:`kneecap.observe.observation` (re-exported here). What repeated windows
of the same engines let :func:`window_deltas` skip is in the :class:`HistogramCache` its caller
passes in (``cache``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import chain
from typing import Iterable, Mapping, Sequence

import numpy as np

from kneecap.observe.histogram import Histogram, HistogramCache, batched_plan, bucket_plan, merge_histograms
from kneecap.observe.observation import OBSERVATION_FIELDS, NoObservation, Observation, Reason
from kneecap.observe.scrape import Labels, Snapshot
from kneecap.observe.vllm_metric_names import (CACHE_CONFIG, COUNTERS, GAUGES, HISTOGRAMS, PROMPT_TOKENS_CREATED,
                                               SUCCESS_CREATED)

__all__ = ["OBSERVATION_FIELDS", "Histogram", "HistogramCache", "NoObservation", "Observation", "Reason",
           "WindowDeltas", "combine", "merge_histograms", "observe", "window_deltas"]

QUANTILE = 0.95


@dataclass(frozen=True)
class WindowDeltas:
    """Everything one pod's window contributes, before turning it into an observation."""

    window_s: float
    t_end_s: float
    counters: Mapping[str, float | None]
    histograms: Mapping[str, Histogram | None]
    running: tuple[float, ...]
    waiting: tuple[float, ...]
    kv_usage: tuple[float, ...]
    kv_capacity_tokens: float | None
    gpu_memory_utilization: float | None
    kv_cache_memory_bytes: float | None


class _Fail(Exception):
    def __init__(self, no: NoObservation):
        self.no = no


def _missing(name: str, snaps: Iterable[Snapshot]) -> NoObservation:
    snaps = list(snaps)
    for s in snaps:
        if name in s.invalid:
            return NoObservation(Reason.INVALID_VALUE, name)
    for s in snaps:
        if s.truncated:
            return NoObservation(Reason.TRUNCATED, name)
    return NoObservation(Reason.MISSING_METRIC, name)


def _pick(names: tuple[str, ...], suffix: str, snaps: Sequence[Snapshot], required: bool) -> str | None:
    """First of ``names`` (current name, then older ones) present in every snapshot; None for
    an optional metric present in none; otherwise a typed failure."""
    for n in names:
        n_sfx = n + suffix
        for s in snaps:
            if not s.series.get(n_sfx):
                break
        else:
            return n
    seen = [n for n in names if any(s.get(n + suffix) for s in snaps)]
    if required or seen:
        raise _Fail(_missing((seen or names)[0] + suffix, snaps))
    return None


def _series_delta(name: str, prev: Snapshot, cur: Snapshot) -> dict[Labels, float]:
    a, b = prev.series.get(name) or {}, cur.series.get(name) or {}
    if a.keys() != b.keys():
        if name in prev.invalid or name in cur.invalid:
            raise _Fail(NoObservation(Reason.INVALID_VALUE, name))
        gone = sorted(set(a) ^ set(b))
        raise _Fail(NoObservation(Reason.SERIES_CHANGED, f"{name}{dict(gone[0])}"))
    out = {}
    for k, v in b.items():
        d = v - a[k]
        if d < 0:
            raise _Fail(NoObservation(Reason.COUNTER_RESET, name))
        out[k] = d
    return out


def _counter(names: tuple[str, ...], prev: Snapshot, cur: Snapshot, required: bool) -> float | None:
    name = _pick(names, "", (prev, cur), required)
    if name is None:
        return None
    return math.fsum(_series_delta(name, prev, cur).values())


def _histogram(names: tuple[str, ...], prev: Snapshot, cur: Snapshot, required: bool,
               cache: HistogramCache | None = None) -> Histogram | None:
    base = _pick(names, "_count", (prev, cur), required)
    if base is None:
        return None
    for sfx in ("_bucket", "_sum"):
        if not (prev.series.get(base + sfx) and cur.series.get(base + sfx)):
            raise _Fail(_missing(base + sfx, (prev, cur)))
    name = base + "_bucket"
    a, b = prev.series[name], cur.series[name]
    keys = tuple(b)
    same_order = tuple(a) == keys  # shared label tuples: identity checks, no hashing
    plan = bucket_plan(keys, cache) if same_order or a.keys() == b.keys() else None
    if plan is None:
        return _histogram_general(base, prev, cur)
    # _series_delta of the buckets, vectorised (the same subtractions)
    n = len(keys)
    d = np.fromiter(b.values(), float, n) - np.fromiter(a.values() if same_order else map(a.__getitem__, keys),
                                                         float, n)
    if (d < 0).any():
        raise _Fail(NoObservation(Reason.COUNTER_RESET, name))
    d_sum = _series_delta(base + "_sum", prev, cur)
    d_count = _series_delta(base + "_count", prev, cur)
    parts = []
    for rest, idx, moments in plan:
        if rest not in d_count or rest not in d_sum:
            raise _Fail(_missing(base + "_count", (prev, cur)))
        cum = d[idx]
        count = d_count[rest]
        if ((cum[1:] - cum[:-1]) < -1e-9).any() or abs(cum[-1] - count) > 1e-6 * max(1.0, count):
            raise _Fail(NoObservation(Reason.INVALID_VALUE, f"{base} (inconsistent buckets)"))
        parts.append(Histogram(moments.bounds, cum, d_sum[rest], count, moments))
    if len(plan) != len(d_count):
        raise _Fail(_missing(base + "_bucket", (prev, cur)))
    if len(parts) == 1:  # merge_histograms of one part with ascending bounds: the part, 0.0 added
        cum += 0.0
        return Histogram(moments.bounds, cum, math.fsum((d_sum[rest],)), math.fsum((count,)), moments)
    return merge_histograms(parts)


def _histograms_batched(prev: Snapshot, cur: Snapshot,
                        cache: HistogramCache | None = None) -> dict[str, Histogram | None] | None:
    """Every histogram of the window at once (one subtraction, one check of all buckets), or
    None when anything is unusual (a metric missing or renamed on one side, series changed or
    reordered, no bucket plan, a reset, inconsistent buckets): then :func:`_histogram`, one by
    one, gives the result or the typed failure. Where it answers, it is what that gives."""
    ps, cs = prev.series, cur.series
    bases, plans, news, olds, sums, counts = [], [], [], [], [], []
    n_all = 0
    try:
        for names, required in HISTOGRAMS.values():
            base = None
            for n in names:
                if ps.get(n + "_count") and cs.get(n + "_count"):
                    base = n
                    break
            if base is None:
                if required or any(ps.get(n + "_count") or cs.get(n + "_count") for n in names):
                    return None
                bases.append(None)
                continue
            a, b = ps.get(base + "_bucket"), cs.get(base + "_bucket")
            if not (a and b and ps.get(base + "_sum") and cs.get(base + "_sum")):
                return None
            keys = tuple(b)
            if tuple(a) != keys:
                return None
            plan = bucket_plan(keys, cache)
            if plan is None:
                return None
            d_sum = _series_delta(base + "_sum", prev, cur)
            d_count = _series_delta(base + "_count", prev, cur)
            if len(plan) != len(d_count):
                return None
            for rest, _, _ in plan:
                if rest not in d_count or rest not in d_sum:
                    return None
            bases.append(base)
            plans.append(plan)
            news.append(b.values())
            olds.append(a.values())
            sums.append(d_sum)
            counts.append(d_count)
            n_all += len(keys)
    except _Fail:
        return None
    # _series_delta of all buckets, vectorised (the same subtractions)
    d = np.fromiter(chain.from_iterable(news), float, n_all) - np.fromiter(chain.from_iterable(olds), float, n_all)
    if (d < 0).any():
        return None
    _, groups, gather, inner, last = batched_plan(tuple(plans), cache)
    cum = d[gather]
    count_all = np.fromiter((dc[rest] for gs, dc in zip(groups, counts) for rest, _, _ in gs), float, len(last))
    if (((cum[1:] - cum[:-1]) < -1e-9) & inner).any() or \
            (np.abs(cum[last] - count_all) > 1e-6 * np.maximum(1.0, count_all)).any():
        return None
    cum += 0.0  # what merge_histograms' zeros + cumulative gives
    out: dict[str, Histogram | None] = {}
    it = iter(zip(groups, sums, counts))
    for k, base in zip(HISTOGRAMS, bases):
        if base is None:
            out[k] = None
            continue
        gs, d_sum, d_count = next(it)
        if len(gs) == 1:
            rest, moments, sl = gs[0]
            out[k] = Histogram(moments.bounds, cum[sl], math.fsum((d_sum[rest],)), math.fsum((d_count[rest],)), moments)
        else:
            out[k] = merge_histograms([Histogram(moments.bounds, cum[sl], d_sum[rest], d_count[rest], moments)
                                       for rest, moments, sl in gs])
    return out


def _histogram_general(base: str, prev: Snapshot, cur: Snapshot) -> Histogram:
    """:func:`_histogram` for any bucket series (label by label)."""
    d_bucket = _series_delta(base + "_bucket", prev, cur)
    d_sum = _series_delta(base + "_sum", prev, cur)
    d_count = _series_delta(base + "_count", prev, cur)
    # group buckets by series (labels without `le`)
    per_series: dict[Labels, dict[float, float]] = {}
    for labels, v in d_bucket.items():
        rest = tuple(kv for kv in labels if kv[0] != "le")
        le = dict(labels).get("le")
        try:
            bound = float(le)
        except (TypeError, ValueError):
            raise _Fail(NoObservation(Reason.INVALID_VALUE, f"{base}_bucket le={le!r}")) from None
        per_series.setdefault(rest, {})[bound] = v
    parts = []
    for rest, buckets in per_series.items():
        if rest not in d_count or rest not in d_sum:
            raise _Fail(_missing(base + "_count", (prev, cur)))
        bounds = np.array(sorted(buckets))
        cum = np.array([buckets[b] for b in bounds])
        count = d_count[rest]
        if not np.isinf(bounds[-1]) or np.any(np.diff(cum) < -1e-9) or abs(cum[-1] - count) > 1e-6 * max(1.0, count):
            raise _Fail(NoObservation(Reason.INVALID_VALUE, f"{base} (inconsistent buckets)"))
        parts.append(Histogram(bounds, cum, d_sum[rest], count))
    if len(per_series) != len(d_count):
        raise _Fail(_missing(base + "_bucket", (prev, cur)))
    return merge_histograms(parts)


def _gauge_samples(names: tuple[str, ...], snaps: Sequence[Snapshot], how: str) -> tuple[float, ...]:
    """The gauge at each snapshot (engines summed or averaged). The window's ends must have
    it; an intermediate scrape that lacks it (or has other series) is skipped."""
    name = _pick(names, "", (snaps[0], snaps[-1]), True)
    keys = set(snaps[-1].get(name))
    out = []
    for i, s in enumerate(snaps):
        series = s.get(name)
        if not series or set(series) != keys:
            if 0 < i < len(snaps) - 1:
                continue
            gone = sorted(set(series or {}) ^ keys)
            raise _Fail(NoObservation(Reason.SERIES_CHANGED, f"{name}{dict(gone[0])}"))
        vals = list(series.values())
        out.append(math.fsum(vals) if how == "sum" else math.fsum(vals) / len(vals))
    return tuple(out)


def _cache_config(snap: Snapshot) -> tuple[float | None, float | None, float | None]:
    """KV capacity (tokens, summed over engines), memory fraction and KV bytes (first engine)."""
    series = snap.get(CACHE_CONFIG)
    if not series:
        return None, None, None

    def num(labels: dict[str, str], key: str) -> float | None:
        try:
            v = float(labels.get(key, "None"))
        except ValueError:
            return None
        return v if math.isfinite(v) else None

    capacity, gmu, kvb = 0.0, None, None
    for key in sorted(series):
        labels = dict(key)
        blocks, size = num(labels, "num_gpu_blocks"), num(labels, "block_size")
        if blocks is None or size is None:
            capacity = None
        elif capacity is not None:
            capacity += blocks * size
        gmu = num(labels, "gpu_memory_utilization") if gmu is None else gmu
        kvb = num(labels, "kv_cache_memory_bytes") if kvb is None else kvb
    return capacity, gmu, kvb


def window_deltas(prev: Snapshot, cur: Snapshot, between: Sequence[Snapshot] = (),
                  cache: HistogramCache | None = None) -> WindowDeltas | NoObservation:
    """One pod's raw window (counters, histogram deltas, gauge samples), or why not. ``cache``:
    the bucket plans kept by the owner of the scrapes (None: planned afresh); what it holds
    changes how fast, never what, this computes."""
    window_s = cur.t_s - prev.t_s
    if not window_s > 0:
        return NoObservation(Reason.BAD_WINDOW, f"window_s={window_s}")
    a, b = prev.process_start_s, cur.process_start_s
    if a is not None and b is not None and b != a:
        return NoObservation(Reason.COUNTER_RESET, "process restarted")
    for created in (SUCCESS_CREATED, PROMPT_TOKENS_CREATED):
        ca, cb = prev.get(created), cur.get(created)
        if ca and cb and any(k in ca and ca[k] != v for k, v in cb.items()):
            return NoObservation(Reason.COUNTER_RESET, f"{created} changed")
    try:
        counters = {k: _counter(names, prev, cur, req) for k, (names, req) in COUNTERS.items()}
        hists = _histograms_batched(prev, cur, cache)
        if hists is None:  # something unusual: histogram by histogram, each failure typed
            hists = {k: _histogram(names, prev, cur, req, cache) for k, (names, req) in HISTOGRAMS.items()}
        snaps = (prev, *between, cur)
        running = _gauge_samples(GAUGES["running"][0], snaps, "sum")
        waiting = _gauge_samples(GAUGES["waiting"][0], snaps, "sum")
        kv = _gauge_samples(GAUGES["kv_usage"][0], snaps, "mean")
    except _Fail as f:
        return f.no
    capacity, gmu, kvb = _cache_config(cur)
    return WindowDeltas(window_s, cur.t_s, counters, hists, running, waiting, kv, capacity, gmu, kvb)


def _mean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return math.fsum(xs) / len(xs)


def _all_or_none(xs: Sequence[float | None]) -> list[float] | None:
    return None if any(x is None for x in xs) else list(xs)  # type: ignore[return-value]


def combine(parts: Sequence[WindowDeltas],
            slo_targets_s: Mapping[str, float | None] | None = None) -> Observation | NoObservation:
    """Turn one or more pods' window deltas into one observation (pool semantics, see
    :class:`Observation`): counts and rates add, per-request distributions merge their
    histograms, batch/KV quantities average over pods. ``slo_targets_s``: the per-request
    latency SLOs (``{"ttft": 1.0, "tpot": 0.05, "e2e": None}``) whose surely missed share of
    the window's requests the observation carries (``slo_missed_fraction``)."""
    if not parts:
        return NoObservation(Reason.NO_PODS)
    window_s = _mean(p.window_s for p in parts)
    total = {k: _all_or_none([p.counters[k] for p in parts]) for k in COUNTERS}
    finished = math.fsum(total["finished"])
    if finished <= 0:
        busy = (
            math.fsum(total["prompt_tokens"]) > 0
            or math.fsum(total["generation_tokens"]) > 0
            or any(max(p.running) > 0 for p in parts)
        )
        return NoObservation(Reason.NO_FINISHED if busy else Reason.IDLE)
    hist: dict[str, Histogram | None] = {}
    for k in HISTOGRAMS:
        hs = _all_or_none([p.histograms[k] for p in parts])
        hist[k] = merge_histograms(hs) if hs else None
    for k in ("input_len", "output_len", "ttft", "e2e"):
        if hist[k].count <= 0:  # type: ignore[union-attr]
            return NoObservation(Reason.INVALID_VALUE, f"{k}: histogram count 0 with {finished:g} finished")

    def mean_p95(k: str) -> tuple[float | None, float | None]:
        h = hist[k]
        if h is None or h.count <= 0:
            return None, None
        return h.mean(), h.quantile(QUANTILE)

    def rate(k: str) -> float:
        # rates add over pods, each over its own window
        return math.fsum(c / p.window_s for c, p in zip(total[k], parts))

    lens = {}
    for k in ("input_len", "output_len"):
        h = hist[k]
        lens[k] = (h.mean(), h.cv(), h.quantile(QUANTILE))  # type: ignore[union-attr]
    lat = {k: mean_p95(k) for k in ("ttft", "itl", "tpot", "e2e", "queue_time", "prefill_time", "decode_time")}
    floor = {k: hist[k].quantile_floor(QUANTILE) if hist[k] is not None and hist[k].count > 0 else None
             for k in ("ttft", "itl", "tpot", "e2e")}
    if lat["itl"][0] is None:
        if math.fsum(total["generation_tokens"]) > finished:
            return NoObservation(Reason.INVALID_VALUE, "itl: histogram count 0")
        # one token per request (a disaggregated prefill pool, max_tokens 1): no interval between tokens
        lat["itl"], floor["itl"] = (0.0, 0.0), 0.0
    missed = _slo_missed_fraction(hist, slo_targets_s)
    inference = [p.histograms["inference_time"] for p in parts]
    little = (
        _mean(h.sum / p.window_s for h, p in zip(inference, parts))  # type: ignore[union-attr]
        if all(h is not None for h in inference)
        else None
    )
    caps = _all_or_none([p.kv_capacity_tokens for p in parts])
    gmus = _all_or_none([p.gpu_memory_utilization for p in parts])
    kvbs = _all_or_none([p.kv_cache_memory_bytes for p in parts])
    return Observation(
        window_s=window_s,
        t_end_s=max(p.t_end_s for p in parts),
        pods=len(parts),
        finished_requests=finished,
        request_rate_rps=rate("finished"),
        mean_batch=_mean(_mean(p.running) for p in parts),
        max_batch=max(max(p.running) for p in parts),
        batch_samples=sum(len(p.running) for p in parts),
        queue_len=math.fsum(_mean(p.waiting) for p in parts),
        prompt_tokens=math.fsum(total["prompt_tokens"]),
        generation_tokens=math.fsum(total["generation_tokens"]),
        prompt_tok_s=rate("prompt_tokens"),
        generation_tok_s=rate("generation_tokens"),
        input_len_mean=lens["input_len"][0],
        input_len_cv=lens["input_len"][1],
        input_len_p95=lens["input_len"][2],
        output_len_mean=lens["output_len"][0],
        output_len_cv=lens["output_len"][1],
        output_len_p95=lens["output_len"][2],
        ttft_mean_s=lat["ttft"][0],
        ttft_p95_s=lat["ttft"][1],
        itl_mean_s=lat["itl"][0],
        itl_p95_s=lat["itl"][1],
        e2e_mean_s=lat["e2e"][0],
        e2e_p95_s=lat["e2e"][1],
        kv_usage=_mean(_mean(p.kv_usage) for p in parts),
        kv_usage_max=max(max(p.kv_usage) for p in parts),
        tpot_mean_s=lat["tpot"][0],
        tpot_p95_s=lat["tpot"][1],
        queue_time_mean_s=lat["queue_time"][0],
        queue_time_p95_s=lat["queue_time"][1],
        prefill_time_mean_s=lat["prefill_time"][0],
        prefill_time_p95_s=lat["prefill_time"][1],
        decode_time_mean_s=lat["decode_time"][0],
        decode_time_p95_s=lat["decode_time"][1],
        mean_batch_little=little,
        preemptions=math.fsum(total["preemptions"]) if total["preemptions"] is not None else None,
        kv_capacity_tokens=_mean(caps) if caps else None,
        gpu_memory_utilization=_mean(gmus) if gmus else None,
        kv_cache_memory_bytes=_mean(kvbs) if kvbs else None,
        ttft_p95_floor_s=floor["ttft"],
        itl_p95_floor_s=floor["itl"],
        e2e_p95_floor_s=floor["e2e"],
        tpot_p95_floor_s=floor["tpot"],
        slo_missed_fraction=missed,
    )


def _slo_missed_fraction(hist: Mapping[str, Histogram | None],
                         targets_s: Mapping[str, float | None] | None) -> float | None:
    """The share of the window's requests that surely missed a declared per-request latency SLO:
    the most of any one metric (each a lower bound from its buckets, so their union is at least
    that). TPOT counts only where the engine exports it per request (ITL's histogram counts
    tokens). None: no SLO declared, or none of its histograms exported."""
    shares = [hist[k].fraction_surely_above(x) for k, x in (targets_s or {}).items()
              if x is not None and k in ("ttft", "tpot", "e2e") and hist.get(k) is not None and hist[k].count > 0]
    return max(shares) if shares else None


def observe(prev: Snapshot, cur: Snapshot, between: Sequence[Snapshot] = (),
            slo_targets_s: Mapping[str, float | None] | None = None) -> Observation | NoObservation:
    """The observation of one pod's window ``prev`` → ``cur``; ``between`` are optional
    intermediate scrapes whose gauges (batch, queue, KV usage) join the averages;
    ``slo_targets_s``: as :func:`combine`'s."""
    d = window_deltas(prev, cur, between)
    return d if isinstance(d, NoObservation) else combine([d], slo_targets_s)
