"""A pool's observation from its pods' scrapes, and Observation <-> Kubernetes status dicts.

Pods are merged at the level of their window deltas, not of finished observations: rates and
counts add, per-request distributions merge their histogram buckets (so the pool's p95 is the
p95 of all the pool's requests, which no average of per-pod p95s gives), and per-pod
quantities (batch, KV usage, KV capacity, memory settings) are averaged over pods.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from kneecap.naming import status_key
from kneecap.observe.observation import NoObservation, Observation, Reason
from kneecap.observe.scrape import Snapshot
from kneecap.observe.window import WindowDeltas, combine, window_deltas

@dataclass(frozen=True)
class PoolObservation:
    """The pool's observation (or why none), and which pods were left out and why."""

    observation: Observation | NoObservation
    excluded: Mapping[str, NoObservation]  # pod url -> reason


def observe_pool(windows: Sequence[tuple[Snapshot, ...]]) -> PoolObservation:
    """Merge several pods' windows ``(prev, cur)`` or ``(prev, cur, between)`` into one pool
    observation (``between``: intermediate scrapes whose gauges join the averages).

    A pod whose window is broken (counter reset, missing metric, truncated, ...) is left out
    and named in ``excluded``; the pool observation comes from the others.
    """
    parts: list[WindowDeltas] = []
    excluded: dict[str, NoObservation] = {}
    for i, (prev, cur, *rest) in enumerate(windows):
        d = window_deltas(prev, cur, rest[0] if rest else ())
        if isinstance(d, NoObservation):
            excluded[cur.url or f"pod{i}"] = d
        else:
            parts.append(d)
    if not parts:
        reasons = list(excluded.values())
        return PoolObservation(reasons[0] if reasons else NoObservation(Reason.NO_PODS), excluded)
    return PoolObservation(combine(parts), excluded)


# --- Kubernetes status dicts ---------------------------------------------------------------
_TO_CAMEL = {f.name: status_key(f.name) for f in fields(Observation)}
_FROM_CAMEL = {v: k for k, v in _TO_CAMEL.items()}
# keys earlier versions wrote → the current ones: an upgraded operator reads the status (ring,
# workload) its predecessor wrote
EARLIER_KEYS = MappingProxyType({"inputLengthCV": "inputLengthCoefficientOfVariation",
                                 "outputLengthCV": "outputLengthCoefficientOfVariation"})


def with_current_keys(data: Mapping[str, Any], earlier: Mapping[str, str] = EARLIER_KEYS) -> dict[str, Any]:
    """``data`` with the keys of earlier versions renamed to the current ones (``earlier``:
    old → new); where both are present the current key's value is kept."""
    return {earlier.get(k, k): v for k, v in data.items() if not (k in earlier and earlier[k] in data)}


def to_status(obs: Observation) -> dict[str, Any]:
    """Plain JSON-able dict with API-convention camelCase keys (``ttftP95Seconds``); ``None`` fields are omitted."""
    return {_TO_CAMEL[k]: getattr(obs, k) for k in _TO_CAMEL if getattr(obs, k) is not None}


def from_status(data: Mapping[str, Any]) -> Observation:
    """Inverse of :func:`to_status` (the keys of earlier versions read too). Raises ValueError
    naming an unknown, missing or non-numeric key."""
    data = with_current_keys(data)
    unknown = set(data) - set(_FROM_CAMEL)
    if unknown:
        raise ValueError(f"observation: unknown keys {sorted(unknown)}")
    return numbers_from_status(Observation, data, _TO_CAMEL, ints=("pods", "batch_samples"))


def numbers_from_status(cls, data: Mapping[str, Any], keys: Mapping[str, str], ints: tuple[str, ...] = ()):
    """``cls`` (a dataclass of numbers) from a status dict: field ``name`` read at ``keys[name]``;
    a field defaulting to None may be absent. Raises ValueError naming a missing or non-finite key."""
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        key = keys[f.name]
        if key not in data:
            if f.default is None:
                continue
            raise ValueError(f"observation.{key}: missing")
        v = data[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"observation.{key}: expected a finite number, got {v!r}")
        kwargs[f.name] = int(v) if f.name in ints else float(v)
    return cls(**kwargs)
