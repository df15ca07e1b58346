"""GAUSS with the engine's own limits: batch cap, KV cache, prefix caching (fixed seeds)."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest

from kneecap.errors import InputError
from kneecap.model import gauss
from kneecap.model.arch import get_arch
from kneecap.model.gauss.admission import _admit, _admit_kv
from kneecap.model.hardware import get_gpu
from kneecap.model.memory import memory_split
from tests.support.gauss_reference import COEF, WL, erlang_c, rng


def naive_seat_starts(arrival, service, hold_after, seats):
    """Event by event: a request starts when it has arrived, the prefill slot is free and fewer
    than ``seats`` earlier requests are still running (each runs service + hold_after)."""
    starts, departures, prefill_free = [], [], 0.0
    for a, s, h in zip(arrival, service, hold_after):
        t = max(a, prefill_free)
        while sum(d > t for d in departures) >= seats:
            t = min(d for d in departures if d > t)
        starts.append(t)
        prefill_free = t + s
        departures.append(t + s + h)
    return np.array(starts)


def test_seat_recurrence_matches_an_event_simulation():
    r = rng(4)
    shape = (3, 400)
    arrival = np.cumsum(r.exponential(0.2, shape), axis=1)
    service, after = r.exponential(0.05, shape), r.exponential(1.5, shape)
    no = np.zeros(shape, dtype=bool)
    p, p0, used, switched = _admit(arrival, service, service, no, np.zeros(shape), after, 1, 5)
    for row in range(3):
        np.testing.assert_allclose(p[row], naive_seat_starts(arrival[row], service[row], after[row], 5), atol=1e-9)
    np.testing.assert_allclose(p0, arrival + gauss.lindley_waits(service, np.diff(arrival, axis=1, prepend=0.0)),
                               atol=1e-9)  # p0: the prefill slot alone
    assert np.all(p >= p0) and (p > p0).mean() > 0.2 and not switched.any() and np.array_equal(used, service)
    # the event-by-event KV admission with a cache that never fills is the same recurrence
    kv = _admit_kv(arrival, service, service, no, np.zeros(shape), after, 1, 5, 1e12, np.ones(shape),
                   np.ones(shape), service, service, np.ones(shape))
    np.testing.assert_allclose(kv[0], p, atol=1e-9)
    assert not kv[4].any() and not kv[5].any() and not kv[6].any()


def test_a_full_kv_cache_preempts_the_newest_and_delays_it():
    """Two requests of 600 resident tokens growing 100 tokens/s in a 1300-token cache: the
    second (newest) is preempted when the cache fills, waits for the first to leave, then
    recomputes and finishes late; the first is untouched."""
    one = lambda *v: np.array([v], dtype=float)  # noqa: E731
    out = _admit_kv(one(0.0, 0.1), one(0.2, 0.2), one(0.2, 0.2), np.zeros((1, 2), bool), one(0.0, 0.0),
                    one(2.0, 2.0), 1, 8, 1300.0, one(600.0, 600.0), one(100.0, 100.0), one(0.2, 0.2),
                    one(0.4, 0.4), one(200.0, 200.0))
    p, _, _, _, preemptions, first_delay, decode_delay = (x[0] for x in out)
    assert list(preemptions) == [0, 1] and first_delay[1] == 0.0
    # prefills 0-0.2 and 0.2-0.4; R = 1200 + 100·(t − 0.2) + 100·(t − 0.4) reaches 1300 at t = 0.8,
    # when the second has 40 tokens; the first leaves at 2.2; the second recomputes 600 + 40 tokens
    # (0.2 + 0.2·40/200 s) and decodes its other 160 (1.6 s): it ends at 4.04 instead of 2.4
    assert list(p) == pytest.approx([0.0, 0.2]) and decode_delay[1] == pytest.approx(4.04 - 2.4)


def test_the_cap_moves_the_wait_as_erlang_c_says():
    """Negligible prefill, a step cost that does not depend on the batch and exponential output
    lengths: each seat is held for H ≈ OL·d, exponential, so the running set is M/M/c. The
    wait the cap adds must be Erlang C's: P(wait) = C(c, a), E[W] = C(c, a)·E[H]/(c − a).
    Monte-Carlo tolerance: the 95% CI of the mean is ±3% at 8·10⁵ samples (4 replications)."""
    coef = gauss.ServiceCoefficients(prefill_s_per_token=1e-7, decode_step_s=0.01)
    wl = gauss.Workload(gauss.FixedLength(20), gauss.ExponentialLength(100.0))
    _, _, out = gauss.sample_workload(wl, 4 * 10**6, rng(9))
    hold_s = out.mean() * 0.01  # OL steps of d: the prefill step carries the first token
    c, a = 4, 2.8
    r = gauss.simulate(wl, coef, a / hold_s, rng=rng(2), samples=800_000, replications=4,
                       limits=gauss.EngineLimits(max_num_seqs=c))
    assert r.admission_wait_fraction == pytest.approx(erlang_c(c, a), abs=0.015)
    assert r.admission_wait.mean == pytest.approx(erlang_c(c, a) * hold_s / (c - a), rel=0.05)
    assert r.wait.mean == pytest.approx(r.admission_wait.mean, rel=0.01)  # the prefill slot itself is idle
    assert r.tbt.p99 == pytest.approx(0.01, rel=1e-3)  # the step cost does not grow with the batch
    free = gauss.simulate(wl, coef, a / hold_s, rng=rng(2), samples=200_000, replications=4, limits=None)
    assert free.wait.mean < 1e-3 * r.wait.mean  # without the cap nobody waits


def test_a_tighter_cap_raises_ttft_and_lowers_tpot():
    runs = {cap: gauss.simulate(WL, COEF, 3.0, rng=rng(10), samples=200_000, replications=4,
                                limits=gauss.EngineLimits(max_num_seqs=cap)) for cap in (256, 16, 12)}
    wide, mid, tight = runs[256], runs[16], runs[12]
    assert wide.admission_wait_fraction == 0.0 < mid.admission_wait_fraction < tight.admission_wait_fraction
    assert wide.ttft.p95 < mid.ttft.p95 < tight.ttft.p95 and tight.ttft.p95 > 5 * wide.ttft.p95
    assert wide.tbt.p95 > mid.tbt.p95 > tight.tbt.p95
    assert wide.tbt.p99 > tight.tbt.p99
    assert tight.stable_binding == "batch" and tight.stable_rate_rps < wide.stable_rate_rps
    k2 = gauss.simulate(WL, COEF, 6.0, rng=rng(10), samples=100_000, replications=4, servers=2,
                        limits=gauss.EngineLimits(max_num_seqs=12))
    assert k2.admission_wait_fraction > 0 and k2.ttft.p95 > 2 * wide.ttft.p95


def test_max_num_active_seqs_caps_the_running_set_too():
    a = gauss.simulate(WL, COEF, 3.0, rng=rng(10), samples=50_000, replications=4,
                       limits=gauss.EngineLimits(max_num_seqs=12))
    b = gauss.simulate(WL, COEF, 3.0, rng=rng(10), samples=50_000, replications=4,
                       limits=gauss.EngineLimits(max_num_seqs=256, max_num_active_seqs=12))
    assert gauss.EngineLimits(max_num_seqs=256, max_num_active_seqs=12).slots == 12
    assert asdict(a.ttft) == asdict(b.ttft) and asdict(a.tbt) == asdict(b.tbt)


def test_past_the_cap_the_batch_stage_is_infeasible():
    limits = gauss.EngineLimits(max_num_seqs=12)
    r = gauss.simulate(WL, COEF, 1.0, rng=rng(), samples=20_000, replications=4, limits=limits)
    with pytest.raises(gauss.Infeasible, match=r"^infeasible: batch stage: .* stability limit "
                                               r".*the running set fills max_num_seqs") as exc:
        gauss.simulate(WL, COEF, 1.01 * r.stable_rate_rps, rng=rng(), samples=20_000, replications=4, limits=limits)
    assert exc.value.stage == "batch"


def test_kv_exhaustion_preempts_and_costs_latency():
    few = gauss.simulate(WL, COEF, 2.4, rng=rng(10), samples=100_000, replications=4,
                         limits=gauss.EngineLimits(kv_capacity_tokens=15_000))
    ample = gauss.simulate(WL, COEF, 2.4, rng=rng(10), samples=100_000, replications=4,
                           limits=gauss.EngineLimits(kv_capacity_tokens=10**8))
    assert ample.preempted_fraction == 0.0 and ample.preemption_mean_s == 0.0 and ample.admission_wait.p99 == 0.0
    assert 0.002 < few.preempted_fraction <= few.preemptions_per_request < 0.1
    # a preemption waits for room and recomputes a prompt and what it had: more than a mean prompt's compute
    assert few.preemption_mean_s > float(gauss.prefill_compute_s(COEF, 800.0, 0.0)[0])
    assert few.e2e.mean > ample.e2e.mean and few.ttft.p95 > 1.3 * ample.ttft.p95  # admission waits for room too
    assert few.admission_wait_fraction > 0.01
    assert few.stable_binding == "kv" and few.stable_rate_rps < ample.stable_rate_rps


def test_prefix_caching_lowers_ttft_in_whole_blocks():
    wl = gauss.Workload(gauss.LogNormalLength(1200, 0.5), gauss.LogNormalLength(100, 1.0),
                        cached_tokens=gauss.FixedLength(700))
    kw = dict(rng=rng(3), samples=50_000, replications=4)
    on = gauss.simulate(wl, COEF, 2.0, limits=gauss.EngineLimits(), **kw)
    off = gauss.simulate(wl, COEF, 2.0, rng=rng(3), samples=50_000, replications=4,
                         limits=gauss.EngineLimits(enable_prefix_caching=False))
    assert on.ttft.p50 < off.ttft.p50 - 0.015 and on.ttft.p95 < off.ttft.p95
    # 700 cached tokens hit as 43 blocks of 16 = 688: the same as a 688-token prefix
    blocks = gauss.simulate(gauss.Workload(wl.input_tokens, wl.output_tokens, gauss.FixedLength(688)), COEF, 2.0,
                            limits=gauss.EngineLimits(), rng=rng(3), samples=50_000, replications=4)
    assert asdict(blocks.service) == asdict(on.service)


def test_caps_that_never_bind_reproduce_the_uncapped_result():
    kw = dict(samples=100_000, replications=4)
    free = gauss.simulate(WL, COEF, 3.0, rng=rng(10), limits=None, **kw)
    capped = gauss.simulate(WL, COEF, 3.0, rng=rng(10),
                            limits=gauss.EngineLimits(max_num_seqs=256, kv_capacity_tokens=10**7), **kw)
    for name in ("ttft", "tbt", "wait", "service", "e2e"):
        assert asdict(getattr(free, name)) == asdict(getattr(capped, name)), name
    assert capped.admission_wait_fraction == 0.0 and capped.preempted_fraction == 0.0
    assert free.admission_wait is None and free.limits is None
    k2 = [gauss.simulate(WL, COEF, 6.0, rng=rng(10), servers=2, limits=lim, **kw)
          for lim in (None, gauss.EngineLimits(max_num_seqs=256))]
    assert asdict(k2[0].ttft) == asdict(k2[1].ttft) and asdict(k2[0].tbt) == asdict(k2[1].tbt)


def test_engine_limits_follow_vllms_defaults_and_memory_split():
    llama = get_arch("llama-3.1-8b")
    big, budget = gauss.engine_limits_for(llama, get_gpu("h100-80gb"))
    assert (big.max_num_seqs, budget) == (1024, 8192)  # vLLM V1 on ≥ 70 GiB GPUs
    small, budget = gauss.engine_limits_for(llama, get_gpu("a100-80gb"))
    assert (small.max_num_seqs, budget) == (256, 2048) and small.enable_prefix_caching
    split = memory_split(llama, get_gpu("a100-80gb"), 0.9, 256, 2048)
    assert small.kv_capacity_tokens == split.num_gpu_blocks * 16 == split.kv_capacity_tokens
    lim, _ = gauss.engine_limits_for(llama, get_gpu("a100-80gb"), kv_cache_memory_bytes=10 * 2**30, max_num_seqs=64)
    assert lim.kv_capacity_tokens == (10 * 2**30 // (16 * llama.kv_bytes_per_token)) * 16 and lim.max_num_seqs == 64
    assert gauss.engine_limits_for(llama, get_gpu("a100-80gb"), num_gpu_blocks_override=8)[0].kv_capacity_tokens == 128


@pytest.mark.parametrize("kwargs, field", [
    (dict(max_num_seqs=0), "max_num_seqs"), (dict(max_num_active_seqs=-2), "max_num_active_seqs"),
    (dict(kv_capacity_tokens=0), "kv_capacity_tokens"), (dict(block_size=1.5), "block_size"),
    (dict(enable_prefix_caching="yes"), "enable_prefix_caching"),
])
def test_bad_limits_name_the_field(kwargs, field):
    with pytest.raises(InputError) as exc:
        gauss.EngineLimits(**kwargs)
    assert exc.value.field == field


def test_bad_limit_combinations_name_the_field():
    with pytest.raises(InputError, match="max_num_batched_tokens ≥ max_num_seqs") as exc:
        gauss.simulate(WL, COEF, 1.0, rng=rng(), samples=1000, replications=4,
                       limits=gauss.EngineLimits(max_num_seqs=1024))
    assert exc.value.field == "max_num_batched_tokens"
    with pytest.raises(InputError) as exc:
        gauss.sustainable_rate(WL, COEF, rng=rng(), samples=1000, limits={"max_num_seqs": 8})
    assert exc.value.field == "limits"
    llama, a100 = get_arch("llama-3.1-8b"), get_gpu("a100-80gb")
    for kwargs, field in ((dict(kv_cache_memory_bytes=1000), "kv_cache_memory_bytes"),
                          (dict(gpu_memory_utilization=0.05), "gpu_memory_utilization"),
                          (dict(max_num_batched_tokens=0), "max_num_batched_tokens"),
                          (dict(num_gpu_blocks_override=0), "num_gpu_blocks_override")):
        with pytest.raises(InputError) as exc:
            gauss.engine_limits_for(llama, a100, **kwargs)
        assert exc.value.field == field, kwargs
