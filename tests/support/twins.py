"""Real HTTP servers for operator tests: `kneecap twin` processes and `kneecap load` clients.

The twin runs `time_scale` times faster than the wall clock, but only as fast as the CPU lets
it: on a busy machine it falls behind. `TwinTime` puts an operator test on the twins' own clock,
as the demo does (kneecap.demo.clock): the operator's `now` is a `TwinClock` that follows the
twins, each scrape is stamped with the twin's simulated time from the same /metrics body, and
the load is paced on the twin's clock (`kneecap load --sim-clock`), so every rate, window and
cooldown is in the twin's seconds however far it lags, and waits are counted in them too.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from kneecap.demo.clock import (  # noqa: F401 (free_port re-exported)
    SIM_TIME_GAUGE, TwinClock, free_port, twin_time_scrape,
)
from kneecap.sim.loadgen import arrival_times
from kneecap.sim.server import SIM_TIME_HEADER

ROOT = Path(__file__).resolve().parents[2]
KNEECAP = [sys.executable, "-m", "kneecap"]


def _wait_http(url: str, timeout_s: float, proc: subprocess.Popen, said) -> None:
    """Until `url` answers 200; `said()`: what the process printed, for the error if it exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {said()}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} not up after {timeout_s}s")


class Twin:
    """One `kneecap twin` process (a stand-in vLLM pod) on a free port of 127.0.0.1, or on the
    `host` and `port` given (a pod's own IP and engine port, on the real control plane)."""

    def __init__(self, model: str, arch: str, gpu: str, max_num_seqs: int, time_scale: float,
                 extra: list[str] | None = None, host: str = "127.0.0.1", port: int | None = None):
        self.host, self.port = host, port if port is not None else free_port()
        self.args = [model, "--arch", arch, "--gpu", gpu, f"--max-num-seqs={max_num_seqs}",
                     "--host", host, "--port", str(self.port), "--time-scale", str(time_scale),
                     *(extra or [])]
        self.proc: subprocess.Popen | None = None
        # a file, not a pipe: a pipe nobody reads blocks the process once it fills
        self.stderr = tempfile.TemporaryFile()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    start_timeout_s = 30.0  # how long its /health may take to answer (a hang bound)

    def start(self, anchor: str | None = None) -> "Twin":
        """Start the process; `anchor`: `TwinClock.anchor()`, to put its clock on that one."""
        env = dict(os.environ, PYTHONPATH=str(ROOT / "operator"))
        anchored = ["--sim-clock-anchor", anchor] if anchor else []
        self.proc = subprocess.Popen([*KNEECAP, "twin", *self.args, *anchored], cwd=ROOT, env=env,
                                     stdout=subprocess.DEVNULL, stderr=self.stderr)
        _wait_http(self.url + "/health", self.start_timeout_s, self.proc, self.stderr_tail)
        return self

    def stderr_tail(self, n_bytes: int = 2000) -> str:
        """The end of what the process wrote to stderr."""
        self.stderr.seek(0, os.SEEK_END)
        self.stderr.seek(max(self.stderr.tell() - n_bytes, 0))
        return self.stderr.read().decode(errors="replace")

    def state(self) -> str:
        """Whether the process runs, or how it ended and what it said (a test's account)."""
        if self.proc is None:
            return "not started"
        code = self.proc.poll()
        return "running" if code is None else f"exited {code}: {self.stderr_tail()}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def load(url: str, rate: float, duration_s: float, input_mean: int = 200, output_mean: int = 400,
         seed: int = 0) -> subprocess.Popen:
    """`kneecap load` in the background (open-loop Poisson arrivals), paced on the wall clock."""
    return _load_process(url, ["--rate", str(rate), "--duration", str(duration_s), "--input-mean", str(input_mean),
                               "--output-mean", str(output_mean), "--seed", str(seed)])


def _load_process(url: str, args: list[str], stderr=subprocess.DEVNULL) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "operator"))
    return subprocess.Popen([*KNEECAP, "load", url, *args, "--json"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr)


def _drain(stream, tail: collections.deque) -> None:
    for raw in stream:
        tail.append(raw.decode(errors="replace").strip())


def load_state(proc: subprocess.Popen) -> str:
    """A load process in a line: running or its exit status, and its last stderr lines."""
    rc = proc.poll()
    tail = " / ".join(list(getattr(proc, "stderr_tail", ()))[-3:])
    return f"load {proc.pid} " + ("running" if rc is None else f"exited {rc}") + (f" ({tail})" if tail else "")


class TwinTime:
    """One simulated clock for an operator test and the twins it starts (module docstring).

    A thread reads each twin's clock (the `X-Kneecap-Sim-Time` header of its /health) every
    `poll_s` wall seconds into a `TwinClock`, so the operator's clock moves between scrapes, and
    stops following a twin that is gone (connection refused). Times are simulated seconds;
    `timeout_s` arguments are wall seconds that only bound a hang."""

    def __init__(self, scale: float, poll_s: float = 0.05, scrape_timeout_s: float = 10.0):
        self.scale, self.poll_s, self.scrape_timeout_s = scale, poll_s, scrape_timeout_s
        self.clock = TwinClock(scale, lead_wall_s=4 * poll_s)
        self._urls: list[str] = []
        self._files: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="twin-time", daemon=True)
        self._thread.start()

    def __call__(self) -> float:
        return self.clock()

    def scrape(self):
        """The operator's scrape: stamped with the scraped twin's own clock."""
        return twin_time_scrape(self.clock, timeout_s=self.scrape_timeout_s)

    def served_time(self, url: str, page: str) -> float:
        """The twin's clock in the /metrics `page` it served at `url` (heard by this clock); this
        clock's time when the page has none."""
        found = re.search(rf"^{SIM_TIME_GAUGE}(?:{{[^}}]*}})? (\S+)$", page, flags=re.M)
        if found is None:
            return self()
        sim = float(found.group(1))
        self.clock.heard(url.removesuffix("/metrics"), sim, time.time())
        return sim

    def start(self, twin: Twin) -> Twin:
        """Start `twin` on this clock (held while the process starts: that is the machine's time)."""
        self.clock.hold()
        try:
            twin.start(anchor=self.clock.anchor())
        finally:
            self.clock.release()
        self._urls.append(twin.url)
        return twin

    def _follow(self) -> None:
        while not self._stop.wait(self.poll_s):
            for url in list(self._urls):
                try:
                    with urllib.request.urlopen(url + "/health", timeout=self.scrape_timeout_s) as r:
                        sim = r.headers.get(SIM_TIME_HEADER)
                    if sim is not None:
                        self.clock.heard(url, float(sim), time.time())
                except urllib.error.URLError as exc:
                    if isinstance(exc.reason, ConnectionRefusedError):  # stopped: no longer holds the clock back
                        self._urls.remove(url)
                        self.clock.keep_only(self._urls)
                except (OSError, ValueError):
                    pass  # a slow answer: the clock waits for the next one

    def load(self, url: str, phases: list[tuple[float, float]], input_tokens: int = 200, output_tokens: int = 400,
             seed: int = 0) -> subprocess.Popen:
        """`kneecap load --sim-clock` in the background: Poisson arrivals at each (rate/s, seconds)
        phase in turn, on the twin's clock, from when the process first reads it; returns once
        it has (a process takes the machine's time to start, not the twin's)."""
        rng = np.random.default_rng(seed)
        t0, arrivals = 0.0, []
        for rate_rps, duration_s in phases:
            arrivals.append(t0 + arrival_times(rng, rate_rps, duration_s))
            t0 += duration_s
        fd, path = tempfile.mkstemp(prefix="kneecap-load-", suffix=".csv")
        self._files.append(path)
        with os.fdopen(fd, "w") as f:
            f.write("arrival_s,input_tokens,output_tokens\n")
            f.writelines(f"{a!r},{input_tokens},{output_tokens}\n" for a in np.concatenate(arrivals).tolist())
        proc = _load_process(url, ["--trace", path, "--time-scale", str(self.scale), "--sim-clock", "--no-stream"],
                             stderr=subprocess.PIPE)
        line = proc.stderr.readline()  # "kneecap load: clock at ..." once it has read the twin's clock
        if not line.startswith(b"kneecap load:"):
            proc.wait(10)
            raise RuntimeError(f"kneecap load did not start: {(line + proc.stderr.read()).decode()[-2000:]}")
        # the rest of its stderr read as it comes (a pipe nobody reads blocks the writer once full),
        # its last lines kept for a timeout's account (`load_state`)
        proc.stderr_tail = collections.deque([line.decode(errors="replace").strip()], maxlen=20)
        threading.Thread(target=_drain, args=(proc.stderr, proc.stderr_tail), daemon=True).start()
        return proc

    def wait(self, sim_s: float, timeout_s: float = 60.0) -> None:
        """Sleep until `sim_s` simulated seconds have passed on this clock."""
        end, deadline = self() + sim_s, time.monotonic() + timeout_s
        while self() < end:
            if time.monotonic() > deadline:
                raise AssertionError(f"the twins' clock did not advance {sim_s} s within {timeout_s} s wall")
            time.sleep(self.poll_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for path in self._files:
            os.unlink(path)


async def post_completions(url: str, body: dict, n: int) -> list[dict]:
    """`n` concurrent POSTs of `body` to `url`/v1/completions; their JSON answers (each a 200)."""
    import asyncio

    import aiohttp

    async with aiohttp.ClientSession() as s:
        async def one() -> dict:
            async with s.post(url + "/v1/completions", json=body) as r:
                assert r.status == 200, await r.text()
                return await r.json()
        return list(await asyncio.gather(*(one() for _ in range(n))))
