"""A graceful stop that finishes this replica's writes before kopf says goodbye to its peers.

On SIGTERM kopf cancels its root tasks at once: the peering keep-alive removes this replica's
entry (the standby resumes within a second) while a control tick already past its checks is
still sending its writes, so for a moment two replicas act on the same objects. `Drain` is
the order controller-runtime's manager keeps (runnables stop, then the lease is released): on
the signal, no new tick or fleet write starts, the handlers under way finish, and only then is
kopf's stop flag raised, which removes the peering entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

log = logging.getLogger("kneecap.drain")

# how long the handlers under way may run past the signal before kopf stops anyway; with kopf's
# own 5 s for hung tasks it stays within a pod's default 30 s termination grace period
DRAIN_TIMEOUT_S = 15.0


class Drain:
    """Counts the handlers under way; `begin` stops new work, `stopped` is set once they are done."""

    def __init__(self, timeout_s: float = DRAIN_TIMEOUT_S):
        if not timeout_s > 0:
            raise ValueError(f"Drain timeout_s: expected > 0, got {timeout_s!r}")
        self.timeout_s = timeout_s
        self.draining = False
        self._active = 0
        self._idle: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    @property
    def active(self) -> int:
        """Handlers under way (inside `work`)."""
        return self._active

    @contextlib.asynccontextmanager
    async def work(self):
        """Around a handler's body: the stop waits until it leaves."""
        self._active += 1
        try:
            yield
        finally:
            self._active -= 1
            if self._active == 0 and self._idle is not None:
                self._idle.set()

    async def idle(self) -> bool:
        """Wait until no handler is under way, at most ``timeout_s``; False when some still are."""
        if self._active == 0:
            return True
        self._idle = asyncio.Event()
        try:
            async with asyncio.timeout(self.timeout_s):
                while self._active:
                    self._idle.clear()
                    await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def begin(self, stop: asyncio.Event) -> None:
        """Stop new work, then set ``stop`` once the handlers under way are done (at once when
        called again: a second signal does not wait)."""
        if self.draining:
            stop.set()
            return
        self.draining = True
        log.info("stopping: %d handler(s) under way finish before this replica leaves its peers", self._active)
        self._task = asyncio.get_running_loop().create_task(self._stop_when_idle(stop), name="kneecap drain")

    async def _stop_when_idle(self, stop: asyncio.Event) -> None:
        if not await self.idle():
            log.warning("stopping with %d handler(s) still under way after %g s", self._active, self.timeout_s)
        stop.set()

    def install(self, stop: asyncio.Event, signals=(signal.SIGTERM, signal.SIGINT)) -> None:
        """Make ``signals`` begin the drain (replacing kopf's handlers, which stop at once)."""
        loop = asyncio.get_running_loop()
        for sig in signals:
            loop.add_signal_handler(sig, self.begin, stop)
