"""`kneecap run`: the operator (kopf), namespace- or cluster-scoped, with liveness and metrics."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from kneecap.commands import common

HELP = "run the operator: reconcile LLMDeployments and keep vLLM at the knee"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[],
                       help="watch this namespace (repeatable; globs as kopf allows)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch the whole cluster")
    parser.add_argument("--selector", metavar="SELECTOR", default=None,
                        help="act only on the LLMDeployments whose labels match this label selector "
                             "(kubectl -l syntax, e.g. kneecap.io/shard=a): one shard of several "
                             "operators, each with its own --peering and a disjoint selector")
    parser.add_argument("--liveness", type=int, metavar="PORT", default=None,
                        help="serve kopf's liveness probe at http://0.0.0.0:PORT/healthz")
    parser.add_argument("--metrics-port", type=int, metavar="PORT", default=None,
                        help="serve the operator's Prometheus metrics on this port")
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument("--peering", metavar="NAME", default=None,
                         help="leader election among operator replicas through this ClusterKopfPeering "
                              "object (the chart passes its own): one replica acts, the others wait")
    peering.add_argument("--standalone", action="store_true", help="no peering (one replica only; the default)")
    parser.add_argument("--priority", type=int, default=None,
                        help="peering priority of this replica (default: the earliest-started replica leads)")
    parser.add_argument("--tick", type=float, default=10.0, metavar="SECONDS",
                        help="timer wake-up period: each resource acts every spec.control.interval, "
                             "to within half a tick (default 10)")
    parser.add_argument("--fleet-inventory", action="append", metavar="TYPE=COUNT[@PRICE]", default=None,
                        help="GPUs the fleet advice may pack onto, as kneecap pack --gpus takes them, e.g. "
                             "h100-80gb=12,l40s=4,l4=8@0.7 (price: the catalog's when omitted; repeatable): it may "
                             "then advise a smaller or cheaper GPU type (advice only; docs/placement.md). Default: "
                             "the GPU types the fleet holds today")
    parser.add_argument("--fleet-interval", type=float, default=60.0, metavar="SECONDS",
                        help="how often each LLMDeployment's fleet timer reads the fleet advice (the packing "
                             "reruns only when the fleet's inputs change)")
    parser.add_argument("--fleet-cpu-share", type=float, default=None, metavar="FRACTION",
                        help="the most CPU, as a share of one core on average, that the fleet advice spends "
                             "repacking for workload drift alone (a change of the fleet's deployments, specs or "
                             "replicas repacks at once; default 0.05)")
    parser.add_argument("--fleet-max-evaluations", type=int, default=None, metavar="N",
                        help="the most GAUSS tail evaluations (about a CPU-second each) one packing of the fleet "
                             "advice may spend; a fleet that needs more gets no recommendation, said why in "
                             "status.placement (kneecap pack has no bound; default 200)")
    parser.add_argument("--max-concurrent-reconciles", type=int, default=None, metavar="N",
                        help="LLMDeployments whose control tick or spec reconcile may run at once; the others "
                             "wait for a slot (default 4; as controller-runtime's MaxConcurrentReconciles: past a "
                             "few, one tick's CPU delays the others' API replies until they time out)")
    parser.add_argument("--verbose", action="store_true")
    common.add_json(parser, "log as JSON lines on stdout (kopf's JSON format, with the object each line is about)")


def _check(args) -> None:
    from kneecap.errors import InputError

    for name in ("liveness", "metrics_port"):
        port = getattr(args, name)
        if port is not None and not 0 < port < 65536:
            raise InputError(f"--{name.replace('_', '-')}", f"expected a TCP port 1-65535, got {port}")
    if args.tick <= 0:
        raise InputError("--tick", f"expected seconds > 0, got {args.tick}")
    if args.selector is not None:
        from kneecap.control.shard import parse_selector

        parse_selector(args.selector, "--selector")
    if not args.fleet_interval > 0 or args.fleet_interval == float("inf"):
        raise InputError("--fleet-interval", f"expected seconds > 0, got {args.fleet_interval}")
    if args.fleet_cpu_share is not None and not 0.0 < args.fleet_cpu_share <= 1.0:
        raise InputError("--fleet-cpu-share", f"expected a fraction of a core in (0, 1], got {args.fleet_cpu_share}")
    if args.max_concurrent_reconciles is not None and args.max_concurrent_reconciles < 1:
        raise InputError("--max-concurrent-reconciles", f"expected a count ≥ 1, got {args.max_concurrent_reconciles}")
    if args.fleet_max_evaluations is not None and args.fleet_max_evaluations < 1:
        raise InputError("--fleet-max-evaluations", f"expected a count ≥ 1, got {args.fleet_max_evaluations}")
    fleet_inventory(args)


def fleet_bounds(args) -> dict:
    """The OperatorConfig fields of ``--fleet-cpu-share`` and ``--fleet-max-evaluations`` given."""
    out = {}
    if args.fleet_cpu_share is not None:
        out["fleet_cpu_share"] = float(args.fleet_cpu_share)
    if args.fleet_max_evaluations is not None:
        out["fleet_max_evaluations"] = int(args.fleet_max_evaluations)
    return out


def fleet_inventory(args):
    """The GPUs the fleet advice may pack onto (``--fleet-inventory``, parsed as ``kneecap pack
    --gpus``: a tuple of ``packing.GpuOffer``), None without the flag (today's GPU types);
    InputError naming ``--fleet-inventory``."""
    if args.fleet_inventory is None:
        return None
    from kneecap.commands.pack import parse_gpus

    return parse_gpus(args.fleet_inventory, "--fleet-inventory")


def run(args) -> int:
    _check(args)
    import kopf

    from kneecap.control.drain import Drain
    from kneecap.control.handlers import OperatorConfig, build_registry, operator_settings
    from kneecap.control.metrics import OperatorMetrics

    if args.json:
        kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.JSON)
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler):
                handler.setStream(sys.stdout)
    else:
        logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        logging.getLogger("kopf.objects").addFilter(_quiet_timer_successes)
    metrics = OperatorMetrics()
    if args.metrics_port:
        metrics.serve(args.metrics_port)
    selector = None
    if args.selector is not None:
        from kneecap.control.shard import parse_selector

        selector = parse_selector(args.selector, "--selector")
        logging.getLogger("kneecap.shard").info("shard %s: acting on LLMDeployments matching it only (finalizer %s)",
                                                selector, selector.finalizer)
    inventory = fleet_inventory(args)
    if inventory is not None:
        logging.getLogger("kneecap.fleet").info(
            "fleet advice packs onto %s (advice only: spec.accelerator.gpu is never changed)",
            ", ".join(f"{o.gpu.key}={o.count}@{o.cost_per_hour:g}" for o in inventory))
    drain = Drain()
    registry = build_registry(OperatorConfig(metrics=metrics, tick_s=args.tick, peering_priority=args.priority,
                                             selector=selector, fleet_s=args.fleet_interval, drain=drain,
                                             fleet_inventory=inventory, **fleet_bounds(args),
                                             **({} if args.max_concurrent_reconciles is None
                                                else {"max_concurrent_reconciles": args.max_concurrent_reconciles})))
    kwargs: dict = {
        "registry": registry,
        "standalone": args.standalone or args.peering is None,
        "clusterwide": bool(args.all_namespaces),
        "namespaces": list(args.namespace),
        "liveness_endpoint": f"http://0.0.0.0:{args.liveness}/healthz" if args.liveness else None,
    }
    if args.peering:
        kwargs["peering_name"] = args.peering
    if not args.all_namespaces and not args.namespace:
        kwargs["clusterwide"] = True
    kwargs["settings"] = operator_settings(kwargs["namespaces"], clusterwide=kwargs["clusterwide"])
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_operate(kwargs, drain))
    return 0


async def _operate(kwargs: dict, drain) -> None:
    """kopf.operator, its SIGTERM/SIGINT handlers replaced by the drain's: the handlers under
    way finish before kopf's stop removes this replica from its peers (kneecap.control.drain)."""
    import kopf

    existing = asyncio.all_tasks()
    stop = asyncio.Event()
    tasks = await kopf.spawn_tasks(stop_flag=stop, **kwargs)
    drain.install(stop)
    await kopf.run_tasks(tasks, ignored=existing)


def _quiet_timer_successes(record: logging.LogRecord) -> bool:
    """Drop kopf's "Timer 'control' succeeded." line: the control timer wakes every --tick per
    resource (200 resources: 40 lines a second); decisions have their own log lines and Events."""
    return record.msg != "Timer 'control' succeeded."


def _loop_factory():
    """uvloop's event loop where it is installed (as `kopf run` does): an operator's CPU goes
    mostly to sockets and the event loop (hundreds of scrapes and API calls per interval)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
