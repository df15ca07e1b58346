"""Real H100 operating points (data/real-h100/profiles.csv) as the window observations the
loop would have made: one Llama-2-7B curve, nine batch caps. The ``curve`` fixture of
tests/conftest.py reads it."""

from __future__ import annotations

import csv
from pathlib import Path

from kneecap.observe.observation import Observation

CURVE = "advisor_output_length/llama-2-7b/ol130/n2000/mem0.9"


def curve_rows(profiles_csv: Path) -> dict[int, dict]:
    """The curve's rows by max_num_seqs."""
    with open(profiles_csv) as f:
        rows = [r for r in csv.DictReader(f) if r["curve"] == CURVE]
    assert len(rows) == 9
    return {int(r["max_num_seqs"]): r for r in rows}


def observation(row: dict) -> Observation:
    """One measured operating point as the window observation the loop would have made."""
    thr = float(row["throughput_tok_s"])
    il, ol = float(row["input_len"]), float(row["output_len"])
    rps = float(row["request_throughput"])
    e2e = float(row["e2e_client_ms"]) / 1e3
    return Observation(
        window_s=60.0, t_end_s=0.0, pods=1, finished_requests=rps * 60, request_rate_rps=rps,
        mean_batch=float(row["batch"]), max_batch=float(row["max_num_seqs"]), batch_samples=12, queue_len=0.0,
        prompt_tokens=rps * 60 * il, generation_tokens=rps * 60 * ol, prompt_tok_s=thr * il / (il + ol),
        generation_tok_s=thr * ol / (il + ol), input_len_mean=il, input_len_cv=0.0, input_len_p95=il,
        output_len_mean=ol, output_len_cv=0.0, output_len_p95=ol, ttft_mean_s=0.05, ttft_p95_s=0.1,
        itl_mean_s=float(row["itl_ms"]) / 1e3, itl_p95_s=float(row["itl_ms"]) / 1e3, e2e_mean_s=e2e,
        e2e_p95_s=e2e, kv_usage=float(row["kv_usage_mean"]), kv_usage_max=float(row["kv_usage_max"]),
        kv_capacity_tokens=float(row["kv_capacity_tokens"]),
        gpu_memory_utilization=float(row["gpu_memory_utilization"]))
