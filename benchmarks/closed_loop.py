"""Closed loop: does the operator, running for real, land where an exhaustive sweep says it should?

Setup (kneecap.sim.demo_virtual: `kneecap demo`'s LLMDeployment, load and records, run in
virtual time on kneecap.sim.cluster, so the result is the same on any machine): OPT-1.3B on an
H100 64 GB twin, pods start at max_num_seqs 256 and gpu_memory_utilization 0.9, a Poisson load (60 req/s,
log-normal 200/200 tokens, CV 0.3, at most 320 in flight) that keeps the server busy at every
cap, the operator in enforce mode with ε = 0.25 and a TPOT SLO of 50 ms.

Reference: the same twin engine (kneecap.sim.engine) swept in simulated time over every
max_num_seqs in 1..256 under the same load; BCA's rule (eq. 13: argmax T(B) s.t.
T(B)/(B·T(1)) > ε, KV fits) applied to the measured T(B) picks the reference cap.

Targets: applied cap within 15% of the reference, throughput within 5% of the reference's,
memory fraction follows the cap (GiB released), ≤ 3 pod restarts, no change in ≥ 20 further
intervals, zero SLO misses after convergence. Writes closed_loop.{json,md,png} to results/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _paths import RESULTS  # noqa: E402

from kneecap.demo.harness import DemoConfig  # noqa: E402
from kneecap.demo.report import plot, row_line, summary_text  # noqa: E402
from kneecap.model import bca  # noqa: E402
from kneecap.model.arch import get_arch  # noqa: E402
from kneecap.model.hardware import get_gpu  # noqa: E402
from kneecap.sim.engine import Engine, engine_config  # noqa: E402
from kneecap.sim.demo_virtual import run_demo_virtual  # noqa: E402
from kneecap.sim.loadgen import arrival_times, sample_lengths  # noqa: E402

# cooldown 120 s: the horizon a restart must pay for itself over
CONFIG = DemoConfig(duration_s=660.0, interval_s=15.0, cooldown_s=120.0)
SWEEP_SIM_S = 40.0  # simulated seconds per cap; throughput measured after the first quarter


def sweep_cap(cfg: DemoConfig, cap: int, arch, gpu, seed: int = 0) -> dict:
    """One cap under the demo's load: Poisson arrivals gated at max_concurrency in flight."""
    rng = np.random.default_rng(seed)
    t_arr = arrival_times(rng, cfg.rate_rps, SWEEP_SIM_S)
    ins = sample_lengths(rng, t_arr.size, cfg.input_mean, cfg.input_cv)
    outs = sample_lengths(rng, t_arr.size, cfg.output_mean, cfg.output_cv)
    eng = Engine(engine_config(arch, gpu, max_num_seqs=cap, gpu_memory_utilization=cfg.gpu_memory_utilization))
    i, inflight, t0 = 0, 0, SWEEP_SIM_S / 4
    tokens, itl, done = 0, [], []
    while eng.now_s < SWEEP_SIM_S:
        while i < t_arr.size and t_arr[i] <= eng.now_s and inflight < cfg.max_concurrency:
            eng.add_request(int(ins[i]), int(outs[i]), arrival_s=eng.now_s)
            i, inflight = i + 1, inflight + 1
        if not eng.has_work():
            eng.now_s = t_arr[i] if i < t_arr.size else SWEEP_SIM_S
            continue
        r = eng.step()
        if r.start_s >= t0:
            tokens += r.num_tokens  # prompt + generated tokens processed (SLIM's T, eq. 6)
            itl.extend(x for _, _, x in r.tokens if x is not None)
            done.extend(q.finish_s - q.scheduled_s for q in r.finished)
        inflight -= len(r.finished)
    span = eng.now_s - t0
    return {"cap": cap, "throughput_tok_s": tokens / span, "itl_p95_s": float(np.percentile(itl, 95)) if itl else None,
            "e2e_in_batch_mean_s": float(np.mean(done)) if done else None,
            "mean_batch": eng.running_integral_s / max(eng.busy_s, 1e-9)}


def sweep(cfg: DemoConfig, caps) -> list[dict]:
    arch, gpu = get_arch(cfg.architecture or "opt-1.3b"), get_gpu(cfg.gpu)
    return [sweep_cap(cfg, int(c), arch, gpu) for c in caps]


def reference(cfg: DemoConfig, points: list[dict]) -> dict:
    """BCA's eq. 13 on the measured curve (same ε, SLO and KV capacity as the operator's spec)."""
    caps = np.array([p["cap"] for p in points], dtype=float)
    thr = np.array([p["throughput_tok_s"] for p in points])
    e2e = np.array([p["e2e_in_batch_mean_s"] or 0.0 for p in points])

    def measured(batch):  # the sweep covers every integer cap, so this is a lookup
        return np.interp(batch, caps, thr), np.interp(batch, caps, e2e)

    res = bca.advise(measured, cfg.architecture or "opt-1.3b", cfg.gpu, cfg.input_mean, cfg.output_mean,
                     slo_e2e_s=cfg.slo_e2e_s, epsilon=cfg.efficiency_floor, min_cap=1, max_cap=int(caps.max()),
                     gpu_memory_utilization=cfg.gpu_memory_utilization)
    return {"cap": res.cap, "throughput_tok_s": res.pred_throughput_tok_s, "binding": res.binding,
            "efficiency": res.efficiency, "best_throughput_tok_s": float(thr.max())}


def verdict(s: dict, ref: dict) -> dict:
    cap_err = abs(s["converged_max_num_seqs"] - ref["cap"]) / ref["cap"]
    thr = s["throughput_converged_tok_s"]
    thr_err = abs(thr - ref["throughput_tok_s"]) / ref["throughput_tok_s"] if thr else None
    return {
        "cap_within_15pct": cap_err <= 0.15, "cap_error": cap_err,
        "throughput_within_5pct": thr_err is not None and thr_err <= 0.05, "throughput_error": thr_err,
        "memory_follows_cap": s["converged_gpu_memory_utilization"] < s["start_gpu_memory_utilization"]
        if s["converged_max_num_seqs"] < s["start_max_num_seqs"] else True,
        "restarts_le_3": s["restarts"] <= 3,
        "no_flapping_20_intervals": s["intervals_after_convergence"] >= 20,
        "zero_slo_misses": s["slo_intervals"] > 0 and s["slo_intervals_met"] == s["slo_intervals"],
    }


def markdown(out: dict) -> str:
    s, ref, v = out["summary"], out["reference"], out["verdict"]
    ok = lambda b: "yes" if b else "**no**"  # noqa: E731
    lines = [
        "# Closed loop: OPT-1.3B on h100-64gb, real operator vs exhaustive twin sweep", "",
        f"Load {out['config']['rate_rps']:g} req/s Poisson (≤ {out['config']['max_concurrency']} in flight), "
        f"{out['config']['input_mean']:g}/{out['config']['output_mean']:g} tokens (CV {out['config']['input_cv']:g}), "
        f"ε = {out['config']['efficiency_floor']:g}, TPOT SLO {out['config']['slo_tpot_s']:g} s, interval "
        f"{out['config']['interval_s']:g} s; virtual time (deterministic, seeded): {out['simulated_s']:.0f} simulated s "
        f"in {s['wall_s']:.1f} s of CPU (+ sweep {out['sweep_wall_s']:.0f} s).", "",
        "| metric | operator (closed loop) | sweep reference | target | met |",
        "|---|---|---|---|---|",
        f"| max_num_seqs | {s['start_max_num_seqs']} → {s['converged_max_num_seqs']} | {ref['cap']} ({ref['binding']}) "
        f"| within 15% ({v['cap_error']:.1%}) | {ok(v['cap_within_15pct'])} |",
        f"| throughput tok/s | {s['throughput_converged_tok_s'] or float('nan'):.0f} | {ref['throughput_tok_s']:.0f} "
        f"| within 5% ({(v['throughput_error'] or float('nan')):.1%}) | {ok(v['throughput_within_5pct'])} |",
        f"| gpu_memory_utilization | {s['start_gpu_memory_utilization']:g} → {s['converged_gpu_memory_utilization']:g} "
        f"| | follows the cap; {s['released_gib']:.1f} GiB released | {ok(v['memory_follows_cap'])} |",
        f"| pod restarts | {s['restarts']} | | ≤ 3 | {ok(v['restarts_le_3'])} |",
        f"| intervals after the last change | {s['intervals_after_convergence']} | | ≥ 20 unchanged | "
        f"{ok(v['no_flapping_20_intervals'])} |",
        f"| SLO after convergence | {s['slo_intervals_met']}/{s['slo_intervals']} intervals | | all | "
        f"{ok(v['zero_slo_misses'])} |",
        "", "Trajectory (one line per control decision):", "", "```",
        *out["lines"], "```", "",
        "Sweep (every cap; selected rows):", "", "| cap | T tok/s | T/(B·T(1)) | ITL p95 ms |", "|---|---|---|---|",
    ]
    t1 = out["sweep"][0]["throughput_tok_s"]
    for p in out["sweep"]:
        if p["cap"] in (1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256) or p["cap"] == ref["cap"]:
            lines.append(f"| {p['cap']} | {p['throughput_tok_s']:.0f} | {p['throughput_tok_s'] / (p['cap'] * t1):.3f} | "
                         f"{(p['itl_p95_s'] or 0) * 1e3:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short run (no 20-interval steady check)")
    args = ap.parse_args(argv)
    cfg = CONFIG
    if args.quick:
        cfg = replace(cfg, duration_s=240.0)
    t = time.process_time()
    points = sweep(cfg, range(1, cfg.max_num_seqs + 1))
    sweep_wall = time.process_time() - t
    ref = reference(cfg, points)
    print(f"sweep: reference cap {ref['cap']} ({ref['binding']}), T {ref['throughput_tok_s']:.0f} tok/s "
          f"[{sweep_wall:.0f}s]", flush=True)
    lines: list[str] = []

    def on_row(r):
        lines.append(row_line(r))
        print(lines[-1], flush=True)

    res = run_demo_virtual(cfg, on_row=on_row)
    s = res.summary
    out = {"config": asdict(cfg), "summary": s, "simulated_s": cfg.duration_s, "reference": ref, "verdict": verdict(s, ref), "lines": lines,
           "sweep": points, "sweep_wall_s": sweep_wall, "rows": [asdict(r) for r in res.rows],
           "kubelet_events": res.kubelet_events}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "closed_loop.json").write_text(json.dumps(out, indent=1, default=str))
    (RESULTS / "closed_loop.md").write_text(markdown(out))
    plot(res, RESULTS / "closed_loop.png")
    print(summary_text(s))
    print(json.dumps(out["verdict"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
