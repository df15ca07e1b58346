"""The status codec: the camelCase blocks of ``status`` that the tick writes and reads back. Pure.

One place converts to and from camelCase: the calibration (SLIM's parameters, its errors, the
keys earlier versions wrote), the observation ring's entries of a pool (parsed once each, through
a cache the loop keeps), the engine settings, the last full window (``status.workload``) and who
owns each pool's replicas. The ring entry itself is :mod:`kneecap.control.status`'s.
"""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Sequence

from kneecap.control import manifests, reconcile, status as status_helpers
from kneecap.errors import InputError
from kneecap.model import calibrate, slim
from kneecap.naming import status_key
from kneecap.observe import pool as obs_pool
from kneecap.observe.observation import Observation


def ownership_status(pools: Sequence[reconcile.PoolState]) -> dict:
    """Who owns each pool's replicas; kneecap does not fight an HPA or a person."""
    out = {}
    for p in pools:
        o = p.ownership
        out[p.pool.role] = {"replicas": o.replicas_owner,
                            "message": (f"replicas are owned by {o.replicas_owner}; kneecap only recommends them"
                                        if o.external else "kneecap manages replicas")}
        if p.adoption is not None:  # spec.targetRef: whose Deployment kneecap tunes
            out[p.pool.role]["target"] = status_helpers.compact({
                "deployment": p.pool.name, "container": p.adoption.container, "controller": p.adoption.controller,
                "adviseOnly": p.adoption.advise_only, "tensorParallelSize": p.adoption.tensor_parallel_size})
    return out


def _ring_key(role: str, e: dict) -> tuple:
    return (role, e.get("windowEndUnixSeconds"), e.get("requestsPerSecond"), e.get("generationTokensPerSecond"))


def parse_ring(entries: Sequence[dict], role: str, parsed: dict | None = None) -> tuple:
    """Each ring entry with its parse for pool ``role`` (None: another pool's, or unreadable).
    ``parsed``: a cache of entries parsed on earlier ticks (an entry never changes once
    written), kept to the entries still in the ring."""
    out, seen = [], set()
    for e in entries:
        obs = None
        if e.get("pool", "server") == role:
            key = _ring_key(role, e)
            obs = parsed.get(key) if parsed is not None else None
            if obs is None:
                try:
                    obs = status_helpers.ring_entry_from_status(e)
                except ValueError:
                    obs = None
            if obs is not None:
                seen.add(key)
                if parsed is not None:
                    parsed[key] = obs
        out.append((e, obs))
    if parsed is not None:
        for key in [k for k in parsed if k[0] == role and k not in seen]:
            del parsed[key]
    return tuple(out)


def ring_entries(status: dict, role: str, parsed: dict | None = None) -> list[status_helpers.RingEntry]:
    """The ring's observations of one pool (entries that do not parse are skipped)."""
    return [o for _, o in parse_ring(status.get("observations") or [], role, parsed) if o is not None]


def settings_status(s: manifests.EngineSettings) -> dict:
    return status_helpers.compact({"maxNumSeqs": s.max_num_seqs, "gpuMemoryUtilization": s.gpu_memory_utilization,
                                   "kvCacheMemoryBytes": s.kv_cache_memory_bytes, "replicas": s.replicas})


def workload_from_status(status: dict, role: str) -> Observation | None:
    """The last window's full observation of the pool, from ``status.workload`` (None if absent
    or unreadable)."""
    w = status.get("workload") or {}
    if w.get("pool", "server") != role:
        return None
    try:
        return obs_pool.from_status({k: v for k, v in w.items() if k != "pool"})
    except ValueError:
        return None


_METRIC_KEYS = MappingProxyType({"mape_pct": "meanErrorPercent", "max_error_pct": "maxErrorPercent",
                                 "n_points": "points", "cost": "fitCost"})
_NOTE_KEYS = MappingProxyType({"checkedS": "checkedUnixSeconds", "ringN": "ringPoints",
                               "ringErrorPct": "ringErrorPercent"})
# status.calibration keys earlier versions wrote → the current ones (an upgraded operator reads them)
_EARLIER_CALIBRATION_KEYS = MappingProxyType({
    "mapePct": "meanErrorPercent", "maxErrorPct": "maxErrorPercent", "nPoints": "points",
    "fitErrorPct": "fitErrorPercent", "parameterStd": "parameterStandardDeviations"})


def calibration_to_status(cal: calibrate.Calibration, error: float | None, accepted_time: str | None) -> dict:
    """A Calibration as status.calibration: camelCase keys (SLIM's parameters included, e.g.
    ``t_fixed_s`` → ``tFixedSeconds``), the fit's error on the current ring (``fitErrorPercent``)
    and when it was created and accepted."""
    return status_helpers.compact({
        "version": cal.version, "form": cal.form, "gpu": cal.gpu, "models": list(cal.models),
        "parameters": {status_key(k): v for k, v in cal.params.items()},
        "parameterStandardDeviations": {status_key(k): v for k, v in cal.std.items()},
        **{_METRIC_KEYS.get(k, status_key(k)): v for k, v in cal.metrics.items()},
        "fitErrorPercent": None if error is None else round(100.0 * error, 3),
        "notes": {_NOTE_KEYS.get(k, k): v for k, v in (cal.notes or {}).items()} or None,
        "createdTime": cal.created, "acceptedTime": accepted_time})


def calibration_from_status(d: dict | None) -> calibrate.Calibration | None:
    """Inverse of :func:`calibration_to_status`, the keys of earlier versions read too (None:
    absent or unreadable)."""
    if not d or "parameters" not in d or d.get("form") not in slim.FORM_PARAMS:
        return None
    d = obs_pool.with_current_keys(d, _EARLIER_CALIBRATION_KEYS)
    names = {status_key(k): k for k in slim.FORM_PARAMS[d["form"]]}
    metrics_back = {v: k for k, v in _METRIC_KEYS.items()}
    notes_back = {v: k for k, v in _NOTE_KEYS.items()}
    try:
        return calibrate.Calibration.from_json(json.dumps({
            "version": d.get("version", calibrate.CALIBRATION_VERSION), "form": d["form"], "gpu": d.get("gpu"),
            "models": d.get("models", []),
            "params": {names.get(k, k): v for k, v in dict(d["parameters"]).items()},
            "std": {names.get(k, k): v for k, v in dict(d.get("parameterStandardDeviations") or {}).items()},
            "metrics": {metrics_back[k]: d[k] for k in metrics_back if k in d},
            "created": d.get("createdTime", ""),
            "notes": {notes_back.get(k, k): v for k, v in dict(d.get("notes") or {}).items()}}))
    except (InputError, TypeError, ValueError):
        return None
