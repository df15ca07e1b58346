"""`kneecap load URL`: open-loop Poisson (or bursty) load against /v1/completions."""

from __future__ import annotations

import asyncio
import json

from kneecap.errors import InputError

HELP = "send open-loop Poisson/bursty completion load; print achieved rate and latency percentiles"


def add_arguments(parser) -> None:
    parser.add_argument("url", help="server base URL (http://host:port) or its /v1/completions")
    parser.add_argument("--rate", type=float, required=True, help="requests per second (mean)")
    parser.add_argument("--duration", type=float, required=True, help="seconds of arrivals")
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
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _fmt(p: dict) -> str:
    if not p:
        return "n/a"
    return f"mean {p['mean']*1e3:.1f}  p50 {p['p50']*1e3:.1f}  p90 {p['p90']*1e3:.1f}  p99 {p['p99']*1e3:.1f} ms"


def run(args) -> int:
    from kneecap.sim.loadgen import run_load

    try:
        report = asyncio.run(run_load(
            args.url, rate_rps=args.rate, duration_s=args.duration, input_mean=args.input_mean,
            input_cv=args.input_cv, output_mean=args.output_mean, output_cv=args.output_cv,
            burst_cv=args.burst_cv, seed=args.seed, max_concurrency=args.max_concurrency, model=args.model,
            token_ids=not args.text_prompts, timeout_s=args.timeout,
            time_scale=args.time_scale))
    except OSError as exc:
        raise InputError("url", f"cannot reach {args.url}: {exc}") from None
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        print(f"{report.url}  model {report.model}")
        print(f"sent {report.sent}  completed {report.completed}  failed {report.failed}  in {report.elapsed_s:.1f} s")
        print(f"rate offered {report.offered_rate_rps:.2f}/s  achieved {report.achieved_rate_rps:.2f}/s  "
              f"throughput {report.throughput_tok_s:.0f} tok/s "
              f"(prompt {report.prompt_tokens_total}, completion {report.completion_tokens_total} tokens)")
        print(f"TTFT  {_fmt(report.ttft_s)}")
        print(f"E2E   {_fmt(report.e2e_s)}")
        print(f"TPOT  {_fmt(report.tpot_s)}")
        for msg, count in report.errors.items():
            print(f"error x{count}: {msg}")
    return 0 if report.failed == 0 else 1
