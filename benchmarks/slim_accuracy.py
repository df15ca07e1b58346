"""SLIM accuracy on the real H100 profiles: the paper's Table III scenarios on this data.

Scenarios (data/real-h100/profiles.csv, suspect_outlier rows dropped):
* same_curve: every curve with ≥ 6 points: fit its 3 smallest-batch points, predict the rest;
* output_length: per model, fit the advisor curves at OL 130/260, predict OL 390;
* model_transfer: fit two models' advisor curves at OL 390, predict the third (3 rotations);
* combined: fit two models at OL 130/260, predict the third at OL 390 (unseen model and OL);
* workload_transfer (beyond the paper): per model, fit the fixed-length batching_results curves,
  predict the ShareGPT background curve (heterogeneous lengths; tests the E[C] fix).

Methods: SLIM as the paper (eq. 9 readings a and b), the kneecap form (default), the Imai-style
linear regression and the LLMVisor-style piecewise fit. Throughput and E2E MAPE (E2E = SLIM's
batch latency B·(IL+OL)/T on both sides). Writes results/slim_accuracy.{md,json}.
"""

from __future__ import annotations

import collections
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _paths import PROFILES_CSV, RESULTS  # noqa: E402

from kneecap.model import baselines, calibrate, profiles, slim  # noqa: E402

GPU = "h100-64gb"
METHODS = ("paper-a", "paper-b", "kneecap", "imai-lr", "llmvisor-pw", "paper-a/np", "kneecap/nocv")
NO_PRIOR = 1e-6  # "/np": the paper's plain least squares (priors ~off), for reference
MODELS = ("opt-1.3b", "opt-2.7b", "llama-2-7b")
TARGETS = {"same_curve": 10.0, "output_length": 4.0, "model_transfer": 10.0}


def fit_predict(method, train, test, target_workload_cv=False):
    """Fit ``method`` on rows ``train``; return (pred throughput, pred e2e, measured throughput).
    ``target_workload_cv``: the target's output-length CV is a known workload descriptor (the
    operator reads it from vLLM's length histograms); here it comes from the target rows' KV
    usage, which depends on the lengths only."""
    a = profiles.profile_arrays(train)
    t = profiles.profile_arrays(test)
    form = method.split("/")[0]
    if form in slim.FORMS:
        # workload CV from the training rows only ("/nocv": eq. 12 at the mean lengths, ablation)
        cvs = {} if method.endswith("/nocv") else profiles.estimate_output_cv(list(a.rows))
        weight = NO_PRIOR if method.endswith("/np") else calibrate.PRIOR_WEIGHT
        cal = calibrate.fit(list(a.models), GPU, a.batch, a.input_len, a.output_len, a.throughput_tok_s,
                            form=form, output_cv=profiles.apply_output_cv(a.rows, cvs), prior_weight=weight,
                            chunked_prefill=a.chunked_prefill)
        if target_workload_cv and not method.endswith("/nocv"):
            cvs = {**cvs, **profiles.estimate_output_cv(list(t.rows))}
        kw = {"output_cv": profiles.apply_output_cv(t.rows, cvs), "chunked_prefill": t.chunked_prefill} \
            if form == "kneecap" else {}
        thr, e2e = calibrate.predict(cal, list(t.models), None, t.batch, t.input_len, t.output_len, **kw)
    else:
        model = baselines.fit_baseline(method, list(a.models), a.batch, a.input_len, a.output_len, a.throughput_tok_s)
        thr, e2e = model.predict(list(t.models), t.batch, t.input_len, t.output_len)
    return thr, e2e, t


def errors(thr, e2e, t):
    e2e_meas = t.batch * (t.input_len + t.output_len) / t.throughput_tok_s
    return np.abs(thr / t.throughput_tok_s - 1) * 100, np.abs(e2e / e2e_meas - 1) * 100


def splits(rows):
    """{scenario: [(case name, train rows, test rows)]}."""
    def adv(model, ol):
        return [r for r in rows if r["source"] == "advisor_output_length" and r["model"] == model
                and r["curve"].split("/")[2] == f"ol{ol}"]

    out = collections.defaultdict(list)
    curves = collections.defaultdict(list)
    for r in rows:
        curves[r["curve"]].append(r)
    for name, rs in curves.items():
        if len(rs) < 6:
            continue
        rs = sorted(rs, key=lambda r: float(r["batch"]))
        out["same_curve"].append((name, rs[:3], rs[3:]))
    for m in MODELS:
        out["output_length"].append((m, adv(m, 130) + adv(m, 260), adv(m, 390)))
    for m in MODELS:
        others = [x for x in MODELS if x != m]
        out["model_transfer"].append((f"{'+'.join(others)} -> {m}", sum((adv(x, 390) for x in others), []), adv(m, 390)))
        out["workload_transfer"].append((f"{m}: batching_results (fixed lengths) -> background (ShareGPT)",
                                         [r for r in rows if r["model"] == m and r["source"] == "batching_results"],
                                         [r for r in rows if r["model"] == m and r["source"] == "background"]))
        out["combined"].append((f"{'+'.join(others)} @130/260 -> {m} @390",
                                sum((adv(x, 130) + adv(x, 260) for x in others), []), adv(m, 390)))
    return out


def plateau_check(rows):
    """The operator's view: online, the running batch only reaches the current cap, and the
    model must say what a larger max_num_seqs would give. Fit each curve's points with
    max_num_seqs ≤ 128; predict its points with max_num_seqs ≥ 256 at B = max_num_seqs (not the
    measured running B). The kneecap form caps the effective batch at the KV capacity (and the
    chunked-prefill token budget) from the row's config; without caps, and in the paper's
    SLIM, B = max_num_seqs."""
    curves = collections.defaultdict(list)
    for r in rows:
        curves[r["curve"]].append(r)
    errs = {"kneecap + caps": [], "kneecap, no caps": [], "paper-a": []}
    for rs in curves.values():
        train = [r for r in rs if float(r["max_num_seqs"]) <= 128]
        test = [r for r in rs if float(r["max_num_seqs"]) >= 256 and r["kv_capacity_tokens"]]
        if len(train) < 3 or not test:
            continue
        a = profiles.profile_arrays(train)
        cvs = profiles.estimate_output_cv(list(a.rows))
        f = lambda k: np.array([float(r[k] or 0) for r in test])  # noqa: E731
        chunked = np.array([r["chunked_prefill"] == "True" for r in test])
        budget = np.where(chunked, [float(r["max_num_batched_tokens"] or 512) for r in test], 1e12)
        cv = profiles.apply_output_cv(test, cvs)
        fits = {form: calibrate.fit(list(a.models), GPU, a.batch, a.input_len, a.output_len, a.throughput_tok_s,
                                    form=form, output_cv=profiles.apply_output_cv(a.rows, cvs),
                                    chunked_prefill=a.chunked_prefill)
                for form in ("kneecap", "paper-a")}
        base = {"output_cv": cv, "chunked_prefill": chunked}
        for key, form, kw in (("kneecap + caps", "kneecap", {**base, "kv_capacity_tokens": f("kv_capacity_tokens"),
                                                             "max_num_batched_tokens": budget}),
                              ("kneecap, no caps", "kneecap", base), ("paper-a", "paper-a", {})):
            thr, _ = calibrate.predict(fits[form], test[0]["model"], None, f("max_num_seqs"), f("input_len"),
                                       f("output_len"), **kw)
            errs[key].extend(np.abs(thr / f("throughput_tok_s") - 1) * 100)
    return {k: {"throughput_mape_pct": float(np.mean(v)), "n_points": len(v)} for k, v in errs.items()}


def main():
    rows = [r for r in profiles.read_csv_text(PROFILES_CSV.read_text()) if not profiles.is_outlier(r)]
    t0 = time.perf_counter()
    results = {}
    for scenario, cases in splits(rows).items():
        res = {"cases": {}, "pooled": {}}
        pooled = {m: ([], []) for m in METHODS}
        for case, train, test in cases:
            res["cases"][case] = {"n_train": len(train), "n_test": len(test)}
            for m in METHODS:
                et, ee = errors(*fit_predict(m, train, test, target_workload_cv=scenario == "workload_transfer"))
                pooled[m][0].extend(et)
                pooled[m][1].extend(ee)
                res["cases"][case][m] = {"throughput_mape_pct": float(et.mean()), "e2e_mape_pct": float(ee.mean()),
                                         "throughput_max_pct": float(et.max())}
        for m in METHODS:
            res["pooled"][m] = {"throughput_mape_pct": float(np.mean(pooled[m][0])),
                                "e2e_mape_pct": float(np.mean(pooled[m][1])), "n_points": len(pooled[m][0])}
        results[scenario] = res
    plateau = plateau_check(rows)
    elapsed = time.perf_counter() - t0

    # Targets for the default form
    checks = {}
    for scenario, limit in TARGETS.items():
        worst_case = max(c["kneecap"]["throughput_mape_pct"] for c in results[scenario]["cases"].values())
        pooled = results[scenario]["pooled"]["kneecap"]["throughput_mape_pct"]
        value = pooled if scenario == "same_curve" else worst_case
        checks[scenario] = {"target_pct": limit, "measured_pct": value, "met": value <= limit,
                            "measure": "pooled MAPE" if scenario == "same_curve" else "worst case MAPE"}
    for scenario, res in results.items():
        best_base = min(res["pooled"][b]["throughput_mape_pct"] for b in baselines.BASELINES)
        k = res["pooled"]["kneecap"]["throughput_mape_pct"]
        checks[f"{scenario}_vs_best_baseline"] = {"kneecap_pct": k, "best_baseline_pct": best_base, "met": k <= best_base}

    out = {"data": str(PROFILES_CSV.name), "gpu": GPU, "methods": list(METHODS), "scenarios": results,
           "targets": checks, "at_max_num_seqs": plateau, "elapsed_s": elapsed}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "slim_accuracy.json").write_text(json.dumps(out, indent=2) + "\n")

    lines = ["# SLIM accuracy on the real H100 profiles (paper Table III scenarios)", "",
             "Throughput / E2E MAPE (%), pooled over held-out points. Measured by `benchmarks/slim_accuracy.py`",
             "on data/real-h100/profiles.csv (suspect_outlier rows dropped). E2E is SLIM's batch latency",
             "B·(IL+OL)/T. `kneecap` is the default form; `paper-a`/`paper-b` are SLIM as published with the two",
             "readings of eq. 9, fitted with the same weak priors as kneecap (`paper-a/np`: plain least squares,",
             "as the paper fits); `imai-lr` and `llmvisor-pw` are the baselines; `kneecap/nocv` ablates fix (ii)",
             "(output-length CV = 0: eq. 12 at the mean lengths, no per-admission prefill step). The CV is",
             "estimated from the training rows' KV usage; in workload_transfer the target workload's CV is",
             "taken as known (the operator reads it from vLLM's length histograms; here from the target rows'",
             "KV usage, which depends on the lengths only).", "",
             "| scenario | n test | " + " | ".join(METHODS) + " |", "|---|---|" + "---|" * len(METHODS)]
    for scenario, res in results.items():
        n = res["pooled"]["kneecap"]["n_points"]
        cells = [f"{res['pooled'][m]['throughput_mape_pct']:.1f} / {res['pooled'][m]['e2e_mape_pct']:.1f}" for m in METHODS]
        lines.append(f"| **{scenario}** | {n} | " + " | ".join(cells) + " |")
    lines += ["", "## Per case (throughput MAPE %)", "", "| scenario | case | " + " | ".join(METHODS) + " |",
              "|---|---|" + "---|" * len(METHODS)]
    for scenario, res in results.items():
        for case, c in res["cases"].items():
            lines.append(f"| {scenario} | {case} | " + " | ".join(f"{c[m]['throughput_mape_pct']:.1f}" for m in METHODS) + " |")
    lines += ["", "## Targets for the default form (kneecap)", ""]
    for name, c in checks.items():
        if "target_pct" in c:
            lines.append(f"- {name}: {c['measure']} {c['measured_pct']:.1f}% vs ≤ {c['target_pct']:.0f}% → "
                         f"{'met' if c['met'] else 'NOT met'}")
        else:
            lines.append(f"- {name}: kneecap {c['kneecap_pct']:.1f}% vs best baseline {c['best_baseline_pct']:.1f}% → "
                         f"{'met' if c['met'] else 'NOT met'}")
    lines += ["", "## Predicting at the configured max_num_seqs (KV-capacity / token-budget plateau)", "",
              "Fit each curve's points with max_num_seqs ≤ 128; predict its points with max_num_seqs ≥ 256 at",
              "B = max_num_seqs (online the batch only reaches the current cap), so the model must know where",
              "the running batch stops growing.", "",
              "| method | n | throughput MAPE % |", "|---|---|---|"]
    lines += [f"| {k} | {v['n_points']} | {v['throughput_mape_pct']:.1f} |" for k, v in plateau.items()]
    lines += ["", f"Paper (its data): SLIM 15.1% same curve, 5.6% output length, 24.3% model, 17.6% combined.",
              f"Run time {elapsed:.1f} s."]
    (RESULTS / "slim_accuracy.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
