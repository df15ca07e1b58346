"""Real HTTP servers for operator tests: `kneecap twin` processes and `kneecap load` clients.

The twin runs `time_scale` times faster than the wall clock; `SimClock` and `scaled_scrape`
(kneecap.demo.clock, re-exported here) give the operator a clock at the twin's speed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from kneecap.demo.clock import SimClock, free_port, scaled_scrape  # noqa: F401 (re-exported)

ROOT = Path(__file__).resolve().parents[2]
KNEECAP = [sys.executable, "-m", "kneecap"]


def _wait_http(url: str, timeout_s: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} not up after {timeout_s}s")


class Twin:
    """One `kneecap twin` process (a stand-in vLLM pod) on a free port."""

    def __init__(self, model: str, arch: str, gpu: str, max_num_seqs: int, time_scale: float,
                 extra: list[str] | None = None):
        self.port = free_port()
        self.args = [model, "--arch", arch, "--gpu", gpu, f"--max-num-seqs={max_num_seqs}",
                     "--host", "127.0.0.1", "--port", str(self.port), "--time-scale", str(time_scale),
                     *(extra or [])]
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "Twin":
        env = dict(os.environ, PYTHONPATH=str(ROOT / "operator"))
        self.proc = subprocess.Popen([*KNEECAP, "twin", *self.args], cwd=ROOT, env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _wait_http(self.url + "/health", 30, self.proc)
        return self

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
    """`kneecap load` in the background (open-loop Poisson arrivals)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "operator"))
    return subprocess.Popen([*KNEECAP, "load", url, "--rate", str(rate), "--duration", str(duration_s),
                             "--input-mean", str(input_mean), "--output-mean", str(output_mean),
                             "--seed", str(seed), "--json"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


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
