"""Traces derived from a real one that change one property each, so a policy is judged on more
than the trace it was shaped on (a trace suite).

Every variant keeps the real requests (their count, order and, unless the variant is about
lengths, their token counts) and changes one thing:

* :func:`diurnal`: the arrival rate swings over the trace (a day's peak and trough) — stresses
  scaling up ahead of a rising rate and back down on a falling one;
* :func:`bursts`: the rate jumps to ``factor``× for short windows — stresses reacting within a
  window, and the cost of pods that load after the burst has passed;
* :func:`scale_lengths`: prompts (or outputs) ``factor``× longer — stresses the calibration at
  lengths it never saw, prefill-bound TTFT (long context) or decode-bound TPOT and KV (long outputs);
* :func:`mix_shift`: from a point on, the requests' lengths come from the long (or short) half of
  the trace — stresses noticing that the workload changed (recalibration, a cap that must move).

Rate variants warp time: with a rate multiplier m(τ) > 0 and M(τ) = ∫₀^τ m(s) ds, request i at
original time tᵢ moves to τᵢ = M⁻¹(tᵢ), so the new local rate is the original's times m(τ)
(dN/dτ = dN/dt · dt/dτ). Pure and deterministic (a variant that draws takes a seed).
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Callable, Mapping

import numpy as np

from kneecap.errors import InputError
from kneecap.sim.trace import Trace

GRID_STEPS = 200_000  # the time warp's grid: M is integrated and inverted on it (linear between points)


def _positive(value: float, field: str, *, upper: float | None = None, inclusive_low: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(field, f"expected a finite number, got {value!r}")
    low_ok = value >= 0 if inclusive_low else value > 0
    if not low_ok or (upper is not None and value >= upper):
        bound = f"in [0, {upper:g})" if inclusive_low and upper is not None else (
            f"in (0, {upper:g})" if upper is not None else "positive")
        raise InputError(field, f"expected a number {bound}, got {value!r}")
    return float(value)


def warp_rate(trace: Trace, multiplier: Callable[[np.ndarray], np.ndarray], source: str) -> Trace:
    """The trace with its local arrival rate multiplied by ``multiplier(τ)`` (vectorised, > 0) at
    the new time τ (module docstring)."""
    span_s = trace.span_s
    if span_s <= 0:
        return Trace(trace.arrival_s.copy(), trace.input_tokens, trace.output_tokens, source)
    # M(τ) ≥ min(m)·τ: the grid reaches M = span once τ = span / min(m); found by doubling
    horizon_s = span_s
    for _ in range(64):
        tau_s = np.linspace(0.0, horizon_s, GRID_STEPS + 1)
        m = np.asarray(multiplier(tau_s), dtype=float)
        if m.shape != tau_s.shape or not np.all(np.isfinite(m)) or np.any(m <= 0):
            raise InputError("multiplier", "expected a finite rate multiplier > 0 at every time")
        cumulative_s = np.concatenate(([0.0], np.cumsum((m[1:] + m[:-1]) * 0.5 * np.diff(tau_s))))
        if cumulative_s[-1] >= span_s:
            break
        horizon_s *= 2.0
    arrival_s = np.interp(trace.arrival_s, cumulative_s, tau_s)
    return Trace(np.maximum.accumulate(arrival_s), trace.input_tokens, trace.output_tokens, source)


def diurnal(trace: Trace, swing: float = 0.6, periods: float = 1.0) -> Trace:
    """The rate times 1 − swing·cos(2πτ/P), P = span/periods: from a trough of (1 − swing)× at the
    start to a peak of (1 + swing)× half a period later; over whole periods the span is kept."""
    swing = _positive(swing, "swing", upper=1.0, inclusive_low=True)
    period_s = trace.span_s / _positive(periods, "periods")
    if period_s <= 0:
        return trace
    return warp_rate(trace, lambda tau_s: 1.0 - swing * np.cos(2.0 * np.pi * tau_s / period_s),
                     f"{trace.source} (diurnal ±{swing:.0%}, {periods:g} period(s))")


def bursts(trace: Trace, factor: float = 3.0, count: int = 3, burst_s: float = 300.0) -> Trace:
    """The rate times ``factor`` for ``count`` bursts of ``burst_s`` each, and unchanged between
    them: burst k takes the requests of the original window of ``factor·burst_s`` centred at
    (k + ½)·span/count and sends them within ``burst_s`` (dτ/dt = 1/factor inside, 1 outside), so
    what follows a burst comes ``(factor − 1)·burst_s`` earlier."""
    factor = _positive(factor, "factor")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InputError("count", f"expected a whole number of bursts ≥ 1, got {count!r}")
    burst_s = _positive(burst_s, "burst_s")
    span_s, window_s = trace.span_s, factor * burst_s
    if count * window_s >= span_s:
        raise InputError("burst_s", f"{count} bursts of {burst_s:g} s at ×{factor:g} take {count * window_s:g} s "
                                    f"of the trace's {span_s:g} s")
    starts_s = (np.arange(count) + 0.5) * span_s / count - window_s / 2.0
    # the time inside each window so far, compressed by 1/factor there
    inside_s = np.clip(trace.arrival_s[:, None] - starts_s[None, :], 0.0, window_s).sum(axis=1)
    arrival_s = trace.arrival_s - (1.0 - 1.0 / factor) * inside_s
    return Trace(arrival_s, trace.input_tokens, trace.output_tokens,
                 f"{trace.source} ({count} bursts ×{factor:g} of {burst_s:g} s)")


def scale_lengths(trace: Trace, input_factor: float = 1.0, output_factor: float = 1.0,
                  max_input_tokens: int | None = None, max_output_tokens: int | None = None) -> Trace:
    """Every prompt ``input_factor``× and every output ``output_factor``× as long (rounded, at
    least 1 token, at most the given maxima: a model's context bounds what a real trace can hold)."""
    input_factor = _positive(input_factor, "input_factor")
    output_factor = _positive(output_factor, "output_factor")
    inputs = np.maximum(np.rint(trace.input_tokens * input_factor), 1).astype(np.int64)
    outputs = np.maximum(np.rint(trace.output_tokens * output_factor), 1).astype(np.int64)
    for name, limit in (("max_input_tokens", max_input_tokens), ("max_output_tokens", max_output_tokens)):
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise InputError(name, f"expected a whole number of tokens ≥ 1, got {limit!r}")
    if max_input_tokens is not None:
        inputs = np.minimum(inputs, max_input_tokens)
    if max_output_tokens is not None:
        outputs = np.minimum(outputs, max_output_tokens)
    return Trace(trace.arrival_s, inputs, outputs,
                 f"{trace.source} (prompts ×{input_factor:g}, outputs ×{output_factor:g})")


def mix_shift(trace: Trace, at_fraction: float = 0.5, toward: str = "long", seed: int = 0) -> Trace:
    """From ``at_fraction`` of the span on, each request's (prompt, output) pair is drawn (seeded,
    with replacement) from the trace's requests whose prompt is above (``long``) or at most
    (``short``) the median: the arrivals stay, the length mix moves, and prompt and output stay
    paired as they were measured."""
    at_fraction = _positive(at_fraction, "at_fraction", upper=1.0)
    if toward not in ("long", "short"):
        raise InputError("toward", f"expected long or short, got {toward!r}")
    median = float(np.median(trace.input_tokens))
    pool = np.flatnonzero(trace.input_tokens > median if toward == "long" else trace.input_tokens <= median)
    if pool.size == 0:
        raise InputError("toward", f"no request has a prompt {'above' if toward == 'long' else 'at most'} "
                                   f"the median ({median:g} tokens)")
    after = trace.arrival_s >= at_fraction * trace.span_s
    drawn = np.random.default_rng(seed).choice(pool, size=int(after.sum()), replace=True)
    inputs, outputs = trace.input_tokens.copy(), trace.output_tokens.copy()
    inputs[after], outputs[after] = trace.input_tokens[drawn], trace.output_tokens[drawn]
    return Trace(trace.arrival_s, inputs, outputs,
                 f"{trace.source} (length mix shifted to the {toward} half at {at_fraction:.0%})")


# The suite's variants at their default strength: name → (the property it stresses, the variant).
SUITE: Mapping[str, tuple[str, Callable[[Trace], Trace]]] = MappingProxyType({
    "diurnal": ("a rate that swings from 0.4× to 1.6× over the trace (scaling ahead of it and back)", diurnal),
    "bursts": ("three sudden 3× bursts of 5 min (reaction within a window; pods that load too late)", bursts),
    "long-prompts": ("prompts 4× longer (prefill-bound TTFT, a calibration outside its lengths)",
                     lambda t: scale_lengths(t, input_factor=4.0)),
    "long-outputs": ("outputs 4× longer (decode-bound TPOT, KV pressure: the cap and memory knobs)",
                     lambda t: scale_lengths(t, output_factor=4.0)),
    "mix-shift": ("the length mix moves to the long half of the prompts halfway (recalibration)", mix_shift),
    "code-lengths": ("the length mix of a code-completion service: prompts ×1.5, outputs ×0.1 (prefill-heavy "
                     "steps, TPOT over a few tokens: tails that cross the SLO for minutes, the error budget)",
                     lambda t: scale_lengths(t, input_factor=1.5, output_factor=0.1)),
})
