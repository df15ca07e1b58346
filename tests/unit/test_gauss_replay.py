"""gauss.replay: GAUSS on a given trace (measured arrivals and lengths instead of draws)."""

from __future__ import annotations

import numpy as np
import pytest

from kneecap.errors import InputError
from kneecap.model import gauss

COEF = gauss.ServiceCoefficients(prefill_s_per_token=1e-4, decode_step_s=0.02, decode_s_per_seq=1e-3,
                                 request_overhead_s=0.005)


def test_isolated_requests_pay_their_own_prefill_and_decode_alone():
    arrival = np.array([0.0, 100.0, 200.0])  # far apart: nobody queues or shares a batch
    inp, out = np.array([100, 1000, 1500]), np.array([10, 50, 1])
    r = gauss.replay(arrival, inp, out, COEF, rng=np.random.default_rng(0), limits=None)
    compute, n = gauss.prefill_compute_s(COEF, inp, np.zeros(3))
    lo = compute + n * COEF.decode_step_s + COEF.request_overhead_s
    # the residual of an engine step in flight adds at most one step at B̄ ≈ 0
    assert np.all(r.ttft_s >= lo - 1e-12) and np.all(r.ttft_s <= lo + 1e-3)
    assert r.tbt_s[2] == -1.0  # one output token: no TBT
    assert r.tbt_s[:2] == pytest.approx(gauss.decode_step_s(COEF, 1.0, 0.0), rel=0.02)
    assert r.e2e_s[:2] == pytest.approx(r.ttft_s[:2] + (out[:2] - 1) * r.tbt_s[:2])
    assert r.rate_rps == pytest.approx(2 / 200.0)


def test_a_burst_packs_behind_the_first_prompt_and_the_batch_cap_delays_the_last():
    arrival = np.arange(6) * 1e-6
    inp, out = np.full(6, 200), np.full(6, 100)
    free = gauss.replay(arrival, inp, out, COEF, rng=np.random.default_rng(0), limits=gauss.EngineLimits(max_num_seqs=8))
    capped = gauss.replay(arrival, inp, out, COEF, rng=np.random.default_rng(0), limits=gauss.EngineLimits(max_num_seqs=2))
    first = arrival + free.ttft_s
    # the first prompt runs alone; the five that waited for it share the next step (5·200 ≤ 2048)
    assert np.ptp(first[1:]) < 1e-9 and first[1] > first[0]
    # two seats: the last pair waits for two whole decode windows of the pairs before it
    assert capped.ttft_s[-1] > capped.ttft_s[0] + 2 * 99 * gauss.decode_step_s(COEF, 1.0, 0.0)
    assert capped.ttft_s[-1] > 3 * free.ttft_s[-1]


@pytest.mark.parametrize("kw, field", [(dict(arrival_s=[1.0, 0.0]), "arrival_s"),
                                       (dict(input_tokens=[5]), "input_tokens"),
                                       (dict(cached_tokens=[10, 0]), "cached_tokens")])
def test_bad_traces_name_the_field(kw, field):
    args = dict(arrival_s=[0.0, 1.0], input_tokens=[10, 10], output_tokens=[5, 5], **{})
    args.update(kw)
    with pytest.raises(InputError) as exc:
        gauss.replay(args.pop("arrival_s"), args.pop("input_tokens"), args.pop("output_tokens"), COEF,
                     rng=np.random.default_rng(0), **args)
    assert exc.value.field == field
