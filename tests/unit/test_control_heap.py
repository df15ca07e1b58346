"""The operator gives freed heap pages back to the OS (kneecap.control.heap)."""

import json
import subprocess
import sys

import pytest

from kneecap.control import heap

SCRIPT = r"""
import json, numpy as np
from kneecap.control import heap

def rss_bytes():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))

# a freed 16 MiB array raises glibc's mmap threshold, as a λ search's first temporaries do
big = np.ones(16 * 2**20 // 8)
del big
blocks, pins = [], []
for _ in range(200):  # 200 MiB from the heap now, every page touched ...
    blocks.append(np.ones(2**20 // 8))
    pins.append(np.ones(1024))  # ... each followed by a small block that stays, as live objects do
del blocks  # free, but fenced in by the pins: the heap cannot shrink from its top
before = rss_bytes()
released = heap.release_freed_heap()
print(json.dumps({"before": before, "after": rss_bytes(), "released": released}))
"""


def _glibc() -> bool:
    return heap._malloc_trim() is not None


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _glibc(), reason="malloc_trim is glibc's")
def test_freed_arrays_leave_the_resident_set_when_released():
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    got = json.loads(run.stdout)
    assert got["released"] is True
    mib = 2**20
    # without the release the 200 MiB freed stay resident (the pinned heap cannot shrink) ...
    assert got["before"] > 200 * mib
    # ... and the release hands (nearly) all of them back
    assert got["before"] - got["after"] > 180 * mib


def test_release_is_a_no_op_without_malloc_trim(monkeypatch):
    monkeypatch.setattr(heap, "_malloc_trim", lambda: None)
    assert heap.release_freed_heap() is False
