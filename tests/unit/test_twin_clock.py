"""The demo's clock that follows the twins' clocks (it keeps the slowest twin's pace, never runs
back, holds while held) and the twin's --sim-clock-anchor flag. The twin's own clock, served:
tests/integration/test_twin_clock_http.py.
"""

from __future__ import annotations

import time

import pytest

from kneecap.commands.twin import parse_anchor
from kneecap.demo.clock import TwinClock
from kneecap.errors import InputError


def test_anchor_flag_is_checked():
    assert parse_anchor("1.5:2") == (1.5, 2.0) and parse_anchor(None) is None
    for bad in ("1.5", "a:b", "1:2:3", "inf:0"):
        with pytest.raises(InputError) as exc:
            parse_anchor(bad)
        assert exc.value.field == "sim_clock_anchor"


def test_demo_clock_follows_the_pace_of_the_slowest_twin_and_never_runs_back():
    clock = TwinClock(1000.0, lead_wall_s=0.01)  # a reading counts for 0.01 wall s = 10 simulated s
    clock.heard("a", 500.0, time.time())  # followed from here, whatever its own origin
    c0 = clock()
    time.sleep(0.05)
    c1 = clock()
    assert c0 <= c1 <= c0 + 10.0 + 1e-6  # 50 simulated s of wall time, but a's reading vouches for 10
    clock.heard("a", 501.0, time.time())  # a advanced 1 s: the clock waits for it (never back)
    assert c1 <= clock() <= c0 + 11.0 + 1e-6
    clock.heard("b", 10.0, time.time())
    clock.keep_only(["b"])  # a stopped serving: b sets the pace
    time.sleep(0.05)
    c2 = clock()
    assert c2 <= c0 + 21.0 + 1e-6
    clock.keep_only([])  # no twin left: it runs on from where it was, at its scale, no jump
    time.sleep(0.05)
    assert clock() >= c2 + 40.0


def test_demo_clock_holds_while_held():
    clock = TwinClock(1000.0)
    clock.hold()
    clock.hold()  # two process starts at once
    a = clock()
    time.sleep(0.05)
    clock.release()
    assert clock() == a  # still held once
    clock.release()
    time.sleep(0.05)
    assert clock() > a + 10.0 and clock.held_wall_s >= 0.05
