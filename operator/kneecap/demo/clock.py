"""Simulated time for twins run `time_scale` times faster than the wall clock.

The twin reports every latency in simulated seconds. The operator computes rates as
Δcounter/Δt, so it gets a clock that runs at the twin's speed (`SimClock`) and stamps each
real scrape with it (`scaled_scrape`): the scrape still goes over HTTP to the twin; only the
timestamp is in simulated time.
"""

from __future__ import annotations

import dataclasses
import socket
import time

from kneecap.observe.scrape import scrape


class SimClock:
    """Wall clock sped up `scale` times from the moment it is made."""

    def __init__(self, scale: float):
        self.scale = scale
        self.t0 = time.time()

    def __call__(self) -> float:
        return self.t0 + (time.time() - self.t0) * self.scale


def scaled_scrape(clock: SimClock, timeout_s: float = 2.0):
    async def _scrape(url: str):
        snap = await scrape(url, timeout_s=timeout_s)
        return dataclasses.replace(snap, t_s=clock())
    return _scrape


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
