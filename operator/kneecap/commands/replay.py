"""`kneecap replay TRACE`: a request trace against kneecap and the usual baselines, in virtual time.

Every policy serves the same arrivals on the same twin engines, pods and controllers
(kneecap.sim.cluster); the clock is simulated, so the result does not depend on the machine
(same trace, options and seed: the same JSON). See kneecap.sim.replay for the policies.

`kneecap replay --fleet FLEET.yaml [TRACE] [--deployment-trace NAME=PATH ...]`: a fleet replay
(issue 24, item 4; kneecap.sim.fleet_replay): every deployment of the fleet (as `kneecap pack -f` reads it)
serves a trace of its own (``--deployment-trace NAME=PATH``, else one derived from TRACE at the
deployment's declared rate and lengths), all at once, under the policies one-per-gpu (today) and
kneecap+pack (the fleet packed with `kneecap pack`'s search from the workloads seen on the
traces, engines time-slicing shared GPUs). Reports GPUs, $/h and each deployment's attainment.
Exit codes: 0 replayed; 1 kneecap+pack found no packing; 2 bad input (the entry and field, or
the deployment without a trace, named).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from kneecap.commands import common
from kneecap.errors import InputError

HELP = ("replay a request trace (Azure LLM 2023/2024, BurstGPT, Mooncake or arrival_s,input_tokens,output_tokens) "
        "against serving policies")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kneecap.sim.hpa import HPASpec
    from kneecap.sim.engine_node import KubeletConfig
    from kneecap.sim.fleet_replay import DEFAULT_DURATION_S, FLEET_POLICIES
    from kneecap.sim.replay import DEFAULT_POLICIES, POLICIES, ReplayConfig
    from kneecap.sim.trace_variants import SUITE

    d, h, k = ReplayConfig(), HPASpec(), KubeletConfig()
    parser.add_argument("trace", type=Path, nargs="?", default=None,
                        help="CSV with TIMESTAMP,ContextTokens,GeneratedTokens (Azure LLM 2023 and 2024), Timestamp,"
                             "Request tokens,Response tokens (BurstGPT) or arrival_s,input_tokens,output_tokens; or "
                             "JSON lines with timestamp (ms),input_length,output_length (Mooncake) (with --fleet: the "
                             "trace each deployment without --deployment-trace gets its own cut of)")
    parser.add_argument("--model", default=d.model, help=f"model served (default {d.model})")
    parser.add_argument("--arch", default=None, help="catalog model shape (default: guessed from --model)")
    parser.add_argument("--gpu", default=d.gpu, help=f"catalog GPU of each pod (default {d.gpu})")
    parser.add_argument("--tensor-parallel-size", type=int, default=d.tensor_parallel_size, metavar="TP",
                        help="GPUs per replica (spec.engine.tensorParallelSize): each pod's engine is split across "
                             "TP GPUs and the cost counts them")
    common.add_slo(parser, ttft=d.slo_ttft_s, tpot=d.slo_tpot_s)
    common.add_quantile(parser, d.quantile)
    parser.add_argument("--variant", choices=tuple(SUITE), default=None,
                        help="replay the trace changed in one property (before compression): "
                             + "; ".join(f"{name}: {stresses}" for name, (stresses, _) in SUITE.items()))
    parser.add_argument("--trace-start", type=float, default=0.0, metavar="S",
                        help="replay the requests from S seconds into the trace as recorded, before compression "
                             "(default 0)")
    parser.add_argument("--trace-seconds", type=float, default=None, metavar="S",
                        help="replay only the requests of S seconds of the trace as recorded (from --trace-start, "
                             "before compression): a day of a week-long trace (default: to its end)")
    squeeze = parser.add_mutually_exclusive_group()
    squeeze.add_argument("--compress", type=float, default=1.0,
                         help="time compression: arrivals come this many times faster (default 1)")
    squeeze.add_argument("--peak-replicas", type=int, default=None, metavar="N",
                         help="instead of --compress: the least whole compression at which the defaults need at "
                              "least N replicas for the trace's peak (found by replaying it)")
    parser.add_argument("--min-replicas", type=int, default=d.min_replicas)
    parser.add_argument("--max-replicas", type=int, default=d.max_replicas)
    parser.add_argument("--start-replicas", type=int, default=None,
                        help="the pool kneecap and the HPA start from (default: the defaults' peak-sized pool)")
    parser.add_argument("--cost-per-gpu-hour", type=float, default=d.cost_per_gpu_hour)
    parser.add_argument("--seed", type=int, default=d.seed, help="router tie-breaks")
    parser.add_argument("--policy", action="append", choices=POLICIES + FLEET_POLICIES, default=None,
                        help="policy to run (repeatable; default: " + ", ".join(DEFAULT_POLICIES)
                             + "; the ablations kneecap:replicas-only and kneecap:knobs-only when named; with "
                               "--fleet: " + " and ".join(FLEET_POLICIES) + ", both by default)")
    parser.add_argument("--interval", type=float, default=d.interval_s,
                        help="kneecap's control interval and window, seconds")
    parser.add_argument("--cooldown", type=float, default=d.cooldown_s,
                        help="kneecap's cooldown: the least time between changes (and the least horizon a restart pays over)")
    parser.add_argument("--released-memory-value", type=float, default=d.released_memory_value,
                        help="kneecap's spec.control.releasedMemoryValue (default 0: the score gives released "
                             "memory no value; --fleet measures it instead, as GPUs returned and $/h)")
    parser.add_argument("--rate-headroom", type=float, default=d.rate_headroom,
                        help="kneecap's spec.control.rateHeadroom: pools are sized for this multiple of the observed "
                             f"rate (default {d.rate_headroom:g})")
    parser.add_argument("--hysteresis", type=float, default=d.hysteresis,
                        help=f"kneecap's spec.control.hysteresis (default {d.hysteresis:g})")
    parser.add_argument("--scale-down-deviations", type=float, default=d.scale_down_deviations,
                        help="kneecap's spec.control.scaleDownDeviations: a scale-down serves the rate times 1 + this "
                             f"many coefficients of variation of the pool's work (default {d.scale_down_deviations:g})")
    parser.add_argument("--allow-downtime", action="store_true",
                        help="kneecap may restart a one-replica pool (spec.control.allowDowntime)")
    parser.add_argument("--hpa-metric", choices=("kv", "waiting"), default=h.metric,
                        help="defaults+hpa: per-pod metric (KV-cache usage or waiting requests)")
    parser.add_argument("--hpa-target", type=float, default=h.target, help="defaults+hpa: average target per pod")
    parser.add_argument("--load-gib-s", type=float, default=k.load_gib_s, help="model load bandwidth, GiB/s")
    parser.add_argument("--startup-s", type=float, default=k.startup_s, help="engine start-up after the load, s")
    parser.add_argument("--grace-s", type=float, default=k.termination_grace_s,
                        help="a stopping pod finishes its requests for this long")
    parser.add_argument("--interrupted", choices=("lost", "retried"), default=k.interrupted,
                        help="requests a stopping pod still holds after the grace period")
    fleet = parser.add_argument_group("fleet replay (--fleet)")
    fleet.add_argument("--fleet", metavar="FLEET.yaml", default=None,
                       help="replay a fleet (entries as `kneecap pack -f` takes them), every deployment on its own "
                            "trace, all at once, under one-per-gpu and kneecap+pack; --model, --gpu, the SLO and "
                            "the pool options then come from the fleet")
    fleet.add_argument("--deployment-trace", dest="fleet_traces", action="append", default=None,
                       metavar="NAME=PATH",
                       help="deployment NAME's trace (repeatable); a deployment without one gets a cut of TRACE")
    fleet.add_argument("--duration", type=float, default=None, metavar="S",
                       help=f"virtual seconds of each trace cut from TRACE (default {DEFAULT_DURATION_S:g}): its "
                            "requests at the deployment's declared rate, lengths scaled to its declared means")
    fleet.add_argument("--observe", type=float, default=None, metavar="S",
                       help="kneecap+pack packs from the workload seen in each trace's first S seconds (default: "
                            "the whole trace)")
    from kneecap.commands.pack import add_packing_arguments

    add_packing_arguments(fleet)
    common.add_json(parser, "print the report as one JSON object")
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG of the runs over time (with --fleet: "
                                                                 "each deployment's attainment per policy)")


def config_from_args(args):
    from kneecap.control.spec import guess_architecture
    from kneecap.model.arch import CATALOG
    from kneecap.sim.hpa import HPASpec
    from kneecap.sim.engine_node import KubeletConfig
    from kneecap.sim.replay import ReplayConfig

    arch = args.arch or (args.model if args.model in CATALOG else guess_architecture(args.model))
    if arch is None:
        raise InputError("--arch", f"required: no catalog model found in --model {args.model!r}")
    for name in ("load_gib_s", "startup_s", "grace_s"):
        v = getattr(args, name)
        positive = name == "load_gib_s"
        if not (v == v and v >= 0 and v != float("inf")) or (positive and v <= 0):
            raise InputError("--" + name.replace("_", "-"),
                             f"expected a {'positive' if positive else 'non-negative'} finite number, got {v}")
    return ReplayConfig(
        model=args.model, architecture=arch, gpu=args.gpu, tensor_parallel_size=args.tensor_parallel_size,
        slo_ttft_s=args.slo_ttft_s, slo_tpot_s=args.slo_tpot_s,
        quantile=args.quantile, min_replicas=args.min_replicas, max_replicas=args.max_replicas,
        start_replicas=args.start_replicas,
        cost_per_gpu_hour=args.cost_per_gpu_hour, seed=args.seed, interval_s=args.interval, cooldown_s=args.cooldown,
        released_memory_value=args.released_memory_value, allow_downtime=args.allow_downtime,
        rate_headroom=args.rate_headroom, hysteresis=args.hysteresis, scale_down_deviations=args.scale_down_deviations,
        hpa=HPASpec(metric=args.hpa_metric, target=args.hpa_target),
        kubelet=KubeletConfig(load_gib_s=args.load_gib_s, startup_s=args.startup_s,
                              termination_grace_s=args.grace_s, interrupted=args.interrupted))


def run(args) -> int:
    from kneecap.sim import replay_report as rep
    from kneecap.sim.fleet_replay import FLEET_POLICIES
    from kneecap.sim.replay import DEFAULT_POLICIES, compression_for_peak, replay, series
    from kneecap.sim.trace import compress, cut, read_trace
    from kneecap.sim.trace_variants import SUITE

    if args.fleet is not None:
        return run_fleet(args)
    if args.trace is None:
        raise InputError("trace", "required: a trace CSV (or --fleet FLEET.yaml)")
    if args.fleet_traces:
        raise InputError("trace", "--deployment-trace NAME=PATH names a fleet deployment's trace: only with --fleet")
    if any(p in FLEET_POLICIES for p in args.policy or ()):
        raise InputError("policy", f"{' and '.join(FLEET_POLICIES)} are fleet policies: only with --fleet")
    for flag, value in (("gpus", args.gpus), ("inventory", args.inventory), ("observe", args.observe),
                        ("duration", args.duration)):
        if value is not None:
            raise InputError(flag, f"--{flag} is a fleet replay option: only with --fleet")
    cfg = config_from_args(args)
    cfg.check()
    raw = read_trace(args.trace)
    if args.trace_start or args.trace_seconds is not None:
        raw = cut(raw, args.trace_start, args.trace_seconds)
    if args.variant is not None:
        raw = SUITE[args.variant][1](raw)
    factor = args.compress if args.peak_replicas is None else compression_for_peak(raw, cfg, args.peak_replicas)
    trace = compress(raw, factor)
    policies = tuple(dict.fromkeys(args.policy or DEFAULT_POLICIES))
    out = replay(trace, cfg, policies)
    report = out["report"]
    report["compress"] = factor
    if args.peak_replicas is not None:
        report["compress_for_peak_replicas"] = args.peak_replicas
    if args.plot is not None:
        rep.plot(report, {p: series(cfg, r) for p, r in out["runs"].items()}, args.plot,
                 title=f"{Path(trace.source).name} ×{factor:g}: {cfg.architecture} on {cfg.gpu}")
    if args.json:
        print(json.dumps(report, sort_keys=True))
        return 0
    t = report["trace"]
    how = "" if args.peak_replicas is None else f": the least at which the peak needs ≥ {args.peak_replicas} replicas"
    print(f"{t['source']}: {t['requests']} requests over {t['span_s']:.0f} s (compressed ×{factor:g}{how}), "
          f"{cfg.architecture} on {cfg.gpu}, SLO p{cfg.quantile * 100:g} TTFT ≤ {cfg.slo_ttft_s:g} s, "
          f"TPOT ≤ {cfg.slo_tpot_s * 1e3:g} ms")
    print(rep.table_text(report))
    print(f"simulated {report['simulated_s']:.0f} s in {out['wall_s']:.1f} s of CPU "
          f"({report['simulated_s'] / max(out['wall_s'], 1e-9):.0f}× real time)", file=sys.stderr)
    return 0


# ----------------------------------------------------------------------------- --fleet


def fleet_traces(args, deployments) -> dict:
    """Deployment name → Trace: ``--deployment-trace NAME=PATH`` as read, else a cut of TRACE
    (``fleet_replay.derive_trace``); InputError naming a NAME the fleet lacks, a malformed
    option or a deployment left without a trace."""
    from kneecap.sim.fleet_replay import derive_trace
    from kneecap.sim.trace import read_trace

    names = [d.name for d in deployments]
    given = {}
    for value in args.fleet_traces or ():
        name, sep, path = value.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise InputError("trace", f"expected NAME=PATH, got {value!r}")
        name = name.strip()
        if name not in names:
            raise InputError("trace", f"{name!r} names no deployment of the fleet ({', '.join(names)})")
        if name in given:
            raise InputError("trace", f"deployment {name!r}: two traces given")
        given[name] = path.strip()
    missing = [n for n in names if n not in given]
    if missing and args.trace is None:
        raise InputError("trace", f"deployment {missing[0]!r} has no trace: give --deployment-trace "
                                  f"{missing[0]}=PATH or a TRACE to cut every deployment's trace from")
    traces = {}
    base = read_trace(args.trace) if missing else None
    for i, d in enumerate(deployments):
        if d.name in given:
            try:
                traces[d.name] = read_trace(given[d.name])
            except InputError as exc:
                raise InputError(f"trace {d.name}", str(exc).split(": ", 1)[-1]) from None
        else:
            traces[d.name] = derive_trace(base, d, i, seed=args.seed,
                                          **({} if args.duration is None else {"duration_s": args.duration}))
    return traces


def draw_attainment(ax, report: dict) -> None:
    """A fleet replay's per-deployment attainment, one bar per policy (its GPUs and $/h in the legend)."""
    pols = [(p, r) for p, r in report["policies"].items() if r.get("deployments")]
    names = list(report["traces"])
    h = 0.8 / max(len(pols), 1)
    for k, (p, r) in enumerate(pols):
        att = [d["slo_attainment_requests"] or 0.0 for d in r["deployments"]]
        ax.barh([i + k * h for i in range(len(names))], att, height=h,
                label=f"{p}: {r['gpus']} GPUs, ${r['cost_per_hour']:.2f}/h")
    ax.set_yticks([i + h * (len(pols) - 1) / 2 for i in range(len(names))], names)
    ax.invert_yaxis()
    lo = min([d["slo_attainment_requests"] or 0.0 for _, r in pols for d in r["deployments"]] + [0.9])
    ax.set_xlim(max(0.0, lo - 0.02), 1.0)
    ax.set_xlabel("SLO attainment (requests meeting both TTFT and TPOT SLOs)")
    ax.set_title("fleet replay: every deployment's trace at once")
    ax.legend(fontsize=8, loc="lower left")


def _fleet_plot(report: dict, path: Path) -> None:
    from kneecap.plotting import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(report["traces"]) + 1.8))
    draw_attainment(ax, report)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fleet_text(report: dict) -> str:
    lines = []
    for p, r in report["policies"].items():
        if not r.get("feasible", True):
            lines.append(f"{p}: no packing: {r['message']}")
            continue
        lines.append(f"{p}: {r['gpus']} GPUs, ${r['cost_per_hour']:.2f}/h {r['by_type']}; "
                     f"{'every SLO met' if r['all_slo_met'] else 'SLO missed'} over the traces")
        lines.append(f"  {'deployment':<16} {'q':<4} {'requests':>8} {'refused':>7} {'attainment':>10} "
                     f"{'TTFT p95/p99 (s)':>18} {'TPOT p95/p99 (ms)':>18}  met")
        for d in r["deployments"]:
            q = {0.5: "p50", 0.95: "p95", 0.99: "p99"}[d["slo"]["quantile"]]
            t, o = d["ttft_s"], d["tpot_s"]
            f = lambda x, s=1.0: "—" if x is None else f"{x * s:.3g}"  # noqa: E731
            lines.append(f"  {d['name']:<16} {q:<4} {d['requests']:>8} {d['refused']:>7} "
                         f"{d['slo_attainment_requests']:>10.4f} {f(t['p95']) + '/' + f(t['p99']):>18} "
                         f"{f(o['p95'], 1e3) + '/' + f(o['p99'], 1e3):>18}  "
                         f"{'yes' if d['slo_met_over_trace'] else 'NO'}")
    if "gpus_returned" in report:
        lines.append(f"kneecap+pack returns {report['gpus_returned']} GPUs, ${report['savings_per_hour']:.2f}/h")
    return "\n".join(lines)


def run_fleet(args) -> int:
    import time

    from kneecap.commands.pack import build
    from kneecap.sim.fleet_replay import FLEET_POLICIES, fleet_replay

    if args.trace_start or args.trace_seconds is not None:
        flag = "trace-start" if args.trace_start else "trace-seconds"
        raise InputError(flag, f"--{flag} cuts the trace of a single replay; with --fleet, --duration sets each "
                               "deployment's cut")
    policies = tuple(dict.fromkeys(args.policy or FLEET_POLICIES))
    bad = [p for p in policies if p not in FLEET_POLICIES]
    if bad:
        raise InputError("policy", f"{bad[0]!r} replays one trace; with --fleet: {' or '.join(FLEET_POLICIES)}")
    if args.observe is not None and not (math.isfinite(args.observe) and args.observe > 0):
        raise InputError("observe", f"expected a positive number of seconds, got {args.observe}")
    if isinstance(args.seed, bool) or args.seed < 0:
        raise InputError("seed", f"expected a non-negative integer, got {args.seed}")
    deployments, inventory = build(args)
    traces = fleet_traces(args, deployments)
    t0 = time.process_time()
    report = fleet_replay(deployments, traces, inventory, policies, observe_s=args.observe, margin=args.margin,
                          seed=args.seed, samples=args.samples)
    report["fleet"] = str(args.fleet)
    if args.plot is not None:
        _fleet_plot(report, args.plot)
    if args.json:
        print(json.dumps(report, sort_keys=True, allow_nan=False))
    else:
        print(_fleet_text(report))
    print(f"fleet replay: {time.process_time() - t0:.1f} s of CPU", file=sys.stderr)
    feasible = all(r.get("feasible", True) for r in report["policies"].values())
    return common.EXIT_OK if feasible else common.EXIT_FAILED
