"""Open-loop load against an OpenAI ``/v1/completions`` server (vLLM or the twin).

Arrivals are a renewal process with rate λ and inter-arrival CV ``burst_cv``: CV 1 is Poisson
(exponential gaps), CV > 1 bursty, CV < 1 smoother; gaps are Gamma(k = 1/CV², θ = 1/(λ·k)),
whose mean is 1/λ and CV is 1/√k. Input and output lengths are log-normal with the given mean
and CV (σ² = ln(1 + CV²), μ = ln(mean) − σ²/2; CV 0 gives the mean exactly), rounded to
whole tokens. Each request asks for exactly its sampled output (``max_tokens``, ``ignore_eos``)
and, by default, sends its prompt as random token ids in [16, 256) (so every server counts the
same prompt length and prefix caching finds nothing to share). TTFT is measured on the stream
at the first chunk carrying a choice (the first token: its text can be empty, a byte-level token
that ends inside a UTF-8 character), E2E at its end.

``time_scale`` X is for the twin run X times faster than real time: rate, duration and every
reported latency are then in simulated seconds (arrivals are sent X times faster; measured
times are multiplied by X).

A schedule can also come from a trace (:mod:`kneecap.sim.trace`, ``run_schedule``): each
request goes out at its arrival instant with its prompt and output lengths. The client's own
lateness (when a send left after its scheduled instant, because this process could not keep
up) is reported as ``send_lateness_s`` (p99 and max).

``sim_clock``: pace the sends on the server's simulated clock instead of the wall clock. A twin
(and the demo's router) answers ``GET /health`` with the header ``X-Kneecap-Sim-Time`` (its
simulated time, seconds); it is polled every ``SIM_CLOCK_POLL_S`` wall seconds and extrapolated
at ``time_scale`` in between, never backwards. A twin that falls behind the wall clock then
still gets the offered rate in its own time, and elapsed time and rates are on its clock
(latencies remain wall × ``time_scale``).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import aiohttp
import numpy as np

from kneecap.errors import InputError
from kneecap.sim.server import SIM_TIME_HEADER

PROMPT_TOKEN_IDS = (16, 256)  # ids every tiny test vocabulary has
SIM_CLOCK_POLL_S = 0.05
LATE_WARN_S = 0.1  # a send this late (in the server's seconds) at p99 means the client fell behind


@dataclass(frozen=True)
class RequestRecord:
    """One request as the client saw it. Times in seconds from the start of the run."""

    prompt_tokens: int
    max_tokens: int
    sent_s: float
    ok: bool
    ttft_s: float | None = None
    e2e_s: float | None = None
    completion_tokens: int = 0
    usage_prompt_tokens: int | None = None  # what the server counted
    error: str | None = None


@dataclass(frozen=True)
class LoadReport:
    """Totals and latency percentiles of one run (seconds: wall × time_scale)."""

    url: str
    model: str
    offered_rate_rps: float
    duration_s: float
    elapsed_s: float
    sent: int
    completed: int
    failed: int
    achieved_rate_rps: float  # completed / elapsed
    prompt_tokens_total: int  # as the server reported in usage (sent lengths if it did not)
    completion_tokens_total: int
    throughput_tok_s: float
    ttft_s: dict = field(default_factory=dict)  # mean, p50, p90, p95, p99
    e2e_s: dict = field(default_factory=dict)
    tpot_s: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict)  # message -> count
    send_lateness_s: dict = field(default_factory=dict)  # p99, max: send instant − scheduled instant
    clock: str = "wall"  # "wall" (× time_scale) or "sim" (the server's X-Kneecap-Sim-Time)
    records: tuple = ()

    @property
    def fell_behind(self) -> bool:
        """Whether the client sent late enough to change the offered load (p99 over LATE_WARN_S)."""
        return bool(self.send_lateness_s) and self.send_lateness_s["p99"] > LATE_WARN_S

    def to_dict(self, with_records: bool = False) -> dict:
        d = asdict(self)
        d["fell_behind"] = self.fell_behind
        if not with_records:
            d.pop("records")
        return d


def sample_lengths(rng: np.random.Generator, n: int, mean: float, cv: float) -> np.ndarray:
    """Log-normal token counts with the given mean and CV (module docstring), each ≥ 1."""
    if not (mean >= 1):
        raise InputError("mean", f"expected a mean length ≥ 1 token, got {mean!r}")
    if not (cv >= 0):
        raise InputError("cv", f"expected a non-negative CV, got {cv!r}")
    if cv == 0:
        return np.full(n, max(1, round(mean)), dtype=int)
    sigma2 = math.log1p(cv * cv)
    x = rng.lognormal(math.log(mean) - sigma2 / 2.0, math.sqrt(sigma2), n)
    return np.maximum(1, np.rint(x)).astype(int)


def arrival_times(rng: np.random.Generator, rate_rps: float, duration_s: float, burst_cv: float = 1.0) -> np.ndarray:
    """Arrival instants in [0, duration) of a Gamma renewal process (module docstring)."""
    if not (rate_rps > 0 and math.isfinite(rate_rps)):
        raise InputError("rate", f"expected a positive finite rate, got {rate_rps!r}")
    if not (duration_s > 0 and math.isfinite(duration_s)):
        raise InputError("duration", f"expected a positive finite duration, got {duration_s!r}")
    if not (burst_cv > 0 and math.isfinite(burst_cv)):
        raise InputError("burst_cv", f"expected a positive CV, got {burst_cv!r}")
    k = 1.0 / (burst_cv * burst_cv)
    expected = rate_rps * duration_s
    n = int(expected + 10 * math.sqrt(expected) * max(1.0, burst_cv) + 16)
    gaps = rng.gamma(k, 1.0 / (rate_rps * k), n)
    t = np.cumsum(gaps)
    while t[-1] < duration_s:  # rare: draw more
        t = np.concatenate([t, t[-1] + np.cumsum(rng.gamma(k, 1.0 / (rate_rps * k), n))])
    return t[t < duration_s]


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    a = np.asarray(values, dtype=float)
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p95": float(np.percentile(a, 95)), "p99": float(np.percentile(a, 99)), "max": float(a.max())}


def client_session(**kwargs) -> aiohttp.ClientSession:
    """The session a load is sent with: unbounded concurrency and no kept-alive connections. A
    server closes an idle connection after its keep-alive timeout (uvicorn: 5 s); a client whose
    event loop is busy may not have read that close yet and send on the dead connection (aiohttp:
    ``ServerDisconnectedError``, a failed request that the server never saw). A fresh loopback
    connection per request costs far less than one token step."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True), **kwargs)


def completions_url(url: str) -> str:
    u = url.rstrip("/")
    if u.endswith("/v1/completions"):
        return u
    if u.endswith("/v1"):
        return u + "/completions"
    return u + "/v1/completions"


async def discover_model(session: aiohttp.ClientSession, url: str) -> str:
    base = completions_url(url)[: -len("/completions")]
    async with session.get(base + "/models") as resp:
        if resp.status != 200:
            raise InputError("model", f"{base}/models answered HTTP {resp.status}; pass the model name")
        data = await resp.json()
    try:
        return data["data"][0]["id"]
    except (KeyError, IndexError, TypeError):
        raise InputError("model", f"{base}/models lists no model; pass the model name") from None


async def _one(session, url, model, prompt_len, max_tokens, t0, token_ids, timeout_s, seed,
               stream: bool = True) -> RequestRecord:
    if token_ids:
        prompt = np.random.default_rng(seed).integers(*PROMPT_TOKEN_IDS, prompt_len).tolist()
    else:
        prompt = " ".join(["hello"] * prompt_len)
    body = {"model": model, "prompt": prompt, "max_tokens": int(max_tokens), "min_tokens": int(max_tokens),
            "ignore_eos": True, "temperature": 0.0, "stream": stream,
            **({"stream_options": {"include_usage": True}} if stream else {})}
    sent = time.perf_counter()
    ttft = None
    chunks = 0
    usage = None
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                text = (await resp.text())[:200]
                return RequestRecord(prompt_len, max_tokens, sent - t0, False, error=f"HTTP {resp.status}: {text}")
            if not stream:
                usage = (await resp.json()).get("usage")
            while stream:
                raw = await resp.content.readline()
                if not raw:
                    break
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                obj = json.loads(payload)
                if obj.get("usage"):
                    usage = obj["usage"]
                for _ in obj.get("choices") or []:
                    chunks += 1
                    if ttft is None:
                        ttft = time.perf_counter() - sent
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        return RequestRecord(prompt_len, max_tokens, sent - t0, False, error=f"{type(exc).__name__}: {exc}"[:200])
    e2e = time.perf_counter() - sent
    completion = int(usage["completion_tokens"]) if usage else chunks
    return RequestRecord(prompt_len, max_tokens, sent - t0, True, ttft, e2e, completion,
                         int(usage["prompt_tokens"]) if usage else None)


def _scaled(r: RequestRecord, time_scale: float, sent_s: float) -> RequestRecord:
    mul = (lambda v: None if v is None else v * time_scale)
    return replace(r, sent_s=sent_s, ttft_s=mul(r.ttft_s), e2e_s=mul(r.e2e_s))


class WallClock:
    """The wall clock sped up ``time_scale`` times, from zero at creation."""

    def __init__(self, time_scale: float):
        self.time_scale = time_scale
        self._t0 = time.perf_counter()

    def __call__(self) -> float:
        return (time.perf_counter() - self._t0) * self.time_scale

    def wall_wait_s(self, ahead_s: float) -> float:
        return ahead_s / self.time_scale


class ServerClock:
    """The server's simulated clock (``X-Kneecap-Sim-Time`` on ``GET /health``), polled and
    extrapolated at ``time_scale`` between polls; never runs backwards (module docstring)."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, time_scale: float,
                 poll_s: float = SIM_CLOCK_POLL_S):
        self.session, self.time_scale, self.poll_s = session, time_scale, poll_s
        self.url = completions_url(base_url)[: -len("/v1/completions")] + "/health"
        self._sim_s = self._wall_s = 0.0
        self._last = -math.inf
        self._task: asyncio.Task | None = None

    async def read(self) -> float:
        async with self.session.get(self.url, timeout=aiohttp.ClientTimeout(total=10)) as resp:
            value = resp.headers.get(SIM_TIME_HEADER)
        try:
            sim_s = float(value)
        except (TypeError, ValueError):
            raise InputError("sim_clock", f"{self.url} sent no {SIM_TIME_HEADER} header "
                                          f"(got {value!r}); only a kneecap twin or the demo's router has one") from None
        self._sim_s, self._wall_s = sim_s, time.perf_counter()
        return sim_s

    async def start(self) -> "ServerClock":
        await self.read()
        self._task = asyncio.create_task(self._poll())
        return self

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.read()
            except (aiohttp.ClientError, asyncio.TimeoutError, InputError):
                pass  # extrapolate from the last reading until the next one answers

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def __call__(self) -> float:
        now = self._sim_s + (time.perf_counter() - self._wall_s) * self.time_scale
        self._last = max(self._last, now)
        return self._last

    def wall_wait_s(self, ahead_s: float) -> float:
        return min(ahead_s / self.time_scale, self.poll_s)


async def run_load(url: str, *, rate_rps: float, duration_s: float, input_mean: float, output_mean: float,
                   input_cv: float = 0.0, output_cv: float = 0.0, burst_cv: float = 1.0, seed: int = 0,
                   **kwargs) -> LoadReport:
    """Send open-loop renewal-process load for ``duration_s`` seconds, wait for every answer, and
    report (``run_schedule``'s keywords pass through)."""
    rng = np.random.default_rng(seed)
    arrivals = arrival_times(rng, rate_rps, duration_s, burst_cv)
    n = len(arrivals)
    prompts = sample_lengths(rng, n, input_mean, input_cv)
    outputs = sample_lengths(rng, n, output_mean, output_cv)
    return await run_schedule(url, arrivals, prompts, outputs, seed=seed, offered_rate_rps=rate_rps,
                              duration_s=duration_s, **kwargs)


async def run_schedule(url: str, arrivals_s, prompts, outputs, *, seed: int = 0,
                       offered_rate_rps: float | None = None, duration_s: float | None = None,
                       max_concurrency: int | None = None, model: str | None = None, token_ids: bool = True,
                       timeout_s: float = 600.0, time_scale: float = 1.0, sim_clock: bool = False,
                       stream: bool = True, start_at_s: float | None = None,
                       on_start: Callable[[float, float], None] | None = None,
                       session: aiohttp.ClientSession | None = None) -> LoadReport:
    """Send request i at ``arrivals_s[i]`` (seconds from the start, ascending, in the server's
    seconds) with ``prompts[i]`` prompt and ``outputs[i]`` output tokens; wait for every answer
    and report. Latencies are wall seconds × ``time_scale``; ``stream=False`` asks for one
    response per request (no TTFT on the client, a fraction of the CPU on both sides).
    ``start_at_s`` (with ``sim_clock``): the schedule starts when the server's clock reads it
    (default: when the first reading comes), so a process started early sends on time.
    ``on_start(now_s, start_s)`` is called once the clock has been read, before the first send."""
    if max_concurrency is not None and max_concurrency < 1:
        raise InputError("max_concurrency", f"expected a positive integer, got {max_concurrency!r}")
    if start_at_s is not None and not (sim_clock and math.isfinite(start_at_s)):
        raise InputError("start_at", "a start time is a reading of the server's clock: give a finite one, "
                                     "with sim_clock")
    if not (time_scale > 0 and math.isfinite(time_scale)):
        raise InputError("time_scale", f"expected a positive number, got {time_scale!r}")
    arrivals = np.asarray(arrivals_s, dtype=float)
    n = len(arrivals)
    if n == 0 or not (len(prompts) == len(outputs) == n):
        raise InputError("schedule", f"expected as many prompts and outputs as arrivals (≥ 1), got "
                                     f"{n}, {len(prompts)}, {len(outputs)}")
    if not (np.all(np.isfinite(arrivals)) and np.all(np.diff(arrivals) >= 0) and arrivals[0] >= 0):
        raise InputError("arrivals", "expected finite, non-negative, ascending arrival times")
    if duration_s is None:
        duration_s = float(arrivals[-1])
    if offered_rate_rps is None:
        offered_rate_rps = n / duration_s if duration_s > 0 else math.inf
    endpoint = completions_url(url)
    own = session is None
    if own:
        session = client_session()
    clock = None
    try:
        if model is None:
            model = await discover_model(session, url)
        clock = await ServerClock(session, url, time_scale).start() if sim_clock else WallClock(time_scale)
        sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        start_s = clock() if start_at_s is None else start_at_s
        if on_start is not None:
            on_start(clock(), start_s)
        wall0 = time.perf_counter()
        lateness = np.zeros(n)

        async def send(i: int, sent_s: float) -> RequestRecord:
            args = (session, endpoint, model, int(prompts[i]), int(outputs[i]), wall0, token_ids, timeout_s,
                    [seed, i], stream)
            if sem is None:
                return _scaled(await _one(*args), time_scale, sent_s)
            async with sem:
                return _scaled(await _one(*args), time_scale, sent_s)

        tasks = []
        for i in range(n):  # one dispatcher: sends leave in schedule order
            while (ahead := arrivals[i] - (clock() - start_s)) > 0:
                await asyncio.sleep(clock.wall_wait_s(ahead))
            sent_s = clock() - start_s
            lateness[i] = sent_s - arrivals[i]
            tasks.append(asyncio.create_task(send(i, sent_s)))
        records = await asyncio.gather(*tasks)
        elapsed = clock() - start_s
    finally:
        if isinstance(clock, ServerClock):
            await clock.stop()
        if own:
            await session.close()
    ok = [r for r in records if r.ok]
    errors: dict[str, int] = {}
    for r in records:
        if not r.ok:
            errors[r.error] = errors.get(r.error, 0) + 1
    prompt_total = sum(r.usage_prompt_tokens if r.usage_prompt_tokens is not None else r.prompt_tokens for r in ok)
    completion_total = sum(r.completion_tokens for r in ok)
    tpot = [(r.e2e_s - r.ttft_s) / (r.completion_tokens - 1) for r in ok
            if r.ttft_s is not None and r.completion_tokens > 1]
    return LoadReport(
        url=endpoint, model=model, offered_rate_rps=float(offered_rate_rps), duration_s=float(duration_s),
        elapsed_s=elapsed, sent=n, completed=len(ok), failed=n - len(ok),
        achieved_rate_rps=len(ok) / elapsed if elapsed > 0 else 0.0,
        prompt_tokens_total=int(prompt_total), completion_tokens_total=int(completion_total),
        throughput_tok_s=(prompt_total + completion_total) / elapsed if elapsed > 0 else 0.0,
        ttft_s=_percentiles([r.ttft_s for r in ok if r.ttft_s is not None]),
        e2e_s=_percentiles([r.e2e_s for r in ok]), tpot_s=_percentiles(tpot), errors=errors,
        send_lateness_s={"p99": float(np.percentile(lateness, 99)), "max": float(lateness.max())},
        clock="sim" if sim_clock else "wall", records=tuple(records),
    )
