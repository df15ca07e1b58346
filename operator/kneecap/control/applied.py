"""The record of what kneecap applied to a pool, and when: `kneecap.io/applied` on the Deployment.

The record travels in the same Deployment patch as the settings, so the cooldown and the step
limit survive a status write that fails after the patch, and an operator restart. The status
(``status.applied``) is written after the patch and read back from the newest record: a
Deployment's annotation wins over a status that is missing or older. Pure.
"""

from __future__ import annotations

import json
from typing import Iterable

from kneecap.control import status

APPLIED_ANNOTATION = "kneecap.io/applied"
RECORD_KEYS = ("maxNumSeqs", "gpuMemoryUtilization", "kvCacheMemoryBytes", "replicas", "time", "reason", "restart")


def annotation_patch(record: dict) -> dict:
    """The metadata part of a Deployment merge patch that stores ``record`` (JSON, the keys of
    RECORD_KEYS that it has)."""
    body = json.dumps({k: record[k] for k in RECORD_KEYS if record.get(k) is not None}, sort_keys=True,
                      separators=(",", ":"))
    return {"metadata": {"annotations": {APPLIED_ANNOTATION: body}}}


def from_deployment(deploy: dict | None) -> dict | None:
    """The record in a Deployment's annotation, or None (absent, not JSON, or no readable time)."""
    raw = (((deploy or {}).get("metadata") or {}).get("annotations") or {}).get(APPLIED_ANNOTATION)
    try:
        record = json.loads(raw) if raw else None
        if not isinstance(record, dict) or status.parse_iso(record.get("time")) is None:
            return None
    except (ValueError, TypeError):
        return None
    return {k: record[k] for k in RECORD_KEYS if k in record}


def time_s(record: dict | None) -> float | None:
    try:
        return status.parse_iso((record or {}).get("time"))
    except (ValueError, TypeError):
        return None


def newest(status_applied: dict | None, record: dict | None) -> dict:
    """status.applied, replaced by the Deployment's record when that one is newer (the status
    write after the patch failed, or the status was lost)."""
    status_applied = dict(status_applied or {})
    t_status, t_record = time_s(status_applied), time_s(record)
    if t_record is not None and (t_status is None or t_record > t_status):
        return {**status_applied, **record}
    return status_applied


def last_applied_s(status_applied: dict | None, records: Iterable[dict | None]) -> float | None:
    """When kneecap last changed any pool of the deployment: the newest of status.applied
    and the pools' records (one cooldown for the whole deployment)."""
    times = [t for t in [time_s(status_applied), *map(time_s, records)] if t is not None]
    return max(times) if times else None
