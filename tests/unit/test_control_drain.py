"""The graceful stop (kneecap.control.drain): kopf's stop flag is raised only once the handlers
under way have finished, so a replica's last write comes before it leaves its peers."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest

from kneecap.control.drain import Drain


async def held_open(drain: Drain, release: asyncio.Event) -> asyncio.Task:
    """A handler inside the drain's work() until ``release`` is set (started and inside on return)."""
    async def handler():
        async with drain.work():
            await release.wait()

    task = asyncio.create_task(handler())
    await asyncio.sleep(0)
    return task


def test_the_stop_waits_for_the_handlers_under_way_and_new_work_sees_the_drain():
    async def scenario():
        drain, stop = Drain(timeout_s=30), asyncio.Event()
        order: list[str] = []
        release = asyncio.Event()

        async def handler(name: str):
            async with drain.work():
                await release.wait()
                order.append(f"{name} wrote")

        tasks = [asyncio.create_task(handler(n)) for n in ("tick", "fleet")]
        await asyncio.sleep(0)  # both inside work()
        assert drain.active == 2 and not drain.draining
        drain.begin(stop)
        assert drain.draining  # the timers' stopping() turns True at once: no new tick starts
        await asyncio.sleep(0.05)
        assert not stop.is_set()  # two handlers still under way
        release.set()
        await asyncio.wait_for(stop.wait(), 5)
        order.append("stop")
        await asyncio.gather(*tasks)
        return order, drain.active

    order, active = asyncio.run(scenario())
    assert order == ["tick wrote", "fleet wrote", "stop"] and active == 0


def test_nothing_under_way_stops_at_once_and_a_second_signal_does_not_wait():
    async def scenario():
        idle_drain, idle_stop = Drain(), asyncio.Event()
        idle_drain.begin(idle_stop)
        await asyncio.wait_for(idle_stop.wait(), 1)

        drain, stop = Drain(timeout_s=30), asyncio.Event()
        hold = asyncio.Event()
        task = await held_open(drain, hold)
        drain.begin(stop)
        await asyncio.sleep(0.05)
        first = stop.is_set()
        drain.begin(stop)  # the operator's user asked again: stop now
        second = stop.is_set()
        hold.set()
        await task
        return first, second

    assert asyncio.run(scenario()) == (False, True)


def test_a_handler_that_never_finishes_delays_the_stop_by_the_timeout_only(caplog):
    async def scenario():
        drain, stop = Drain(timeout_s=0.2), asyncio.Event()
        task = await held_open(drain, asyncio.Event())  # never released
        loop = asyncio.get_running_loop()
        began = loop.time()
        drain.begin(stop)
        await asyncio.wait_for(stop.wait(), 5)
        waited = loop.time() - began
        task.cancel()
        return waited

    with caplog.at_level(logging.WARNING, logger="kneecap.drain"):
        waited = asyncio.run(scenario())
    assert 0.2 <= waited < 2.0
    assert "stopping with 1 handler(s) still under way after 0.2 s" in caplog.text


def test_sigterm_begins_the_drain_instead_of_stopping_at_once():
    async def scenario():
        drain, stop = Drain(timeout_s=30), asyncio.Event()
        drain.install(stop, signals=(signal.SIGTERM,))
        release = asyncio.Event()
        wrote = []

        async def tick():
            async with drain.work():
                await release.wait()
                wrote.append(stop.is_set())

        task = asyncio.create_task(tick())
        await asyncio.sleep(0)
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            async with asyncio.timeout(5):
                while not drain.draining:  # the loop runs the signal's handler on a later iteration
                    await asyncio.sleep(0.01)
            held = not stop.is_set()
            release.set()
            await asyncio.wait_for(stop.wait(), 5)
        finally:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)
        await task
        return held, wrote

    assert asyncio.run(scenario()) == (True, [False])  # the tick wrote before the stop flag


def test_a_drain_needs_a_positive_timeout():
    with pytest.raises(ValueError, match="timeout_s: expected > 0, got 0"):
        Drain(timeout_s=0)
