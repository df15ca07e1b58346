"""`kneecap load URL`: open-loop Poisson (or bursty) load, or a trace replayed, against /v1/completions."""

from __future__ import annotations

import asyncio
import json
import sys

from kneecap.commands import common
from kneecap.errors import InputError

HELP = ("send open-loop Poisson/bursty completion load, or replay a trace; print achieved rate and latency "
        "percentiles")


def add_arguments(parser) -> None:
    parser.add_argument("url", help="server base URL (http://host:port) or its /v1/completions")
    parser.add_argument("--rate", type=float, help="requests per second (mean); not with --trace")
    parser.add_argument("--duration", type=float, help="seconds of arrivals; with --trace: replay only the "
                                                         "requests of the first DURATION (compressed) seconds")
    parser.add_argument("--trace", help="replay this trace (any layout kneecap replay reads: Azure LLM 2023/2024, BurstGPT, "
                                        "Mooncake, CSV arrival_s,input_tokens,output_tokens): each request at its "
                                        "arrival with its prompt and output lengths (--input-*, --output-*, "
                                        "--burst-cv do not apply)")
    parser.add_argument("--compress", type=float, default=1.0,
                        help="with --trace: play it X times faster (arrival times / X)")
    parser.add_argument("--input-mean", type=float, default=128.0, help="mean prompt length, tokens")
    parser.add_argument("--input-cv", type=float, default=0.0, help="prompt length CV (log-normal; 0 = fixed)")
    parser.add_argument("--output-mean", type=float, default=128.0, help="mean output length, tokens")
    parser.add_argument("--output-cv", type=float, default=0.0, help="output length CV (log-normal; 0 = fixed)")
    parser.add_argument("--burst-cv", type=float, default=1.0, help="inter-arrival CV: 1 Poisson, >1 bursty")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-concurrency", type=int, help="cap on requests in flight (default: none)")
    parser.add_argument("--model", help="model name (default: the first from /v1/models)")
    parser.add_argument("--text-prompts", action="store_true",
                        help="send prompts as words instead of token ids (server tokenizer decides the count)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, wall seconds")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="for a twin run X times faster: rate, duration and latencies in its simulated seconds")
    parser.add_argument("--sim-clock", action="store_true",
                        help="pace on the server's simulated clock (a kneecap twin's or the demo router's "
                             "X-Kneecap-Sim-Time header), not the wall clock")
    parser.add_argument("--start-at", type=float, metavar="SIM_S",
                        help="with --sim-clock: start the schedule when the server's clock reads SIM_S")
    parser.add_argument("--no-stream", dest="stream", action="store_false",
                        help="one response per request instead of a token stream (no client-side TTFT; far "
                             "less CPU for client and server)")
    common.add_json(parser)


def _fmt(p: dict) -> str:
    if not p:
        return "n/a"
    return f"mean {p['mean']*1e3:.1f}  p50 {p['p50']*1e3:.1f}  p90 {p['p90']*1e3:.1f}  p99 {p['p99']*1e3:.1f} ms"


def _schedule_kwargs(args) -> dict:
    """What `run_load` or `run_schedule` needs besides the URL, from the flags (checked)."""
    if args.trace is None:
        missing = [f for f in ("rate", "duration") if getattr(args, f) is None]
        if missing:
            raise InputError(missing[0], f"--{missing[0]} is required without --trace")
        return dict(rate_rps=args.rate, duration_s=args.duration, input_mean=args.input_mean,
                    input_cv=args.input_cv, output_mean=args.output_mean, output_cv=args.output_cv,
                    burst_cv=args.burst_cv)
    from kneecap.sim.trace import compress, read_trace

    if args.rate is not None:
        raise InputError("rate", "--rate does not apply to --trace (the trace's arrivals set it; use --compress)")
    trace = compress(read_trace(args.trace), args.compress)
    keep = slice(None)
    if args.duration is not None:
        if not args.duration > 0:
            raise InputError("duration", f"expected a positive number of seconds, got {args.duration}")
        keep = trace.arrival_s < args.duration
        if not keep.any():
            raise InputError("duration", f"no request of {trace.source} arrives in the first {args.duration:g}s")
    return dict(arrivals_s=trace.arrival_s[keep], prompts=trace.input_tokens[keep],
                outputs=trace.output_tokens[keep], duration_s=args.duration)


def _started(now_s: float, start_s: float) -> None:
    """One stderr line once the clock is read (the demo waits for it before its clock runs)."""
    print(f"kneecap load: clock at {now_s:.3f}, schedule from {start_s:.3f}", file=sys.stderr, flush=True)


def run(args) -> int:
    from kneecap.sim.loadgen import run_load, run_schedule

    kwargs = _schedule_kwargs(args)
    common = dict(seed=args.seed, max_concurrency=args.max_concurrency, model=args.model,
                  token_ids=not args.text_prompts, timeout_s=args.timeout, time_scale=args.time_scale,
                  sim_clock=args.sim_clock, stream=args.stream, start_at_s=args.start_at, on_start=_started)
    try:
        report = asyncio.run((run_schedule if args.trace else run_load)(args.url, **kwargs, **common))
    except OSError as exc:
        raise InputError("url", f"cannot reach {args.url}: {exc}") from None
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        print(f"{report.url}  model {report.model}" + (f"  trace {args.trace}" if args.trace else ""))
        print(f"sent {report.sent}  completed {report.completed}  failed {report.failed}  in {report.elapsed_s:.1f} s"
              + ("  (server's simulated clock)" if report.clock == "sim" else ""))
        print(f"rate offered {report.offered_rate_rps:.2f}/s  achieved {report.achieved_rate_rps:.2f}/s  "
              f"throughput {report.throughput_tok_s:.0f} tok/s "
              f"(prompt {report.prompt_tokens_total}, completion {report.completion_tokens_total} tokens)")
        print(f"TTFT  {_fmt(report.ttft_s)}")
        print(f"E2E   {_fmt(report.e2e_s)}")
        print(f"TPOT  {_fmt(report.tpot_s)}")
        late = report.send_lateness_s
        print(f"send lateness  p99 {late['p99'] * 1e3:.1f}  max {late['max'] * 1e3:.1f} ms"
              + ("  -- WARNING: the client fell behind schedule; the offered load was lower than asked"
                 if report.fell_behind else ""))
        for msg, count in report.errors.items():
            print(f"error x{count}: {msg}")
    return 0 if report.failed == 0 else 1
