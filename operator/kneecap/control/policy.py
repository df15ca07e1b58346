"""Guards between a recommendation and a pod restart (DESIGN §4.5). Pure.

Changing --max-num-seqs or the memory flag restarts vLLM pods, so the operator acts only when
the models are trustworthy and the predicted gain is worth a restart: never on a failed scrape
or a bad fit, only with enough observations, no rollout in progress, cooldown elapsed, gain ≥
minImprovement and outside the hysteresis band; the target is clamped to the spec's bounds and
moves at most ×maxStepFactor per step, its cap rounded down to a CUDA-graph capture size (a rise
that rounding would undo is widened to the next capture size: :func:`round_step`). A
change that restarts pods must pay for itself (:mod:`kneecap.control.restart`: tokens gained
over the horizon the workload is expected to hold (read from the window history) > tokens lost
to the restart, else ``RestartNotWorthIt``) and must leave a Ready pod unless
``spec.control.allowDowntime`` (else ``RestartNeedsDowntime``); when either holds the flags,
a replica change is still applied on its own (it restarts nothing), and it does not wait for
the cooldown either (a scale-down is stabilised before it gets here:
:func:`kneecap.control.replica_stabilisation.stabilised_replicas`). Every outcome carries a
CamelCase reason and a message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from kneecap.control.manifests import EngineSettings
from kneecap.control.restart import RestartCost
from kneecap.control.spec import BatchingSpec, ControlSpec, PoolBounds

APPLY = "apply"
HOLD = "hold"


@dataclass(frozen=True)
class Proposal:
    """What the models recommend for one pool, with its predicted benefit over what is live."""

    settings: EngineSettings
    throughput_gain: float  # predicted relative throughput (or goodput) gain, e.g. 0.12
    memory_gain: float = 0.0  # relative GPU memory reservation released, e.g. 0.4


@dataclass(frozen=True)
class GuardState:
    """Facts about the world the guards need."""

    now_s: float
    last_applied_s: float | None
    rollout_in_progress: bool
    n_observations: int
    fit_ok: bool
    fit_message: str = ""
    replicas_external: bool = False
    restart: RestartCost | None = None  # what restarting the pool costs (None: not weighed)


@dataclass(frozen=True)
class Decision:
    action: str  # APPLY | HOLD
    reason: str  # CamelCase, for conditions, Events and the decisions counter
    message: str
    target: EngineSettings  # what would be (or is) applied after clamping and step limiting
    clamped: bool = False
    step_limited: bool = False
    restart: dict | None = None  # the restart's cost and gain (RestartCost.to_status), when weighed


def step_limit(current: int, target: int, factor: float) -> int:
    """Move from current toward target by at most ×factor (or ÷factor)."""
    if current <= 0:
        return target
    hi = math.floor(current * factor)
    lo = math.ceil(current / factor)
    return max(lo, min(hi, target))


def round_step(current: int, stepped: int, destination: int, round_cap: Callable[[int], int]) -> int:
    """The stepped cap rounded (a CUDA-graph capture size), never undoing the step: a rise that
    rounds back to ``current`` or below is widened to the next capture size above ``current``
    (the first value whose rounding exceeds it), provided that is not past ``destination``; if
    none is, the cap stays (no capture size lies between)."""
    rounded = round_cap(stepped)
    if stepped <= current or rounded > current:
        return rounded
    for cap in range(current + 1, destination + 1):
        wider = round_cap(cap)
        if wider > current:
            return wider if wider <= destination else current
    return current


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def guard(
    current: EngineSettings,
    proposal: Proposal,
    control: ControlSpec,
    batching: BatchingSpec,
    replica_bounds: PoolBounds,
    state: GuardState,
    memory_for_cap: Callable[[int], tuple[float, int | None]] | None = None,
    round_cap: Callable[[int], int] | None = None,
    gains_for: Callable[[EngineSettings], tuple[float, float]] | None = None,
    replicas_saved_for: Callable[[EngineSettings], float] | None = None,
) -> Decision:
    """Decide whether to move `current` toward `proposal`. Pure; see the module docstring.

    `memory_for_cap(cap) -> (gpu_memory_utilization, kv_cache_memory_bytes)` recomputes the
    memory setting when the step limit or rounding changes the cap, so KV always matches the
    cap applied. `round_cap(cap)`: the cap the engine runs well (a CUDA-graph capture size).
    `gains_for(settings) -> (throughput_gain, memory_gain)`: the predicted gains of the settings
    applied when step limiting or rounding moves them off the proposal. `replicas_saved_for(settings)`:
    the replicas the SLO needs at `current`'s flags beyond those at `settings`' (GAUSS), asked only
    when a restart is weighed, of the step and of the recommendation it leads to. A restart is then
    weighed on the smaller gain of the step and of the recommendation it leads to: a step that
    brings nothing itself is not taken for its destination, nor one toward a destination that
    does not pay.
    """
    full = proposal
    want = proposal.settings
    hold = lambda reason, msg, target=current: Decision(HOLD, reason, msg, target)  # noqa: E731
    if not state.fit_ok:
        return hold("BadFit", f"calibration not trusted ({state.fit_message or 'fit failed'}); keeping the last good state")
    if state.n_observations < control.min_observations:
        return hold("TooFewObservations",
                    f"{state.n_observations} observations < minObservations {control.min_observations}")

    cap = min(max(want.max_num_seqs, batching.min_max_num_seqs), batching.max_max_num_seqs)
    replicas = current.replicas if state.replicas_external else replica_bounds.clamp(want.replicas)
    clamped = cap != want.max_num_seqs or (not state.replicas_external and replicas != want.replicas)
    limited_cap = step_limit(current.max_num_seqs, cap, control.max_step_factor)
    if round_cap is not None and limited_cap != current.max_num_seqs:
        limited_cap = round_step(current.max_num_seqs, limited_cap, cap, round_cap)
    limited_replicas = replicas if state.replicas_external else step_limit(current.replicas, replicas,
                                                                          control.max_step_factor)
    step_limited = limited_cap != cap or limited_replicas != replicas
    gmu, kvb = want.gpu_memory_utilization, want.kv_cache_memory_bytes
    if limited_cap != want.max_num_seqs and memory_for_cap is not None:
        gmu, kvb = memory_for_cap(limited_cap)
    target = EngineSettings(limited_cap, gmu, kvb, limited_replicas)
    if gains_for is not None and (target.max_num_seqs, target.gpu_memory_utilization) != (
            want.max_num_seqs, want.gpu_memory_utilization):
        proposal = replace(proposal, settings=target, **dict(zip(("throughput_gain", "memory_gain"),
                                                                  gains_for(target))))
    d = lambda action, reason, msg: Decision(action, reason, msg, target, clamped, step_limited)  # noqa: E731
    note = (" (clamped to bounds)" if clamped else "") + (f" (step limited to ×{control.max_step_factor:g})"
                                                          if step_limited else "")

    flags_same = (target.max_num_seqs == current.max_num_seqs
                  and math.isclose(target.gpu_memory_utilization, current.gpu_memory_utilization, abs_tol=1e-3)
                  and target.kv_cache_memory_bytes == current.kv_cache_memory_bytes)
    if flags_same and target.replicas == current.replicas:
        return d(HOLD, "NoChange", f"live settings already match the recommendation{note}")
    asked: dict[EngineSettings, float] = {}  # replicas_saved_for, once per settings

    def saved(settings: EngineSettings) -> float:
        if replicas_saved_for is None:
            return 0
        if settings not in asked:
            asked[settings] = replicas_saved_for(settings)
        return asked[settings]

    within_band = (_rel(target.max_num_seqs, current.max_num_seqs) < control.hysteresis
                   and _rel(target.gpu_memory_utilization, current.gpu_memory_utilization) < control.hysteresis
                   and target.replicas == current.replicas
                   # a few % more memory can be twice the KV cache: a change the SLO's replicas pay for is no noise
                   and not saved(target) > 0)
    if within_band:
        return d(HOLD, "WithinHysteresis",
                 f"change cap {current.max_num_seqs}->{target.max_num_seqs}, memory "
                 f"{current.gpu_memory_utilization:g}->{target.gpu_memory_utilization:g} is inside the "
                 f"{control.hysteresis:.0%} hysteresis band")
    gain = max(proposal.throughput_gain, proposal.memory_gain)
    if gain < control.min_improvement and target.replicas == current.replicas:
        return d(HOLD, "BelowMinImprovement",
                 f"predicted gain {gain:.1%} (throughput {proposal.throughput_gain:+.1%}, memory released "
                 f"{proposal.memory_gain:.1%}) < minImprovement {control.min_improvement:.1%}")
    if state.rollout_in_progress:
        return d(HOLD, "RolloutInProgress", "a rollout of the pool is still in progress")
    if state.last_applied_s is not None and state.now_s - state.last_applied_s < control.cooldown_s:
        left = control.cooldown_s - (state.now_s - state.last_applied_s)
        wait = f"cooldown: {left:.0f}s left of {control.cooldown_s:.0f}s since the last change"
        if target.replicas != current.replicas:  # scaling restarts no pod: it does not wait (module docstring)
            alone = replace(current, replicas=target.replicas)
            return Decision(APPLY, "Recommended", f"replicas {current.replicas}->{alone.replicas}{note}; flag changes "
                                                  f"wait ({wait})", alone, clamped, step_limited)
        return d(HOLD, "Cooldown", wait)
    summary = (f"cap {current.max_num_seqs}->{target.max_num_seqs}, memory {current.gpu_memory_utilization:g}->"
               f"{target.gpu_memory_utilization:g}, replicas {current.replicas}->{target.replicas}; predicted "
               f"throughput {proposal.throughput_gain:+.1%}, memory released {proposal.memory_gain:.1%}{note}")
    rc = state.restart
    if flags_same or rc is None:
        return d(APPLY, "Recommended", summary)
    step_saved = saved(target)
    record = rc.to_status(proposal.throughput_gain, proposal.memory_gain, step_saved)
    full_saved = saved(full.settings) if full is not proposal else step_saved
    if full is not proposal and rc.gain_tokens(full.throughput_gain, full.memory_gain, full_saved) < record["gainTokens"]:
        record = rc.to_status(full.throughput_gain, full.memory_gain, full_saved)
        summary += (f"; the recommendation it steps toward (cap {full.settings.max_num_seqs}) predicts throughput "
                    f"{full.throughput_gain:+.1%}, memory released {full.memory_gain:.1%}")
    numbers = (f"{record['gainTokens']} tokens gained over the {rc.horizon_text}"
               + (f" ({record['replicasSaved']:+d} replica(s) for the SLO at the new flags)"
                  if record["replicasSaved"] else "")
               + f" vs {record['costTokens']} lost restarting {rc.pods} pod(s) × {rc.restart_s:.0f}s "
                 f"({rc.source.lower()})"
               + ("" if rc.saturated else "; neither the cap nor the KV cache limits the pool now, so more "
                                          "capacity at the cap adds no tokens"))
    held = None
    if rc.downtime and not control.allow_downtime:
        held = ("RestartNeedsDowntime",
                f"applying restarts the pool's only serving pod: no pod serves for ~{rc.restart_s:.0f}s; set "
                f"spec.control.allowDowntime, or spec.rollout.maxSurge ≥ 1 where a spare GPU exists ({summary})")
    elif record["gainTokens"] <= record["costTokens"]:
        held = ("RestartNotWorthIt", f"the restart does not pay for itself: {numbers} ({summary})")
    if held is None:
        downtime = f"; downtime ~{rc.restart_s:.0f}s (allowDowntime)" if rc.downtime else ""
        return Decision(APPLY, "Recommended", f"{summary}; the restart pays for itself: {numbers}{downtime}", target,
                        clamped, step_limited, record)
    if target.replicas != current.replicas:  # a replica change alone restarts no pod
        alone = replace(current, replicas=target.replicas)
        return Decision(APPLY, "Recommended", f"replicas {current.replicas}->{alone.replicas} only, flags held "
                                              f"({held[0]}): {held[1]}", alone, clamped, step_limited, record)
    return Decision(HOLD, held[0], held[1], target, clamped, step_limited, record)


def only_replicas_changed(current: EngineSettings, target: EngineSettings) -> bool:
    """True when applying `target` would not restart pods (only the replica count moves)."""
    return replace(current, replicas=target.replicas) == target
