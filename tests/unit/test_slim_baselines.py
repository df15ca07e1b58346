"""Baselines (Imai-style LR, LLMVisor-style piecewise): they fit what they can represent."""

import numpy as np
import pytest

from kneecap.errors import InputError
from kneecap.model import baselines


def test_imai_lr_fits_a_latency_linear_in_its_features():
    rng = np.random.default_rng(0)
    m = list(rng.choice(["opt-1.3b", "opt-2.7b", "llama-2-7b"], 60))
    b = rng.uniform(1, 300, 60)
    il = rng.uniform(50, 500, 60)
    ol = rng.uniform(50, 500, 60)
    e2e = 0.5 + 0.004 * ol + 3e-5 * b * ol + 1e-3 * b  # inside the feature span
    thr = b * (il + ol) / e2e
    model = baselines.fit_baseline("imai-lr", m, b, il, ol, thr)
    t, e = model.predict(m, b, il, ol)
    np.testing.assert_allclose(e, e2e, rtol=0.02)
    np.testing.assert_allclose(t, thr, rtol=0.02)


def test_llmvisor_piecewise_finds_the_breakpoint():
    b = np.array([1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512], float)
    il, ol = 200.0, 200.0
    step = 0.004 + 2e-5 * b + 1e-4 * np.maximum(b - 100, 0)  # slope jumps at B = 100
    e2e = ol * step
    model = baselines.fit_baseline("llmvisor-pw", "opt-1.3b", b, il, ol, b * (il + ol) / e2e)
    assert 90 <= model.breakpoint <= 130
    _, e = model.predict("opt-1.3b", b, il, ol)
    np.testing.assert_allclose(e, e2e, rtol=0.05)


def test_baselines_reject_bad_input():
    with pytest.raises(InputError) as exc:
        baselines.fit_baseline("svm", "opt-1.3b", [1], 1, 1, [1.0])
    assert exc.value.field == "baseline"
    with pytest.raises(InputError) as exc:
        baselines.fit_baseline("imai-lr", "opt-1.3b", [1, 2], 10, 10, [1.0])
    assert exc.value.field == "throughput_tok_s"
