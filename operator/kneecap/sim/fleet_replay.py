"""Fleet replay (issue 24, item 4): several traces at once on a GPU inventory, in virtual time.

A fleet (``model.packing.parse_fleet``'s deployments) where every deployment has a trace of its
own, replayed under two policies, each a placement of every replica on a GPU:

* ``one-per-gpu`` (today): every replica on a whole GPU of its declared type at its declared
  flags (vLLM's defaults where none are declared). kneecap's knobs do not run here: this is the
  fleet as declared, the "before" of a packing;
* ``kneecap+pack``: ``model.packing.pack`` places the fleet from the workload kneecap would have
  observed on each trace (:func:`observed`: the request rate, and log-normal prompt and output
  lengths with the trace's means and coefficients of variation, over the first ``observe_s``
  seconds, default the whole trace: a placement is a slow decision made from a long history, and
  the replay's traces are that history; a shorter window shows how it fares when the rest of the
  trace differs). The packing's caps and memory shares then serve the traces.

Each replica serves every ``replicas``-th request of its deployment's trace (round robin: the
split the packing's per-replica rate assumes; the same under both policies), and every GPU's
engines replay their requests together, time-slicing it (``sim.shared_gpu.replay_arrivals``:
one engine alone runs as it would on a GPU of its own). Engines on different GPUs never meet, so
the GPUs are replayed one after another. Scores per deployment (all its replicas' requests),
as ``kneecap replay`` scores a run (``sim.replay.score``): SLO attainment (the fraction of
requests meeting both the TTFT and the TPOT SLO; a refused request meets neither), whether the
SLO quantile over the whole trace met both SLOs (refused requests count as misses), and the
p50/p95/p99 of TTFT and TPOT over the requests served. Per policy: GPUs by type and $/h.

Where ``kneecap replay``'s ``--released-memory-value`` puts a price on released GPU memory, the
fleet replay measures it: the memory the packing frees is whole GPUs returned, in $/h.

:func:`derive_trace` cuts a deployment's trace out of one real trace (deterministic, seeded):
a contiguous run of its requests (cyclic) from a seeded start, its time scaled to the
deployment's declared rate over ``duration_s`` and its lengths to the declared means, so the
deployments share the real trace's burstiness and length mix but not its requests' times.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from kneecap.errors import InputError
from kneecap.model import gauss, packing
from kneecap.sim import shared_gpu
from kneecap.sim.pack_verify import placement_loads
from kneecap.sim.replay import _q, _r
from kneecap.sim.trace import Trace
from kneecap.sim.trace_variants import scale_lengths

FLEET_POLICIES = ("one-per-gpu", "kneecap+pack")
DEFAULT_DURATION_S = 1800.0
MIN_REQUESTS = 20  # a derived trace holds at least this many requests


def _length_mean(dist) -> float:
    return float(dist.tokens if isinstance(dist, gauss.FixedLength) else dist.mean)


def derive_trace(base: Trace, d: packing.Deployment, index: int, *, duration_s: float = DEFAULT_DURATION_S,
                 seed: int = 0) -> Trace:
    """Deployment ``d``'s trace (the ``index``-th of the fleet) cut from ``base`` (module
    docstring): n = max(MIN_REQUESTS, round(rate·duration_s)) consecutive requests of ``base``
    (cyclically; the gap across the wrap is the mean gap) from a start drawn from
    ``default_rng([seed, index])``, their gaps scaled so the last arrives at ``duration_s``, their
    prompts and outputs scaled to d's declared means (``trace_variants.scale_lengths``, each at
    most half the model's context so every request fits it)."""
    if not (isinstance(duration_s, (int, float)) and math.isfinite(duration_s) and duration_s > 0):
        raise InputError("duration", f"expected a positive number of seconds, got {duration_s!r}")
    big = len(base)
    if big < 2 or base.span_s <= 0:
        raise InputError("trace", f"{base.source}: a trace to derive from needs two requests at distinct times")
    n = max(MIN_REQUESTS, int(round(d.rate_rps * duration_s)))
    start = int(np.random.default_rng([int(seed), int(index)]).integers(big))
    idx = (start + np.arange(n)) % big
    gaps = np.diff(base.arrival_s, append=base.arrival_s[-1] + base.span_s / (big - 1))
    t = np.concatenate(([0.0], np.cumsum(gaps[idx[:-1]])))
    t = t * (duration_s / t[-1]) if t[-1] > 0 else np.linspace(0.0, duration_s, n)
    cut = Trace(t, base.input_tokens[idx], base.output_tokens[idx],
                f"{base.source} [{d.name}: {n} requests from #{start}, over {duration_s:g} s]")
    half = (d.arch.max_position or 2048) // 2
    inp = np.maximum(cut.input_tokens, 1).mean()
    out = np.maximum(cut.output_tokens, 1).mean()
    scaled = scale_lengths(cut, _length_mean(d.workload.input_tokens) / inp,
                           _length_mean(d.workload.output_tokens) / out, max_input_tokens=half,
                           max_output_tokens=half)
    return Trace(scaled.arrival_s, scaled.input_tokens, scaled.output_tokens, cut.source)


def _lengths(x: np.ndarray):
    mean = float(np.mean(x))
    cv = float(np.std(x) / mean) if mean > 0 else 0.0
    return gauss.FixedLength(mean) if cv == 0 else gauss.LogNormalLength(mean, cv)


def observed(d: packing.Deployment, trace: Trace, observe_s: float | None = None) -> packing.Deployment:
    """``d`` with the workload seen on ``trace`` over its first ``observe_s`` seconds (None, or
    past its end: all of it): requests per second, prompt and output lengths as log-normals of the seen mean and
    coefficient of variation. What ``kneecap+pack`` packs from."""
    span = trace.span_s if observe_s is None else min(float(observe_s), trace.span_s)
    seen = trace.arrival_s <= span
    n = int(seen.sum())
    if n < 2 or span <= 0:
        raise InputError("observe", f"deployment {d.name!r}: {n} request(s) in the first {span:g} s of its trace; "
                                    "the packing needs at least two to see a rate")
    inp = np.maximum(trace.input_tokens[seen], 1).astype(float)
    out = np.maximum(trace.output_tokens[seen], 1).astype(float)
    return replace(d, rate_rps=n / span, workload=gauss.Workload(_lengths(inp), _lengths(out)))


def today_placement(deployments, inventory=None) -> tuple[packing.GpuPlacement, ...]:
    """``one-per-gpu``: every replica on a GPU of its own, its declared type and flags; the price
    as ``packing.pack`` prices today's GPUs (the deployment's, else the inventory's, else the
    catalog's)."""
    price = {o.gpu.key: o.cost_per_hour for o in inventory or ()}
    out = []
    for d in deployments:
        p = d.cost_per_hour if d.cost_per_hour is not None else price.get(d.gpu.key, d.gpu.cost_per_hour)
        for r in range(d.replicas):
            out.append(packing.GpuPlacement(d.gpu.key, p, (packing.EngineResult(
                d.name, r, d.max_num_seqs, d.gpu_memory_utilization, None, None, False, None, None),)))
    return tuple(out)


def replay_placement(placement, deployments, traces: dict) -> tuple[list, dict]:
    """Every GPU of ``placement`` replayed on its share of the traces (module docstring), one GPU
    after another. Returns (per GPU its engines' summaries, per deployment name its requests'
    (TTFT, TPOT, refused) arrays in trace order)."""
    by = {d.name: d for d in deployments}
    ttft = {d.name: np.full(len(traces[d.name]), np.inf) for d in deployments}
    tpot = {d.name: np.full(len(traces[d.name]), np.inf) for d in deployments}
    refused = {d.name: np.zeros(len(traces[d.name]), dtype=bool) for d in deployments}
    gpus = []
    for gi, g in enumerate(placement):
        loads = placement_loads(deployments, g)
        shares = []
        for e in g.engines:
            tr, reps = traces[e.deployment], by[e.deployment].replicas
            shares.append(np.arange(e.replica, len(tr), reps))
        arrivals = [(traces[e.deployment].arrival_s[k], traces[e.deployment].input_tokens[k],
                     traces[e.deployment].output_tokens[k]) for e, k in zip(g.engines, shares)]
        runs = shared_gpu.replay_arrivals(loads, g.gpu, arrivals)
        engines = []
        for e, k, run in zip(g.engines, shares, runs):
            ttft[e.deployment][k], tpot[e.deployment][k], refused[e.deployment][k] = run.ttft_s, run.tpot_s, run.refused
            engines.append({"deployment": e.deployment, "replica": e.replica, "max_num_seqs": e.max_num_seqs,
                            "gpu_memory_utilization": _r(e.gpu_memory_utilization), "requests": int(k.size),
                            "refused": int(run.refused.sum()), "preemptions": run.preemptions,
                            "gpu_busy_s": _r(run.busy_s, 3)})
        gpus.append({"index": gi, "gpu": g.gpu, "cost_per_hour": g.cost_per_hour, "engines": engines})
    return gpus, {n: (ttft[n], tpot[n], refused[n]) for n in ttft}


def deployment_score(d: packing.Deployment, ttft: np.ndarray, tpot: np.ndarray, refused: np.ndarray) -> dict:
    """One deployment's requests scored as ``sim.replay.score`` scores a run (module docstring)."""
    inf = float("inf")
    good = (ttft <= (d.ttft_s if d.ttft_s is not None else inf)) & (tpot <= (d.tpot_s if d.tpot_s is not None else inf))
    done = ~refused
    pct = lambda x, q: _r(np.percentile(x[done], q)) if done.any() else None  # noqa: E731
    met = all(slo is None or _q(x, d.quantile) <= slo for slo, x in ((d.ttft_s, ttft), (d.tpot_s, tpot)))
    return {"name": d.name, "requests": int(ttft.size), "completed": int(done.sum()), "refused": int(refused.sum()),
            "good": int(good.sum()), "slo_attainment_requests": _r(good.mean()) if ttft.size else None,
            "slo_met_over_trace": bool(met),
            "slo": {"quantile": d.quantile, "ttft_s": d.ttft_s, "tpot_s": d.tpot_s},
            "ttft_s": {f"p{q}": pct(ttft, q) for q in (50, 95, 99)},
            "tpot_s": {f"p{q}": pct(tpot, q) for q in (50, 95, 99)}}


def _policy_report(placement, deployments, traces) -> dict:
    gpus, lat = replay_placement(placement, deployments, traces)
    per = [deployment_score(d, *lat[d.name]) for d in deployments]
    totals = packing._totals(placement)
    totals["cost_per_hour"] = _r(totals["cost_per_hour"], 4)
    return {**totals, "all_slo_met": all(p["slo_met_over_trace"] for p in per),
            "min_attainment": min(p["slo_attainment_requests"] for p in per), "deployments": per, "placement": gpus}


def fleet_replay(deployments, traces: dict, inventory=None, policies=FLEET_POLICIES, *, observe_s=None,
                 margin: float = packing.DEFAULT_MARGIN, seed: int = 0, samples: int = packing.SAMPLES) -> dict:
    """The fleet replay's report (module docstring; JSON-ready, deterministic: no wall clock).
    ``traces``: deployment name → :class:`Trace`, one per deployment; ``inventory``: the GPUs
    ``kneecap+pack`` may use (``packing.GpuOffer``s; None: the fleet's GPUs today)."""
    deployments = tuple(deployments)
    missing = [d.name for d in deployments if d.name not in traces]
    if missing:
        raise InputError("trace", f"deployment {missing[0]!r} has no trace")
    extra = sorted(set(traces) - {d.name for d in deployments})
    if extra:
        raise InputError("trace", f"{extra[0]!r} names no deployment of the fleet")
    bad = [p for p in policies if p not in FLEET_POLICIES]
    if bad or not policies:
        raise InputError("policy", f"expected {' or '.join(FLEET_POLICIES)} with --fleet, got {bad or policies}")
    seen = tuple(observed(d, traces[d.name], observe_s) for d in deployments)
    report = {"seed": seed, "margin": margin, "observe_s": observe_s,
              "traces": {d.name: {"source": traces[d.name].source, "requests": len(traces[d.name]),
                                  "span_s": _r(traces[d.name].span_s, 3), "observed_rate_rps": _r(o.rate_rps),
                                  "observed_input_mean": _r(_length_mean(o.workload.input_tokens), 2),
                                  "observed_output_mean": _r(_length_mean(o.workload.output_tokens), 2)}
                         for d, o in zip(deployments, seen)},
              "policies": {}}
    for policy in dict.fromkeys(policies):
        if policy == "one-per-gpu":
            report["policies"][policy] = _policy_report(today_placement(seen, inventory), seen, traces)
            continue
        res = packing.pack(seen, inventory, margin=margin, seed=seed, samples=samples)
        if not res.feasible:
            out = packing.result_dict(res)
            report["policies"][policy] = {"feasible": False, "message": out["message"], "unplaced": out["unplaced"]}
            continue
        rep = _policy_report(res.after, seen, traces)
        predicted = {d["name"]: d["after"] for d in packing.result_dict(res)["deployments"]}
        for p in rep["deployments"]:
            p["predicted"] = {"ttft_s": predicted[p["name"]]["ttft_s"], "tpot_s": predicted[p["name"]]["tpot_s"],
                              "slo_met_with_margin": predicted[p["name"]]["slo_met_with_margin"]}
        report["policies"][policy] = {"feasible": True, **rep}
    pols = report["policies"]
    if "one-per-gpu" in pols and pols.get("kneecap+pack", {}).get("feasible"):
        before, after = pols["one-per-gpu"], pols["kneecap+pack"]
        report["gpus_returned"] = before["gpus"] - after["gpus"]
        report["savings_per_hour"] = _r(before["cost_per_hour"] - after["cost_per_hour"], 4)
    return report
