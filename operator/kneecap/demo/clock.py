"""Simulated time for twins run `time_scale` times faster than the wall clock.

The twin reports every latency in simulated seconds. The operator computes rates as
Δcounter/Δt, so each scrape (still over HTTP to the twin) is stamped in simulated time.

A twin on a busy CPU runs slower than asked (kneecap.sim.server): its clock waits for its
engine. The demo therefore uses the twins' own clocks: `TwinClock` runs `time_scale` × the
wall clock but never ahead of the slowest twin it has heard from (the operator's `now`, the
load's pacing and the demo's rows all read it), each twin starts on it (`anchor()` →
`kneecap twin --sim-clock-anchor`), and `twin_time_scrape` stamps each scrape with the twin's
`kneecap_twin_sim_time_seconds` from the same /metrics body, so a window's Δcounter/Δt is a
rate on the twin's clock however far it fell behind.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time

from kneecap.observe.scrape import ParseCache, scrape


SIM_TIME_GAUGE = "kneecap_twin_sim_time_seconds"


class TwinClock:
    """`scale` × the wall clock from the moment it is made, held back to the pace of the slowest
    twin it hears from. Each twin's clock is followed from where this clock stood when it was
    first heard (a twin may be ahead: it kept running while this clock was held), each reading
    extrapolated at `scale` for at most `lead_wall_s`, so a reader starved of fresh readings
    waits rather than runs ahead of a twin that lags. Never runs backwards. Thread-safe (the
    operator reads it from its own thread)."""

    def __init__(self, scale: float, lead_wall_s: float = 0.2):
        self.scale = scale
        self.lead_wall_s = lead_wall_s
        self.t0 = time.time()
        self._lock = threading.Lock()
        self._read = (self.t0, self.t0)  # (wall, sim) of the last reading
        self._twins: dict[str, tuple[float, float]] = {}  # twin -> (wall, sim on this clock) when last heard
        self._offsets: dict[str, float] = {}  # twin -> this clock − the twin's, fixed when first heard
        self._holds = 0  # hold() calls not yet released
        self.held_wall_s = 0.0  # wall seconds spent held

    def _now(self, wall: float) -> float:
        last_wall, last_sim = self._read
        sim = last_sim + (0.0 if self._holds else (wall - last_wall) * self.scale)
        for heard_wall, heard_sim in self._twins.values():
            sim = min(sim, heard_sim + min(wall - heard_wall, self.lead_wall_s) * self.scale)
        return max(sim, last_sim)

    def __call__(self) -> float:
        with self._lock:
            wall = time.time()
            if self._holds:
                self.held_wall_s += wall - self._read[0]
            sim = self._now(wall)
            self._read = (wall, sim)
            return sim

    def hold(self) -> None:
        """Stop the clock where it reads now until as many `release()`: while a process of the
        demo's starts (a pod's twin, a load generator), which takes the machine's time, not the
        product's, no simulated time passes for the operator or the load."""
        self()
        with self._lock:
            self._holds += 1

    def release(self) -> None:
        self()
        with self._lock:
            self._holds = max(self._holds - 1, 0)
            if not self._holds:  # the twins ran on meanwhile: follow them from here
                self._twins.clear()
                self._offsets.clear()

    def heard(self, twin: str, sim_s: float, wall_s: float) -> None:
        """Twin `twin`'s clock read `sim_s` at unix time `wall_s` (at the latest)."""
        with self._lock:
            if self._holds:
                return
            if twin not in self._offsets:
                self._offsets[twin] = self._now(time.time()) - sim_s
            self._twins[twin] = (wall_s, sim_s + self._offsets[twin])

    def keep_only(self, twins) -> None:
        """Forget the twins that no longer serve."""
        with self._lock:
            for gone in set(self._twins) - set(twins):
                del self._twins[gone]
                self._offsets.pop(gone, None)

    def anchor(self) -> str:
        """`kneecap twin --sim-clock-anchor` for a twin that starts on this clock now."""
        sim = self()
        return f"{self._read[0]!r}:{sim!r}"


def twin_time_scrape(clock: TwinClock, timeout_s: float = 2.0):
    """A scrape stamped with the twin's own clock (`kneecap_twin_sim_time_seconds` of the same
    body), which the demo's clock also hears; the demo's clock when a body lacks it. The pages
    are parsed with one cache, as the operator's own scrapes are (LoopContext.parse_cache)."""
    cache = ParseCache()

    async def _scrape(url: str):
        snap = await scrape(url, timeout_s=timeout_s, cache=cache)
        sim = next(iter((snap.get(SIM_TIME_GAUGE) or {}).values()), None)
        if sim is None:
            return dataclasses.replace(snap, t_s=clock())
        clock.heard(url.removesuffix("/metrics"), sim, time.time())
        return dataclasses.replace(snap, t_s=sim)
    return _scrape


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
