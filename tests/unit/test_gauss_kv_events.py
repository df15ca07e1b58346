"""The compiled admissions (kneecap.model.gauss.kv_events) compute the interpreted loops'
recurrences bit for bit: under the KV cache, same starts, preemptions and delays on paths where
the cache binds hard (many preemptions and re-admissions); under the batch cap alone, same
starts on paths where the cap binds; with one and two prefill slots."""

from __future__ import annotations

import numpy as np
import pytest

from kneecap.model.gauss.admission import _admit, _admit_kv
from tests.support.gauss_kv_reference import admit as reference_admit
from tests.support.gauss_kv_reference import admit_kv as reference_admit_kv


def _path(seed: int, chains: int, n: int, kv_tokens: float):
    rng = np.random.default_rng(seed)
    shape = (chains, n)
    arrival = np.cumsum(rng.exponential(0.05, shape), axis=1)
    service = rng.exponential(0.04, shape)
    unshared = service * rng.uniform(1.0, 1.5, shape)
    shared = rng.random(shape) < 0.3
    lag = np.where(shared, rng.exponential(0.01, shape), 0.0)
    steps = np.floor(rng.lognormal(5.0, 0.8, shape))
    steps[:, ::17] = 0.0  # one-token outputs: no decode, no KV growth
    tbt = rng.uniform(0.01, 0.05, shape)
    decode = steps * tbt
    prompt = np.floor(rng.lognormal(6.5, 0.7, shape)) + 8.0
    growth = np.where(steps > 0, 1.0 / tbt, 0.0)
    redo_first = service * 1.1
    redo_last = redo_first + steps * 0.001
    return (arrival, service, unshared, shared, lag, decode), (prompt, growth, redo_first, redo_last, steps), kv_tokens


@pytest.mark.parametrize("servers", [1, 2])
@pytest.mark.parametrize("kv_tokens", [4_000.0, 20_000.0, 1e12])
def test_compiled_admission_equals_the_interpreted_loop(servers, kv_tokens):
    path, kv_inputs, kv = _path(7 + servers, chains=3, n=600, kv_tokens=kv_tokens)
    slots = 24
    got = _admit_kv(*path, servers, slots, kv, *kv_inputs)
    want = reference_admit_kv(*path, servers, slots, kv, *kv_inputs)
    names = ("start", "start without cap", "service", "switched", "preemptions", "first-token delay", "decode delay")
    for name, g, w in zip(names, got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w), name
    preemptions = got[4]
    if kv_tokens < 1e12:  # the tight caches exercise preemption and re-admission
        assert preemptions.sum() > 50 and (got[5] > 0).any() and (got[6] > 0).any()
    else:
        assert not preemptions.any()
    assert got[3].any()  # some requests the limits held back lost their shared step


@pytest.mark.parametrize("servers", [1, 2])
@pytest.mark.parametrize("slots", [4, 24, 100_000])
def test_compiled_cap_admission_equals_the_interpreted_loop(servers, slots):
    path, _, _ = _path(3 + servers, chains=3, n=800, kv_tokens=0.0)
    got = _admit(*path, servers, slots)
    want = reference_admit(*path, servers, slots)
    for name, g, w in zip(("start", "start without cap", "service", "switched"), got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w), name
    held = got[0] > got[1]  # requests the cap made wait beyond the prefill slots
    if slots < 100_000:
        assert held.sum() > 100 and got[3].any()
    else:
        assert not held.any() and not got[3].any()
