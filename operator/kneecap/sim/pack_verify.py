"""`kneecap pack --verify`: each packed GPU of a :class:`kneecap.model.packing.PackResult` replayed
on the engine twins time-slicing it (:func:`kneecap.sim.shared_gpu.verify_placement`), measured
quantiles beside the predicted ones. In sim/: the packing (model/) stays pure and knows no twin."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kneecap.errors import InputError
from kneecap.model import colocation
from kneecap.model.hardware import get_gpu
from kneecap.model.packing import (QUANTILE_INDEX, EngineResult, PackResult, _met, _tails_dict, _worst, engine_params,
                                   result_dict)  # noqa: F401

# --verify (``verify``): each packed GPU replayed on the twins (``sim.shared_gpu.verify_placement``)
# long enough that its lightest engine has VERIFY_REQUESTS measured requests (50 past its p95, 10
# past its p99: a p95 within about ±5% for an exponential-like tail, 1.96·√(q(1−q)/n)/(f·x_q)),
# unless its busiest engine would then pass VERIFY_MAX_REQUESTS (the replay's time grows with it;
# the lightest then gets fewer, reported per engine)
VERIFY_REQUESTS = 1000
VERIFY_MAX_REQUESTS = 10_000


@dataclass(frozen=True)
class VerifiedGpu:
    """One packed GPU replayed on the twins: the GPU's index in ``PackResult.after``, the
    ``requests`` and ``seed`` given to ``verify_placement`` and its ``Verification`` (one
    ``MeasuredEngine`` per engine, in the GPU's engine order)."""

    index: int
    gpu: str
    requests: int
    seed: int
    verification: object


def gpu_seed(seed: int, index: int) -> int:
    """The replay seed of packed GPU ``index``: a distinct stream per GPU (``SeedSequence([seed, index])``)."""
    return int(np.random.SeedSequence([int(seed), int(index)]).generate_state(1)[0])


def placement_loads(deployments, g) -> list:
    """One placed GPU's engines (``packing.GpuPlacement``) as ``colocation.EngineLoad``: each
    replica's deployment (found by name in ``deployments``) at the placement's cap and memory
    share, at its per-replica rate, named ``deployment#replica``. The twin replays SLIM's
    kneecap form only: another calibration form is refused (InputError naming the deployment)."""
    by = {d.name: d for d in deployments}
    gpu = get_gpu(g.gpu)
    loads = []
    for e in g.engines:
        d = by[e.deployment]
        params, form = engine_params(d, gpu)
        if form != "kneecap":
            raise InputError("calibration", f"deployment {d.name!r}: the twin replays SLIM's kneecap form only, "
                                            f"its calibration is {form!r}; the twin cannot replay it")
        loads.append(colocation.EngineLoad(d.arch, d.workload, d.rate_per_replica_rps, e.gpu_memory_utilization,
                                           params=params, form=form, max_num_seqs=e.max_num_seqs,
                                           name=f"{d.name}#{e.replica}"))
    return loads


def verify(res: PackResult, *, seed: int = 0, requests: int = VERIFY_REQUESTS,
           max_requests: int = VERIFY_MAX_REQUESTS) -> tuple[VerifiedGpu, ...]:
    """Replay every packed GPU of ``res`` in virtual time, its engines time-sliced on one twin GPU
    at the packing's caps and memory shares (``sim.shared_gpu.verify_placement``, Poisson arrivals
    at each replica's rate, lengths from the deployment's workload, requests vLLM would refuse as
    longer than the model's context refused and counted). GPUs are independent: replayed one
    after another, each with its own seed (:func:`gpu_seed`). ``requests``: the measured requests
    of each GPU's lightest engine, unless its busiest would then pass ``max_requests``."""
    from kneecap.sim import shared_gpu

    if not res.feasible:
        raise InputError("verify", "no packing to verify: a deployment could not be placed")
    for name, v in (("requests", requests), ("max_requests", max_requests)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 100:
            raise InputError(name, f"expected an integer ≥ 100, got {v!r}")
    out = []
    for gi, g in enumerate(res.after):
        gpu = get_gpu(g.gpu)
        loads = placement_loads(res.deployments, g)
        rates = [ld.rate_rps for ld in loads]
        n = max(requests, min(max_requests, int(math.ceil(requests * max(rates) / min(rates)))))
        s = gpu_seed(seed, gi)
        out.append(VerifiedGpu(gi, g.gpu, n, s, shared_gpu.verify_placement(loads, gpu, requests=n, seed=s,
                                                                             oversize="reject")))
    return tuple(out)


def _err(measured, predicted):
    if measured is None or predicted is None or predicted <= 0:
        return None
    return measured / predicted - 1.0


def verification_dict(res: PackResult, verified, out: dict, *, requests: int = VERIFY_REQUESTS,
                      max_requests: int = VERIFY_MAX_REQUESTS) -> dict:
    """``out`` (:func:`result_dict`'s) with the replay added: per deployment ``verified`` (the
    worst replica's measured p50/p95/p99, the relative error measured/predicted − 1 at the SLO
    quantile, whether each SLO is met as measured: no margin) and ``verify`` (per GPU and engine
    what was measured; ``misses``: every SLO missed as measured; ``all_slo_met``)."""
    names = ("p50", "p95", "p99")
    per_engine = {}  # (deployment, replica) -> (EngineResult, MeasuredEngine)
    gpus = []
    for vg in verified:
        g = res.after[vg.index]
        engines = []
        for e, m in zip(g.engines, vg.verification.engines):
            per_engine[(e.deployment, e.replica)] = (e, m)
            engines.append({"deployment": e.deployment, "replica": e.replica, "requests": m.requests,
                            "rejected": m.rejected, "preemptions": m.preemptions, "gpu_share": m.gpu_share,
                            "ttft_s": dict(zip(names, m.ttft_s)), "tpot_s": _tails_dict(m.tpot_s),
                            "predicted": {"ttft_s": _tails_dict(e.ttft_s), "tpot_s": _tails_dict(e.tpot_s)}})
        gpus.append({"index": vg.index, "gpu": vg.gpu, "requests": vg.requests, "seed": vg.seed,
                     "warmup_s": vg.verification.warmup_s, "horizon_s": vg.verification.horizon_s,
                     "gpu_busy_share": vg.verification.gpu_busy_share, "engines": engines})
    misses = []
    for d, entry in zip(res.deployments, out["deployments"]):
        pairs = [per_engine[(d.name, r)] for r in range(d.replicas)]
        k = QUANTILE_INDEX[d.quantile]
        q = names[k]
        ttft = tuple(max(m.ttft_s[j] for _, m in pairs) for j in range(3))
        tpots = [m.tpot_s for _, m in pairs]
        tpot = None if any(t is None for t in tpots) else tuple(max(t[j] for t in tpots) for j in range(3))
        pred_ttft, pred_tpot = _worst([e for e, _ in pairs], "ttft_s"), _worst([e for e, _ in pairs], "tpot_s")
        met = _met(d, ttft, tpot)
        for metric, slo, tail in (("ttft", d.ttft_s, ttft), ("tpot", d.tpot_s, tpot)):
            if slo is not None and tail is not None and tail[k] > slo:
                misses.append({"deployment": d.name, "metric": metric, "quantile": d.quantile,
                               "measured_s": tail[k], "slo_s": slo})
        entry["verified"] = {
            "ttft_s": dict(zip(names, ttft)), "tpot_s": _tails_dict(tpot),
            "requests": sum(m.requests for _, m in pairs), "rejected": sum(m.rejected for _, m in pairs),
            "error": {"ttft": _err(ttft[k], pred_ttft and pred_ttft[k]),
                      "tpot": _err(tpot and tpot[k], pred_tpot and pred_tpot[k]), "quantile": q},
            "slo_met": met}
    out["verify"] = {"requests": requests, "max_requests": max_requests, "gpus": gpus, "misses": misses,
                     "all_slo_met": not misses}
    return out
