"""Semantic drift: does a live object still say what kneecap asked for? Pure.

A real API server does not echo a manifest back: it drops empty fields (``env: []``,
``annotations: {}``), fills in defaults (``imagePullPolicy``, ``revisionHistoryLimit``,
probe timings) and rewrites resource quantities in canonical form (``nvidia.com/gpu: 1`` ->
``"1"``, ``cpu: 0.5`` -> ``"500m"``). Exact comparison would then see a change on every pass
and patch forever. Here both sides are normalised (empties dropped, quantities canonical) and
only the fields kneecap sets are compared.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from kneecap.control.quantity import canonical_quantity

_QUANTITY_MAPS = ("limits", "requests")
_QUANTITY_FIELDS = frozenset({"sizeLimit"})  # emptyDir's
# non-pointer Go fields with omitempty: their zero value is not stored, so it equals absent
_OMITTED_ZEROS = MappingProxyType({"readOnly": False, "initialDelaySeconds": 0})
# pointer-to-struct fields whose empty value means something (``emptyDir: {}`` is a volume
# source): the API server keeps them
_MEANINGFUL_EMPTY = frozenset({"emptyDir"})


def _empty(value: Any, key: str | None = None) -> bool:
    return value is None or value == "" or value == [] or (value == {} and key not in _MEANINGFUL_EMPTY)


def without_empty(obj: Any) -> Any:
    """`obj` without None, empty maps, empty lists and empty strings at map keys (what the API
    server omits); list items are kept (an empty argument is still an argument)."""
    if isinstance(obj, dict):
        out = {k: without_empty(v) for k, v in obj.items()}
        return {k: v for k, v in out.items() if not _empty(v, k)}
    if isinstance(obj, list):
        return [without_empty(v) for v in obj]
    return obj


def _canonical(value: Any) -> Any:
    try:
        return canonical_quantity(value)
    except ValueError:
        return value  # not a quantity: the API would reject it; compare as written


_MISSING = object()


def omitted_zero(key: str, value: Any) -> bool:
    """A non-pointer omitempty field at its zero value (`readOnly: false`): the API server does not store it."""
    zero = _OMITTED_ZEROS.get(key, _MISSING)
    return zero is not _MISSING and type(value) is type(zero) and value == zero


def normalised(obj: Any, _key: str | None = None, _parent: str | None = None) -> Any:
    """`without_empty(obj)` with the values of every ``resources.limits`` / ``resources.requests``
    and ``sizeLimit`` in canonical quantity form, and omitempty zeros (``readOnly: false``) dropped."""
    if isinstance(obj, dict):
        quantities = _key in _QUANTITY_MAPS and _parent == "resources"
        out = {k: _canonical(v) if quantities or k in _QUANTITY_FIELDS else normalised(v, k, _key)
               for k, v in obj.items()}
        return {k: v for k, v in out.items() if not _empty(v, k) and not omitted_zero(k, v)}
    if isinstance(obj, list):
        return [normalised(v, None, _key) for v in obj]
    return obj


def differences(want: Any, live: Any, path: str = "") -> list[str]:
    """Paths where `live` does not carry `want` (both normalised; fields only `live` has are
    server defaults or other writers' and are ignored). Empty: in sync."""
    return _diff(normalised(want), normalised(live), path)


def _diff(want: Any, have: Any, path: str) -> list[str]:
    if isinstance(want, dict):
        if not isinstance(have, dict):
            return [path or "."]
        return [d for k, v in want.items() for d in _diff(v, have.get(k), f"{path}.{k}")]
    if isinstance(want, list):
        if not isinstance(have, list) or len(want) != len(have):
            return [path]
        return [d for i, (w, h) in enumerate(zip(want, have)) for d in _diff(w, h, f"{path}[{i}]")]
    return [] if want == have else [path]


def in_sync(want: Any, live: Any) -> bool:
    return not differences(want, live)
