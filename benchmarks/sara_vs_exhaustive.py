"""SARA vs exhaustive search (SARA §VII-B, Table II): goodput gap and solve time.

Grid: LLaMA 3.1 8B, Qwen2.5 32B, GPT-3 175B on A100-80GB × light/heavy-tailed prompts × 5
budgets. Paper setup (§VII-A): $5/h per GPU, $0.1/h per GiB/s, τ = 0.5/0.15/0.04 s at p = 0.95,
p_mem = p_join = 0.99; heavy: IL log-normal mean 1024 CV 1.25; light: IL exponential mean 1024;
OL exponential mean 256. Both methods evaluate the same SLO-attainment functions
(kneecap.model.sara); the exhaustive search enumerates k_p, k_d, N_bat ≤ 2048 and a 4000-step
bandwidth grid. SARA's time is the median of 5 solves; the one-time ``build_problem`` (service-time
nodes, moments and the M/G/1 waiting-time table) is timed apart (median of 3) and shared by both.

Writes benchmarks/results/sara_vs_exhaustive.{json,md}.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _paths import RESULTS  # noqa: E402

from kneecap.model import sara  # noqa: E402

MODELS = {
    "llama-3.1-8b": [10, 20, 40, 80, 160],
    "qwen2.5-32b": [20, 40, 80, 160, 320],
    "gpt-3-175b": [40, 80, 160, 320, 640],
}
TAILS = {"light": 1.0, "heavy": 1.25}
SLO = sara.SLO(ttft_s=0.5, kv_s=0.15, tpot_s=0.04, quantile=0.95, p_mem=0.99, p_join=0.99)
COSTS = sara.Costs(prefill_gpu_per_hour=5.0, decode_gpu_per_hour=5.0, kv_per_gibps_hour=0.1)


def run_scenario(model: str, tail: str, budget: float) -> dict:
    workload = sara.make_workload(1024, TAILS[tail], 256, 1.0, tail)
    builds = []
    for _ in range(3):
        t0 = time.perf_counter()
        pb = sara.build_problem(model, "a100-80gb", workload, SLO, COSTS)
        builds.append(time.perf_counter() - t0)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        s = sara.plan(pb, budget)
        times.append(time.perf_counter() - t0)
    e = sara.exhaustive(pb, budget)
    sara_s = statistics.median(times)
    row = {
        "model": model, "tail": tail, "budget_per_hour": budget,
        "feasible": s.feasible, "exhaustive_feasible": e.feasible,
        "sara_goodput_rps": s.goodput_rps, "exhaustive_goodput_rps": e.goodput_rps,
        "gap_pct": (100.0 * (e.goodput_rps - s.goodput_rps) / e.goodput_rps) if e.goodput_rps > 0 else None,
        "sara_seconds": sara_s, "build_seconds": statistics.median(builds), "exhaustive_seconds": e.solve_seconds,
        "speedup": e.solve_seconds / sara_s,
        "sara": s.to_dict(), "exhaustive": e.to_dict(),
    }
    return row


def _alloc(d: dict) -> str:
    if not d["feasible"]:
        return "—"
    return (f"{d['prefill_replicas']}×{d['prefill_gpus_per_replica']} / {d['kv_bandwidth_gibps']:.1f} / "
            f"{d['decode_replicas']} / {d['max_num_seqs']}")


def main() -> int:
    rows = [run_scenario(m, t, b) for m, budgets in MODELS.items() for t in TAILS for b in budgets]
    feasible = [r for r in rows if r["exhaustive_feasible"]]
    gaps = [abs(r["gap_pct"]) for r in feasible]
    consistent = all(r["feasible"] == r["exhaustive_feasible"] for r in rows)
    summary = {
        "scenarios": len(rows), "feasible": len(feasible),
        "feasibility_agrees": consistent,
        "max_abs_gap_pct": max(gaps), "mean_abs_gap_pct": statistics.mean(gaps),
        "all_within_5pct": all(g <= 5.0 for g in gaps),
        "median_sara_seconds": statistics.median(r["sara_seconds"] for r in rows),
        "max_sara_seconds": max(r["sara_seconds"] for r in rows),
        "median_build_seconds": statistics.median(r["build_seconds"] for r in rows),
        "median_exhaustive_seconds": statistics.median(r["exhaustive_seconds"] for r in feasible),
        "min_speedup_feasible": min(r["speedup"] for r in feasible),
        "median_speedup_feasible": statistics.median(r["speedup"] for r in feasible),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sara_vs_exhaustive.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=2))

    lines = [
        "# SARA vs exhaustive search",
        "",
        "A100-80GB, $5/h per GPU, $0.1/h per GiB/s, p95 TTFT ≤ 0.5 s, KV ≤ 0.15 s, TPOT ≤ 0.04 s, "
        "p_mem = p_join = 0.99; heavy: IL log-normal (1024, CV 1.25), light: IL exponential (1024); "
        "OL exponential (256). Allocation: prefill replicas×GPUs / KV GiB/s / decode GPUs / max_num_seqs. "
        "Gap = (exhaustive − SARA)/exhaustive; negative when SARA's continuous bandwidth beats the "
        "exhaustive grid. Produced by `benchmarks/sara_vs_exhaustive.py`.",
        "",
        "| model | tail | budget $/h | SARA req/s | exhaustive req/s | gap % | SARA ms | build ms | exhaustive s | speedup | SARA allocation | binding (prefill/kv/decode) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for r in rows:
        s = r["sara"]
        bind = "/".join(s["binding"].get(k, "") for k in ("prefill", "kv", "decode")) if s["feasible"] else s["message"]
        gap = f"{r['gap_pct']:+.3f}" if r["gap_pct"] is not None else "—"
        lines.append(
            f"| {r['model']} | {r['tail']} | {r['budget_per_hour']:g} | {r['sara_goodput_rps']:.2f} | "
            f"{r['exhaustive_goodput_rps']:.2f} | {gap} | {r['sara_seconds'] * 1e3:.1f} | {r['build_seconds'] * 1e3:.0f} | "
            f"{r['exhaustive_seconds']:.2f} | {r['speedup']:.0f}× | {_alloc(s)} | {bind} |")
    lines += [
        "",
        f"Feasible scenarios: {summary['feasible']} of {summary['scenarios']} "
        f"(SARA and exhaustive agree on feasibility: {consistent}). "
        f"Max |gap| {summary['max_abs_gap_pct']:.3f}%, mean {summary['mean_abs_gap_pct']:.3f}%. "
        f"Median SARA solve {summary['median_sara_seconds'] * 1e3:.1f} ms (max {summary['max_sara_seconds'] * 1e3:.1f} ms; "
        f"one-time problem build, shared with the exhaustive search, median {summary['median_build_seconds'] * 1e3:.0f} ms); "
        f"median exhaustive {summary['median_exhaustive_seconds']:.2f} s; speedup ≥ {summary['min_speedup_feasible']:.0f}× "
        f"(median {summary['median_speedup_feasible']:.0f}×) on feasible scenarios.",
        "",
        "Why the gap is ~0 here, unlike the paper's 3.8%: both methods share the same stage models "
        "and the problem separates by stage, so SARA's per-stage minimum resources are exact for "
        "those models; what remains is the bisection tolerance (1e-4) and the exhaustive bandwidth "
        "grid. The gap measures the search, not the queueing approximations (those are checked "
        "against a discrete-event simulation in tests/unit/test_sara_des.py: p95 TTFT within 3% for "
        "k = 1–8 prefill replicas at ρ ≤ 0.9, light and heavy prompts; p95 TPOT within 3% up to decode load 0.9).",
    ]
    (RESULTS / "sara_vs_exhaustive.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if (summary["all_within_5pct"] and consistent) else 1


if __name__ == "__main__":
    sys.exit(main())
