"""The trace suite's variants change the one property each names and keep the rest: the same
requests in the same order; a rate variant's local rate is the original's times its multiplier;
a length variant's arrivals are the original's."""

from __future__ import annotations

import numpy as np
import pytest

from kneecap.errors import InputError
from kneecap.sim import trace_variants
from kneecap.sim.trace import Trace, read_trace
from tests.support.data import AZURE_CONVERSATION_CSV as AZURE


def poisson_trace(rate_rps: float = 20.0, span_s: float = 3600.0, seed: int = 3) -> Trace:
    rng = np.random.default_rng(seed)
    arrival_s = np.cumsum(rng.exponential(1.0 / rate_rps, int(rate_rps * span_s)))
    arrival_s -= arrival_s[0]
    return Trace(arrival_s, rng.integers(10, 2000, arrival_s.size), rng.integers(1, 500, arrival_s.size), "poisson")


def rate_between(trace: Trace, start_s: float, end_s: float) -> float:
    inside = (trace.arrival_s >= start_s) & (trace.arrival_s < end_s)
    return inside.sum() / (end_s - start_s)


def same_requests(a: Trace, b: Trace) -> bool:
    return len(a) == len(b) and np.array_equal(a.input_tokens, b.input_tokens) and np.array_equal(
        a.output_tokens, b.output_tokens)


def test_diurnal_keeps_the_requests_and_swings_the_rate_from_trough_to_peak():
    base = poisson_trace()
    day = trace_variants.diurnal(base, swing=0.6)
    assert same_requests(base, day) and np.all(np.diff(day.arrival_s) >= 0)
    assert day.span_s == pytest.approx(base.span_s, rel=0.01)  # one whole period: the mean rate is kept
    period_s = base.span_s
    trough = rate_between(day, 0.0, 0.05 * period_s)  # multiplier ≈ 1 − 0.6·cos(≤ 18°) ≈ 0.42
    peak = rate_between(day, 0.475 * period_s, 0.525 * period_s)  # ≈ 1.6
    assert trough == pytest.approx(20.0 * (1 - 0.6 * np.mean(np.cos(np.linspace(0, 0.1 * np.pi, 50)))), rel=0.1)
    assert peak == pytest.approx(20.0 * 1.6, rel=0.06)


def test_bursts_triple_the_rate_inside_their_windows_and_leave_it_between():
    base = poisson_trace()
    burst = trace_variants.bursts(base, factor=3.0, count=3, burst_s=120.0)
    assert same_requests(base, burst)
    # each burst sends the requests of a 360 s window within 120 s: 3× the base rate; what
    # follows comes 240 s earlier per burst before it
    for k, window_start_s in enumerate((np.arange(3) + 0.5) * base.span_s / 3 - 180.0):
        start_s = window_start_s - k * 240.0
        assert rate_between(burst, start_s, start_s + 120.0) == pytest.approx(60.0, rel=0.08)
        assert rate_between(burst, start_s - 200.0, start_s) == pytest.approx(20.0, rel=0.1)
    assert burst.span_s == pytest.approx(base.span_s - 3 * 240.0, rel=0.01)


def test_longer_prompts_and_outputs_multiply_each_request_and_respect_the_maxima():
    base = poisson_trace(span_s=60.0)
    longer = trace_variants.scale_lengths(base, input_factor=4.0)
    assert np.array_equal(longer.arrival_s, base.arrival_s) and np.array_equal(longer.input_tokens,
                                                                                base.input_tokens * 4)
    assert np.array_equal(longer.output_tokens, base.output_tokens)
    clipped = trace_variants.scale_lengths(base, output_factor=4.0, max_output_tokens=1000)
    assert clipped.output_tokens.max() == 1000 and np.array_equal(clipped.output_tokens,
                                                                   np.minimum(base.output_tokens * 4, 1000))


def test_a_mix_shift_keeps_the_first_part_and_draws_measured_pairs_from_the_long_half_after():
    base = read_trace(AZURE)
    shifted = trace_variants.mix_shift(base, at_fraction=0.5, toward="long", seed=1)
    assert np.array_equal(shifted.arrival_s, base.arrival_s)
    before = base.arrival_s < 0.5 * base.span_s
    assert np.array_equal(shifted.input_tokens[before], base.input_tokens[before])
    median = np.median(base.input_tokens)
    assert np.all(shifted.input_tokens[~before] > median)
    measured = set(zip(base.input_tokens.tolist(), base.output_tokens.tolist()))
    assert set(zip(shifted.input_tokens[~before].tolist(), shifted.output_tokens[~before].tolist())) <= measured
    assert shifted.input_tokens[~before].mean() > 1.5 * base.input_tokens[~before].mean()
    again = trace_variants.mix_shift(base, at_fraction=0.5, toward="long", seed=1)
    assert np.array_equal(again.input_tokens, shifted.input_tokens)  # seeded: the same draw


def test_every_suite_variant_runs_on_the_real_trace_and_keeps_its_request_count():
    base = read_trace(AZURE)
    for name, (stresses, variant) in trace_variants.SUITE.items():
        derived = variant(base)
        assert len(derived) == len(base) and stresses and derived.source != base.source, name
        assert np.all(np.diff(derived.arrival_s) >= 0) and np.all(derived.input_tokens >= 1), name


@pytest.mark.parametrize("call, field", [
    (lambda t: trace_variants.diurnal(t, swing=1.0), "swing"),
    (lambda t: trace_variants.diurnal(t, periods=0), "periods"),
    (lambda t: trace_variants.bursts(t, factor=-3.0), "factor"),
    (lambda t: trace_variants.bursts(t, count=0), "count"),
    (lambda t: trace_variants.bursts(t, count=4, burst_s=60.0), "burst_s"),
    (lambda t: trace_variants.scale_lengths(t, input_factor=float("nan")), "input_factor"),
    (lambda t: trace_variants.scale_lengths(t, max_input_tokens=0), "max_input_tokens"),
    (lambda t: trace_variants.mix_shift(t, toward="sideways"), "toward"),
    (lambda t: trace_variants.warp_rate(t, lambda tau: np.where(tau > 10, 0.0, 1.0), "x"), "multiplier"),
])
def test_bad_parameters_are_refused_naming_the_field(call, field):
    with pytest.raises(InputError) as err:
        call(poisson_trace(span_s=600.0))
    assert err.value.field == field
