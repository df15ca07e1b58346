"""GAUSS's per-replica SLO-sustainable rate λ*, reused while its inputs stay put.

A GAUSS λ search (Algorithm 1's bisection) costs ~0.1 s of CPU; at 200 deployments and a 30 s
interval, running it every window would be most of an operator's CPU. λ* is a smooth function
of what GAUSS sees: the service times the calibrated SLIM gives at the workload's lengths
(prefill of a prompt; the decode step d(B, C) = p + q·C/B + r·B + s·C, GAUSS §3.3, which at
C = B·context is a + b·B), the length distributions, the batch cap and the KV cache. So a
previous run's λ* is reused when every one of those inputs is within ``REL_TOL`` of the run's
(CVs within ``CV_TOL``): the change in λ* is then of the same order (λ* moves no faster than
the cap where the cap binds, not at all where it does not), well inside the rate headroom
(spec.control.rateHeadroom, 10% by default) the replica count is sized with. A refit that barely
moves the curve, a window whose mean lengths wobble by 1%, a cap BCA moves from 120 to 122 with
them, or another deployment of the same model and GPU with the same SLO all reuse the run. A run
outside tolerance still starts its bisection from the nearest past run's λ*
(:meth:`GaussRuns.nearest`). The p95 sweeps over λ that a window's measured tails are read
against (``decide.measured_rate_factor``, GAUSS §3.7) depend on the same inputs and are kept
and reused the same way, under keys of their own. The store is process memory (lost on restart: the first window after
it runs GAUSS again), bounded per key and in keys.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

REL_TOL = 0.025  # service times and mean lengths: relative
CV_TOL = 0.05  # length coefficients of variation: absolute
MAX_KEYS = 64  # (model, GPU, SLO) combinations kept
MAX_RUNS_PER_KEY = 256


@dataclass(frozen=True)
class GaussInputs:
    """What λ* depends on, reduced to numbers compared with a tolerance.

    ``service_s``: prefill seconds of a mean and a 4× mean prompt, the fixed per-request
    overhead, and the decode step's intercept a = p + q·ctx and slope b = r + s·ctx per
    sequence at the mean context ctx (GAUSS §3.2-3.3). ``lengths``: mean input and output
    tokens. ``cvs``: their coefficients of variation. ``kv_tokens``: the engine's KV cache (0:
    no limit). ``slots``: the batch cap (0: none given)."""

    service_s: tuple[float, ...]
    lengths: tuple[float, float]
    cvs: tuple[float, float]
    kv_tokens: float = 0.0
    slots: float = 0.0

    def relative(self) -> np.ndarray:
        return np.array(self.service_s + self.lengths + (self.kv_tokens, self.slots), dtype=float)


def inputs_for(coef, input_len: float, input_cv: float, output_len: float, output_cv: float,
               kv_tokens: float | None = None, slots: int | None = None) -> GaussInputs:
    """:class:`GaussInputs` of a workload on an engine described by GAUSS ``ServiceCoefficients``."""
    from kneecap.model import gauss

    prefill_s, _ = gauss.prefill_compute_s(coef, np.array([input_len, 4.0 * input_len]), np.zeros(2))
    ctx = input_len + output_len / 2.0  # mean resident context of a decoding sequence
    a_s = coef.decode_step_s + coef.decode_s_per_context_token * ctx  # d(B, B·ctx) = a + b·B (GAUSS §3.3)
    b_s = coef.decode_s_per_seq + coef.decode_s_per_resident_token * ctx
    return GaussInputs((float(prefill_s[0]), float(prefill_s[1]), float(coef.request_overhead_s), float(a_s),
                        float(b_s)), (float(input_len), float(output_len)), (float(input_cv), float(output_cv)),
                       float(kv_tokens or 0.0), float(slots or 0))


class GaussRuns:
    """Past GAUSS results by key, found by input tolerance: λ searches by (model, GPU, form, SLO,
    quantile, seed, TP), the p95 sweeps the measured tails are read against by ("p95-sweep",
    model, GPU, form, seed, TP)."""

    def __init__(self, rel_tol: float = REL_TOL, cv_tol: float = CV_TOL, max_keys: int = MAX_KEYS,
                 max_runs_per_key: int = MAX_RUNS_PER_KEY):
        self.rel_tol, self.cv_tol = rel_tol, cv_tol
        self.max_keys, self.max_runs = max_keys, max_runs_per_key
        self._runs: OrderedDict[tuple, tuple[np.ndarray, np.ndarray, list]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def _deviation(self, key: tuple, inputs: GaussInputs):
        entry = self._runs.get(key)
        if entry is None:
            return None
        self._runs.move_to_end(key)
        rel, cvs, results = entry
        x = inputs.relative()
        # largest relative deviation per past run; a zero input matches only a (near-)zero one
        dev = np.max(np.abs(rel - x) / np.maximum(np.maximum(np.abs(rel), np.abs(x)), 1e-12), axis=1)
        return dev, np.max(np.abs(cvs - np.array(inputs.cvs)), axis=1), results

    def find(self, key: tuple, inputs: GaussInputs):
        """The result of the closest past run whose inputs are all within tolerance, or None."""
        found = self._deviation(key, inputs)
        ok = None if found is None else (found[0] <= self.rel_tol) & (found[1] <= self.cv_tol)
        if ok is None or not ok.any():
            self.misses += 1
            return None
        self.hits += 1
        return found[2][int(np.argmin(np.where(ok, found[0], np.inf)))]

    def nearest(self, key: tuple, inputs: GaussInputs):
        """The result of the past run of ``key`` with the closest inputs, however far (None: no run):
        a warm start for the next run, not an answer."""
        found = self._deviation(key, inputs)
        return None if found is None else found[2][int(np.argmin(found[0] + found[1]))]

    def add(self, key: tuple, inputs: GaussInputs, result) -> None:
        rel, cvs = inputs.relative()[None, :], np.array(inputs.cvs, dtype=float)[None, :]
        if key in self._runs:
            old_rel, old_cvs, results = self._runs.pop(key)
            rel, cvs = np.vstack([old_rel, rel])[-self.max_runs:], np.vstack([old_cvs, cvs])[-self.max_runs:]
            results = (results + [result])[-self.max_runs:]
        else:
            results = [result]
        self._runs[key] = (rel, cvs, results)
        while len(self._runs) > self.max_keys:
            self._runs.popitem(last=False)

    def clear(self) -> None:
        self._runs.clear()
        self.hits = self.misses = 0
