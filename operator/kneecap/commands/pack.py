"""`kneecap pack`: pack a fleet's vLLM engines onto fewer (or cheaper) GPUs, every deployment's
quantile SLOs kept with a margin (issue 24, item 2; the logic: ``kneecap.model.packing``).

Input: ``-f FLEET.yaml`` (a YAML list, or documents each a deployment or a list of them; fields:
``examples/fleet.yaml``) and the GPUs the packing may use: ``--inventory FILE`` (a YAML list of
``{type, count, costPerHour}``) or ``--gpus TYPE=COUNT[@PRICE]`` (repeatable or comma-separated);
neither: the GPUs the fleet holds today. Prices: the inventory's, else the catalog's.

``--verify`` replays the packing on the twins (``sim.pack_verify.verify``: each packed GPU's engines
time-sliced on one virtual-time GPU, seeded, one GPU after another) and reports each deployment's
measured p50/p95/p99 TTFT and TPOT beside the predicted ones.

Exit codes: 0 a packing was found (the JSON or the table says which predicted SLOs hold) and,
with ``--verify``, every SLO is met as measured; 1 a deployment fits no GPU of the inventory
(named, with the best it could do alone on each type), or with ``--verify`` the replay misses an
SLO (the deployments named, measured vs SLO); 2 bad input (an unknown GPU or model, a duplicate
name, a malformed entry: the field is named).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from kneecap.commands import common
from kneecap.errors import InputError

HELP = "pack a fleet's engines onto fewer or cheaper GPUs, keeping every deployment's quantile SLOs"


def add_arguments(p) -> None:
    p.add_argument("-f", "--fleet", required=True, metavar="FLEET.yaml",
                   help="the deployments: a YAML list (or documents) of entries as in examples/fleet.yaml")
    add_packing_arguments(p)
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--verify", action="store_true",
                   help="replay the packing on the twins (virtual time, each GPU's engines time-sliced) and report "
                        "measured p50/p95/p99 TTFT and TPOT beside the predicted; exit 1 if an SLO is missed as "
                        "measured")
    p.add_argument("--verify-requests", type=int, default=1000, metavar="N",
                   help="with --verify: measured requests of each GPU's lightest engine (its busiest at most "
                        "10000 or N)")
    p.add_argument("--plot", metavar="PNG", help="write the GPUs before and after, and what sits on each")
    common.add_json(p)


def add_packing_arguments(p) -> None:
    """The options a packing takes (``kneecap pack`` and ``kneecap replay --fleet``): the GPUs it
    may use, its margin and GAUSS samples."""
    inv = p.add_mutually_exclusive_group()
    inv.add_argument("--inventory", metavar="FILE", help="GPUs the packing may use: a YAML list of "
                                                         "{type, count, costPerHour} (default: today's GPUs)")
    inv.add_argument("--gpus", action="append", metavar="TYPE=COUNT[@PRICE]",
                     help="GPUs the packing may use, e.g. h100-80gb=8,l40s=4@1.8 (price: the catalog's when "
                          "omitted); repeatable")
    p.add_argument("--margin", type=float, default=0.1,
                   help="each predicted quantile must be within (1 - margin) of its SLO")
    p.add_argument("--samples", type=int, default=50_000, help="GAUSS requests simulated per engine and check")


def _yaml(path: str, what: str) -> list:
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InputError(what, f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise InputError(what, f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    entries = []
    for d in docs:
        entries.extend(d if isinstance(d, list) else [d])
    return entries


def _gpus_flag(values: list[str]) -> list[dict]:
    out = []
    for value in values:
        for part in filter(None, (s.strip() for s in value.split(","))):
            key, sep, rest = part.partition("=")
            count, at, price = rest.partition("@")
            try:
                entry = {"type": key.strip(), "count": int(count)}
                if at:
                    entry["costPerHour"] = float(price)
            except ValueError:
                raise InputError("gpus", f"expected TYPE=COUNT[@PRICE], e.g. l40s=4@1.8, got {part!r}") from None
            if not sep:
                raise InputError("gpus", f"expected TYPE=COUNT[@PRICE], e.g. l40s=4@1.8, got {part!r}")
            out.append(entry)
    return out


def parse_gpus(values, flag: str = "gpus"):
    """The inventory ``TYPE=COUNT[@PRICE]`` values give (each one or several comma-separated;
    price: the catalog's when omitted), as ``packing.parse_inventory`` checks it: a tuple of
    ``packing.GpuOffer``. InputError naming ``flag`` (``kneecap pack --gpus``, ``kneecap run
    --fleet-inventory``)."""
    from kneecap.model import packing

    if isinstance(values, str):
        values = [values]
    try:
        return packing.parse_inventory(_gpus_flag(values))
    except InputError as exc:
        raise InputError(flag, str(exc)) from None


def _calibrations(entries: list, base: Path) -> dict:
    from kneecap.model.calibrate import Calibration

    out = {}
    for i, e in enumerate(entries):
        path = e.get("calibration") if isinstance(e, dict) else None
        if isinstance(path, str) and path not in out:
            full = Path(path) if Path(path).is_absolute() else base / path
            try:
                out[path] = Calibration.from_json(full.read_text())
            except OSError as exc:
                raise InputError(f"fleet[{i}].calibration", f"cannot read {full}: {exc.strerror or exc}") from None
            except InputError as exc:
                raise InputError(f"fleet[{i}].calibration", str(exc)) from None
    return out


def build(args):
    """(deployments, inventory or None) from the packing options (:func:`add_packing_arguments`)
    and ``args.fleet``; InputError (exit 2) naming the option, or the entry and field."""
    from kneecap.model import packing

    if not (math.isfinite(args.margin) and 0 <= args.margin < 1):
        raise InputError("margin", f"expected a fraction in [0, 1), got {args.margin}")
    if getattr(args, "verify_requests", 100) < 100:
        raise InputError("verify-requests", f"expected ≥ 100, got {args.verify_requests}")
    if args.samples < 400:
        raise InputError("samples", f"expected ≥ 400 (100 per replication), got {args.samples}")
    entries = _yaml(args.fleet, "fleet")
    deployments = packing.parse_fleet(entries, _calibrations(entries, Path(args.fleet).parent))
    if args.inventory:
        inventory = packing.parse_inventory(_yaml(args.inventory, "inventory"))
    elif args.gpus:
        inventory = parse_gpus(args.gpus)
    else:
        inventory = None
    return deployments, inventory


def _plot(path: str, res) -> None:
    from kneecap.plotting import pyplot

    plt = pyplot()
    names = [d.name for d in res.deployments]
    cmap = plt.get_cmap("tab10")
    color = {n: cmap(i % 10) for i, n in enumerate(names)}
    panels = [("today", res.before)] + ([("packed", res.after)] if res.feasible else [])
    rows = max(len(p) for _, p in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 0.45 * rows + 1.6), squeeze=False)
    for ax, (title, gpus) in zip(axes[0], panels):
        for y, g in enumerate(gpus):
            left = 0.0
            for e in g.engines:
                w = e.gpu_memory_utilization
                ax.barh(y, w, left=left, color=color[e.deployment], edgecolor="white")
                cap = "" if e.max_num_seqs is None else f" cap {e.max_num_seqs}"
                ax.text(left + w / 2, y, f"{e.deployment}#{e.replica}{cap}", ha="center", va="center", fontsize=7)
                left += w
        ax.set_yticks(range(len(gpus)), [f"{g.gpu} ${g.cost_per_hour:g}/h" for g in gpus], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, 1)
        ax.set_xlabel("gpu_memory_utilization (each engine's share)")
        total = math.fsum(g.cost_per_hour for g in gpus)
        ax.set_title(f"{title}: {len(gpus)} GPUs, ${total:.2f}/h")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(x, scale=1.0, unit="s"):
    return "—" if x is None else f"{x * scale:.3g}{unit}"


def _print(out: dict) -> None:
    b = out["before"]
    print(f"today   {b['gpus']} GPUs, ${b['cost_per_hour']:.2f}/h  {b['by_type']}")
    if out["feasible"]:
        a = out["after"]
        print(f"packed  {a['gpus']} GPUs, ${a['cost_per_hour']:.2f}/h  {a['by_type']}  "
              f"({out['gpus_returned']} returned, ${out['savings_per_hour']:.2f}/h saved; margin {out['margin']:.0%})")
        print()
        for g in out["placement"]:
            engines = ", ".join(f"{e['deployment']}#{e['replica']} (cap {e['max_num_seqs']}, "
                                f"mem {e['gpu_memory_utilization']:.3f})" for e in g["engines"])
            print(f"  GPU {g['index']:2d} {g['gpu']:<12} ${g['cost_per_hour']:g}/h  {engines}")
    else:
        print(out["message"])
    print()
    print(f"  {'deployment':<16} {'SLO (q, TTFT, TPOT)':<24} {'before TTFT/TPOT':<22} {'after TTFT/TPOT':<22} met")
    for d in out["deployments"]:
        q = d["slo"]["quantile"]
        k = {0.5: "p50", 0.95: "p95", 0.99: "p99"}[q]
        slo = f"{k} {_fmt(d['slo']['ttft_s'])} {_fmt(d['slo']['tpot_s'], 1e3, 'ms')}"
        bt, bp = d["before"]["ttft_s"], d["before"]["tpot_s"]
        before = f"{_fmt(bt and bt[k])} {_fmt(bp and bp[k], 1e3, 'ms')}"
        after, met = "—", "—"
        if "after" in d:
            at, ap = d["after"]["ttft_s"], d["after"]["tpot_s"]
            after = f"{_fmt(at and at[k])} {_fmt(ap and ap[k], 1e3, 'ms')}"
            met = "yes" if d["after"]["slo_met"] else "NO"
        print(f"  {d['name']:<16} {slo:<24} {before:<22} {after:<22} {met}")
    if out.get("verify"):
        _print_verify(out)
    if not out["feasible"]:
        print()
        for t in out["unplaced"]["best"]:
            print(f"  {out['unplaced']['deployment']} alone on {t['gpu']}: TTFT {_fmt(t['ttft_s'])}, TPOT "
                  f"{_fmt(t['tpot_s'], 1e3, 'ms')} ({t['reason'] or 'fits'}; {t['units_left']} left)")


def _pct(x):
    return "—" if x is None else f"{x:+.1%}"


def _print_verify(out: dict) -> None:
    v = out["verify"]
    print()
    n = len(v["gpus"])
    print(f"verified on the twins ({n} GPU{'' if n == 1 else 's'} replayed one after another in virtual time, "
          f"seed {out['seed']}; each GPU's lightest engine ≥ {v['requests']} measured requests, its busiest ≤ "
          f"{max(v['requests'], v['max_requests'])}; {v['wall_s']:.1f} s)")
    print(f"  {'deployment':<16} {'q':<4} {'predicted TTFT/TPOT':<22} {'verified TTFT/TPOT':<22} "
          f"{'error TTFT/TPOT':<18} {'requests':>8}  met")
    for d in out["deployments"]:
        k = d["verified"]["error"]["quantile"]
        a, m = d["after"], d["verified"]
        pred = f"{_fmt(a['ttft_s'] and a['ttft_s'][k])} {_fmt(a['tpot_s'] and a['tpot_s'][k], 1e3, 'ms')}"
        meas = f"{_fmt(m['ttft_s'][k])} {_fmt(m['tpot_s'] and m['tpot_s'][k], 1e3, 'ms')}"
        err = f"{_pct(m['error']['ttft'])} {_pct(m['error']['tpot'])}"
        rej = f" ({m['rejected']} refused: longer than the model's context)" if m["rejected"] else ""
        print(f"  {d['name']:<16} {k:<4} {pred:<22} {meas:<22} {err:<18} {m['requests']:>8}  "
              f"{'yes' if m['slo_met'] else 'NO'}{rej}")
    if v["misses"]:
        print()
        print(v["message"])


def _misses_message(misses: list) -> str:
    parts = []
    for m in misses:
        k = {0.5: "p50", 0.95: "p95", 0.99: "p99"}[m["quantile"]]
        scale, unit = (1.0, "s") if m["metric"] == "ttft" else (1e3, "ms")
        parts.append(f"{m['deployment']} {k} {m['metric'].upper()} {_fmt(m['measured_s'], scale, unit)} > SLO "
                     f"{_fmt(m['slo_s'], scale, unit)}")
    return "SLO missed as verified: " + "; ".join(parts)


def run(args) -> int:
    from kneecap.model import packing
    from kneecap.sim import pack_verify

    deployments, inventory = build(args)
    res = packing.pack(deployments, inventory, margin=args.margin, seed=args.seed, samples=args.samples)
    out = packing.result_dict(res)
    out["seed"] = args.seed
    if args.verify and res.feasible:
        t0 = time.perf_counter()
        verified = pack_verify.verify(res, seed=args.seed, requests=args.verify_requests,
                                  max_requests=max(args.verify_requests, pack_verify.VERIFY_MAX_REQUESTS))
        pack_verify.verification_dict(res, verified, out, requests=args.verify_requests,
                                  max_requests=max(args.verify_requests, pack_verify.VERIFY_MAX_REQUESTS))
        out["verify"]["wall_s"] = time.perf_counter() - t0
        if out["verify"]["misses"]:
            out["verify"]["message"] = _misses_message(out["verify"]["misses"])
    if args.plot:
        _plot(args.plot, res)
        out["plot"] = args.plot
    if args.json:
        print(json.dumps(out, allow_nan=False))
    else:
        _print(out)
    if not res.feasible or (args.verify and out["verify"]["misses"]):
        return common.EXIT_FAILED
    return common.EXIT_OK
