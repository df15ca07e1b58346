"""GAUSS and the twin against TTFT / TPOT / E2E tails of real vLLM on GPUs (data/gpu-latency).

For every point of the two points tables (llm-d-benchmark: Llama-3.1-70B on A100 and H100
80 GB; LLMServingSim: Llama-3.1-8B and Qwen3 on RTX 4090 and RTX PRO 6000) the run's own
per-request record is replayed:

1. calibration: the project's own, ``kneecap fit data/real-h100/profiles.csv --gpu h100-64gb
   --where source=batching_results`` (docs/getting-started.md's worked example), moved to the
   run's GPU by :func:`kneecap.model.transfer.calibration_on`, as ``kneecap simulate`` does
   (efficiencies carried, the target's FLOP/s and bandwidth in the hardware terms). Nothing is
   fitted to this data;
2. GAUSS: :func:`kneecap.model.gauss.replay` on the run's arrivals and per-request input and
   output lengths, with the run's engine arguments (max_num_seqs, max_num_batched_tokens,
   gpu_memory_utilization or the recorded KV blocks, prefix caching) through
   :func:`gauss.engine_limits_for` at the run's tensor parallel size; the replicas behind one
   Service are GAUSS's servers (one shared FCFS queue, Kiefer–Wolfowitz: an ideal router, where
   a Kubernetes Service picks a replica per connection);
3. the twin: :class:`kneecap.sim.engine.Engine` (what ``kneecap twin`` serves) in virtual time,
   one engine per replica, requests dealt round robin, the roofline's step cost (fitted on the
   same H100 64 GB's offline step timings) on the run's GPU.

Measured per request: TTFT, TPOT = (E2E − TTFT)/(output − 1), E2E; their p50/p90/p95/p99
against the same quantiles of the predictions. A point is *saturated* when its queue grows
through the run: the median TTFT of the last quarter of requests (by arrival) exceeds three
times that of the first quarter. The sustainable rate of a sweep (one experiment, one
workload, several rates) is where its p90 TTFT crosses an SLO of twice the p90 TTFT at the
sweep's lowest rate, interpolated linearly between the swept rates, measured and predicted
with the same rule.

Goals (issue 22; reported, not tuned to): below saturation, p50/p90 TTFT and TPOT within 10%,
p99 within 15%; sustainable rate within 5%.

    PYTHONPATH=operator .venv/bin/python benchmarks/tails_real_gpu.py [--quick]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "operator"))

from benchmarks._paths import PROFILES_CSV, RESULTS  # noqa: E402
from kneecap.errors import InputError  # noqa: E402
from kneecap.model import calibrate, gauss, profiles  # noqa: E402
from kneecap.model.arch import get_arch  # noqa: E402
from kneecap.model.hardware import get_gpu  # noqa: E402
from kneecap.model.transfer import calibration_on  # noqa: E402

DATA = ROOT / "data" / "gpu-latency"
CALIBRATION_GPU = "h100-64gb"
CALIBRATION_WHERE = ("source=batching_results",)
GPU_KEYS = {"A100-SXM4-80GB": "a100-80gb", "H100-80GB": "h100-80gb", "GeForce RTX 4090 24GB": "rtx-4090",
            "RTX PRO 6000 (Blackwell) 96GB": "rtx-pro-6000"}
MODEL_KEYS = {"Qwen/Qwen3-30B-A3B-Instruct-2507": "qwen3-30b-a3b"}
# exp-0's recorded args (--max-model-len 20000 --gpu-memory-utilization 0.95); caps are V1 defaults
LLMD_ARGS = {"max_model_len": 20000, "gpu_memory_utilization": 0.95, "max_num_seqs": 256,
             "max_num_batched_tokens": 2048}
QS = (0.5, 0.9, 0.95, 0.99)
QNAMES = ("p50", "p90", "p95", "p99")
METRICS = ("ttft", "tpot", "e2e")
BOUNDS = {"p50": 0.10, "p90": 0.10, "p95": None, "p99": 0.15}  # goals; p95 reported only
RATE_BOUND = 0.05
SATURATION_RATIO = 3.0
SLO_FACTOR = 2.0


@dataclass
class Point:
    """One measured run: its engine arguments and its requests in arrival order (seconds)."""

    name: str
    source: str
    series: str  # the sweep the point belongs to (experiment + workload)
    gpu: str  # catalog key
    model: str  # catalog key
    tp: int
    replicas: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    max_model_len: int | None
    num_gpu_blocks: int | None
    block_size: int
    prefix_caching: bool
    rate_rps: float  # the offered rate of the table
    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    ttft_s: np.ndarray
    e2e_s: np.ndarray
    notes: list = field(default_factory=list)

    @property
    def tpot_s(self) -> np.ndarray:
        """(E2E − TTFT)/(output − 1) of the requests with more than one output token."""
        many = self.output_tokens > 1
        return ((self.e2e_s - self.ttft_s) / np.maximum(self.output_tokens - 1, 1))[many]

    @property
    def saturated(self) -> bool:
        q = max(1, self.arrival_s.size // 4)
        return bool(np.median(self.ttft_s[-q:]) > SATURATION_RATIO * np.median(self.ttft_s[:q]))


# --------------------------------------------------------------------------- loading


def _series_of(rel: str) -> str:
    exp_dir, fname = rel.rsplit("/", 1)
    return exp_dir.split("openshift/", 1)[-1] + ":" + ("short_input" if "short_input" in fname else "sharegpt")


def _llmd_point(row: dict) -> Point:
    rel = row["source"].split(":", 1)[1]
    with open(DATA / "raw" / "llm-d-benchmark" / rel) as fh:
        reqs = list(csv.DictReader(fh))
    launch = np.array([float(r["launch_time"]) for r in reqs])
    order = np.argsort(launch, kind="stable")
    col = lambda k: np.array([float(reqs[i][k]) for i in order])  # noqa: E731
    launch = launch[order]
    ttft = col("ttft")
    return Point(
        name=rel.split("openshift/", 1)[-1], source=row["source"], series=_series_of(rel),
        gpu=GPU_KEYS[row["gpu"]], model=get_arch(row["model"]).key, tp=int(row["tp"]),
        replicas=2 if "2replicas" in rel else 1, block_size=16, prefix_caching=True, num_gpu_blocks=None,
        rate_rps=float(row["rate_rps"]), arrival_s=launch - launch[0], input_tokens=col("prompt_tokens").astype(int),
        output_tokens=col("generation_tokens").astype(int), ttft_s=ttft, e2e_s=ttft + col("generation_time"),
        notes=["arrivals deterministic (request i at i/QPS)", "prefix-cache hits not recorded: no cached tokens given"],
        **LLMD_ARGS)


def _servingsim_point(row: dict) -> Point:
    rel = row["source"].split(":", 1)[1]  # bench/examples/<GPU>/<model>/vllm/requests.jsonl
    gpu_dir, model_dir = rel.split("/")[2:4]
    d = DATA / "raw" / "llmservingsim" / gpu_dir / model_dir
    reqs = [json.loads(line) for line in (d / "requests.jsonl").read_text().splitlines() if line.strip()]
    meta = json.loads((d / "meta.json").read_text())
    kw, kv = meta["engine_kwargs"], meta.get("kv_cache") or {}
    queued = np.array([r["queued_ts"] for r in reqs])  # the engine's clock, what its TTFT counts from
    order = np.argsort(queued, kind="stable")
    col = lambda k: np.array([float(reqs[i][k]) for i in order])  # noqa: E731
    queued = queued[order]
    notes = ["Poisson arrivals, outputs pinned (ignore_eos)"]
    dp = int(kw.get("data_parallel_size") or 1)
    if kw.get("enable_expert_parallel"):
        notes.append(f"expert parallel over {dp} data-parallel ranks: modelled as {dp} independent engines")
    if not kv:
        notes.append("KV blocks not recorded: from the memory split")
    return Point(
        name=f"{gpu_dir}/{model_dir}", source=row["source"], series=f"llmservingsim:{gpu_dir}/{model_dir}",
        gpu=GPU_KEYS[row["gpu"]], model=MODEL_KEYS.get(row["model"]) or get_arch(row["model"]).key,
        tp=int(kw["tensor_parallel_size"]), replicas=dp, max_num_seqs=int(kw["max_num_seqs"]),
        max_num_batched_tokens=int(kw["max_num_batched_tokens"]),
        gpu_memory_utilization=float(kv.get("gpu_memory_utilization", 0.9)),
        max_model_len=int(kw["max_model_len"]) if kw.get("max_model_len") else None,
        num_gpu_blocks=int(kv["num_gpu_blocks"]) if kv.get("num_gpu_blocks") else None,
        block_size=int(kv.get("block_size", 16)), prefix_caching=bool(kv.get("enable_prefix_caching", True)),
        rate_rps=float(row["rate_rps"]), arrival_s=queued - queued[0], input_tokens=col("input_toks").astype(int),
        output_tokens=col("output_toks").astype(int), ttft_s=col("first_token_ts") - queued,
        e2e_s=col("last_token_ts") - queued, notes=notes)


def load_points() -> list[Point]:
    """Every point of ``llmd_benchmark_points.csv`` and ``llmservingsim_points.csv``, in table order."""
    points = []
    for table, make in (("llmd_benchmark_points.csv", _llmd_point), ("llmservingsim_points.csv", _servingsim_point)):
        with open(DATA / table) as fh:
            points += [make(row) for row in csv.DictReader(fh)]
    return points


# --------------------------------------------------------------------------- models


def project_calibration() -> calibrate.Calibration:
    """``kneecap fit`` on the project's H100 64 GB data, as the README runs it."""
    rows = profiles.filter_rows(profiles.read_csv_text(PROFILES_CSV.read_text()), profiles.parse_where(list(CALIBRATION_WHERE)))
    data = profiles.profile_arrays(rows)
    cv = profiles.apply_output_cv(data.rows, profiles.estimate_output_cv(list(data.rows)))
    return calibrate.fit(list(data.models), get_gpu(CALIBRATION_GPU), data.batch, data.input_len, data.output_len,
                         data.throughput_tok_s, form="kneecap", output_cv=cv, chunked_prefill=data.chunked_prefill)


def gauss_inputs(p: Point, cal: calibrate.Calibration):
    """(coefficients, limits) of GAUSS for the point's engine on its GPU, the calibration transferred."""
    arch, gpu = get_arch(p.model), get_gpu(p.gpu)
    params, _ = calibration_on(cal, gpu)  # what `kneecap simulate --calibration … --gpu …` does
    limits, budget = gauss.engine_limits_for(
        arch, gpu, max_num_seqs=p.max_num_seqs, max_num_batched_tokens=p.max_num_batched_tokens,
        gpu_memory_utilization=p.gpu_memory_utilization, num_gpu_blocks_override=p.num_gpu_blocks,
        block_size=p.block_size, enable_prefix_caching=p.prefix_caching, tensor_parallel_size=p.tp)
    coef = gauss.coefficients_for(arch, gpu, params, form=cal.form, chunk_tokens=budget,
                                  tensor_parallel_size=p.tp)
    return coef, limits


def gauss_predict(p: Point, cal: calibrate.Calibration, seed: int = 0) -> dict:
    coef, limits = gauss_inputs(p, cal)
    r = gauss.replay(p.arrival_s, p.input_tokens, p.output_tokens, coef, rng=np.random.default_rng(seed),
                     servers=p.replicas, limits=limits)
    tpot = r.tbt_s[r.tbt_s >= 0]
    return {"ttft": r.ttft_s, "tpot": tpot, "e2e": r.e2e_s, "stable_rate_rps": r.stable_rate_rps,
            "stable_binding": r.stable_binding, "past_stability": r.rate_rps >= r.stable_rate_rps,
            "preempted": int((r.preemptions > 0).sum()), "kv_capacity_tokens": limits.kv_capacity_tokens}


def twin_predict(p: Point) -> dict:
    """One twin engine per replica in virtual time, requests dealt round robin."""
    from kneecap.sim.engine import Engine, engine_config

    arch, gpu = get_arch(p.model), get_gpu(p.gpu)
    need = int((p.input_tokens + p.output_tokens).max())
    cfg = engine_config(arch, gpu, max_num_seqs=p.max_num_seqs, max_num_batched_tokens=p.max_num_batched_tokens,
                        max_model_len=max(p.max_model_len or 0, need), block_size=p.block_size,
                        gpu_memory_utilization=p.gpu_memory_utilization, num_gpu_blocks_override=p.num_gpu_blocks,
                        tensor_parallel_size=p.tp)
    engines = [Engine(cfg) for _ in range(p.replicas)]
    reqs = [engines[i % p.replicas].add_request(int(n_in), int(n_out), float(t))
            for i, (t, n_in, n_out) in enumerate(zip(p.arrival_s, p.input_tokens, p.output_tokens))]
    for e in engines:
        e.run_until_idle()
    ttft = np.array([r.first_token_s - r.arrival_s for r in reqs])
    e2e = np.array([r.finish_s - r.arrival_s for r in reqs])
    n = np.array([r.output_tokens for r in reqs])
    return {"ttft": ttft, "tpot": ((e2e - ttft) / np.maximum(n - 1, 1))[n > 1], "e2e": e2e,
            "preempted": int(sum(r.num_preemptions > 0 for r in reqs)), "kv_capacity_tokens": cfg.kv_capacity_tokens}


# --------------------------------------------------------------------------- comparison


def decode_batch(arrival_s, ttft_s, e2e_s, replicas: int) -> float:
    """Mean requests decoding per replica over the run: Σ(E2E − TTFT)/(replicas·makespan) (Little)."""
    return float(np.sum(e2e_s - ttft_s) / (replicas * np.max(arrival_s + e2e_s)))


def quantiles(x: np.ndarray) -> dict:
    return dict(zip(QNAMES, map(float, np.quantile(x, QS))))


def rel_err(pred: float, meas: float) -> float:
    return pred / meas - 1.0


def evaluate(p: Point, cal: calibrate.Calibration) -> dict:
    """Measured and predicted quantiles of one point; a model that refuses its inputs says why."""
    meas = {"ttft": p.ttft_s, "tpot": p.tpot_s, "e2e": p.e2e_s}
    out = {"name": p.name, "series": p.series, "gpu": p.gpu, "model": p.model, "tp": p.tp, "replicas": p.replicas,
           "rate_rps": p.rate_rps, "requests": int(p.arrival_s.size), "saturated": p.saturated, "notes": p.notes,
           "engine": {"max_num_seqs": p.max_num_seqs, "max_num_batched_tokens": p.max_num_batched_tokens,
                      "gpu_memory_utilization": p.gpu_memory_utilization, "num_gpu_blocks": p.num_gpu_blocks},
           "measured": {m: quantiles(v) for m, v in meas.items()},
           "measured_decode_batch": decode_batch(p.arrival_s, p.ttft_s, p.e2e_s, p.replicas)}
    for model, run in (("gauss", lambda: gauss_predict(p, cal)), ("twin", lambda: twin_predict(p))):
        t0 = time.monotonic()
        try:
            pred = run()
        except (InputError, gauss.Infeasible) as exc:  # e.g. weights that do not fit: say which
            out[model] = {"not_expressible": str(exc)}
            continue
        res = {k: v for k, v in pred.items() if not isinstance(v, np.ndarray)}
        res["quantiles"] = {m: quantiles(pred[m]) for m in METRICS}
        res["decode_batch"] = decode_batch(p.arrival_s, pred["ttft"], pred["e2e"], p.replicas)
        res["err"] = {m: {q: rel_err(res["quantiles"][m][q], out["measured"][m][q]) for q in QNAMES} for m in METRICS}
        res["wall_s"] = time.monotonic() - t0
        out[model] = res
    return out


def _crossing(rates: list[float], p90s: list[float], slo: float) -> float | None:
    """First rate where the p90 TTFT curve crosses ``slo``, linear between swept rates; None: never."""
    for k in range(1, len(rates)):
        if p90s[k] > slo >= p90s[k - 1]:
            return rates[k - 1] + (slo - p90s[k - 1]) * (rates[k] - rates[k - 1]) / (p90s[k] - p90s[k - 1])
    return None


def sustainable_rates(rows: list[dict]) -> list[dict]:
    """Per sweep: the rate where p90 TTFT crosses SLO_FACTOR × its value at the lowest rate
    (None: not within the swept rates; both None is agreement that it lies beyond the sweep)."""
    out = []
    for series in dict.fromkeys(r["series"] for r in rows):
        pts = sorted((r for r in rows if r["series"] == series), key=lambda r: r["rate_rps"])
        if len(pts) < 3:
            continue
        rates = [r["rate_rps"] for r in pts]
        slo = SLO_FACTOR * pts[0]["measured"]["ttft"]["p90"]
        row = {"series": series, "slo_ttft_p90_s": slo, "rates_rps": rates,
               "measured_rps": _crossing(rates, [r["measured"]["ttft"]["p90"] for r in pts], slo)}
        for model in ("gauss", "twin"):
            if any("quantiles" not in r[model] for r in pts):
                row[model + "_rps"], row[model + "_err"] = None, None
                continue
            lam = _crossing(rates, [r[model]["quantiles"]["ttft"]["p90"] for r in pts], slo)
            row[model + "_rps"] = lam
            row[model + "_err"] = (lam / row["measured_rps"] - 1.0) if lam and row["measured_rps"] else None
            row[model + "_agrees_beyond_sweep"] = lam is None and row["measured_rps"] is None
        out.append(row)
    return out


def goals(rows: list[dict], rates: list[dict]) -> dict:
    """Goal verdicts per model over the points below saturation."""
    res = {}
    for model in ("gauss", "twin"):
        cells = misses = 0
        worst: dict[str, float] = {}
        by_gpu: dict[str, list[int]] = {}
        unexpressed = [r["name"] for r in rows if "quantiles" not in r[model]]
        for r in rows:
            if r["saturated"] or "quantiles" not in r[model]:
                continue
            for m in ("ttft", "tpot"):
                for q, bound in BOUNDS.items():
                    if bound is None:
                        continue
                    e = r[model]["err"][m][q]
                    cells += 1
                    misses += abs(e) > bound
                    tally = by_gpu.setdefault(r["gpu"], [0, 0])
                    tally[0] += abs(e) <= bound
                    tally[1] += 1
                    worst[f"{m} {q}"] = max(worst.get(f"{m} {q}", 0.0), abs(e))
        rate_cells = [x[model + "_err"] for x in rates if x[model + "_err"] is not None]
        beyond = sum(bool(x.get(model + "_agrees_beyond_sweep")) for x in rates)
        one_sided = sum(1 for x in rates if model + "_agrees_beyond_sweep" in x
                        and (x["measured_rps"] is None) != (x[model + "_rps"] is None))
        res[model] = {"cells": cells, "missed": int(misses), "worst_abs_err": worst, "met_by_gpu": by_gpu,
                      "not_expressible": unexpressed,
                      "rate_within_5pct": sum(abs(e) <= RATE_BOUND for e in rate_cells), "rate_cells": len(rate_cells),
                      "rate_beyond_sweep_both": beyond, "rate_one_sided": one_sided}
    return res


def transfer_pairs(rows: list[dict], a: str = "a100-80gb", b: str = "h100-80gb") -> list[dict]:
    """The same engine, model, topology and workload at the same rate on two GPUs (exp-2 vs
    exp-3): the measured ratio b/a of TPOT and TTFT p50 against GAUSS's. Its error isolates
    the transfer (hardware terms) from the error the model makes on both GPUs alike."""
    def key(r):
        return (r["model"], r["tp"], r["replicas"], r["series"].rsplit(":", 1)[1], r["rate_rps"])
    on_b = {key(r): r for r in rows if r["gpu"] == b}
    out = []
    for r in rows:
        other = on_b.get(key(r)) if r["gpu"] == a else None
        if other is None or r["saturated"] or other["saturated"] or "quantiles" not in r["gauss"] \
                or "quantiles" not in other["gauss"]:
            continue
        pair = {"workload": key(r)[3], "rate_rps": r["rate_rps"]}
        for m in ("tpot", "ttft"):
            meas = other["measured"][m]["p50"] / r["measured"][m]["p50"]
            pred = other["gauss"]["quantiles"][m]["p50"] / r["gauss"]["quantiles"][m]["p50"]
            pair[m] = {"measured_ratio": meas, "gauss_ratio": pred, "err": pred / meas - 1.0}
        out.append(pair)
    return out


def per_gpu_errors(rows: list[dict]) -> dict:
    """Median error of p50 TPOT and TTFT per GPU and model over the points below saturation."""
    out = {}
    for gpu in dict.fromkeys(r["gpu"] for r in rows):
        for model in ("gauss", "twin"):
            ok = [r for r in rows if r["gpu"] == gpu and not r["saturated"] and "err" in r[model]]
            if ok:
                out.setdefault(gpu, {"points": len(ok)})
                for m in ("tpot", "ttft"):
                    out[gpu][f"{model}_{m}_p50_median_err"] = float(np.median([r[model]["err"][m]["p50"] for r in ok]))
    return out


def findings(rows: list[dict], per_gpu: dict, pairs: list[dict], rates: list[dict]) -> list[str]:
    """Where GAUSS is wrong and the evidence for why, as numbers from this run."""
    med = lambda xs: float(np.median(xs)) if xs else float("nan")  # noqa: E731
    out = []
    if "a100-80gb" in per_gpu and "h100-80gb" in per_gpu and pairs:
        a, h = per_gpu["a100-80gb"], per_gpu["h100-80gb"]
        out.append(
            f"Transfer: on the H100 80 GB the H100 64 GB calibration predicts p50 TPOT to {_pct(h['gauss_tpot_p50_median_err'])} "
            f"(median, {h['points']} points), on the A100 to {_pct(a['gauss_tpot_p50_median_err'])} ({a['points']} points); "
            f"the twin's roofline, fitted on the same H100 64 GB, to {_pct(h['twin_tpot_p50_median_err'])} and "
            f"{_pct(a['twin_tpot_p50_median_err'])}: both models miss the A100 alike. "
            f"The measured H100/A100 TPOT ratio at light load is {pairs[0]['tpot']['measured_ratio']:.2f}, below the "
            "weight-streaming (bandwidth) ratio 3.35/2.039 → 0.61 alone, so no part of the A100's decode step is "
            f"GPU-independent; GAUSS's {pairs[0]['tpot']['gauss_ratio']:.2f} comes from the per-layer launch floor and "
            "per-step overheads, which model/transfer.py carries unchanged (80 layers × t_layer is ~6 ms of a ~40 ms step). "
            "Scaling that floor with the GPU would close most of the gap, but choosing the rule from these pairs would fit "
            "the transfer to its own test: left as measured.")
    burst = [r for r in rows if r["saturated"] and r["gpu"] == "h100-80gb" and r["rate_rps"] >= 20 and "err" in r["gauss"]]
    if burst:
        out.append(
            f"Bursts past capacity (llm-d sharegpt at ≥ 20 QPS: 252 requests arriving within a few seconds): p50 TTFT "
            f"{_pct(med([r['gauss']['err']['ttft']['p50'] for r in burst]))} (median over {len(burst)} points). By Little's "
            f"law the real engine kept {med([r['measured_decode_batch'] for r in burst]):.1f} requests decoding per replica, "
            f"GAUSS {med([r['gauss']['decode_batch'] for r in burst]):.1f}, the twin "
            + (f"{med([r['twin']['decode_batch'] for r in burst]):.1f} (p50 TTFT "
               f"{_pct(med([r['twin']['err']['ttft']['p50'] for r in burst]))})" if all("err" in r["twin"] for r in burst)
               else "—")
            + f"; GAUSS preempts "
            f"{med([r['gauss']['preempted'] for r in burst]):.0f} requests of 252 but does not charge the recompute's chunk "
            "steps to the other requests (module docstring, item 3), and the data records no preemption count to check "
            "it against. A transient backlog of deterministic burst arrivals, not a steady state: excluded from the goals.")
    e0 = [x for x in rates if x["series"].startswith("exp-0")]
    if e0 and e0[0]["measured_rps"]:
        out.append(
            f"exp-0 (one A100 TP-2 replica, ShareGPT): the real p90 TTFT crosses the SLO at {e0[0]['measured_rps']:.2f} req/s; "
            "GAUSS does not within the sweep (≤ 1.34): its p50 TPOT is low at every rate ("
            + ", ".join(_pct(r["gauss"]["err"]["tpot"]["p50"]) for r in sorted(
                (r for r in rows if r["series"].startswith("exp-0")), key=lambda r: r["rate_rps"]))
            + ": the A100 transfer error above, and more where the batch is larger), so it overestimates the decode "
            "capacity; prompts are whole conversations whose shared prefixes the "
            "data does not identify, so GAUSS computes every prompt token (no cached prefix).")
    ok = [x for x in rates if x["twin_err"] is not None]
    if ok:
        out.append(
            "Sustainable rate: the twin finds the sweeps' capacity "
            + ", ".join(f"{x['series'].split('/')[0]} {x['series'].rsplit(':', 1)[1]} {_pct(x['twin_err'])}" for x in ok)
            + " where GAUSS gives "
            + ", ".join("none in the sweep" if x["gauss_rps"] is None else _pct(x["gauss_err"]) for x in ok)
            + ": at the onset of the backlog the twin's step-by-step scheduling under the KV cache tracks the real "
            "engine's, while GAUSS's mean-field step time (TPOT low on the A100, above) puts the onset later; deep in "
            "the burst both under-predict TTFT (above).")
    pcie = [r for r in rows if r["gpu"] == "rtx-pro-6000" and r["tp"] == 2 and "err" in r["gauss"]]
    single = [r for r in rows if r["gpu"] == "rtx-pro-6000" and r["tp"] == 1 and r["replicas"] == 1 and "err" in r["gauss"]]
    if pcie and single:
        out.append(
            f"TP over PCIe (Qwen3-32B, TP 2 on RTX PRO 6000): p50 TPOT {_pct(pcie[0]['gauss']['err']['tpot']['p50'])}, while "
            f"TP 1 on the same GPU (Llama-3.1-8B) is {_pct(single[0]['gauss']['err']['tpot']['p50'])}, so the miss comes "
            "with TP over PCIe (no NVLink on this card). The modelled all-reduces (2·L NCCL ring all-reduces at the "
            "catalog's PCIe bandwidth and per-step latency) are a few ms of a ~60 ms step at the batch cap of 128; NCCL's "
            "small-message latency over PCIe is typically tens of µs, not 1, yet even that leaves most of the ~25 ms gap; the data "
            "has no per-step timings to tell the all-reduce from the per-rank overheads of two worker processes.")
    sim = [r for r in rows if r["name"].startswith("RTX") and "err" in r["gauss"] and "err" in r["twin"]]
    if sim:
        out.append(
            "LLMServingSim runs (10 req/s Poisson, every one overloaded): GAUSS p50 TTFT "
            + ", ".join(f"{r['name'].split('/')[0]} {r['model']} {_pct(r['gauss']['err']['ttft']['p50'])}" for r in sim)
            + "; twin " + ", ".join(_pct(r["twin"]["err"]["ttft"]["p50"]) for r in sim)
            + ". The twin's roofline step is slower than the real engine on the RTX 4090 (TPOT "
            + _pct(sim[0]["twin"]["err"]["tpot"]["p50"]) + ") where GAUSS's is "
            + _pct(sim[0]["gauss"]["err"]["tpot"]["p50"]) + "; both are queue dynamics past saturation, excluded from the goals.")
    return out


# --------------------------------------------------------------------------- output


def _pct(v):
    return "—" if v is None else f"{100 * v:+.0f}%"


def _ms(v):
    return "—" if v is None else (f"{1e3 * v:.0f}" if v >= 1 else f"{1e3 * v:.1f}")


def markdown(res: dict) -> str:
    cal = res["calibration"]
    lines = [
        "# GAUSS and the twin against real vLLM on GPUs: TTFT / TPOT / E2E tails",
        "",
        f"Generated by `benchmarks/tails_real_gpu.py` in {res['wall_s']:.0f} s. Data: `data/gpu-latency/` "
        "(llm-d-benchmark, LLMServingSim; per-request records). Calibration: `kneecap fit` on "
        f"data/real-h100 ({cal['gpu']}, {', '.join(cal['models'])}; throughput MAPE {cal['mape_pct']:.1f}%), "
        "moved to each run's GPU by `model/transfer.py`; nothing fitted to this data. Each run's own arrivals "
        "and lengths are replayed (GAUSS: `gauss.replay`; twin: `sim.engine`, one per replica, round robin). "
        "Times in ms; error = predicted/measured − 1. `sat` = the queue grows through the run (last-quarter "
        f"median TTFT > {SATURATION_RATIO:g}× the first quarter's): excluded from the goals.",
        "",
        "`GAUSS limit` is GAUSS's stability limit for the run's lengths and engine (req/s, all replicas) and "
        "what binds it.",
        "",
        "| point | GPU | TP×replicas | rate | GAUSS limit | n | sat | metric | measured p50/p90/p95/p99 | GAUSS err p50/p90/p95/p99 | twin err p50/p90/p95/p99 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in res["points"]:
        for m in METRICS:
            meas = "/".join(_ms(r["measured"][m][q]) for q in QNAMES)
            cols = []
            for model in ("gauss", "twin"):
                x = r[model]
                cols.append("/".join(_pct(x["err"][m][q]) for q in QNAMES) if "err" in x else "not expressible")
            g = r["gauss"]
            limit = f"{g['stable_rate_rps']:.2f} ({g['stable_binding']})" if "stable_rate_rps" in g else "—"
            head = (f"| {r['name']} | {r['gpu']} | {r['tp']}×{r['replicas']} | {r['rate_rps']:g} | {limit} | "
                    f"{r['requests']} | {'yes' if r['saturated'] else ''} |") if m == "ttft" else "| | | | | | | |"
            lines.append(f"{head} {m} | {meas} | {cols[0]} | {cols[1]} |")
    lines += ["", "## Not expressible", ""]
    seen = set()
    for r in res["points"]:
        for model in ("gauss", "twin"):
            why = r[model].get("not_expressible")
            if why and (model, why) not in seen:
                seen.add((model, why))
                n = sum(1 for x in res["points"] if x[model].get("not_expressible") == why)
                lines.append(f"- {model}, {n} points: {why}")
    if not seen:
        lines.append("- none")
    lines += ["", f"## Sustainable rate (p90 TTFT crosses {SLO_FACTOR:g}× its value at the sweep's lowest rate)", "",
              "| sweep | SLO p90 TTFT ms | measured req/s | GAUSS req/s | err | twin req/s | err |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    f = lambda v: "—" if v is None else f"{v:.2f}"  # noqa: E731
    for x in res["sustainable"]:
        lines.append(f"| {x['series']} | {_ms(x['slo_ttft_p90_s'])} | {f(x['measured_rps'])} | {f(x['gauss_rps'])} | "
                     f"{_pct(x['gauss_err'])} | {f(x['twin_rps'])} | {_pct(x['twin_err'])} |")
    lines += ["", "## Goals (below saturation: p50/p90 TTFT and TPOT within 10%, p99 within 15%; rate within 5%)", ""]
    for model, g in res["goals"].items():
        worst = ", ".join(f"{k} {v:.0%}" for k, v in g["worst_abs_err"].items())
        per = ", ".join(f"{k} {v[0]}/{v[1]}" for k, v in g["met_by_gpu"].items())
        lines.append(f"- {model}: {g['cells'] - g['missed']}/{g['cells']} cells met ({per or '—'}); worst |err| {worst or '—'}; "
                     f"sustainable rate within 5% on {g['rate_within_5pct']}/{g['rate_cells']} sweeps where both cross the SLO "
                     f"(beyond the sweep on both: {g['rate_beyond_sweep_both']}; crossed on one side only: "
                     f"{g['rate_one_sided']}); "
                     f"{len(g['not_expressible'])} points not expressible.")
    lines += ["", "## Transfer across GPUs (calibration on the H100 64 GB, `model/transfer.py`)", "",
              "Median error of p50 per target GPU, points below saturation:", "",
              "| GPU | points | GAUSS TPOT p50 | GAUSS TTFT p50 | twin TPOT p50 | twin TTFT p50 |",
              "| --- | --- | --- | --- | --- | --- |"]
    for gpu, e in res["per_gpu"].items():
        lines.append(f"| {gpu} | {e['points']} | {_pct(e.get('gauss_tpot_p50_median_err'))} | "
                     f"{_pct(e.get('gauss_ttft_p50_median_err'))} | {_pct(e.get('twin_tpot_p50_median_err'))} | "
                     f"{_pct(e.get('twin_ttft_p50_median_err'))} |")
    tp = res["transfer_pairs"]
    if tp:
        lines += ["", "The same runs on A100 and H100 80 GB (exp-2 vs exp-3, same rate, both below saturation): "
                  "H100/A100 ratio of p50, measured and GAUSS's; the ratio's error is the transfer's alone.", "",
                  "| workload | rate | TPOT ratio meas | GAUSS | err | TTFT ratio meas | GAUSS | err |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for x in tp:
            lines.append(f"| {x['workload']} | {x['rate_rps']:g} | {x['tpot']['measured_ratio']:.3f} | "
                         f"{x['tpot']['gauss_ratio']:.3f} | {_pct(x['tpot']['err'])} | {x['ttft']['measured_ratio']:.3f} | "
                         f"{x['ttft']['gauss_ratio']:.3f} | {_pct(x['ttft']['err'])} |")
        med = lambda m: float(np.median([x[m]["err"] for x in tp]))  # noqa: E731
        lines += ["", f"Median ratio error: TPOT {_pct(med('tpot'))}, TTFT {_pct(med('ttft'))} over {len(tp)} pairs."]
    if res.get("findings"):
        lines += ["", "## Where each model is wrong and why", ""] + [f"- {x}" for x in res["findings"]]
    return "\n".join(lines) + "\n"


def run(quick: bool = False) -> dict:
    t0 = time.monotonic()
    cal = project_calibration()
    points = load_points()
    if quick:
        points = [p for p in points if p.arrival_s.size <= 300][:6]
    rows = [evaluate(p, cal) for p in points]
    rates = sustainable_rates(rows)
    per_gpu, pairs = per_gpu_errors(rows), transfer_pairs(rows)
    return {"per_gpu": per_gpu, "transfer_pairs": pairs, "findings": findings(rows, per_gpu, pairs, rates),"calibration": {"gpu": cal.gpu, "models": list(cal.models), "params": cal.params,
                            "mape_pct": cal.metrics["mape_pct"]},
            "points": rows, "sustainable": rates, "goals": goals(rows, rates), "wall_s": time.monotonic() - t0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="six small points only (no results written)")
    args = ap.parse_args(argv)
    res = run(args.quick)
    text = markdown(res)
    print(text)
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "tails_real_gpu.md").write_text(text)
        (RESULTS / "tails_real_gpu.json").write_text(json.dumps(res, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
