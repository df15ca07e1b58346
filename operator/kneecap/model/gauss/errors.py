"""What GAUSS refuses: inputs that are not valid (``InputError`` through :func:`_positive` and
:func:`_count`, shared by every GAUSS module) and inputs with no finite answer (:class:`Infeasible`)."""

from __future__ import annotations

import math

import numpy as np

from kneecap.errors import InputError


class Infeasible(Exception):
    """No finite answer: a stage is unstable (ρ ≥ 1) or an SLO is below the service time.

    ``stage`` names the binding stage (``prefill``, ``decode``, ``queue``); ``str()`` starts
    with ``"infeasible: <stage> stage: "``.
    """

    def __init__(self, stage: str, reason: str, **details: float):
        self.stage = stage
        self.reason = reason
        self.details = details
        super().__init__(f"infeasible: {stage} stage: {reason}")


def _positive(field_name: str, value: float, allow_zero: bool = False) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(field_name, f"expected a number, got {value!r}") from None
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise InputError(field_name, f"expected a {'non-negative' if allow_zero else 'positive'} finite number, got {value!r}")
    return v


def _count(field_name: str, value, allow_none: bool = False) -> None:
    """A positive integer (or None where ``allow_none``), else InputError naming the field."""
    if value is None and allow_none:
        return
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(field_name, f"expected a positive integer, got {value!r}")
