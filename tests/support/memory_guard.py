"""A pytest plugin that stops the session, with every thread's stack, when the test process
outgrows a memory limit.

Without it a test whose process balloons (a fresh-clone run beside two CPU burners once grew
pytest to 21 GB in under 20 s during tests/kube/test_auth.py) is killed by the kernel's OOM
killer: the run ends with `Killed`, no test named, no stack, and the control plane and vLLM
server it started are left running. With it the run stops at the limit, names the running test
and prints where each thread was, then the session's fixtures tear down as on Ctrl-C.

Limit: ``KNEECAP_TEST_RSS_LIMIT_BYTES`` (default 8 GiB; 0 turns the guard off).
"""

from __future__ import annotations

import _thread
import faulthandler
import os
import signal
import sys
import threading

import pytest

DEFAULT_LIMIT_BYTES = 8 * 1024**3
POLL_S = 0.25


def rss_bytes() -> int:
    """This process's resident set (Linux: /proc/self/statm, in pages)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class MemoryGuard:
    def __init__(self, limit_bytes: int, capture=None):
        self.limit_bytes = limit_bytes
        self.capture = capture  # pytest's capture manager: the report goes past it, to the real stderr
        self.test: str | None = None
        self.tripped = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="memory-guard", daemon=True)

    def start(self) -> None:
        if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL, None):
            # a session started in the background (`cmd &` in a script) ignores SIGINT, and
            # interrupt_main would then do nothing
            signal.signal(signal.SIGINT, signal.default_int_handler)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            rss = rss_bytes()
            if rss > self.limit_bytes:
                self.tripped.set()
                if self.capture is not None:
                    self.capture.suspend_global_capture()
                out = sys.stderr
                out.write(f"\nmemory guard: the test process holds {rss / 1024**3:.1f} GiB, over its limit of "
                          f"{self.limit_bytes / 1024**3:.1f} GiB (KNEECAP_TEST_RSS_LIMIT_BYTES), during "
                          f"{self.test or 'no test (collection or a fixture)'}; every thread's stack:\n")
                out.flush()
                faulthandler.dump_traceback(file=out, all_threads=True)
                out.flush()
                _thread.interrupt_main()  # KeyboardInterrupt in the main thread: pytest stops the session
                break
        while not self._stop.wait(POLL_S):  # still growing past half as much again: out, before the kernel
            if rss_bytes() > 1.5 * self.limit_bytes:
                sys.stderr.write("memory guard: the session did not stop; exiting\n")
                sys.stderr.flush()
                os._exit(3)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item):
        self.test = item.nodeid
        yield
        self.test = None


def pytest_configure(config: pytest.Config) -> None:
    limit = int(os.environ.get("KNEECAP_TEST_RSS_LIMIT_BYTES", DEFAULT_LIMIT_BYTES))
    if limit > 0 and os.path.exists("/proc/self/statm"):
        guard = MemoryGuard(limit, config.pluginmanager.getplugin("capturemanager"))
        config.pluginmanager.register(guard, "kneecap-memory-guard")
        config._kneecap_memory_guard = guard  # noqa: SLF001 - stopped in unconfigure
        guard.start()


def pytest_unconfigure(config: pytest.Config) -> None:
    guard = getattr(config, "_kneecap_memory_guard", None)
    if guard is not None:
        guard.stop()
