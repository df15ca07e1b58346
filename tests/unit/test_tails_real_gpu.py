"""benchmarks/tails_real_gpu.py: the loader reads every carried GPU run as its source tabulated
it, and the replay feeds a run's own requests and engine arguments to GAUSS and the twin."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from benchmarks import tails_real_gpu as bench

TABLES = ("llmd_benchmark_points.csv", "llmservingsim_points.csv")


@pytest.fixture(scope="module")
def points():
    return bench.load_points()


@pytest.fixture(scope="module")
def table_rows():
    rows = []
    for name in TABLES:
        with open(bench.DATA / name) as fh:
            rows += list(csv.DictReader(fh))
    return rows


def test_every_carried_run_is_a_point_and_every_point_has_its_run(points, table_rows):
    assert len(points) == len(table_rows) == 84
    carried = {p.relative_to(bench.DATA / "raw").as_posix() for p in (bench.DATA / "raw").rglob("*")
               if p.name.endswith(".csv") and "timeseries" not in p.name or p.name == "requests.jsonl"}
    named = {"llm-d-benchmark/" + r["source"].split(":", 1)[1] if "llm-d" in r["source"] else
             "llmservingsim/" + "/".join(r["source"].split(":", 1)[1].split("/")[2:4]) + "/requests.jsonl"
             for r in table_rows}
    assert carried == named


def test_the_loader_reproduces_the_sources_own_percentiles(points, table_rows):
    for p, row in zip(points, table_rows):
        assert p.arrival_s.size == int(row["n_requests"]), p.name
        assert p.rate_rps == pytest.approx(float(row["rate_rps"]))
        assert p.input_tokens.mean() == pytest.approx(float(row["input_mean"]), rel=1e-3), p.name
        for q in (50, 90, 95, 99):
            assert np.percentile(p.ttft_s, q) * 1e3 == pytest.approx(float(row[f"ttft_p{q}_ms"]), rel=1e-3), p.name
        for q in (50, 99):
            assert np.percentile(p.e2e_s, q) * 1e3 == pytest.approx(float(row[f"e2e_p{q}_ms"]), rel=1e-3), p.name
        assert np.all(np.diff(p.arrival_s) >= 0) and p.arrival_s[0] == 0.0


def test_engine_arguments_and_topology_come_from_the_run(points):
    by = {p.name: p for p in points}
    rtx = by["RTX4090/Llama-3.1-8B"]
    assert (rtx.gpu, rtx.model, rtx.tp, rtx.replicas) == ("rtx-4090", "llama-3.1-8b", 1, 1)
    assert (rtx.max_num_seqs, rtx.max_num_batched_tokens, rtx.num_gpu_blocks) == (256, 2048, 2588)
    moe = by["RTXPRO6000/Qwen3-30B-A3B-Instruct-2507"]
    assert (moe.model, moe.replicas, moe.max_num_seqs) == ("qwen3-30b-a3b", 2, 128)
    a100 = by["exp-2/vllm-70b-2replicas/LMBench_short_input_qps5.csv"]
    assert (a100.gpu, a100.tp, a100.replicas, a100.gpu_memory_utilization) == ("a100-80gb", 2, 2, 0.95)
    assert by["exp-3/H100/vllm-standalone-llama-3-70b-2replicas-H100/LMBench_sharegpt_output_8.csv"].gpu == "h100-80gb"
    assert by["exp-0/vllm-70b/LMBench_sharegpt_output_0.5.csv"].replicas == 1


def test_replay_of_one_run_uses_exactly_its_requests_and_kv_cache(points):
    p = next(x for x in points if x.name == "RTX4090/Llama-3.1-8B")
    cal = bench.project_calibration()
    g = bench.gauss_predict(p, cal)
    t = bench.twin_predict(p)
    many = int((p.output_tokens > 1).sum())
    for pred in (g, t):
        assert pred["ttft"].size == pred["e2e"].size == 300 and pred["tpot"].size == many
        assert pred["kv_capacity_tokens"] == 2588 * 16  # the run's recorded blocks, not a memory split
        assert np.all(pred["e2e"] > pred["ttft"])
    # the twin generates each request's own output: E2E − TTFT spans its output − 1 steps
    assert np.allclose(t["tpot"] * (p.output_tokens[p.output_tokens > 1] - 1),
                       (t["e2e"] - t["ttft"])[p.output_tokens > 1])
    # 10 req/s of 850-token prompts and 650-token outputs overload a 4090: the run's queue grows,
    # and both models say so (the cache binds: requests are preempted)
    assert p.saturated and g["past_stability"] and g["stable_binding"] == "kv"
    assert g["preempted"] > 0 and t["preempted"] > 0
    row = bench.evaluate(p, cal)
    assert row["measured"]["ttft"]["p50"] == pytest.approx(60.11094, rel=1e-4)  # the table's 60110.94 ms
    assert set(row["gauss"]["err"]) == {"ttft", "tpot", "e2e"}


def test_a_tensor_parallel_run_is_replayed_with_its_tp_and_would_not_fit_without_it(points):
    from dataclasses import replace

    p = next(x for x in points if x.name == "exp-0/vllm-70b/LMBench_sharegpt_output_0.5.csv")
    assert (p.tp, p.gpu, p.model) == (2, "a100-80gb", "llama-3.1-70b")
    cal = bench.project_calibration()
    row = bench.evaluate(p, cal)
    # both models take the run's TP 2 and size the same per-GPU KV cache from the memory split at 0.95
    assert "quantiles" in row["gauss"] and "quantiles" in row["twin"]
    assert row["gauss"]["kv_capacity_tokens"] == row["twin"]["kv_capacity_tokens"] > 0
    assert len(row["measured"]["ttft"]) == 4 and row["requests"] == 252
    # 141 GB of weights on one 80 GB A100: at TP 1 neither model can express the run
    one = bench.evaluate(replace(p, tp=1), cal)
    assert "no KV cache" in one["gauss"]["not_expressible"] and "not_expressible" in one["twin"]
