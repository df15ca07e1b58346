"""`kneecap observe URL... [--interval S] [--count N] [--json]`: live window observations."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict
from urllib.parse import urlsplit

from kneecap.commands import common
from kneecap.errors import InputError

HELP = "scrape vLLM /metrics and print one observation line per window (JSON lines with --json)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("urls", nargs="+", metavar="URL", help="vLLM base URL or its /metrics URL")
    parser.add_argument("--interval", type=float, default=10.0, help="window length, seconds (default 10)")
    parser.add_argument("--count", type=int, default=0, help="stop after N windows (default: run until Ctrl-C)")
    parser.add_argument("--timeout", type=float, default=5.0, help="scrape timeout, seconds (default 5)")
    parser.add_argument("--max-bytes", type=int, default=8 << 20, help="response size cap (default 8 MiB)")
    common.add_json(parser, "one JSON object per line (a window or a scrape error); exit 1 when every scrape failed")


def _metrics_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputError("URL", f"expected http(s)://host:port[/metrics], got {url!r}")
    return url.rstrip("/") + "/metrics" if parts.path in ("", "/") else url


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _line(url: str, result, as_json: bool) -> str:
    from kneecap.observe import Observation

    if as_json:
        if isinstance(result, Observation):
            return json.dumps({"url": url, **asdict(result)})
        return json.dumps({"url": url, "t_s": time.time(), "reason": str(result)})
    if not isinstance(result, Observation):
        return f"{url}  no observation: {result}"
    o = result
    return (
        f"{url}  {o.window_s:5.1f}s  {o.request_rate_rps:6.2f} req/s  batch {o.mean_batch:5.1f} (max {o.max_batch:g})"
        f"  queue {o.queue_len:4.1f}  in {o.input_len_mean:6.1f} out {o.output_len_mean:6.1f} tok"
        f"  gen {o.generation_tok_s:8.1f} tok/s  ttft p95 {o.ttft_p95_s:6.3f}s  itl p95 {o.itl_p95_s * 1e3:6.1f}ms"
        f"  kv {o.kv_usage:4.2f} (max {o.kv_usage_max:4.2f})  preempt {_fmt(o.preemptions, 'g')}"
    )


async def _loop(urls: list[str], interval_s: float, count: int, timeout_s: float, max_bytes: int, as_json: bool) -> int:
    import aiohttp

    from kneecap.observe import ParseCache, ScrapeError, observe, observe_pool, scrape

    sample_s = min(interval_s, 1.0)  # gauges (batch, queue, KV) are sampled this often

    cache = ParseCache()  # one for every scrape of the run, as the operator's

    async def one(session, url):
        try:
            return await scrape(url, timeout_s=timeout_s, max_bytes=max_bytes, session=session, cache=cache)
        except ScrapeError as exc:
            return exc

    windows = 0
    scraped = False  # any scrape answered: exit 1 when none ever did
    async with aiohttp.ClientSession() as session:
        start = await asyncio.gather(*(one(session, u) for u in urls))
        scraped = any(not isinstance(s, Exception) for s in start)
        between: list[list] = [[] for _ in urls]
        t0 = time.monotonic()
        while count <= 0 or windows < count:
            await asyncio.sleep(min(sample_s, max(0.0, t0 + interval_s - time.monotonic())))
            snaps = await asyncio.gather(*(one(session, u) for u in urls))
            scraped = scraped or any(not isinstance(s, Exception) for s in snaps)
            if time.monotonic() - t0 < interval_s - 1e-3:
                for b, s in zip(between, snaps):
                    if not isinstance(s, Exception):
                        b.append(s)
                continue
            pairs = []
            for url, prev, cur, mid in zip(urls, start, snaps, between):
                if isinstance(cur, Exception) or isinstance(prev, Exception):
                    exc = cur if isinstance(cur, Exception) else prev
                    print(_line(url, f"scrape_error:{exc.kind}: {exc}", as_json), flush=True)
                    continue
                print(_line(url, observe(prev, cur, mid), as_json), flush=True)
                pairs.append((prev, cur, mid))
            if len(urls) > 1 and pairs:
                print(_line("pool", observe_pool(pairs).observation, as_json), flush=True)
            start, between, t0 = snaps, [[] for _ in urls], time.monotonic()
            windows += 1
    if scraped:
        return common.EXIT_OK
    if not as_json:
        print(f"kneecap observe: every scrape of {', '.join(urls)} failed", file=sys.stderr)
    return common.EXIT_FAILED


def run(args: argparse.Namespace) -> int:
    if not args.interval > 0:
        raise InputError("interval", f"expected seconds > 0, got {args.interval}")
    if args.count < 0:
        raise InputError("count", f"expected N >= 0 (0 = forever), got {args.count}")
    if not args.timeout > 0:
        raise InputError("timeout", f"expected seconds > 0, got {args.timeout}")
    if args.max_bytes <= 0:
        raise InputError("max-bytes", f"expected bytes > 0, got {args.max_bytes}")
    urls = [_metrics_url(u) for u in args.urls]
    try:
        return asyncio.run(_loop(urls, args.interval, args.count, args.timeout, args.max_bytes, args.json))
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return common.EXIT_INTERRUPTED
