"""The length mix the models are asked about (kneecap.control.workload_estimate): windows of one
mix are pooled, a shift is not, on requests drawn from known log-normal lengths."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kneecap.control import status
from kneecap.control.workload_estimate import POOL_MAX_WINDOWS, pooled
from kneecap.observe.observation import OBSERVATION_FIELDS, Observation

WINDOW_S = 60.0
BASE = Observation(**{f: 0.0 for f in OBSERVATION_FIELDS} | {"pods": 1, "batch_samples": 1, "window_s": WINDOW_S})


def lognormal(rng, mean: float, cv: float, n: int) -> np.ndarray:
    sigma = np.sqrt(np.log1p(cv * cv))
    return rng.lognormal(np.log(mean) - sigma * sigma / 2.0, sigma, n)


def window(t_end_s: float, inp: np.ndarray, out: np.ndarray) -> Observation:
    """The window a pod would report for these finished requests (population moments)."""
    return dataclasses.replace(BASE, t_end_s=t_end_s, finished_requests=float(inp.size),
                               request_rate_rps=inp.size / WINDOW_S, input_len_mean=float(inp.mean()),
                               input_len_cv=float(inp.std() / inp.mean()), output_len_mean=float(out.mean()),
                               output_len_cv=float(out.std() / out.mean()), ttft_p95_s=0.321)


def windows(rng, mixes: list[tuple[float, float]], n: int = 300):
    """One window per (prompt mean, output mean) in ``mixes`` (CVs 1.0 and 0.8), and their requests."""
    drawn = [(lognormal(rng, i, 1.0, n), lognormal(rng, o, 0.8, n)) for i, o in mixes]
    return [window(WINDOW_S * (k + 1), *d) for k, d in enumerate(drawn)], drawn


def test_windows_of_one_mix_pool_and_the_error_shrinks_with_them():
    rng = np.random.default_rng(7)
    single, pooled_err, counts = [], [], []
    for _ in range(200):
        ring, _ = windows(rng, [(1000.0, 250.0)] * 12)
        est, count = pooled(ring[-1], ring)
        counts.append(count)
        single.append(ring[-1].input_len_mean / 1000.0 - 1.0)
        pooled_err.append(est.input_len_mean / 1000.0 - 1.0)
    # the newest windows, up to the bound; a 3σ test splits one mix now and then (heavy tails)
    assert max(counts) == POOL_MAX_WINDOWS and np.mean(np.equal(counts, POOL_MAX_WINDOWS)) > 0.8
    rms = lambda e: float(np.sqrt(np.mean(np.square(e))))  # noqa: E731
    # 300 requests at CV 1: a window's mean is off by ~5.8%; pooled (eight at most, fewer after a split), by about half
    assert rms(single) == pytest.approx(1.0 / np.sqrt(300), rel=0.15)
    assert rms(pooled_err) < 0.6 * rms(single)


def test_pooled_moments_are_those_of_every_request_pooled():
    rng = np.random.default_rng(3)
    ring, drawn = windows(rng, [(1000.0, 250.0)] * 4)
    est, count = pooled(ring[-1], ring)
    assert count == 4
    inp, out = np.concatenate([d[0] for d in drawn]), np.concatenate([d[1] for d in drawn])
    assert est.input_len_mean == pytest.approx(inp.mean(), rel=1e-9)
    assert est.output_len_mean == pytest.approx(out.mean(), rel=1e-9)
    assert est.output_len_cv == pytest.approx(out.std() / out.mean(), rel=1e-9)  # within + between windows
    assert est.finished_requests == 1200  # the requests the lengths are estimated from
    # the rest is the latest window's: its rate, tails and time
    assert (est.request_rate_rps, est.ttft_p95_s, est.t_end_s) == (ring[-1].request_rate_rps, 0.321, ring[-1].t_end_s)


def test_a_shift_of_the_mix_stops_the_pooling():
    rng = np.random.default_rng(5)
    # prompts twice as long from the fifth window on: the estimate is the new mix's alone
    ring, drawn = windows(rng, [(1000.0, 250.0)] * 4 + [(2000.0, 250.0)] * 2)
    est, count = pooled(ring[-1], ring)
    assert count == 2
    assert est.input_len_mean == pytest.approx(np.concatenate([d[0] for d in drawn[-2:]]).mean(), rel=1e-9)
    # the first window of the new mix is taken alone
    est, count = pooled(ring[4], ring[:5])
    assert count == 1 and est == ring[4]
    # longer outputs are a shift too
    ring, _ = windows(rng, [(1000.0, 250.0)] * 4 + [(1000.0, 500.0)])
    assert pooled(ring[-1], ring) == (ring[-1], 1)


def test_idle_windows_are_skipped_and_ring_entries_read():
    rng = np.random.default_rng(11)
    ring, drawn = windows(rng, [(800.0, 300.0)] * 3)
    idle = dataclasses.replace(ring[1], t_end_s=ring[1].t_end_s + 1.0, request_rate_rps=0.0, finished_requests=0.0)
    # what the ring in status keeps of each window (no prompt-length CV: the latest's is used)
    entries = [status.ring_entry_from_status(status.ring_entry(o)) for o in (ring[0], ring[1], idle)]
    est, count = pooled(ring[2], [*entries, ring[2]])
    assert count == 3
    assert est.input_len_mean == pytest.approx(np.concatenate([d[0] for d in drawn]).mean(), rel=1e-5)
    # a latest window with nothing finished is returned as it is
    assert pooled(idle, ring) == (idle, 1)
