"""BCA from a cheap SLIM fit vs BCA on the fully profiled curve (paper 000 Tables V–VI, this data).

For each target curve of data/real-h100/profiles.csv:
* full-profile BCA: eq. 13 applied to the measured points (T and SLIM's E2E = B·(IL+OL)/T per
  point, T(1) the smallest-batch point), ε = 0.1;
* SLIM-BCA: fit SLIM on the training rows, then eq. 13 over integer caps within the curve's KV
  capacity (kneecap.model.bca.advise).
Training rows per setting: same_curve = the curve's 3 smallest-batch (pre-knee) points;
output_length / model_transfer / combined = the splits of slim_accuracy.py (no point of the
target curve profiled). SLOs as the paper: tight = 2×, loose = 4× the measured E2E at the
curve's max_num_seqs=32 point; plus none.

Reported (measured values at SLIM-BCA's cap, interpolated on the measured curve in B):
throughput lost vs the full-profile choice, SLO violation, KV GiB saved vs vLLM's default
(gpu_memory_utilization 0.9) reservation, profiling points and time saved (time of a run =
num_prompts·(IL+OL)/T). Writes results/bca_profiling.{md,json}.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _paths import PROFILES_CSV, RESULTS  # noqa: E402
from slim_accuracy import splits  # noqa: E402

from kneecap.model import bca, calibrate, memory, profiles  # noqa: E402
from kneecap.model.arch import GIB, get_arch  # noqa: E402
from kneecap.model.hardware import get_gpu  # noqa: E402

GPU = get_gpu("h100-64gb")
EPSILON = 0.1
FORMS = ("kneecap", "paper-a")


def curve_arrays(rows):
    rows = sorted(rows, key=lambda r: float(r["batch"]))
    f = lambda k: np.array([float(r[k]) for r in rows])  # noqa: E731
    b, t, il, ol = f("batch"), f("throughput_tok_s"), f("input_len"), f("output_len")
    return rows, b, t, il.mean(), ol.mean(), b * (il + ol) / t


def full_profile_cap(b, t, e2e, slo):
    """Eq. 13 on measured points: argmax T s.t. E2E ≤ SLO and T/(B·T(1)) > ε."""
    eff = t / (b * t[0] / b[0])
    ok = (eff > EPSILON) | (np.arange(b.size) == 0)
    if slo is not None:
        ok &= e2e <= slo
    if not ok.any():
        return 0
    idx = np.nonzero(ok)[0]
    return int(idx[np.argmax(t[idx])])


def run_time_s(rows):
    return sum(float(r["num_prompts"]) * (float(r["input_len"]) + float(r["output_len"])) / float(r["throughput_tok_s"])
               for r in rows)


def evaluate(form, train, target):
    rows, b, t, il, ol, e2e = curve_arrays(target)
    arch = get_arch(rows[0]["model"])
    a = profiles.profile_arrays(train)
    cvs = profiles.estimate_output_cv(list(a.rows))
    cal = calibrate.fit(list(a.models), GPU, a.batch, a.input_len, a.output_len, a.throughput_tok_s, form=form,
                        output_cv=profiles.apply_output_cv(a.rows, cvs), chunked_prefill=a.chunked_prefill)
    cv = float(profiles.apply_output_cv(rows[:1], cvs)[0])
    cap_tokens = int(float(rows[0]["kv_capacity_tokens"] or 0)) or \
        memory.memory_split(arch, GPU, 0.9, int(max(float(r["max_num_seqs"]) for r in rows))).kv_capacity_tokens
    max_cap = int(max(float(r["max_num_seqs"]) for r in rows))
    chunked = rows[0]["chunked_prefill"] == "True"  # the target deployment's config
    budget = float(rows[0]["max_num_batched_tokens"] or 512) if chunked else None
    point32 = [i for i, r in enumerate(rows) if int(float(r["max_num_seqs"])) == 32]
    e2e32 = e2e[point32[0]] if point32 else float(np.interp(32, b, e2e))
    out = {}
    for slo_name, slo in (("none", None), ("loose", 4 * e2e32), ("tight", 2 * e2e32)):
        i_full = full_profile_cap(b, t, e2e, slo)
        res = bca.advise(cal, arch, GPU, il, ol, slo_e2e_s=slo, epsilon=EPSILON, max_cap=max_cap,
                         kv_capacity_tokens=cap_tokens, output_cv=cv, max_num_batched_tokens=budget,
                         chunked_prefill=chunked)
        # The same rule on the same candidate grid (the profiled max_num_seqs points), with SLIM's
        # predicted T and E2E in place of the measured ones: an apples-to-apples decision.
        kw = {"output_cv": cv, "chunked_prefill": chunked, "kv_capacity_tokens": cap_tokens,
              "max_num_batched_tokens": budget} if form == "kneecap" else {}
        t_hat, e2e_hat = calibrate.predict(cal, arch, None, b, il, ol, **kw)
        i_grid = full_profile_cap(b, t_hat, e2e_hat, slo)
        b_at = min(float(res.cap), b[-1])
        t_meas = float(np.interp(b_at, b, t))
        e2e_meas = float(np.interp(b_at, b, e2e))
        kv_pred = memory.kv_tokens_for_cap(res.cap, il + ol) * arch.kv_bytes_per_token / GIB
        kv_full = memory.kv_tokens_for_cap(int(round(b[i_full])), il + ol) * arch.kv_bytes_per_token / GIB
        kv_default = cap_tokens * arch.kv_bytes_per_token / GIB
        out[slo_name] = {
            "slo_e2e_s": slo, "full_cap_batch": float(b[i_full]), "full_max_num_seqs": int(float(rows[i_full]["max_num_seqs"])),
            "slim_cap": res.cap, "slim_binding": res.binding,
            "throughput_full_tok_s": float(t[i_full]), "throughput_at_slim_cap_tok_s": t_meas,
            "throughput_lost_pct": 100.0 * (1.0 - t_meas / t[i_full]),
            "slo_violation_pct": (100.0 * max(e2e_meas / slo - 1.0, 0.0)) if slo else 0.0,
            "kv_default_gib": kv_default, "kv_slim_gib": min(kv_pred, kv_default), "kv_full_gib": min(kv_full, kv_default),
            "kv_saved_gib": kv_default - min(kv_pred, kv_default),
            "grid_cap_batch": float(b[i_grid]), "grid_same_decision": bool(i_grid == i_full),
            "grid_throughput_lost_pct": 100.0 * (1.0 - t[i_grid] / t[i_full]),
            "grid_slo_violation_pct": (100.0 * max(e2e[i_grid] / slo - 1.0, 0.0)) if slo else 0.0,
        }
    return out


def main():
    rows = [r for r in profiles.read_csv_text(PROFILES_CSV.read_text()) if not profiles.is_outlier(r)]
    all_splits = splits(rows)
    curves = collections.defaultdict(list)
    for r in rows:
        curves[r["curve"]].append(r)
    result = {}
    for setting in ("same_curve", "output_length", "model_transfer", "combined"):
        cases = []
        for case, train, test in all_splits[setting]:
            target = curves[test[0]["curve"]] if setting == "same_curve" else test
            profiled = train
            entry = {"case": case, "prof_points": len(profiled),
                     "pred_points": len(target) - (len(train) if setting == "same_curve" else 0)}
            full_rows = target if setting == "same_curve" else train + target
            entry["time_saved_pct"] = 100.0 * (1.0 - run_time_s(profiled) / run_time_s(full_rows))
            entry["points_saved_pct"] = 100.0 * entry["pred_points"] / len(full_rows)
            for form in FORMS:
                entry[form] = evaluate(form, train, target)
            cases.append(entry)
        result[setting] = cases

    summary = {}
    for setting, cases in result.items():
        s = {"prof_points": sum(c["prof_points"] for c in cases), "pred_points": sum(c["pred_points"] for c in cases),
             "points_saved_pct": float(np.mean([c["points_saved_pct"] for c in cases])),
             "time_saved_pct": float(np.mean([c["time_saved_pct"] for c in cases]))}
        for form in FORMS:
            for slo in ("none", "loose", "tight"):
                vals = [c[form][slo] for c in cases]
                s[f"{form}/{slo}"] = {
                    "throughput_lost_mean_pct": float(np.mean([v["throughput_lost_pct"] for v in vals])),
                    "throughput_lost_max_pct": float(np.max([v["throughput_lost_pct"] for v in vals])),
                    "slo_violation_max_pct": float(np.max([v["slo_violation_pct"] for v in vals])),
                    "kv_saved_mean_gib": float(np.mean([v["kv_saved_gib"] for v in vals])),
                    "grid_same_decision": f"{sum(v['grid_same_decision'] for v in vals)}/{len(vals)}",
                    "grid_throughput_lost_mean_pct": float(np.mean([v["grid_throughput_lost_pct"] for v in vals])),
                    "grid_throughput_lost_max_pct": float(np.max([v["grid_throughput_lost_pct"] for v in vals])),
                    "grid_slo_violation_max_pct": float(np.max([v["grid_slo_violation_pct"] for v in vals])),
                }
        summary[setting] = s
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bca_profiling.json").write_text(json.dumps({"epsilon": EPSILON, "gpu": GPU.key, "summary": summary,
                                                            "cases": result}, indent=2) + "\n")
    lines = ["# BCA from a cheap SLIM fit vs full profiling (paper Tables V–VI, real H100 data)", "",
             f"ε = {EPSILON}; SLO tight = 2×, loose = 4× the measured E2E at max_num_seqs=32 on the target curve.",
             "Throughput lost and SLO violation are measured on the target curve at SLIM-BCA's cap (interpolated in B),",
             "against the cap that the same rule picks from the fully profiled curve. KV saved: vs vLLM's default",
             "reservation (gpu_memory_utilization 0.9) of that deployment. Measured by `benchmarks/bca_profiling.py`.", "",
             "## Profiling cost (Table VI)", "", "| setting | prof. points | pred. points | points saved | time saved |",
             "|---|---|---|---|---|"]
    for setting, s in summary.items():
        lines.append(f"| {setting} | {s['prof_points']} | {s['pred_points']} | {s['points_saved_pct']:.1f}% | {s['time_saved_pct']:.1f}% |")
    lines += ["", "## Recommendation quality (Table V): mean / max throughput lost %, max SLO violation %, mean KV saved GiB", "",
              "| setting | form | no SLO | loose SLO | tight SLO |", "|---|---|---|---|---|"]
    for setting, s in summary.items():
        for form in FORMS:
            cells = []
            for slo in ("none", "loose", "tight"):
                v = s[f"{form}/{slo}"]
                cells.append(f"{v['throughput_lost_mean_pct']:.1f} / {v['throughput_lost_max_pct']:.1f}, "
                             f"viol {v['slo_violation_max_pct']:.1f}, {v['kv_saved_mean_gib']:.1f} GiB")
            lines.append(f"| {setting} | {form} | " + " | ".join(cells) + " |")
    lines += ["", "## Same candidate grid as full profiling (profiled max_num_seqs points only)", "",
              "Same decision / mean throughput lost % / max lost % / max SLO violation %.", "",
              "| setting | form | no SLO | loose SLO | tight SLO |", "|---|---|---|---|---|"]
    for setting, s in summary.items():
        for form in FORMS:
            cells = [f"{s[f'{form}/{slo}']['grid_same_decision']}, {s[f'{form}/{slo}']['grid_throughput_lost_mean_pct']:.1f} / "
                     f"{s[f'{form}/{slo}']['grid_throughput_lost_max_pct']:.1f}, viol {s[f'{form}/{slo}']['grid_slo_violation_max_pct']:.1f}"
                     for slo in ("none", "loose", "tight")]
            lines.append(f"| {setting} | {form} | " + " | ".join(cells) + " |")
    lines += ["", "## Per case (kneecap form, tight SLO)", "",
              "| setting | case | full cap B | SLIM cap | binding | lost % | viol % | KV saved GiB |", "|---|---|---|---|---|---|---|---|"]
    for setting, cases in result.items():
        for c in cases:
            v = c["kneecap"]["tight"]
            lines.append(f"| {setting} | {c['case']} | {v['full_cap_batch']:.0f} | {v['slim_cap']} | {v['slim_binding']} | "
                         f"{v['throughput_lost_pct']:.1f} | {v['slo_violation_pct']:.1f} | {v['kv_saved_gib']:.1f} |")
    lines += ["", "Time saved counts each run as num_prompts·(IL+OL)/T: every run here serves 500–2000 prompts, so",
              "the small-batch (pre-knee) runs are the slowest ones and the same-curve setting saves far fewer",
              "seconds than points; the transfer settings skip whole curves at the longest output length.",
              "", "Negative 'lost' means SLIM-BCA's cap measured more throughput than the full-profile choice",
              "(the measured grid is coarse: powers of two). Paper (its data): within 0–15% of the full-profile",
              "choice, 27–60% less profiling time, up to 55 GB KV saved for OPT models."]
    (RESULTS / "bca_profiling.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
