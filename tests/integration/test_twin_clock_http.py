"""The twin's own clock, served: a twin asked to run 10⁵× faster than real time cannot (a Python
engine step costs far more than 10⁻⁵ of the GPU step it models), so its clock must wait for its
engine: the exported time falls behind time_scale × the wall clock, and what it reports stays
consistent with it. Each twin is served in process on a loopback port (aiohttp's TestServer).
The demo's clock on its own: tests/unit/test_twin_clock.py.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from kneecap.cli import build_parser
from kneecap.commands.twin import build_server
from kneecap.demo.clock import SIM_TIME_GAUGE, TwinClock, twin_time_scrape
from kneecap.sim.loadgen import run_schedule
from kneecap.sim.server import CATCH_UP_WALL_S, SIM_TIME_HEADER


def _twin(*flags: str):
    return build_server(build_parser("twin").parse_args(
        ["twin", "opt-125m", "--gpu", "l4", "--max-model-len", "1024", "--max-num-seqs", "1", *flags]))


def _gauge(text: str, name: str) -> float:
    return float(next(ln for ln in text.splitlines() if ln.startswith(name + " ")).split()[-1])


async def test_a_twin_that_cannot_keep_up_holds_its_clock_to_its_engine():
    scale = 1e5
    twin = _twin("--time-scale", f"{scale:g}")
    n = 10
    async with TestServer(twin.app()) as srv, ClientSession() as session:
        wall0 = time.monotonic()
        report = await run_schedule(str(srv.make_url("/")), np.zeros(n), np.full(n, 10), np.full(n, 900),
                                    time_scale=scale, session=session)
        wall_s = time.monotonic() - wall0
        async with session.get(srv.make_url("/metrics")) as r:
            text = await r.text()
            header = float(r.headers[SIM_TIME_HEADER])
    assert report.completed == n
    clock_s = _gauge(text, SIM_TIME_GAUGE) - twin.sim_origin_s
    behind_s = _gauge(text, "kneecap_twin_behind_seconds")
    # 9,000 decode steps of one sequence at a time: the clock reached the engine's time, far short
    # of 10⁵ × the wall time they took (only CATCH_UP_WALL_S of it may run ahead of the engine)
    assert wall_s > 5 * CATCH_UP_WALL_S
    assert twin.engine.busy_s <= twin.engine.now_s <= clock_s < 0.5 * wall_s * scale
    assert behind_s > 0.5 * wall_s * scale - clock_s
    # on its own clock the twin served every request: no latency is longer than the time it ran
    e2e_sum = _gauge(text, 'vllm:e2e_request_latency_seconds_sum{engine="0",model_name="opt-125m"}')
    assert 0 < e2e_sum <= n * clock_s
    assert header >= _gauge(text, SIM_TIME_GAUGE)


async def test_an_idle_twin_clock_runs_at_its_time_scale_from_the_anchor():
    twin = _twin("--time-scale", "10", "--sim-clock-anchor", "1000:5000")
    async with TestServer(twin.app()) as srv, ClientSession() as session:
        async with session.get(srv.make_url("/health")) as r:
            before = float(r.headers[SIM_TIME_HEADER])
        async with session.get(srv.make_url("/health")) as r:
            after = float(r.headers[SIM_TIME_HEADER])
    wall_now = time.time()
    # the clock that read 5000 at unix time 1000, ten times faster
    assert before == pytest.approx(5000 + (wall_now - 1000) * 10, abs=30)
    assert after >= before


async def test_demo_scrape_is_stamped_with_the_twins_clock():
    twin = _twin("--time-scale", "10", "--sim-clock-anchor", "1000:5000")
    clock = TwinClock(10.0)
    async with TestServer(twin.app()) as srv:
        snap = await twin_time_scrape(clock)(str(srv.make_url("/metrics")))
    assert snap.t_s == next(iter(snap.get(SIM_TIME_GAUGE).values()))
    assert snap.t_s == pytest.approx(5000 + (time.time() - 1000) * 10, abs=30)
