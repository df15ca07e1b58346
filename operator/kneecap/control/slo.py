"""Whether windows met the declared SLOs: the SLOMet condition's verdict of one window and the
attainment over the ring (the ``slo_attainment`` metric). Pure.
"""

from __future__ import annotations

from typing import Sequence

from kneecap.control import decide, status as status_helpers
from kneecap.control.spec import LLMDeploymentSpec
from kneecap.observe.observation import Observation


def slo_met(spec: LLMDeploymentSpec, o: Observation | status_helpers.RingEntry) -> tuple[bool, str] | None:
    checks = decide.slo_checks(spec, o)
    if not checks:
        return None
    missed = [f"{n} p95 {v:.3g}s > {slo:g}s" for slo, v, n in checks if v > slo]
    share = getattr(o, "slo_missed_fraction", None)  # the requests themselves, from the buckets
    if missed:
        return False, "; ".join(missed) + (f" ({share:.1%} of the window's requests surely missed)"
                                           if share is not None else "")
    return True, ", ".join(f"{n} p95 {v:.3g}s ≤ {slo:g}s" for slo, v, n in checks)


def slo_attainment(spec: LLMDeploymentSpec, ring: Sequence[Observation | status_helpers.RingEntry]) -> float | None:
    """Fraction of the ring's windows whose p95 latencies met every declared SLO (None: no SLO
    declared, or no window measured one)."""
    met = [r[0] for r in (slo_met(spec, o) for o in ring) if r is not None]
    return sum(met) / len(met) if met else None
