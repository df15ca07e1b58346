"""`kneecap demo`: the whole loop on this machine, no cluster and no GPU.

Starts an in-process Kubernetes API, a node (the emulations' kubelet) that runs each pod as a
`kneecap twin` (a GPU-scale vLLM twin), a Service-like router, Poisson load and the real operator in enforce
mode; prints one line per control interval and a summary read back from the run, and writes
the trajectory PNG and the run's JSON under --out. See kneecap.demo.harness. With --virtual the
same LLMDeployment and load run on the virtual-time cluster instead (kneecap.sim.demo_virtual):
in-process engines on one simulated clock, the same result on any machine, in seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kneecap.commands import common
from kneecap.errors import InputError

HELP = "run kneecap end to end on an embedded cluster (twin pods, load, the real operator)"
EXTRA = "pip install 'kneecap[demo]'"  # the emulated API (kmock) and matplotlib are not `kneecap run`'s


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kneecap.demo.harness import DemoConfig

    parser.epilog = f"Needs the demo extra: {EXTRA}."
    d = DemoConfig()
    parser.add_argument("--model", default=d.model, help=f"model served by the twin pods (default {d.model})")
    parser.add_argument("--arch", default=None, help="catalog model shape (default: guessed from --model)")
    parser.add_argument("--gpu", default=d.gpu, help=f"catalog GPU of each pod (default {d.gpu})")
    parser.add_argument("--rate", type=float, default=d.rate_rps, help="steady request rate, req/s (simulated)")
    parser.add_argument("--input-mean", type=float, default=d.input_mean, help="mean prompt tokens")
    parser.add_argument("--input-cv", type=float, default=d.input_cv, help="prompt length CV (log-normal)")
    parser.add_argument("--output-mean", type=float, default=d.output_mean, help="mean output tokens")
    parser.add_argument("--output-cv", type=float, default=d.output_cv, help="output length CV (log-normal)")
    parser.add_argument("--max-concurrency", type=int, default=d.max_concurrency,
                        help="requests the load keeps in flight at most")
    parser.add_argument("--duration", type=float, default=d.duration_s, help="simulated seconds of load")
    parser.add_argument("--time-scale", type=float, default=d.time_scale,
                        help="simulated seconds per wall second (twins and the operator's clock)")
    parser.add_argument("--interval", type=float, default=d.interval_s,
                        help="control interval and observation window, simulated seconds")
    parser.add_argument("--cooldown", type=float, default=d.cooldown_s, help="seconds between pod restarts")
    parser.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs, help="cap the pods start with")
    parser.add_argument("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization,
                        help="memory fraction the pods start with")
    parser.add_argument("--efficiency-floor", type=float, default=d.efficiency_floor, help="BCA ε (eq. 13)")
    common.add_slo(parser, tpot=d.slo_tpot_s, with_ttft=False, old_tpot=("--slo-tpot",))
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--adopt", action="store_true",
                        help="tune an existing Deployment (spec.targetRef): first create a plain vLLM Deployment as a "
                             "user's Helm chart would, then point an LLMDeployment at it; the summary shows what "
                             "kneecap changed in its pod template (only the managed flags)")
    parser.add_argument("--out", type=Path, default=Path("kneecap-demo"),
                        help="directory for trajectory.png, run.json and the twins' logs")
    parser.add_argument("--disaggregated", action="store_true",
                        help="a prefill and a decode pool (KV transfer) behind a P/D router; the cap followed is "
                             "the decode pool's")
    parser.add_argument("--virtual", action="store_true",
                        help="run on the virtual-time cluster (in-process engines, one simulated clock, "
                             "deterministic) instead of twin processes paced by the wall clock; --time-scale "
                             "does not apply")
    common.add_json(parser, "print the summary as one JSON object")


def config_from_args(args):
    from kneecap.demo.harness import DemoConfig

    if args.max_concurrency < 1:
        raise InputError("max_concurrency", f"expected a positive integer, got {args.max_concurrency}")
    return DemoConfig(model=args.model, architecture=args.arch, gpu=args.gpu, rate_rps=args.rate,
                      input_mean=args.input_mean, output_mean=args.output_mean, input_cv=args.input_cv,
                      output_cv=args.output_cv, duration_s=args.duration, time_scale=args.time_scale,
                      interval_s=args.interval, cooldown_s=args.cooldown, max_num_seqs=args.max_num_seqs,
                      gpu_memory_utilization=args.gpu_memory_utilization, efficiency_floor=args.efficiency_floor,
                      slo_tpot_s=args.slo_tpot_s, max_concurrency=args.max_concurrency, seed=args.seed,
                      adopt=args.adopt, disaggregated=args.disaggregated)


def run(args) -> int:
    if args.virtual and (args.adopt or args.disaggregated):
        flag = "--adopt" if args.adopt else "--disaggregated"
        raise InputError("virtual", f"the virtual-time demo runs kneecap's own single pool; drop {flag} or --virtual")
    if not args.virtual:
        try:
            import kmock  # noqa: F401  (the embedded Kubernetes API)
        except ModuleNotFoundError:
            raise InputError("demo", f"needs kmock (the embedded Kubernetes API): {EXTRA}, or use --virtual") from None
    from kneecap.plotting import pyplot

    pyplot("demo")  # the trajectory PNG: fail before the run, not after it
    from kneecap.demo.report import plot, row_line, summary_text

    cfg = config_from_args(args)
    cfg.check()
    out = Path(args.out)
    live = sys.stderr if args.json else sys.stdout
    on_row = lambda r: print(row_line(r), file=live, flush=True)  # noqa: E731
    if args.virtual:
        from kneecap.sim.demo_virtual import run_demo_virtual

        out.mkdir(parents=True, exist_ok=True)
        print(f"kneecap demo (virtual time): {cfg.model} on {cfg.gpu}, {cfg.rate_rps:g} req/s for "
              f"{cfg.duration_s:g}s; pods start at max_num_seqs={cfg.max_num_seqs}, "
              f"gpu_memory_utilization={cfg.gpu_memory_utilization:g}", file=live, flush=True)
        res = run_demo_virtual(cfg, on_row=on_row)
    else:
        from kneecap.demo.harness import run_demo

        (out / "logs").mkdir(parents=True, exist_ok=True)
        print(f"kneecap demo: {cfg.model} on {cfg.gpu}, {cfg.rate_rps:g} req/s for {cfg.duration_s:g}s simulated "
              f"at {cfg.time_scale:g}x (about {cfg.duration_s / cfg.time_scale:.0f}s wall); pods start at "
              f"max_num_seqs={cfg.max_num_seqs}, gpu_memory_utilization={cfg.gpu_memory_utilization:g}",
              file=live, flush=True)
        res = run_demo(cfg, on_row=on_row, log_dir=out / "logs",
                       on_warning=lambda line: print(line, file=live, flush=True))
    png = plot(res, out / "trajectory.png")
    (out / "run.json").write_text(json.dumps(res.to_json(), indent=1, default=str))
    if args.json:
        print(json.dumps({**res.summary, "png": str(png), "run_json": str(out / "run.json")}))
    else:
        print(summary_text(res.summary))
        print(f"  trajectory   {png}")
    return 0
