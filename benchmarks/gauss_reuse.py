"""How far apart may two windows' GAUSS inputs be for one λ* to serve both? Measured on the λ
searches the operator makes in `kneecap replay` (kneecap policy) of a real trace.

The replay's speed is bound by GAUSS's λ search (one per window, benchmarks/results/trace_replay.md),
and a search is reused only when every input is within `control.gauss_reuse.REL_TOL` of a past
run's. This script puts three scales side by side, per recorded search:

1. GAUSS's own noise: λ* from the same inputs with other seeds (its Monte Carlo error);
2. its sensitivity: λ* with both mean lengths 2.5% and 5% longer (same seed);
3. real traffic: how much a window's mean lengths move from one window to the next, against
   the sampling error of a window's mean length, CV/√n for the n requests finished in it (what
   the operator can tell apart at all); and how much the estimate the models are given (the
   windows of one mix pooled, kneecap.control.workload_estimate) and λ* move from tick to tick.

Writes benchmarks/results/gauss_reuse.{json,md}.

Run: .venv/bin/python benchmarks/gauss_reuse.py [--compress 4] [--samples 8]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _paths import RESULTS, ROOT  # noqa: E402

from kneecap import cli  # noqa: E402
from kneecap.control import decide, gauss_reuse, workload_estimate  # noqa: E402
from kneecap.model import gauss  # noqa: E402

TRACE = ROOT / "data" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
SEEDS = (1, 2, 3, 4, 5)
LENGTH_STEPS = (1.025, 1.05)


@dataclasses.dataclass
class Search:
    """One λ search of the replay: the window it was made for, GAUSS's arguments, its answer."""

    input_mean: float
    output_mean: float
    reused: bool
    rate_rps: float
    args: tuple | None = None  # (workload, coefficients, keywords) of a search that ran


def record_replay(compress: int) -> tuple[list[Search], list[tuple], float]:
    """Every `_gauss_rate` call of one `kneecap replay --policy kneecap` run, in order, and each
    tick's (latest window, the estimate the models were given, windows pooled)."""
    searches: list[Search] = []
    ran: list[tuple] = []
    estimates: list[tuple] = []
    real_rate, real_search, real_pooled = decide._gauss_rate, gauss.sustainable_rate, workload_estimate.pooled

    def pooled(latest, ring, *args, **kw):
        est, count = real_pooled(latest, ring, *args, **kw)
        estimates.append((latest, est, count))
        return est, count

    def search(wl, coef, **kw):
        ran.append((wl, coef, {k: v for k, v in kw.items() if k not in ("rng", "hint_rps")}))
        return real_search(wl, coef, **kw)

    def rate(arch_key, gpu_key, cal, obs, *args, **kw):
        before = len(ran)
        lam, binding, reused = real_rate(arch_key, gpu_key, cal, obs, *args, **kw)
        searches.append(Search(obs.input_len_mean, obs.output_len_mean, reused, lam,
                               ran[before] if len(ran) > before else None))
        return lam, binding, reused

    decide._gauss_rate, gauss.sustainable_rate, workload_estimate.pooled = rate, search, pooled
    cpu0 = time.process_time()
    try:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            cli.main(["replay", str(TRACE), "--compress", str(compress), "--policy", "kneecap", "--json"])
    finally:
        decide._gauss_rate, gauss.sustainable_rate, workload_estimate.pooled = real_rate, real_search, real_pooled
    json.loads(out.getvalue())  # the replay's report: it ran to the end
    return searches, estimates, time.process_time() - cpu0


def lengths_scaled(wl: gauss.Workload, factor: float) -> gauss.Workload:
    return gauss.Workload(input_tokens=dataclasses.replace(wl.input_tokens, mean=wl.input_tokens.mean * factor),
                          output_tokens=dataclasses.replace(wl.output_tokens, mean=wl.output_tokens.mean * factor))


def probe(s: Search) -> dict:
    """λ* at other seeds and at longer lengths, for one search that ran."""
    wl, coef, kw = s.args
    base = gauss.sustainable_rate(wl, coef, rng=np.random.default_rng(0), **kw).rate_rps
    seeds = np.array([gauss.sustainable_rate(wl, coef, rng=np.random.default_rng(k), **kw).rate_rps for k in SEEDS])
    steps = {f"{f:g}": gauss.sustainable_rate(lengths_scaled(wl, f), coef, rng=np.random.default_rng(0),
                                              **kw).rate_rps / base - 1.0 for f in LENGTH_STEPS}
    return {"rate_rps": base, "seed_cv": float(seeds.std() / seeds.mean()),
            "seed_range": float((seeds.max() - seeds.min()) / seeds.mean()), "lengths_step": steps}


def quantiles(x) -> dict:
    x = np.asarray(x, dtype=float)
    return {"p50": float(np.median(x)), "p90": float(np.quantile(x, 0.9))} if x.size else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compress", type=int, default=4)
    ap.add_argument("--samples", type=int, default=8, help="searches probed at other seeds and lengths")
    args = ap.parse_args()

    searches, estimates, replay_cpu_s = record_replay(args.compress)
    ran = [s for s in searches if s.args is not None]
    if len(searches) < 2 or not ran:
        raise SystemExit(f"the replay made {len(searches)} λ searches ({len(ran)} ran): nothing to compare")
    cpu0 = time.process_time()
    picked = [ran[i] for i in np.unique(np.linspace(0, len(ran) - 1, min(args.samples, len(ran))).astype(int))]
    probes = [probe(s) for s in picked]
    probe_cpu_s = time.process_time() - cpu0

    # each tick's latest window (what a model fed one window sees) and the pooled estimate
    latest = [e[0] for e in estimates if e[0].finished_requests > 0]
    pooled_obs = [e[1] for e in estimates if e[0].finished_requests > 0]
    counts = np.array([e[2] for e in estimates if e[0].finished_requests > 0])

    def moves(obs) -> np.ndarray:
        means = np.array([[o.input_len_mean, o.output_len_mean] for o in obs])
        return np.abs(np.diff(means, axis=0)) / means[:-1]  # window to window, relative

    raw_move, est_move = moves(latest), moves(pooled_obs)
    n = np.maximum(np.array([o.finished_requests for o in latest]), 1.0)
    sem = np.array([[o.input_len_cv, o.output_len_cv] for o in latest]) / np.sqrt(n)[:, None]  # CV/√n
    # λ* per window: the first search of each tick (a tick may search again at other limits)
    means = np.array([[s.input_mean, s.output_mean] for s in searches])
    first = np.concatenate(([True], np.any(means[1:] != means[:-1], axis=1)))
    rates = np.array([s.rate_rps for s, f in zip(searches, first) if f])
    rate_move = np.abs(np.diff(rates)) / np.maximum(rates[:-1], 1e-12)

    res = {
        "trace": TRACE.name, "compress": args.compress,
        "searches": len(searches), "windows": len(latest), "reused": int(sum(s.reused for s in searches)),
        "ran": len(ran),
        "reuse_rel_tol": gauss_reuse.REL_TOL, "replay_cpu_s": replay_cpu_s, "probe_cpu_s": probe_cpu_s,
        "gauss_noise": {"seed_cv": quantiles([p["seed_cv"] for p in probes]),
                        "seed_range": quantiles([p["seed_range"] for p in probes])},
        "sensitivity": {k: quantiles([p["lengths_step"][k] for p in probes]) for k in probes[0]["lengths_step"]},
        "window_to_window": {"input_mean": quantiles(raw_move[:, 0]), "output_mean": quantiles(raw_move[:, 1])},
        "estimate_to_estimate": {"input_mean": quantiles(est_move[:, 0]), "output_mean": quantiles(est_move[:, 1]),
                                 "rate_rps": quantiles(rate_move), "windows_pooled": quantiles(counts)},
        "window_sampling_error": {"input_mean": quantiles(sem[:, 0]), "output_mean": quantiles(sem[:, 1]),
                                  "finished_requests": quantiles(n)},
        "probes": probes,
        "machine": {"nproc": os.cpu_count(), "python": platform.python_version(), "platform": platform.machine(),
                    "load_average": os.getloadavg()},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "gauss_reuse.json").write_text(json.dumps(res, indent=2) + "\n")
    pct = lambda q: f"{100 * q['p50']:.1f}% / {100 * q['p90']:.1f}%"  # noqa: E731
    rows = [
        ("GAUSS's own noise: λ* seed-to-seed CV (seeds 1-5, same inputs)", pct(res["gauss_noise"]["seed_cv"])),
        ("GAUSS's own noise: λ* range over the seeds", pct(res["gauss_noise"]["seed_range"])),
        *((f"λ* change with both mean lengths ×{k}", pct(v)) for k, v in res["sensitivity"].items()),
        ("window to window: input mean length moves", pct(res["window_to_window"]["input_mean"])),
        ("window to window: output mean length moves", pct(res["window_to_window"]["output_mean"])),
        ("pooled estimate, tick to tick: input mean length moves", pct(res["estimate_to_estimate"]["input_mean"])),
        ("pooled estimate, tick to tick: output mean length moves", pct(res["estimate_to_estimate"]["output_mean"])),
        ("tick to tick: λ* moves", pct(res["estimate_to_estimate"]["rate_rps"])),
        ("windows pooled", "{p50:.0f} / {p90:.0f}".format(**res["estimate_to_estimate"]["windows_pooled"])),
        ("a window's sampling error of the input mean (CV/√n)", pct(res["window_sampling_error"]["input_mean"])),
        ("a window's sampling error of the output mean (CV/√n)", pct(res["window_sampling_error"]["output_mean"])),
    ]
    md = ["# GAUSS λ* reuse: its own noise against real traffic's window-to-window change", "",
          f"`kneecap replay` of {TRACE.name} ×{args.compress} (the whole trace), kneecap policy: "
          f"{len(latest)} windows, {len(searches)} λ searches, {res['reused']} reused (inputs within "
          f"{100 * gauss_reuse.REL_TOL:g}% of a past run's), {len(ran)} ran; {len(probes)} of them probed at {len(SEEDS)} other seeds and at longer "
          f"lengths. {res['date']}, {os.cpu_count()} CPUs, load average {res['machine']['load_average'][0]:.2f}; "
          f"replay {replay_cpu_s:.0f} CPU-s, probes {probe_cpu_s:.0f} CPU-s.", "",
          "| quantity | p50 / p90 (over the probed searches, or the windows) |", "|---|---|",
          *(f"| {a} | {b} |" for a, b in rows), ""]
    (RESULTS / "gauss_reuse.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
