"""Sensitivity of kneecap's replica policy to its constants, over the whole trace suite.

Issue 23 asks that the policy's constants come from a sweep over the suite, never from one
trace. The three that size a colocated pool are swept here: ``spec.control.rateHeadroom`` (the
multiple of the observed rate the pool is sized for), ``spec.control.hysteresis`` (the band a
replica count must leave before it moves) and ``spec.control.scaleDownDeviations`` (the spread
of the pool's work a scale-down keeps in reserve). Every trace of `trace_suite.py` (same compressions,
same config) is replayed with the kneecap policy alone at each setting; the oracle and the
baselines do not depend on them and are read from trace_suite.json (run that first, on the same
code). Per setting: good requests per GPU-hour against the oracle, SLO attainment, and how many
traces meet the suite's goals (attainment ≥ q wherever the oracle's is, ≥ 0.97× the oracle's
good requests per GPU-hour). Virtual time: deterministic.

    PYTHONPATH=operator .venv/bin/python benchmarks/trace_sweep.py [--settings H/B[/D],...] [--only TRACE ...] [--part FILE]
    PYTHONPATH=operator .venv/bin/python benchmarks/trace_sweep.py [--settings H/B[/D],...] --merge FILE ...

Writes trace_sweep.{json,md} to results/ (``--name``: another stem; ``--part``: one partial JSON
for ``--merge``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _paths import RESULTS  # noqa: E402
from trace_replay import CONFIG, TRACE  # noqa: E402
from trace_suite import cases, code_version, merged_rows  # noqa: E402

from kneecap.sim.replay import Sweep, peak_sized_replicas, replay  # noqa: E402
from kneecap.sim.trace import compress, read_trace  # noqa: E402

# (rateHeadroom, hysteresis, scaleDownDeviations); the shipped default is the first
SHIPPED_DEVIATIONS = 1.0
SETTINGS = ((1.1, 0.1, 1.0), (1.0, 0.1, 1.0), (1.2, 0.1, 1.0), (1.35, 0.1, 1.0), (1.1, 0.0, 1.0), (1.1, 0.2, 1.0),
            (1.1, 0.1, 0.0), (1.1, 0.1, 2.0))
VS_ORACLE_GOAL = 0.97


def parse_settings(text: str) -> tuple[tuple[float, float, float], ...]:
    """``1.2/0.1,1.1/0.1/2`` -> ((1.2, 0.1, 1.0), (1.1, 0.1, 2.0)): rateHeadroom/hysteresis[/scaleDownDeviations]
    (the shipped deviations where left out), the shipped setting first."""
    try:
        out = []
        for item in text.split(","):
            parts = [float(v) for v in item.split("/")]
            if len(parts) not in (2, 3):
                raise ValueError(item)
            out.append((parts[0], parts[1], parts[2] if len(parts) == 3 else SHIPPED_DEVIATIONS))
    except ValueError:
        raise argparse.ArgumentTypeError("expected HEADROOM/HYSTERESIS[/DEVIATIONS] separated by commas, "
                                         f"got {text!r}")
    return tuple(out)


def label(setting) -> str:
    return " / ".join(f"{v:g}" for v in setting)


def run_trace(trace, factor: int, settings=SETTINGS, base=CONFIG) -> list[dict]:
    """kneecap at every setting on one trace, all from the same start (the defaults' peak-sized pool)."""
    squeezed = compress(trace, factor)
    start = peak_sized_replicas(squeezed, base, Sweep())
    out = []
    for headroom, band, deviations in settings:
        cpu0 = time.process_time()
        cfg = dataclasses.replace(base, start_replicas=start, rate_headroom=headroom, hysteresis=band,
                                  scale_down_deviations=deviations)
        k = replay(squeezed, cfg, ["kneecap"])["report"]["policies"]["kneecap"]
        out.append({"rate_headroom": headroom, "hysteresis": band, "scale_down_deviations": deviations,
                    "good_per_gpu_hour": k["good_per_gpu_hour"] or 0.0,
                    "attainment": k["slo_attainment_requests"], "mean_replicas": k["mean_replicas"],
                    "pods_started": k["pods_started"], "flaps": k["flaps"], "restarts": k["restarts"],
                    "cpu_s": round(time.process_time() - cpu0, 1)})
    return out


def summarise(rows: list[dict], suite: dict, quantile: float, settings=SETTINGS) -> list[dict]:
    """Per setting: traces meeting the goals against the oracle of trace_suite.json."""
    ref = {r["trace"]: r for r in suite["rows"]}
    out = []
    for i, setting in enumerate(settings):
        ratios, met, att_met = [], 0, 0
        for r in rows:
            s, o = r["settings"][i], ref[r["trace"]]
            oracle_good, oracle_att = o["good_per_gpu_hour"]["oracle"], o["attainment"]["oracle"]
            ratio = s["good_per_gpu_hour"] / oracle_good if oracle_good else None
            s["vs_oracle"] = None if ratio is None else round(ratio, 4)
            attains = s["attainment"] >= quantile or oracle_att < quantile
            att_met += attains
            met += bool(attains and ratio is not None and ratio >= VS_ORACLE_GOAL)
            if ratio is not None:
                ratios.append(ratio)
        out.append({"setting": list(setting), "traces": len(rows), "goals_met": met,
                    "attainment_met": att_met, "min_vs_oracle": round(min(ratios), 4) if ratios else None,
                    "geomean_vs_oracle": round(statistics.geometric_mean(ratios), 4) if ratios else None,
                    "flaps": sum(r["settings"][i]["flaps"] for r in rows)})
    return out


def markdown(rows: list[dict], summary: list[dict], suite: dict, settings=SETTINGS) -> str:
    head = [label(s) for s in settings]
    out = ["# Trace suite: sensitivity of the replica policy", "", __doc__.split("\n\n")[1].replace("\n", " "), "",
           f"Suite results: trace_suite.json on {suite.get('code', '?')}. Columns: rateHeadroom / hysteresis / "
           "scaleDownDeviations.", "",
           "| setting | traces meeting the goals | attainment ≥ q where the oracle's is | vs oracle, worst | "
           "vs oracle, geometric mean | flaps |", "|---|---|---|---|---|---|"]
    for s in summary:
        shipped = " (shipped)" if tuple(s["setting"]) == tuple(settings[0]) else ""
        out.append(f"| {label(s['setting'])}{shipped} | {s['goals_met']} of {s['traces']} "
                   f"| {s['attainment_met']} of {s['traces']} | {s['min_vs_oracle']} | {s['geomean_vs_oracle']} "
                   f"| {s['flaps']} |")
    if len(rows) < len(suite["rows"]):
        out += ["", f"Run on {len(rows)} of the suite's {len(suite['rows'])} traces (`--only`): "
                    + ", ".join(r["trace"] for r in rows) + "."]
    out += ["", "Per trace, kneecap's good requests per GPU-hour against the oracle (attainment of requests):", "",
            "| trace | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    for r in rows:
        out.append(f"| {r['trace']} | " + " | ".join(f"{s['vs_oracle']} ({s['attainment']:.4f})"
                                                   for s in r["settings"]) + " |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", type=parse_settings, default=None,
                    help="rateHeadroom/hysteresis[/scaleDownDeviations] to run, the shipped one first "
                         "(default: SETTINGS)")
    ap.add_argument("--name", default="trace_sweep", help="the results' file stem (default trace_sweep)")
    ap.add_argument("--only", nargs="*", default=None, help="trace names to run (default all)")
    ap.add_argument("--part", type=Path, default=None, help="write this partial JSON instead of the results")
    ap.add_argument("--merge", nargs="*", type=Path, default=None, help="partial JSONs to merge into the results")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    settings = args.settings or SETTINGS
    suite = json.loads((args.out / "trace_suite.json").read_text())
    if args.merge is not None:
        rows = merged_rows(args.merge, [r["trace"] for r in suite["rows"]])  # the suite's order
    else:
        rows = []
        for name, _, trace, factor, cfg in cases(read_trace(TRACE)):
            if args.only is not None and name not in args.only:
                continue
            rows.append({"trace": name, "compress": factor, "settings": run_trace(trace, factor, settings, cfg)})
            print(json.dumps({"trace": name, "good": [s["good_per_gpu_hour"] for s in rows[-1]["settings"]]}),
                  flush=True)
        if args.part is not None:
            args.part.write_text(json.dumps({"rows": rows}, indent=1))
            return 0
    summary = summarise(rows, suite, CONFIG.quantile, settings)
    result = {"settings": [list(s) for s in settings], "summary": summary, "rows": rows,
              "suite_code": suite.get("code"),
              "code": code_version()}
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1, sort_keys=True))
    (args.out / f"{args.name}.md").write_text(markdown(rows, summary, suite, settings))
    print(markdown(rows, summary, suite, settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
