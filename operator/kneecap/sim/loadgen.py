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
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import asdict, dataclass, field, replace

import aiohttp
import numpy as np

from kneecap.errors import InputError

PROMPT_TOKEN_IDS = (16, 256)  # ids every tiny test vocabulary has


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
    records: tuple = ()

    def to_dict(self, with_records: bool = False) -> dict:
        d = asdict(self)
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


async def _one(session, url, model, prompt_len, max_tokens, t0, token_ids, timeout_s, seed) -> RequestRecord:
    if token_ids:
        prompt = np.random.default_rng(seed).integers(*PROMPT_TOKEN_IDS, prompt_len).tolist()
    else:
        prompt = " ".join(["hello"] * prompt_len)
    body = {"model": model, "prompt": prompt, "max_tokens": int(max_tokens), "min_tokens": int(max_tokens),
            "ignore_eos": True, "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    ttft = None
    chunks = 0
    usage = None
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                text = (await resp.text())[:200]
                return RequestRecord(prompt_len, max_tokens, sent - t0, False, error=f"HTTP {resp.status}: {text}")
            async for raw in resp.content:
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


def _scaled(r: RequestRecord, time_scale: float) -> RequestRecord:
    if time_scale == 1.0:
        return r
    mul = (lambda v: None if v is None else v * time_scale)
    return replace(r, sent_s=r.sent_s * time_scale, ttft_s=mul(r.ttft_s), e2e_s=mul(r.e2e_s))


async def run_load(url: str, *, rate_rps: float, duration_s: float, input_mean: float, output_mean: float,
                   input_cv: float = 0.0, output_cv: float = 0.0, burst_cv: float = 1.0, seed: int = 0,
                   max_concurrency: int | None = None, model: str | None = None, token_ids: bool = True,
                   timeout_s: float = 600.0, time_scale: float = 1.0,
                   session: aiohttp.ClientSession | None = None) -> LoadReport:
    """Send open-loop load for ``duration_s`` seconds, wait for every answer, and report.
    Latencies and rates are in the server's seconds (wall seconds × ``time_scale``)."""
    if max_concurrency is not None and max_concurrency < 1:
        raise InputError("max_concurrency", f"expected a positive integer, got {max_concurrency!r}")
    if not (time_scale > 0 and math.isfinite(time_scale)):
        raise InputError("time_scale", f"expected a positive number, got {time_scale!r}")
    rng = np.random.default_rng(seed)
    arrivals = arrival_times(rng, rate_rps, duration_s, burst_cv) / time_scale
    n = len(arrivals)
    prompts = sample_lengths(rng, n, input_mean, input_cv)
    outputs = sample_lengths(rng, n, output_mean, output_cv)
    endpoint = completions_url(url)
    own = session is None
    if own:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    try:
        if model is None:
            model = await discover_model(session, url)
        sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        t0 = time.perf_counter()

        async def fire(i: int) -> RequestRecord:
            delay = arrivals[i] - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            args = (session, endpoint, model, int(prompts[i]), int(outputs[i]), t0, token_ids, timeout_s, [seed, i])
            if sem is None:
                return _scaled(await _one(*args), time_scale)
            async with sem:
                return _scaled(await _one(*args), time_scale)

        records = await asyncio.gather(*(fire(i) for i in range(n)))
        elapsed = (time.perf_counter() - t0) * time_scale
    finally:
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
        url=endpoint, model=model, offered_rate_rps=float(rate_rps), duration_s=float(duration_s),
        elapsed_s=elapsed, sent=n, completed=len(ok), failed=n - len(ok),
        achieved_rate_rps=len(ok) / elapsed if elapsed > 0 else 0.0,
        prompt_tokens_total=int(prompt_total), completion_tokens_total=int(completion_total),
        throughput_tok_s=(prompt_total + completion_total) / elapsed if elapsed > 0 else 0.0,
        ttft_s=_percentiles([r.ttft_s for r in ok if r.ttft_s is not None]),
        e2e_s=_percentiles([r.e2e_s for r in ok]), tpot_s=_percentiles(tpot), errors=errors,
        records=tuple(records),
    )
