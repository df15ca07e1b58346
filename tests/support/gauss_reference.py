"""Reference values for the GAUSS tests: seeded generators, Erlang C, one engine's service
coefficients and a workload (shared by tests/unit/test_gauss.py and test_gauss_limits.py)."""

from __future__ import annotations

import math

import numpy as np

from kneecap.model import gauss


def rng(seed=0):
    return np.random.default_rng(seed)


def erlang_c(k: int, a: float) -> float:
    """Textbook Erlang C: probability that an arrival waits in M/M/k with offered load a = λ/μ."""
    head = sum(a**i / math.factorial(i) for i in range(k))
    tail = a**k / math.factorial(k) * k / (k - a)
    return tail / (head + tail)


COEF = gauss.ServiceCoefficients(prefill_s_per_token=3e-5, prefill_s_per_attended_token=1e-9,
                                 prefill_s_per_chunk=2e-3, decode_step_s=0.012, decode_s_per_context_token=1e-6,
                                 decode_s_per_seq=5e-4, decode_s_per_resident_token=4e-8, chunk_tokens=512,
                                 request_overhead_s=0.01)
WL = gauss.Workload(gauss.LogNormalLength(800, 1.0), gauss.LogNormalLength(150, 1.0))
