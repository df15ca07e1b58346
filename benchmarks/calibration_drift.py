"""How much of GAUSS's λ* comes from the workload and how much from the online SLIM fit? Measured
on the calibrations and windows of a `kneecap replay` (kneecap policy) of a real trace.

The operator refits SLIM on its last windows (`decide.recalibrate`) and sizes replicas with
GAUSS's λ* per replica on that fit (`decide.colocated_replicas`). The fits of one hour differ
(each explains the windows it was fitted on, within maxFitError), so λ* for the same workload
may differ between them. This script records every calibration the replay used and every
window sized, then computes λ* for a spread of the hour's windows under every distinct
calibration (same engine flags, seed and SLOs as the tick used): per window, the spread across
calibrations against the λ* the tick used, and the highest per-pod rate served within the SLO at
those lengths in the hour (what the pool was seen doing, a floor the model should not go below).

Two replays: the suite's 8B row (`trace_replay.py`'s trace and config, ×5) and its 70B TP 2 row
(`trace_suite.LARGE_MODEL`, ×1). Writes benchmarks/results/calibration_drift.{json,md}.

Run: .venv/bin/python benchmarks/calibration_drift.py [--windows 8]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _paths import RESULTS  # noqa: E402
from trace_replay import CONFIG, TRACE  # noqa: E402
from trace_suite import LARGE_MODEL  # noqa: E402

from kneecap.control import decide  # noqa: E402
from kneecap.control.spec import parse_spec  # noqa: E402
from kneecap.sim.replay import llmd_spec, run_policy  # noqa: E402
from kneecap.sim.trace import compress, read_trace  # noqa: E402

LENGTH_MATCH = 0.1  # a window served "at the same lengths": both mean lengths within 10%


def record(trace, cfg, start_replicas: int) -> tuple[list[tuple], list[tuple], float]:
    """(calibrations in use: (window end, calibration, error), the windows sized: (observation,
    engine settings, λ* per replica, binding) of the sizing each tick reported in its status
    (its replay ``ticks``), CPU-s) of one kneecap replay."""
    cals, calls = [], []
    real_recal, real_sized = decide.recalibrate, decide.colocated_replicas

    def recalibrate(arch_key, gpu_key, observations, *args, **kw):
        out = real_recal(arch_key, gpu_key, observations, *args, **kw)
        if out.calibration is not None and observations:
            cals.append((observations[-1].t_end_s, out.calibration, out.error))
        return out

    def colocated(spec, cal, obs, *args, **kw):
        n, binding, alloc = real_sized(spec, cal, obs, *args, **kw)
        calls.append((obs, kw.get("settings"), alloc.get("sustainableRequestsPerSecondPerReplica"), binding))
        return n, binding, alloc

    decide.recalibrate, decide.colocated_replicas = recalibrate, colocated
    cpu0 = time.process_time()
    try:
        run = run_policy(trace, cfg, "kneecap", start_replicas=start_replicas)
    finally:
        decide.recalibrate, decide.colocated_replicas = real_recal, real_sized
    cpu_s = time.process_time() - cpu0
    epoch = run.cluster.now() - run.cluster.t_s  # the virtual clock's unix time at 0 s
    sized = []
    for tick in run.ticks:  # the call whose λ* the tick's status reports, at the window's own rate
        match = [c for c in calls if c[1] is not None and abs(c[0].t_end_s - epoch - tick["t_s"]) < 1e-6
                 and c[2] == tick["sustainable_rps_per_replica"] and c[3] == tick["replicas_binding"]]
        if match:
            sized.append(match[0])
    return [(t - epoch, c, e) for t, c, e in cals], [(o, st, lam, b, o.t_end_s - epoch) for o, st, lam, b in sized], cpu_s


def drift(name: str, trace, cfg, start_replicas: int, windows: int) -> dict:
    spec = parse_spec(llmd_spec(cfg))
    cals, sized, replay_cpu_s = record(trace, cfg, start_replicas)
    distinct: dict[tuple, tuple] = {}
    for t_s, cal, err in cals:
        distinct.setdefault(tuple(sorted(cal.params.items())), (t_s, cal, err))
    fits = sorted(distinct.values(), key=lambda c: c[0])
    picked = [sized[i] for i in np.unique(np.linspace(0, len(sized) - 1, min(windows, len(sized))).astype(int))]
    cpu0 = time.process_time()
    rows = []
    for obs, settings, used, binding, t_s in picked:
        limits = decide.gauss_limits(spec, obs, settings)
        rates = np.array([decide._gauss_rate(spec.model.architecture, spec.accelerator.gpu, cal, obs, spec.slo.ttft_s,
                                             spec.slo.tpot_s, spec.slo.quantile, 0, limits, decide.model_tp(spec))[0]
                          for _, cal, _ in fits])
        same = [o.request_rate_rps / o.pods for o, *_ in sized
                if o.pods >= 1 and not decide.surely_missed(spec, o)
                and abs(o.input_len_mean / obs.input_len_mean - 1.0) <= LENGTH_MATCH
                and abs(o.output_len_mean / obs.output_len_mean - 1.0) <= LENGTH_MATCH]
        rows.append({"t_s": round(t_s, 1), "input_mean": round(obs.input_len_mean, 1),
                     "output_mean": round(obs.output_len_mean, 1), "pods": obs.pods,
                     "rate_rps_per_pod": round(obs.request_rate_rps / max(obs.pods, 1), 4),
                     "kv_tokens": limits.kv_capacity_tokens, "max_num_seqs": limits.slots,
                     "used_rps": round(float(used), 4), "used_binding": binding,
                     "gauss_rps_per_fit": [round(float(r), 4) for r in rates],
                     "spread": round(float(rates.max() / rates.min()), 3) if rates.min() > 0 else None,
                     "served_at_same_lengths_rps_per_pod": round(max(same), 4) if same else None,
                     "windows_at_same_lengths": len(same)})
    return {"name": name, "replay_cpu_s": round(replay_cpu_s, 1), "cross_cpu_s": round(time.process_time() - cpu0, 1),
            "ticks_sized": len(sized), "calibrations_used": len(cals), "distinct_calibrations": len(fits),
            "calibrations": [{"t_s": round(t, 1), "error_pct": None if e is None else round(100 * e, 2),
                              "points": int(c.metrics.get("n_points", 0)),
                              "batch_range": [round(float(c.notes.get("batchMin", np.nan)), 2),
                                              round(float(c.notes.get("batchMax", np.nan)), 2)],
                              "params": {k: float(f"{v:.4g}") for k, v in c.params.items()}} for t, c, e in fits],
            "windows": rows}


def write_md(res: dict) -> str:
    md = ["# Calibration drift: λ* per replica under the hour's SLIM fits", "",
          f"{res['date']}, {res['machine']['nproc']} CPUs, load average {res['machine']['load_average'][0]:.2f}. "
          "GAUSS's λ* per replica (seed 0, the tick's engine flags and SLOs, no measured bound) for a spread of "
          "each replay's windows under every distinct calibration the replay used (one column each, by the "
          "window end it was fitted at). `used`: the λ* the tick sized with, as its status reports it "
          "(`binding` served or missed: a measured per-pod rate bounded GAUSS's); `served`: the highest per-pod "
          f"rate served within the SLO in the hour at the same lengths (both means within {LENGTH_MATCH:.0%}), "
          "with the number of such windows.", ""]
    for c in res["cases"]:
        fits = c["calibrations"]
        md += [f"## {c['name']}", "",
               f"{c['ticks_sized']} ticks sized; {c['calibrations_used']} calibrations in use over the replay, "
               f"{c['distinct_calibrations']} distinct; replay {c['replay_cpu_s']} CPU-s, cross λ* {c['cross_cpu_s']} CPU-s.",
               "", "| window end s | prompt / output mean | pods | rate per pod | λ* used (binding) | "
               + " | ".join(f"λ*, fit of {f['t_s']:g} s" for f in fits) + " | max ÷ min | served (windows) |",
               "|" + "---|" * (7 + len(fits))]
        for w in c["windows"]:
            served = w["served_at_same_lengths_rps_per_pod"]
            md.append(f"| {w['t_s']:g} | {w['input_mean']:.0f} / {w['output_mean']:.0f} | {w['pods']} | "
                      f"{w['rate_rps_per_pod']:.3g} | {w['used_rps']:.3g} ({w['used_binding']}) | "
                      + " | ".join(f"{r:.3g}" for r in w["gauss_rps_per_fit"])
                      + f" | {w['spread']} | {'—' if served is None else f'{served:.3g}'} ({w['windows_at_same_lengths']}) |")
        md += ["", "| fit of s | error % | points | batches fitted |", "|---|---|---|---|"]
        md += [f"| {f['t_s']:g} | {f['error_pct']} | {f['points']} | {f['batch_range'][0]}–{f['batch_range'][1]} |"
               for f in fits]
        md.append("")
    return "\n".join(md)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=8, help="windows per replay to size under every fit")
    args = ap.parse_args()
    raw = read_trace(TRACE)
    name70, _, cfg70 = LARGE_MODEL
    cases = [drift("azure-conv ×5, Llama-3.1-8B on H100 (trace_replay.py)", compress(raw, 5), CONFIG, 3, args.windows),
             drift(f"{name70} ×1 (trace_suite.py)", raw, cfg70, 4, args.windows)]
    res = {"trace": TRACE.name, "cases": cases,
           "machine": {"nproc": os.cpu_count(), "python": platform.python_version(), "platform": platform.machine(),
                       "load_average": os.getloadavg()},
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "calibration_drift.json").write_text(json.dumps(res, indent=2) + "\n")
    md = write_md(res)
    (RESULTS / "calibration_drift.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
