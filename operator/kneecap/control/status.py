"""Status helpers: Kubernetes-style conditions and the bounded observation ring. Pure.

Conditions follow the API conventions (type, status "True"/"False"/"Unknown", CamelCase
reason, message, observedGeneration, lastTransitionTime); lastTransitionTime only moves when
the status flips, so it says how long a state has held.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from kneecap.naming import status_key
from kneecap.observe.pool import numbers_from_status, with_current_keys

READY = "Ready"
CALIBRATED = "Calibrated"
SLO_MET = "SLOMet"
DEGRADED = "Degraded"
CONFLICT = "Conflict"  # an object kneecap would own exists and is someone else's
API_ERROR = "ApiError"  # an API write of the operator failed (status True until writes succeed again)
ADVISORY = "Advisory"  # spec.targetRef: a target kneecap may not write to (another controller's): it advises only
METRICS_URL_IGNORED = "MetricsURLIgnored"  # a pod's kneecap.io/metrics-url names a host other than its own IP
CONDITION_TYPES = (READY, CALIBRATED, SLO_MET, DEGRADED, CONFLICT, API_ERROR, ADVISORY, METRICS_URL_IGNORED)


def iso(t_s: float) -> str:
    """RFC 3339 UTC timestamp with second precision (as Kubernetes writes them)."""
    return _dt.datetime.fromtimestamp(t_s, tz=_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str | None) -> float | None:
    if not text:
        return None
    return _dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=_dt.timezone.utc).timestamp()


def _status_str(status: bool | str | None) -> str:
    if status is None:
        return "Unknown"
    if isinstance(status, bool):
        return "True" if status else "False"
    if status not in ("True", "False", "Unknown"):
        raise ValueError(f"condition status must be True/False/Unknown, got {status!r}")
    return status


def get_condition(conditions: Iterable[dict] | None, type_: str) -> dict | None:
    return next((c for c in conditions or () if c.get("type") == type_), None)


def set_condition(conditions: list[dict] | None, type_: str, status: bool | str | None, reason: str,
                  message: str, generation: int | None, now_s: float) -> list[dict]:
    """New conditions list with `type_` set; lastTransitionTime kept unless the status flips."""
    st = _status_str(status)
    old = get_condition(conditions, type_)
    ltt = old["lastTransitionTime"] if old and old.get("status") == st and old.get("lastTransitionTime") else iso(now_s)
    new = {"type": type_, "status": st, "reason": reason, "message": message,
           "observedGeneration": generation, "lastTransitionTime": ltt}
    out = [c for c in conditions or () if c.get("type") != type_]
    out.append(new)
    order = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return sorted(out, key=lambda c: order.get(c["type"], len(order)))


def set_conflict(conditions: list[dict] | None, conflicts, generation: int | None, now_s: float) -> list[dict]:
    """The Conflict condition from reconcile's conflicts (objects that exist and are not kneecap's)."""
    return set_condition(conditions, CONFLICT, bool(conflicts), "NotOwned" if conflicts else "NoConflict",
                         "; ".join(c.message for c in conflicts) or "every object kneecap manages is its own",
                         generation, now_s)


def rounded(values: dict[str, Any], digits: int = 6) -> dict[str, Any]:
    """Floats to `digits` significant digits, and those ≥ 10^digits (Unix times, token totals)
    to the millisecond: the ring is re-sent with every status patch and a window's noise is
    percent-level, so the 17-digit reprs only cost bytes. Other values pass through."""
    big = 10.0**digits
    return {k: (round(v, 3) if abs(v) >= big else float(f"{v:.{digits}g}")) if isinstance(v, float) else v
            for k, v in values.items()}


@dataclass(frozen=True)
class RingEntry:
    """What the observation ring keeps of a window's Observation: what SLIM is fitted on (batch,
    lengths, tokens/s per pod), the p95 latencies SLO attainment counts, the rate and when. The
    ring is re-sent with every status write and re-read with every watch event, so it keeps 21 of
    the 44 fields; the whole latest window is ``status.workload``. Field names are
    Observation's, so the fit and the SLO checks read either."""

    t_end_s: float
    window_s: float
    pods: int
    request_rate_rps: float
    mean_batch: float
    max_batch: float
    prompt_tok_s: float
    generation_tok_s: float
    input_len_mean: float
    output_len_mean: float
    output_len_cv: float
    ttft_p95_s: float
    itl_p95_s: float
    e2e_p95_s: float
    mean_batch_little: float | None = None
    kv_capacity_tokens: float | None = None
    tpot_p95_s: float | None = None  # per-request TPOT, where the engine exports it
    ttft_p95_floor_s: float | None = None  # the least each p95 can be given the buckets (a sure miss)
    itl_p95_floor_s: float | None = None
    e2e_p95_floor_s: float | None = None
    tpot_p95_floor_s: float | None = None


RING_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RingEntry))
_RING_KEYS = MappingProxyType({f.name: status_key(f.name) for f in fields(RingEntry)})


def ring_entry(observation, targets: Mapping[str, float | None] | None = None) -> dict[str, Any]:
    """A ring entry (camelCase status keys, rounded) of an Observation; None fields omitted.
    ``targets``: the SLO each p95 field is held to (``{"ttft_p95_s": 1.0, …}``, None where none
    is declared); a p95's floor is then kept only where the p95 exceeds its target, the one case
    a ring entry's floor is read for (a sure miss), so a window within its SLOs costs the status
    no bytes for them. None: every floor kept."""
    def keep(name: str) -> bool:
        if getattr(observation, name) is None:
            return False
        if targets is None or not name.endswith("_p95_floor_s"):
            return True
        p95, target = getattr(observation, name.replace("_floor_s", "_s")), targets.get(name.replace("_floor_s", "_s"))
        return target is not None and p95 is not None and p95 > target
    return rounded({key: getattr(observation, name) for name, key in _RING_KEYS.items() if keep(name)})


def ring_entry_from_status(data: dict[str, Any]) -> RingEntry:
    """Inverse of :func:`ring_entry`. Other keys are ignored (entries written by earlier versions
    carry every Observation field) and their renamed keys read (``outputLengthCV``); raises
    ValueError naming a missing or non-numeric one."""
    return numbers_from_status(RingEntry, with_current_keys(data), _RING_KEYS, ints=("pods",))


def push_observation(ring: list[dict] | None, observation: dict, limit: int) -> list[dict]:
    """Append to the bounded ring (oldest dropped first)."""
    if limit < 1:
        raise ValueError(f"limit must be ≥ 1, got {limit}")
    return (list(ring or []) + [observation])[-limit:]


def condition_true(conditions: Iterable[dict] | None, type_: str) -> bool:
    c = get_condition(conditions, type_)
    return bool(c and c.get("status") == "True")


def ready(deployments: Iterable[dict], *, conflicts: Iterable = (), missing: Iterable[str] = (),
          unschedulable: Iterable[str] = (), detail: str | None = None) -> tuple[bool, str, str]:
    """The Ready condition (status, reason, message) of an LLMDeployment whose pools run as
    ``deployments``: every one has a ready replica, no ``spec.targetRef`` Deployment is
    ``missing`` and none of reconcile's ``conflicts`` is a pool's Deployment that is someone
    else's (a Service that is does not stop the pools serving). ``unschedulable``: why pods stay
    Pending (the reason then); ``detail``: the message instead of the default (what reconcile
    did to each pool). The one rule for Ready: the spec handler and every tick call it."""
    missing, unschedulable, deployments = list(missing), list(unschedulable), list(deployments)
    if missing:
        return False, "TargetMissing", "; ".join(missing)[:900]
    conflict = any(c.kind == "Deployment" for c in conflicts)
    ok = bool(deployments) and not conflict and all(
        int((d.get("status") or {}).get("readyReplicas", 0) or 0) >= 1 for d in deployments)
    if not ok and unschedulable:
        return False, "PodsUnschedulable", "; ".join(unschedulable)[:900]
    return ok, "PodsReady" if ok else "PodsNotReady", (detail or (
        "every pool has a ready replica" if ok else "a pool has no ready replica"))[:900]


def phase_of(conditions: list[dict] | None, invalid: bool = False) -> str:
    """One word for `kubectl get`: Invalid, Conflict, Degraded, Calibrating, Running, Pending."""
    if invalid:
        return "Invalid"
    if condition_true(conditions, CONFLICT):
        return "Conflict"
    if condition_true(conditions, DEGRADED):
        return "Degraded"
    if not condition_true(conditions, READY):
        return "Pending"
    if not condition_true(conditions, CALIBRATED):
        return "Calibrating"
    return "Running"


def compact(d: dict[str, Any]) -> dict[str, Any]:
    """Drop None values (status stays readable; merge-patch would delete those keys anyway)."""
    return {k: v for k, v in d.items() if v is not None}


def replacing(before: Mapping[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """``after`` as a merge patch over ``before`` that replaces each object ``after`` writes: a key
    of ``before``'s object that ``after``'s lacks is sent as null, at every depth. RFC 7386 keeps
    what a patch does not name, so a field a tick no longer sets (a hold that ended, a p95 a window
    did not measure) would otherwise stay in the status for good. Top-level keys ``after`` does
    not name are left to their writers."""
    return {k: _replaced(before.get(k), v) for k, v in after.items()}


def _replaced(old: Any, new: Any) -> Any:
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return new
    return {**{k: None for k in old if k not in new}, **{k: _replaced(old.get(k), v) for k, v in new.items()}}
