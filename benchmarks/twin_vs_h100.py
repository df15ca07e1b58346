"""Check the twin against a real H100: replay the max_num_seqs sweeps of profiles.csv.

For every curve of sources ``background`` and ``batching_results`` (suspect outliers dropped),
each sweep step is replayed on the twin's engine (:mod:`kneecap.sim.engine`) in simulated time,
not over HTTP: same model, max_num_seqs, KV blocks (num_gpu_blocks from the row), max_model_len,
V0 scheduling without chunked prefill (as the data's vLLM), all ``num_prompts`` arriving at t=0
(request rate = inf in the data). Throughput = (input + output tokens) / makespan, as the
data's client measured it.

Prompt lengths: ``batching_results`` sent identical dummy prompts, so every request has the
row's mean input and output length. ``background`` sent ShareGPT conversations, whose lengths
we do not have: we draw input and output lengths from log-normals with the row's means and a
coefficient of variation of 1.0 each (ShareGPT lengths are heavy-tailed with CV ≈ 1), clipped
like vLLM's benchmark filter (input ≤ 1024, input + output ≤ 2048, each ≥ 4) and rescaled to
the row's mean, same draw (seed) for every step of a curve.

Metrics per curve: throughput MAPE over the sweep, and the plateau onset: the first sweep step
whose throughput gain over the previous step is below 5% (same rule on both; a sweep that never
plateaus has its onset one past its last step; steps dropped as outliers are skipped on both). Targets: MAPE
≤ 20% on every curve, onset within one sweep step.

The roofline's constants are not fitted here: they come from offline.csv step timings
(``--refit`` reproduces that fit and prints it; it never reads profiles.csv).

Usage: python benchmarks/twin_vs_h100.py [--refit] [--quick]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _paths import OFFLINE_CSV, PROFILES_CSV, RESULTS  # noqa: E402

from kneecap.model.arch import get_arch  # noqa: E402
from kneecap.model.hardware import get_gpu  # noqa: E402
from kneecap.sim.engine import Engine, engine_config  # noqa: E402
from kneecap.sim.roofline import StepCostParams, attention_flops, step_time_s  # noqa: E402

GPU_KEY = "h100-64gb"
SOURCES = ("background", "batching_results")
EXTRA_SOURCES = ("chunked_prefill_results", "advisor_output_length")  # informational, chunked prefill on
SHAREGPT_CV = 1.0
PLATEAU_GAIN = 0.05
MAPE_TARGET = 0.20


def lognormal_lengths(rng: np.random.Generator, n: int, mean: float, cv: float) -> np.ndarray:
    """Log-normal draws with the given mean and CV: σ² = ln(1 + cv²), μ = ln(mean) − σ²/2."""
    sigma2 = np.log1p(cv * cv)
    return rng.lognormal(np.log(mean) - sigma2 / 2.0, np.sqrt(sigma2), n)


def sharegpt_like(n: int, in_mean: float, out_mean: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Heterogeneous lengths with the row's means (module docstring), as integers."""
    rng = np.random.default_rng(seed)
    x_in = np.clip(lognormal_lengths(rng, n, in_mean, SHAREGPT_CV), 4, 1024)
    x_in = np.clip(np.rint(x_in * in_mean / x_in.mean()), 4, 1024).astype(int)
    x_out = np.clip(lognormal_lengths(rng, n, out_mean, SHAREGPT_CV), 4, None)
    x_out = np.rint(x_out * out_mean / x_out.mean()).astype(int)
    x_out = np.clip(x_out, 4, 2048 - x_in)
    return x_in, x_out


def load_curves(sources=SOURCES) -> dict[str, list[dict]]:
    """Sweeps of the given sources, outliers dropped (and rows without a recorded KV size)."""
    curves: dict[str, list[dict]] = defaultdict(list)
    with open(PROFILES_CSV) as fh:
        for row in csv.DictReader(fh):
            if row["source"] in sources and row["suspect_outlier"] != "True" and row["num_gpu_blocks"]:
                curves[row["curve"]].append(row)
    for rows in curves.values():
        rows.sort(key=lambda r: int(r["max_num_seqs"]))
    return dict(curves)


def replay_row(row: dict, lengths: tuple[np.ndarray, np.ndarray]) -> dict:
    arch = get_arch(row["model"])
    max_model_len = int(row["max_model_len"] or 2048)
    mnbt = int(row["max_num_batched_tokens"]) if row["max_num_batched_tokens"] else None
    cfg = engine_config(arch, get_gpu(GPU_KEY), max_num_seqs=int(row["max_num_seqs"]),
                        max_num_batched_tokens=mnbt, max_model_len=max_model_len,
                        block_size=int(row["block_size"]), num_gpu_blocks_override=int(row["num_gpu_blocks"]),
                        gpu_memory_utilization=float(row["gpu_memory_utilization"]),
                        enable_chunked_prefill=row["chunked_prefill"] == "True")
    engine = Engine(cfg)
    x_in, x_out = lengths
    for i, o in zip(x_in.tolist(), x_out.tolist()):
        engine.add_request(i, o, 0.0)
    engine.run_until_idle()
    total = int(x_in.sum() + x_out.sum())
    return {"throughput_tok_s": total / engine.now_s, "batch": engine.running_integral_s / engine.busy_s,
            "preemptions": engine.num_preemptions, "makespan_s": engine.now_s}


def plateau_onset(thr: list[float]) -> int:
    """Index of the first sweep step whose gain over the previous step is < PLATEAU_GAIN;
    ``len(thr)`` (one past the last step) when the sweep never plateaus."""
    for k in range(1, len(thr)):
        if thr[k] / thr[k - 1] - 1.0 < PLATEAU_GAIN:
            return k
    return len(thr)


def run(quick: bool = False, extra: bool = True) -> dict:
    out = {"gpu": GPU_KEY, "sharegpt_cv": SHAREGPT_CV, "plateau_gain": PLATEAU_GAIN,
           "step_cost": StepCostParams().__dict__}
    out["curves"] = replay_curves(load_curves(SOURCES), quick)
    out["summary"] = summary(out["curves"])
    if extra:
        out["extra_curves"] = replay_curves(load_curves(EXTRA_SOURCES), quick)
        out["extra_summary"] = summary(out["extra_curves"])
    return out


def summary(c: list[dict]) -> dict:
    return {"curves": len(c), "mape_mean": float(np.mean([x["mape"] for x in c])),
            "mape_max": float(np.max([x["mape"] for x in c])),
            "curves_mape_ok": sum(x["mape_ok"] for x in c), "curves_onset_ok": sum(x["onset_ok"] for x in c)}


def replay_curves(curves: dict[str, list[dict]], quick: bool) -> list[dict]:
    done = []
    for name, rows in curves.items():
        n = int(rows[0]["num_prompts"])
        in_mean, out_mean = float(rows[0]["input_len"]), float(rows[0]["output_len"])
        if rows[0]["source"] == "background":
            lengths = sharegpt_like(n, in_mean, out_mean, seed=len(name))
        else:
            lengths = (np.full(n, round(in_mean)), np.full(n, round(out_mean)))
        points = []
        for row in rows:
            if quick and int(row["max_num_seqs"]) < 8:
                continue
            twin = replay_row(row, lengths)
            points.append({"max_num_seqs": int(row["max_num_seqs"]), "real_tok_s": float(row["throughput_tok_s"]),
                           "twin_tok_s": twin["throughput_tok_s"], "real_batch": float(row["batch"]),
                           "twin_batch": twin["batch"], "real_preemptions": int(float(row["preemptions"] or 0)),
                           "twin_preemptions": twin["preemptions"]})
        real = [p["real_tok_s"] for p in points]
        sim = [p["twin_tok_s"] for p in points]
        caps = [p["max_num_seqs"] for p in points]
        errs = [abs(s - r) / r for s, r in zip(sim, real)]
        on_r, on_t = plateau_onset(real), plateau_onset(sim)
        onset_ok = abs(on_r - on_t) <= 1
        done.append({
            "curve": name, "source": rows[0]["source"], "model": rows[0]["model"], "num_prompts": n,
            "input_len": in_mean, "output_len": out_mean, "kv_capacity_tokens": int(rows[0]["kv_capacity_tokens"]),
            "mape": float(np.mean(errs)), "max_abs_err": float(np.max(errs)),
            "onset_real_cap": caps[on_r] if on_r < len(caps) else None,  # None: no plateau in the sweep
            "onset_twin_cap": caps[on_t] if on_t < len(caps) else None,
            "onset_step_diff": on_t - on_r,
            "onset_ok": onset_ok, "mape_ok": float(np.mean(errs)) <= MAPE_TARGET, "points": points,
        })
    return done


def _curve_table(curves: list[dict]) -> list[str]:
    lines = ["| curve | MAPE | worst point | onset real | onset twin | ok |", "| --- | --- | --- | --- | --- | --- |"]
    for c in curves:
        ok = "yes" if c["mape_ok"] and c["onset_ok"] else "NO"
        lines.append(f"| {c['curve']} | {c['mape']:.1%} | {c['max_abs_err']:.1%} | {c['onset_real_cap']} | "
                     f"{c['onset_twin_cap']} | {ok} |")
    return lines


def _point_tables(curves: list[dict]) -> list[str]:
    lines = []
    for c in curves:
        lines += [f"### {c['curve']}", "", "| max_num_seqs | real tok/s | twin tok/s | err | real B | twin B | "
                  "real preempt | twin preempt |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for p in c["points"]:
            err = p["twin_tok_s"] / p["real_tok_s"] - 1
            lines.append(f"| {p['max_num_seqs']} | {p['real_tok_s']:.0f} | {p['twin_tok_s']:.0f} | {err:+.1%} | "
                         f"{p['real_batch']:.1f} | {p['twin_batch']:.1f} | {p['real_preemptions']} | "
                         f"{p['twin_preemptions']} |")
        lines.append("")
    return lines


def _verdict(s: dict) -> str:
    return (f"**{s['curves_mape_ok']}/{s['curves']} curves with MAPE ≤ 20%, {s['curves_onset_ok']}/{s['curves']} "
            f"with onset within one step; mean MAPE {s['mape_mean']:.1%}, worst {s['mape_max']:.1%}.**")


def markdown(res: dict) -> str:
    lines = [
        "# Twin vs real H100 (profiles.csv sweeps)", "",
        "Generated by `benchmarks/twin_vs_h100.py`. Real: vLLM ~0.6 V0 on an H100 64 GB "
        "(data/real-h100/profiles.csv, sources background and batching_results, suspect outliers "
        "dropped). Twin: `kneecap.sim.engine` replaying each sweep step in simulated time (V0 scheduling, "
        "the row's KV blocks, all prompts at t=0). Background prompts: log-normal lengths, CV "
        f"{res['sharegpt_cv']} for input and output (ShareGPT's real lengths are not in the data). Plateau "
        f"onset: first step with < {res['plateau_gain']:.0%} throughput gain over the previous step (None: no "
        "plateau within the sweep, counted as one past its last step).", "",
        _verdict(res["summary"]), "", *_curve_table(res["curves"]), "",
        "![real vs twin](twin_vs_h100.png)", "",
    ]
    if "extra_curves" in res:
        lines += ["## Also: chunked-prefill sweeps (informational, not in the target)", "",
                  "Sources chunked_prefill_results and advisor_output_length (V0 chunked prefill, 512-token "
                  "budget; identical prompts); the twin runs its chunked scheduler. Curves without a recorded "
                  "KV size are skipped.", "", _verdict(res["extra_summary"]), "", *_curve_table(res["extra_curves"]),
                  ""]
    lines += ["## Per point (throughput tok/s, mean running batch, preemptions)", "", *_point_tables(res["curves"])]
    if "extra_curves" in res:
        lines += _point_tables(res["extra_curves"])
    lines += ["Step-cost constants (set once from offline.csv, not fitted to these curves): "
              + ", ".join(f"{k}={v}" for k, v in res["step_cost"].items()), ""]
    return "\n".join(lines)


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = res["curves"]
    cols = 4
    rows = -(-len(curves) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, c in zip(axes.flat, curves):
        caps = [p["max_num_seqs"] for p in c["points"]]
        ax.plot(caps, [p["real_tok_s"] for p in c["points"]], "o-", label="real H100")
        ax.plot(caps, [p["twin_tok_s"] for p in c["points"]], "s--", label="twin")
        ax.set_xscale("log", base=2)
        ax.set_title(c["curve"].replace("/olx", "").replace("/mem0.9", ""), fontsize=8)
        ax.set_xlabel("max_num_seqs", fontsize=8)
        ax.set_ylabel("tok/s", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.text(0.05, 0.9, f"MAPE {c['mape']:.1%}", transform=ax.transAxes, fontsize=8)
    for ax in list(axes.flat)[len(curves):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def refit() -> dict:
    """Reproduce the roofline constants from offline.csv step timings (see kneecap.sim.roofline)."""
    from scipy.optimize import least_squares

    gpu = get_gpu(GPU_KEY)
    obs = []
    with open(OFFLINE_CSV) as fh:
        for r in csv.DictReader(fh):
            if r["status"] != "ok" or not r["timing_usable"].startswith("yes"):
                continue
            arch = get_arch(r["model"])
            b, il, ol = int(r["batch_size"]), int(r["prompt_len"]), int(r["output_len"])
            slow = 1.05 if r["timing_usable"] == "yes_with_nsys_overhead" else 1.0
            # decode step: B sequences, mean earlier context il + ol/2
            obs.append((arch, b, b, b * (il + ol / 2.0), 4.0 * arch.layers * arch.hidden * b * (il + ol / 2.0),
                        False, float(r["decode_time_per_step_ms"]) / 1e3 / slow))
            n = int(r["n_prefill_steps"])
            seqs = b / n
            obs.append((arch, seqs, seqs * il, 0.0, seqs * attention_flops(arch, il, 0), True,
                        float(r["prefill_only_time_est_s"]) / n / slow))

    def residuals(p):
        cost = StepCostParams(0.90, p[2], p[3], p[0], p[1], p[4])
        return np.array([np.log(step_time_s(a, gpu, num_seqs=s, num_tokens=t, kv_read_tokens=kv, attn_flops=fa,
                                            has_prefill=pre, cost=cost) / y)
                         for a, s, t, kv, fa, pre, y in obs])

    fit = least_squares(residuals, [1e-3, 3e-5, 0.7, 0.5, 1e-4],
                        bounds=([0, 0, 0.1, 0.1, 0], [0.01, 5e-4, 1, 1, 1e-3]))
    names = ["step_overhead_s", "per_seq_overhead_s", "attn_bw_efficiency", "compute_efficiency",
             "eager_layer_overhead_s"]
    return {"params": dict(zip(names, fit.x.tolist())), "rms_log_err": float(np.sqrt(np.mean(fit.fun ** 2))),
            "n_steps": len(obs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refit", action="store_true", help="reproduce the step-cost fit on offline.csv and exit")
    ap.add_argument("--quick", action="store_true", help="skip sweep steps below max_num_seqs 8 (not written)")
    ap.add_argument("--no-extra", action="store_true", help="skip the informational chunked-prefill sweeps")
    args = ap.parse_args(argv)
    if args.refit:
        print(json.dumps(refit(), indent=2))
        return 0
    t0 = time.time()
    res = run(quick=args.quick, extra=not args.no_extra)
    res["runtime_s"] = time.time() - t0
    print(f"{'curve':52s} {'MAPE':>6s} {'worst':>6s} {'onset real':>10s} {'onset twin':>10s}")
    for c in res["curves"]:
        print(f"{c['curve']:52s} {c['mape']:6.1%} {c['max_abs_err']:6.1%} {str(c['onset_real_cap']):>10s} "
              f"{str(c['onset_twin_cap']):>10s}  {'ok' if c['mape_ok'] and c['onset_ok'] else 'MISS'}")
    for key in ("summary", "extra_summary"):
        if key in res:
            s = res[key]
            print(f"{'target' if key == 'summary' else 'extra (chunked prefill)'}: MAPE ≤ 20%: "
                  f"{s['curves_mape_ok']}/{s['curves']}  onset ±1 step: {s['curves_onset_ok']}/{s['curves']}  "
                  f"mean MAPE {s['mape_mean']:.1%}")
    print(f"({res['runtime_s']:.0f} s)")
    if not args.quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "twin_vs_h100.json").write_text(json.dumps(res, indent=1))
        (RESULTS / "twin_vs_h100.md").write_text(markdown(res))
        plot(res, RESULTS / "twin_vs_h100.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
