"""Give the freed pages of the C heap back to the operating system, on a schedule.

GAUSS's λ searches and SLIM's refits allocate and free numpy arrays of megabytes each. glibc's
malloc serves a large block with its own mmap until the first such block is freed; from then on
its mmap threshold follows the largest block freed (up to 32 MiB, mallopt(3) M_MMAP_THRESHOLD),
so later arrays come from the heap, and what they free stays resident for as long as anything
lives above it. The process then holds the peak of every planning burst as if it were in use,
which is what a container's memory usage and limit see. ``malloc_trim(0)`` (malloc_trim(3),
glibc ≥ 2.8) returns every whole free page of every arena with madvise(MADV_DONTNEED) and costs
a walk of the free lists, so the operator calls it once per control tick rather than fixing
the threshold (which would mmap and fault in every large temporary of every λ search). Where
the C library has no ``malloc_trim`` (musl, macOS) nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import logging

log = logging.getLogger(__name__)


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the process's C library has none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_freed_heap() -> bool:
    """Return the heap's free pages to the OS; False where the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


async def release_periodically(interval_s: float) -> None:
    """:func:`release_freed_heap` every ``interval_s`` until cancelled (the operator's cleanup)."""
    if _malloc_trim() is None:
        log.info("the C library has no malloc_trim: freed heap pages stay with the process")
        return
    while True:
        await asyncio.sleep(interval_s)
        release_freed_heap()
