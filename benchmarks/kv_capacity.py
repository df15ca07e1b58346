"""Predicted vs vLLM-reported KV capacity on every row of the real H100 profiles.

For each row: kneecap.model.memory.memory_split(model, h100-64gb, the row's
gpu_memory_utilization, max_num_seqs, max_num_batched_tokens) against the row's
kv_capacity_tokens. Target: ≤ 2% error on every row.
"""

from __future__ import annotations

import csv
import json
import platform
import sys

import numpy as np

from _paths import PROFILES_CSV, RESULTS
from kneecap.model.arch import get_arch
from kneecap.model.hardware import get_gpu
from kneecap.model.memory import default_max_num_batched_tokens, memory_split

TARGET = 0.02


def _reserve_rows(rows, gpu):
    """(D·T, V·S, measured reserve bytes, KV bytes) per row."""
    out = []
    for r in rows:
        arch = get_arch(r["model"])
        budget = int(r["max_num_batched_tokens"]) if r["max_num_batched_tokens"] else \
            default_max_num_batched_tokens(int(r["max_model_len"]), r["chunked_prefill"] == "True")
        kv = int(r["num_gpu_blocks"]) * int(r["block_size"]) * arch.kv_bytes_per_token
        reserve = gpu.memory_bytes * float(r["gpu_memory_utilization"]) - kv - arch.weight_bytes
        out.append((arch.hidden * budget, arch.vocab * int(r["max_num_seqs"]), reserve, kv, r["model"]))
    return out


def leave_one_model_out(rows, gpu) -> dict[str, float]:
    """Refit (base, a, s) of the reserve model without one model; worst KV error on that model."""
    from scipy.optimize import least_squares

    data = _reserve_rows(rows, gpu)
    result = {}
    for held in sorted({d[4] for d in data}):
        train = np.array([d[:4] for d in data if d[4] != held], dtype=float)
        test = np.array([d[:4] for d in data if d[4] == held], dtype=float)

        def model(p, x):
            return p[0] * 2**20 + np.maximum(p[1] * x[:, 0], p[2] * x[:, 1])

        fit = least_squares(lambda p: (model(p, train) - train[:, 2]) / 2**20, [100.0, 20.0, 30.0])
        result[held] = float(np.max(np.abs(model(fit.x, test) - test[:, 2]) / test[:, 3]))
    return result


def main() -> int:
    gpu = get_gpu("h100-64gb")
    rows = [r for r in csv.DictReader(PROFILES_CSV.open()) if r["kv_capacity_tokens"]]
    table = []
    for r in rows:
        arch = get_arch(r["model"])
        chunked = r["chunked_prefill"] == "True"
        budget = int(r["max_num_batched_tokens"]) if r["max_num_batched_tokens"] else \
            default_max_num_batched_tokens(int(r["max_model_len"]), chunked)
        split = memory_split(arch, gpu, float(r["gpu_memory_utilization"]), int(r["max_num_seqs"]), budget,
                             int(r["block_size"]))
        measured = int(r["kv_capacity_tokens"])
        table.append((r["curve"], r["model"], int(r["max_num_seqs"]), budget, measured, split.kv_capacity_tokens,
                      (split.kv_capacity_tokens - measured) / measured))
    err = np.abs(np.array([t[-1] for t in table]))
    by_model = {}
    for t in table:
        by_model.setdefault(t[1], []).append(abs(t[-1]))
    print(f"KV capacity: predicted vs vLLM-reported, {len(table)} rows of {PROFILES_CSV.name} (h100-64gb)")
    print(f"{'model':<12}{'rows':>6}{'mean |err| %':>14}{'max |err| %':>13}")
    for m, e in sorted(by_model.items()):
        print(f"{m:<12}{len(e):>6}{100 * np.mean(e):>14.3f}{100 * np.max(e):>13.3f}")
    print(f"{'all':<12}{len(err):>6}{100 * err.mean():>14.3f}{100 * err.max():>13.3f}   target ≤ {100 * TARGET:.0f}%")
    worst = max(table, key=lambda t: abs(t[-1]))
    print(f"worst row: {worst[0]} max_num_seqs={worst[2]} budget={worst[3]}: measured {worst[4]}, predicted {worst[5]}")
    loo = leave_one_model_out(rows, gpu)
    print("leave-one-model-out (reserve constants refit on the other two models):")
    for m, e in sorted(loo.items()):
        print(f"  {m:<12} max |err| {100 * e:.3f}%")
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "kv_capacity", "data": str(PROFILES_CSV.name), "gpu": "h100-64gb", "rows": len(table),
        "mean_abs_err": float(err.mean()), "max_abs_err": float(err.max()), "target": TARGET,
        "pass": bool(err.max() <= TARGET and max(loo.values()) <= TARGET),
        "leave_one_model_out_max_abs_err": loo, "machine": platform.platform(),
        "per_model": {m: {"rows": len(e), "mean_abs_err": float(np.mean(e)), "max_abs_err": float(np.max(e))}
                      for m, e in by_model.items()},
    }
    (RESULTS / "kv_capacity.json").write_text(json.dumps(result, indent=2) + "\n")
    with (RESULTS / "kv_capacity.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["curve", "model", "max_num_seqs", "max_num_batched_tokens", "measured_kv_tokens",
                    "predicted_kv_tokens", "rel_err"])
        w.writerows(table)
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
