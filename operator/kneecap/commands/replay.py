"""`kneecap replay TRACE`: a request trace against kneecap and the usual baselines, in virtual time.

Every policy serves the same arrivals on the same twin engines, pods and controllers
(kneecap.sim.cluster); the clock is simulated, so the result does not depend on the machine
(same trace, options and seed: the same JSON). See kneecap.sim.replay for the policies.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kneecap.commands import common
from kneecap.errors import InputError

HELP = "replay a request trace (Azure LLM format or arrival_s,input_tokens,output_tokens) against serving policies"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kneecap.sim.hpa import HPASpec
    from kneecap.sim.kubelet_virtual import KubeletConfig
    from kneecap.sim.replay import DEFAULT_POLICIES, POLICIES, ReplayConfig
    from kneecap.sim.trace_variants import SUITE

    d, h, k = ReplayConfig(), HPASpec(), KubeletConfig()
    parser.add_argument("trace", type=Path, help="CSV: TIMESTAMP,ContextTokens,GeneratedTokens or "
                                                 "arrival_s,input_tokens,output_tokens")
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
    parser.add_argument("--policy", action="append", choices=POLICIES, default=None,
                        help="policy to run (repeatable; default: " + ", ".join(DEFAULT_POLICIES)
                             + "; the ablations kneecap:replicas-only and kneecap:knobs-only when named)")
    parser.add_argument("--interval", type=float, default=d.interval_s,
                        help="kneecap's control interval and window, seconds")
    parser.add_argument("--cooldown", type=float, default=d.cooldown_s,
                        help="kneecap's cooldown between changes (the horizon a restart must pay for itself over)")
    parser.add_argument("--released-memory-value", type=float, default=d.released_memory_value,
                        help="kneecap's spec.control.releasedMemoryValue (default 0: the score gives released "
                             "memory no value)")
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
    common.add_json(parser, "print the report as one JSON object")
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG of the runs over time")


def config_from_args(args):
    from kneecap.control.spec import guess_architecture
    from kneecap.model.arch import CATALOG
    from kneecap.sim.hpa import HPASpec
    from kneecap.sim.kubelet_virtual import KubeletConfig
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
        hpa=HPASpec(metric=args.hpa_metric, target=args.hpa_target),
        kubelet=KubeletConfig(load_gib_s=args.load_gib_s, startup_s=args.startup_s,
                              termination_grace_s=args.grace_s, interrupted=args.interrupted))


def run(args) -> int:
    from kneecap.sim import replay_report as rep
    from kneecap.sim.replay import DEFAULT_POLICIES, compression_for_peak, replay, series
    from kneecap.sim.trace import compress, read_trace
    from kneecap.sim.trace_variants import SUITE

    cfg = config_from_args(args)
    cfg.check()
    raw = read_trace(args.trace)
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
