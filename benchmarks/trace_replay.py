"""Trace replay: over a real hour of bursty traffic, does kneecap keep the SLO with fewer GPUs?

Setup: the Azure LLM inference trace 2023 (conversation, 19,366 requests in one hour,
data/azure-llm-2023/, CC-BY 4.0, Patel et al. ISCA 2024) replayed with `kneecap.sim.replay`
in virtual time: Llama-3.1-8B on h100-80gb twins, SLO p95 TTFT ≤ 1 s and p95 TPOT ≤ 50 ms,
pods load 16 GB of weights at 2 GiB/s plus 30 s of start-up, a stopping pod finishes its
requests for 30 s and loses the rest. Policies: kneecap (enforce), vLLM defaults on a pool
sized for the peak, the defaults under an HPA on KV-cache usage (target 0.5) and on waiting
requests (5 per pod), the defaults under llm-d's SLO-aware KEDA recipe (keda-slo), and the best
static configuration in hindsight (oracle).

Compression: the least whole factor at which the defaults' pool sized for the peak needs at least
three replicas (`kneecap.sim.replay.compression_for_peak`, the `--peak-replicas 3` of `kneecap
replay`), found by replaying the trace: ×5 here (×4 still fits the peak on two). The least
such factor because what a replay compresses is only the arrivals: a pod's model load (≈ 38 s),
the HPA's 300 s scale-down window and the operator's cooldown keep their length, so every extra
factor makes them weigh more against the trace than they would on the real hour. The goals are
also reported at ×6 and ×7 (`--also`), as measured.

Goals (reported as measured, met or not): kneecap's good requests per GPU-hour ≥ 97% of the
oracle's and ≥ 1.2× that of defaults+hpa, at an SLO attainment no lower than either; ≤ 1
restart per replica-hour; no flapping (no setting revisited within the cooldown).
Also reported: the requests kneecap serves outside the SLO (and which baselines miss them too),
and an upper bound on what any replica autoscaler could reach against defaults+hpa.
Writes trace_replay.{json,md,png} to results/.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _paths import RESULTS, ROOT  # noqa: E402

from kneecap.model.arch import get_arch  # noqa: E402
from kneecap.sim import replay_report as rep  # noqa: E402
from kneecap.sim.replay import (DEFAULT_CAP, DEFAULT_MEMORY, ReplayConfig, compression_for_peak,  # noqa: E402
                                latencies, replay, run_policy, series)
from kneecap.sim.trace import Trace, compress, read_trace  # noqa: E402

TRACE = ROOT / "data" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
PEAK_REPLICAS = 3
ALSO = (6.0, 7.0)
CONFIG = ReplayConfig(model="meta-llama/Llama-3.1-8B-Instruct", architecture="llama-3.1-8b", gpu="h100-80gb",
                      slo_ttft_s=1.0, slo_tpot_s=0.05, quantile=0.95, min_replicas=1, max_replicas=8)


def goals(report: dict) -> dict:
    p = report["policies"]
    k, o, h = p["kneecap"], p["oracle"], p["defaults+hpa"]
    att = lambda s: s["slo_attainment_requests"] or 0.0  # noqa: E731
    g = lambda s: s["good_per_gpu_hour"] or 0.0  # noqa: E731
    # the best of what users run today: every baseline of the replay but the hindsight oracle
    best = max((q for q in p if q not in ("kneecap", "oracle")), key=lambda q: g(p[q]))
    return {
        "vs_oracle": round(g(k) / g(o), 4) if g(o) else None,
        "vs_oracle_met": g(k) >= 0.97 * g(o),
        "vs_hpa": round(g(k) / g(h), 4) if g(h) else None,
        "vs_hpa_met": g(k) >= 1.2 * g(h),
        "attainment_met": att(k) >= max(att(o), att(h)),
        "restarts_per_replica_hour": k["restarts_per_replica_hour"],
        "restarts_met": (k["restarts_per_replica_hour"] or 0.0) <= 1.0,
        "flaps": k["flaps"],
        "flaps_met": k["flaps"] == 0,
        "defaults_replicas": p["defaults"]["settings"]["replicas"],
        "best_baseline": best,
        "vs_best_baseline": round(g(k) / g(p[best]), 4) if g(p[best]) else None,
    }


def autoscaling_bound(trace: Trace, cfg: ReplayConfig, hpa_good_per_gpu_hour: float,
                      settings: list[tuple[int, float]]) -> dict:
    """An upper bound on good requests per GPU-hour for any replica autoscaler on one of the engine
    ``settings`` (cap, memory): an oracle that knows each report window's arrivals runs, in each
    window, the fewest replicas at which, on the best of the settings, that window alone (replayed
    from empty pods, so nothing queued from the window before) serves every request within both
    SLOs ("strict", 100% attainment) or meets the SLO quantiles ("quantile"). "free": replicas
    change at no cost; "with load": each replica added also holds its GPU for the model-load delay
    first; "with load, cooldown": besides, no
    scale-down within the cooldown of a scale-up (kneecap's rule, ``replica_stabilisation.stabilised_replicas``;
    the cheapest such schedule, found by dynamic programming over windows)."""
    width_s = cfg.window_s
    load_s = cfg.kubelet.load_delay_s(get_arch(cfg.architecture))
    k = (trace.arrival_s // width_s).astype(int)
    need = {"strict": [], "quantile": []}
    good = {"strict": 0, "quantile": 0}
    for w in range(int(k.max()) + 1):
        idx = k == w
        part = Trace(trace.arrival_s[idx] - w * width_s, trace.input_tokens[idx], trace.output_tokens[idx],
                     trace.source)
        left = {"strict", "quantile"}
        for r in range(cfg.min_replicas, cfg.max_replicas + 1):
            met = {"strict": False, "quantile": False}
            n_ok = {"strict": 0, "quantile": 0}
            for cap, mem in settings:
                if not idx.any():
                    ok = np.zeros(0, dtype=bool)
                    now = {"strict": True, "quantile": True}
                else:
                    ttft, tpot = latencies(run_policy(part, cfg, "static", static=(cap, mem, r)).requests)
                    ok = (ttft <= cfg.slo_ttft_s) & (tpot <= cfg.slo_tpot_s)
                    now = {"strict": bool(ok.all()),
                           "quantile": bool(np.quantile(ttft, cfg.quantile, method="inverted_cdf") <= cfg.slo_ttft_s
                                            and np.quantile(tpot, cfg.quantile, method="inverted_cdf")
                                            <= cfg.slo_tpot_s)}
                for rule in left:
                    if not met[rule]:  # the first setting meeting the rule, else the most good requests
                        met[rule] = now[rule]
                        n_ok[rule] = int(ok.sum()) if now[rule] else max(n_ok[rule], int(ok.sum()))
            for rule in sorted(left):
                if met[rule] or r == cfg.max_replicas:
                    need[rule].append(r)
                    good[rule] += n_ok[rule]
                    left.discard(rule)
            if not left:
                break
    out = {}
    for rule, chosen in need.items():
        good_n = good[rule]
        widths = np.minimum(width_s, max(trace.span_s, 1e-9) - np.arange(len(chosen)) * width_s)
        ups = float(np.maximum(np.diff(chosen), 0).sum())
        schedules = {"free": (chosen, float(np.dot(chosen, widths))),
                     "with load": (chosen, float(np.dot(chosen, widths)) + ups * load_s),
                     "with load, cooldown": _cheapest_schedule(chosen, widths, load_s, cfg.cooldown_s,
                                                               cfg.max_replicas)}
        for cost, (plan, g_s) in schedules.items():
            gph = good_n / (g_s / 3600.0)
            vs_hpa = round(gph / hpa_good_per_gpu_hour, 4) if hpa_good_per_gpu_hour else None
            out[f"{rule}, {cost}"] = {"replicas": list(plan), "gpu_hours": round(g_s / 3600.0, 4), "good": good_n,
                                      "good_per_gpu_hour": round(gph, 1), "vs_hpa": vs_hpa}
    return out


def _cheapest_schedule(need: list[int], widths: np.ndarray, load_s: float, cooldown_s: float,
                       max_replicas: int) -> tuple[list[int], float]:
    """The replica schedule with the fewest GPU-seconds that runs at least ``need`` in every window,
    pays ``load_s`` per replica added and scales down only ``cooldown_s`` after its last scale-up.
    State: (replicas, seconds since the last scale-up at the window's start, capped at the cooldown)."""
    best = {(r, cooldown_s): (r * float(widths[0]), [r]) for r in range(need[0], max_replicas + 1)}
    for w in range(1, len(need)):
        nxt: dict = {}
        for (r, since), (cost, plan) in best.items():
            elapsed = min(since + float(widths[w - 1]), cooldown_s)  # at the start of window w
            for r2 in range(need[w], max_replicas + 1):
                if r2 < r and elapsed < cooldown_s:
                    continue
                s2 = 0.0 if r2 > r else elapsed
                c2 = cost + r2 * float(widths[w]) + max(r2 - r, 0) * load_s
                key = (r2, s2)
                if key not in nxt or c2 < nxt[key][0]:
                    nxt[key] = (c2, plan + [r2])
        best = nxt
    cost, plan = min(best.values())
    return plan, cost


def missed_requests(cfg: ReplayConfig, runs: dict) -> dict:
    """Which requests kneecap serves outside the SLO, and whether each baseline misses them too."""
    missed = {}
    for p, r in runs.items():
        ttft, tpot = latencies(r.requests)
        missed[p] = (ttft > cfg.slo_ttft_s) | (tpot > cfg.slo_tpot_s)
    if "kneecap" not in missed:
        return {}
    rq = runs["kneecap"].requests
    ttft, tpot = latencies(rq)
    idx = np.flatnonzero(missed["kneecap"])
    return {"count": int(idx.size),
            "also_missed_by": {p: int(m[idx].sum()) for p, m in missed.items() if p != "kneecap"},
            "first": [{"request": int(i), "arrival_s": round(float(rq.arrival_s[i]), 2),
                       "input_tokens": int(rq.input_tokens[i]), "output_tokens": int(rq.output_tokens[i]),
                       "ttft_s": round(float(ttft[i]), 3) if np.isfinite(ttft[i]) else None,
                       "tpot_s": round(float(tpot[i]), 4) if np.isfinite(tpot[i]) else None} for i in idx[:10]]}


def _misses_line(m: dict) -> str:
    if not m:
        return ""
    if not m["count"]:
        return "kneecap serves every request within both SLOs."
    shared = ", ".join(f"{p} {n}" for p, n in m["also_missed_by"].items())
    ms = lambda v: "—" if v is None else f"{v * 1e3:.3g}"  # noqa: E731
    which = "; ".join(f"#{x['request']} at {x['arrival_s']} s ({x['input_tokens']}→{x['output_tokens']} tokens, "
                      f"TTFT {x['ttft_s']} s, TPOT {ms(x['tpot_s'])} ms)" for x in m["first"])
    return (f"kneecap serves {m['count']} requests outside the SLO (of them also missed by: {shared}): {which}.")


def _bound_line(bound: dict, cooldown_s: float) -> str:
    strict, quantile = bound["strict, with load, cooldown"]["vs_hpa"], bound["quantile, with load, cooldown"]["vs_hpa"]
    reach = "attainable" if strict >= 1.2 else "not attainable"
    return (f"With the model load and kneecap's {cooldown_s:g} s cooldown after a scale-up, an autoscaler "
            f"reaches at most {strict:g}× defaults+hpa at 100% attainment ({quantile:g}× holding only the p95 "
            f"quantiles): the 1.2× goal is {reach} on this trace at 100% attainment. Without the cooldown the bound "
            f"is {bound['strict, with load']['vs_hpa']:g}×, for perfect foresight and no reaction delay.")


def _why_factor(report: dict) -> str:
    n = report.get("compress_for_peak_replicas")
    return f" (the least whole factor at which the defaults need ≥ {n} replicas for the peak)" if n else ""


def markdown(report: dict, gl: dict, cpu_s: float) -> str:
    t = report["trace"]
    lines = [
        "# Trace replay (virtual time)",
        "",
        f"{t['source']}: {t['requests']} requests, compressed ×{report['compress']:g}{_why_factor(report)} to {t['span_s']:.0f} s "
        f"(mean {t['mean_rate_rps']:.1f} req/s); Llama-3.1-8B on h100-80gb twins; SLO p95 TTFT ≤ 1 s, "
        f"p95 TPOT ≤ 50 ms. Same arrivals for every policy; deterministic (seeded, simulated clock).",
        "",
        rep.table_markdown(report),
        "",
        "| goal | measured | met |",
        "|---|---|---|",
        f"| good req/GPU-h ≥ 97% of oracle | {gl['vs_oracle']} | {gl['vs_oracle_met']} |",
        f"| good req/GPU-h ≥ 1.2× defaults+hpa | {gl['vs_hpa']} | {gl['vs_hpa_met']} |",
        f"| SLO attainment ≥ oracle's and defaults+hpa's | "
        f"{report['policies']['kneecap']['slo_attainment_requests']} | {gl['attainment_met']} |",
        f"| ≤ 1 restart per replica-hour | {gl['restarts_per_replica_hour']} | {gl['restarts_met']} |",
        f"| (reported) good req/GPU-h against the best baseline ({gl['best_baseline']}) | {gl['vs_best_baseline']} | |",
        f"| no flapping | {gl['flaps']} flaps | {gl['flaps_met']} |",
        "",
        f"The defaults' pool sized for the peak: {gl['defaults_replicas']} replicas; kneecap and the HPA start "
        f"from it. Speed (simulated ÷ CPU seconds): "
        + ", ".join(f"{p} {v['ratio']:.0f}× ({v['mean_replicas']:.1f} replicas)" for p, v in report["speed"].items())
        + ". "
        f"Simulated {report['simulated_s']:.0f} s (all runs and the sweep) in {cpu_s:.0f} s of CPU "
        f"({report['simulated_s'] / max(cpu_s, 1e-9):.0f}× real time) on {platform.machine()} "
        f"({platform.python_implementation()} {platform.python_version()}).",
        "",
        _misses_line(report["kneecap_misses"]),
        "",
        "Is 1.2× defaults+hpa reachable? An upper bound: an autoscaling oracle on the defaults' or the "
        "oracle's engine settings that knows each 60 s window's arrivals and runs the fewest replicas serving "
        "that window "
        "(replayed alone from empty pods: optimistic) within the SLO: every request (strict, 100% "
        "attainment) or the p95 quantiles.",
        "",
        "| autoscaling oracle | replicas per window | GPU-h | good req/GPU-h | × defaults+hpa |",
        "|---|---|---|---|---|",
        *(f"| {name} | {' '.join(map(str, b['replicas']))} | {b['gpu_hours']} | {b['good_per_gpu_hour']:.0f} | "
          f"{b['vs_hpa']} |" for name, b in report["autoscaling_bound"].items()),
        "",
        _bound_line(report["autoscaling_bound"], report["config"]["cooldown_s"]),
        "",
        *_sensitivity_lines(report.get("sensitivity", [])),
    ]
    return "\n".join(lines) + "\n"


def sensitivity(raw: Trace, factors) -> list[dict]:
    """The goals at other compressions (the four policies replayed again at each)."""
    rows = []
    for f in factors:
        r = replay(compress(raw, f), CONFIG)["report"]
        k = r["policies"]["kneecap"]
        rows.append({"compress": f, "defaults_replicas": r["start_replicas"], **goals(r),
                     "attainment": {p: s["slo_attainment_requests"] for p, s in r["policies"].items()},
                     "mean_replicas": {p: s["mean_replicas"] for p, s in r["policies"].items()},
                     "kneecap_restarts": k["restarts"]})
    return rows


def _sensitivity_lines(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    out = ["The same goals at other compressions (as measured; the table above is the chosen factor):", "",
           "| × | defaults' peak pool | vs oracle | vs defaults+hpa | attainment kneecap / oracle / hpa "
           "| kneecap replicas | restarts/replica-h | flaps |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        a = r["attainment"]
        out.append(f"| {r['compress']:g} | {r['defaults_replicas']} | {r['vs_oracle']} ({'met' if r['vs_oracle_met'] else 'not met'}) "
                   f"| {r['vs_hpa']} ({'met' if r['vs_hpa_met'] else 'not met'}) "
                   f"| {a['kneecap']:.5f} / {a['oracle']:.5f} / {a['defaults+hpa']:.5f} "
                   f"({'met' if r['attainment_met'] else 'not met'}) | {r['mean_replicas']['kneecap']:.2f} "
                   f"| {r['restarts_per_replica_hour']} | {r['flaps']} |")
    return out + [""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compress", type=float, default=None,
                    help=f"a fixed factor (default: the least at which the peak needs {PEAK_REPLICAS} replicas)")
    ap.add_argument("--also", type=float, nargs="*", default=list(ALSO), help="other factors to report the goals at")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    raw = read_trace(TRACE)
    cpu0 = time.process_time()
    factor = args.compress if args.compress is not None else compression_for_peak(raw, CONFIG, PEAK_REPLICAS)
    trace = compress(raw, factor)
    out = replay(trace, CONFIG)
    cpu_s = time.process_time() - cpu0
    report = out["report"]
    report["compress"] = factor
    if args.compress is None:
        report["compress_for_peak_replicas"] = PEAK_REPLICAS
    report["kneecap_misses"] = missed_requests(CONFIG, out["runs"])
    best = report["policies"]["oracle"]["settings"]
    report["autoscaling_bound"] = autoscaling_bound(
        trace, CONFIG, report["policies"]["defaults+hpa"]["good_per_gpu_hour"],
        sorted({(DEFAULT_CAP, DEFAULT_MEMORY), (best["max_num_seqs"], best["gpu_memory_utilization"])}, reverse=True))
    gl = goals(report)
    report["goals"] = gl
    report["cpu_s"] = round(cpu_s, 1)
    report["sensitivity"] = sensitivity(raw, [f for f in args.also if f != factor])
    # speed of each policy's run (CPU seconds: the machine is shared, its wall clock says little)
    report["speed"] = {p: {"simulated_s": round(r.cluster.t_s, 1), "cpu_s": round(r.wall_s, 2),
                           "mean_replicas": report["policies"][p]["mean_replicas"],
                           "ratio": round(r.cluster.t_s / max(r.wall_s, 1e-9), 1)} for p, r in out["runs"].items()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "trace_replay.json").write_text(json.dumps(report, indent=1, sort_keys=True))
    (args.out / "trace_replay.md").write_text(markdown(report, gl, cpu_s))
    rep.plot(report, {p: series(CONFIG, r) for p, r in out["runs"].items()}, args.out / "trace_replay.png",
             title=f"Azure conversation trace ×{factor:g}: Llama-3.1-8B on H100 80 GB")
    print(rep.table_text(report))
    print(json.dumps(gl))
    print(f"simulated {report['simulated_s']:.0f} s in {cpu_s:.0f} s CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
