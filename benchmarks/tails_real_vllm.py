"""GAUSS and the twin against TTFT/TPOT/E2E tails measured on a real vLLM (CPU build).

The engine is vLLM's CPU build from ``.venv-vllm`` (``scripts/setup-vllm.sh``) serving a
random-weight Llama built like the tests' tiny one but wider (hidden 512, 4 layers, 8 heads:
steps of 6–20 ms, so batching, chunked prefill and prompt packing show). Per point:

1. calibrate as a user would on a GPU, right before the point: a short profiling sweep of
   closed decode batches (B requests sent at once, at two context lengths; the server's mean
   TPOT over each burst, read with the observe code) fitted to GAUSS's d(B, C) (§3.3,
   ``gauss.fit_decode_coefficients``) and single prompts of several lengths (the server's
   mean TTFT) fitted to the prefill cost (§3.2) plus a fixed per-request overhead (SLIM
   t_fixed: tokenisation, scheduling, detokenisation);
2. send open-loop Poisson load with ``kneecap.sim.loadgen`` (what ``kneecap load`` runs) at a
   fraction of the sustainable rate GAUSS predicts from the first calibration, and measure
   TTFT, TPOT (per request, (E2E − TTFT)/(tokens − 1)) and E2E p50/p95/p99 client-side and from
   the server's histograms (Prometheus ``histogram_quantile`` interpolation, coarse buckets);
3. predict the same quantiles with GAUSS (``gauss.simulate``, what ``kneecap simulate`` runs)
   and with the twin engine (``kneecap.sim.engine``, what ``kneecap twin`` serves) run in
   virtual time on the same arrivals and lengths, its step cost described for this CPU from
   the same calibration.

Points alternate (workloads interleaved, rates in a different order each repetition) so slow
drifts of a shared machine spread over all of them; the load average is recorded per point.

    PYTHONPATH=operator .venv/bin/python benchmarks/tails_real_vllm.py [--quick] [--reps N]

The full run (2 repetitions × 6 points × ~300 requests) took 20 min here; ``--quick`` runs
the 30% and 60% points once with ~200 requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "operator"))

from benchmarks._paths import RESULTS  # noqa: E402
from kneecap.model import gauss  # noqa: E402
from kneecap.observe import scrape  # noqa: E402
from kneecap.observe.window import WindowDeltas, window_deltas  # noqa: E402
from kneecap.sim import loadgen  # noqa: E402

MODEL_SHAPE = {"HIDDEN": 512, "LAYERS": 4, "HEADS": 8, "MAX_POSITIONS": 4096}
MAX_NUM_SEQS = 32
MAX_MODEL_LEN = 4096
CHUNK_TOKENS = 2048  # --max-num-batched-tokens
BLOCK_SIZE = 128  # vLLM's CPU block size
SERVER_ARGS = ["--max-num-seqs", str(MAX_NUM_SEQS), "--max-model-len", str(MAX_MODEL_LEN),
               "--max-num-batched-tokens", str(CHUNK_TOKENS), "--seed", "0"]
# (input mean, input CV, output mean, output CV): log-normal, as kneecap load samples them
WORKLOADS = {"light": (128.0, 0.5, 64.0, 0.5), "heavy": (128.0, 1.5, 64.0, 1.5)}
FRACTIONS = (0.3, 0.6, 0.85)
PIN_MIN_CORES = 3  # the engine's, vLLM's host processes', the client's
QS = (0.5, 0.95, 0.99)
MODELS = ("gauss", "gauss_paper", "twin", "gauss_anchored", "twin_anchored")
QNAMES = ("p50", "p95", "p99")
METRICS = ("ttft", "tpot", "e2e")
# decode sweep: (batch, prompt tokens) with 40 output tokens each; two contexts so the batch and
# context terms of d(B, C) separate
CAL_DECODE = ((1, 48), (4, 48), (12, 48), (24, 48), (4, 600), (12, 600))
CAL_OUTPUT = 40
CAL_PROMPTS = (16, 256, 768, 1536)


# --------------------------------------------------------------------------- server


def build_model(out_dir: Path) -> Path:
    """The tests' tiny Llama recipe, wider (MODEL_SHAPE), built under .venv-vllm."""
    import subprocess

    from tests.support.vllm_server import check_vllm_python

    code = ("import sys; sys.path.insert(0, sys.argv[1]); import tiny_llama; "
            + "; ".join(f"tiny_llama.{k} = {v}" for k, v in MODEL_SHAPE.items())
            + "; print(tiny_llama.build(sys.argv[2]))")
    subprocess.run([str(check_vllm_python()), "-c", code, str(ROOT / "tests" / "support"), str(out_dir)],
                   check=True, capture_output=True, timeout=300)
    return out_dir


# --------------------------------------------------------------------------- calibration


async def _burst(session, url: str, model: str, prompt: int, output: int, n: int, seed: int):
    """``n`` requests sent at once (a closed batch), as loadgen sends them."""
    endpoint = loadgen.completions_url(url)
    t0 = time.perf_counter()
    return await asyncio.gather(*(loadgen._one(session, endpoint, model, prompt, output, t0, True, 300.0,
                                               [seed, i]) for i in range(n)))


@dataclass(frozen=True)
class Calibration:
    coef: gauss.ServiceCoefficients
    decode_rms_rel: float
    prefill_rms_rel: float
    decode_points: list  # (B, resident tokens, TPOT s)
    prefill_points: list  # (prompt tokens, TTFT s)


async def _window(session, url: str, send) -> WindowDeltas:
    """What the server's histograms saw while ``send()`` ran (the observe code's window)."""
    before = await scrape(url + "/metrics", timeout_s=30, max_bytes=8 << 20, session=session)
    recs = await send()
    bad = [r.error for r in recs if not r.ok]
    if bad:
        raise RuntimeError(f"calibration requests failed: {bad[:3]}")
    await asyncio.sleep(0.3)  # the engine publishes the last request's stats
    d = window_deltas(before, await scrape(url + "/metrics", timeout_s=30, max_bytes=8 << 20, session=session))
    if not isinstance(d, WindowDeltas):
        raise RuntimeError(f"calibration window: {d}")
    return d


async def calibrate(session, url: str, model: str, seed: int) -> Calibration:
    """Decode sweep → d(B, C) (GAUSS §3.3); prompt sweep → prefill cost (§3.2) + t_fixed.

    Step times are the server's (its per-request TPOT and TTFT histograms over each burst's
    window, read by the observe code): on a starved machine the client reads tokens in bursts,
    so its own timings say more about its scheduling than about the engine's steps."""
    ol = CAL_OUTPUT
    dec = []
    for b, il in CAL_DECODE:
        d = await _window(session, url, lambda: _burst(session, url, model, il, ol, b, seed + b + il))
        dec.append((b, b * (il + ol / 2.0), d.histograms["tpot"].mean()))
    fit = gauss.fit_decode_coefficients(*(np.array(c) for c in zip(*dec)), per_seq_context=False)
    pre = []
    for k, n in enumerate(CAL_PROMPTS):
        async def one_by_one(n=n, k=k):
            return [(await _burst(session, url, model, n, 1, 1, seed + 1000 + 10 * k + j))[0] for j in range(3)]
        d = await _window(session, url, one_by_one)
        pre.append((n, d.histograms["ttft"].mean()))
    # TTFT(IL) at idle = t_fixed + p + a·IL + b·IL² (one chunk: A = IL; GAUSS §3.2 with the
    # empty decode batch costing p, §3.4); relative non-negative least squares
    from scipy.optimize import nnls

    x = np.array([n for n, _ in pre], dtype=float)
    y = np.array([t for _, t in pre])
    design = np.column_stack([np.ones_like(x), x, x * x])
    scale = design.max(axis=0)
    sol, _ = nnls((design / scale) / y[:, None], np.ones_like(y))
    t0, a, b = sol / scale
    prefill_rms = float(np.sqrt(np.mean((design @ (sol / scale) / y - 1.0) ** 2)))
    coef = fit.apply(gauss.ServiceCoefficients(
        prefill_s_per_token=max(a, 1e-9), prefill_s_per_attended_token=b, chunk_tokens=CHUNK_TOKENS,
        decode_step_s=1.0, request_overhead_s=max(t0 - fit.decode_step_s, 0.0)))
    return Calibration(coef, fit.rms_relative_error, prefill_rms, dec, pre)


# --------------------------------------------------------------------------- predictions


def workload_of(name: str) -> gauss.Workload:
    im, icv, om, ocv = WORKLOADS[name]
    return gauss.Workload(gauss.LogNormalLength(im, icv), gauss.LogNormalLength(om, ocv))


def gauss_predict(coef: gauss.ServiceCoefficients, name: str, rate_rps: float, samples: int) -> dict:
    try:
        r = gauss.simulate(workload_of(name), coef, rate_rps, rng=np.random.default_rng(7), samples=samples,
                           replications=4)
    except gauss.Infeasible as exc:
        return {"infeasible": str(exc)}
    out = {m: {q: getattr(s, q) for q in QNAMES} for m, s in (("ttft", r.ttft), ("tpot", r.tbt), ("e2e", r.e2e))}
    out["tpot_mean_s"] = r.tbt.mean
    return out


def cpu_step_cost(coef: gauss.ServiceCoefficients, arch):
    """The twin's hardware description for this CPU, from the calibration: a 'GPU' whose peak
    FLOP/s gives the fitted prefill cost per token (2·N FLOPs per token, roofline.py), whose
    KV-read efficiency gives the fitted cost per resident token s, and whose weight streaming is
    free (it is in the fitted step cost); step and per-sequence overheads are the fitted p and r
    (less the per-token compute a decode token already pays)."""
    from kneecap.model.hardware import GPU
    from kneecap.sim.roofline import StepCostParams

    peak = 2.0 * arch.params / coef.prefill_s_per_token
    bw = 1e15  # weight streaming is inside the fitted step cost p; KV reads cost s per token:
    kv_eff = min(1.0, arch.kv_bytes_per_token / (coef.decode_s_per_resident_token * bw)) \
        if coef.decode_s_per_resident_token > 0 else 1.0
    hw = GPU("cpu-calibrated", "this CPU (calibrated)", peak, bw, 1024.0, 0.0)
    cost = StepCostParams(bw_efficiency=1.0, attn_bw_efficiency=kv_eff, compute_efficiency=1.0,
                          step_overhead_s=coef.decode_step_s,
                          per_seq_overhead_s=max(coef.decode_s_per_seq - coef.prefill_s_per_token, 0.0),
                          eager_layer_overhead_s=0.0)
    return hw, cost


def twin_predict(coef, arch, arrivals_s, prompts, outputs) -> dict:
    """The twin engine (continuous batching, chunked prefill, block KV cache) in virtual time on
    the measured run's arrivals and lengths; the calibrated per-request overhead added to TTFT."""
    from kneecap.sim.engine import Engine, engine_config

    hw, cost = cpu_step_cost(coef, arch)
    cfg = engine_config(arch, hw, max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=CHUNK_TOKENS,
                        max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE, num_gpu_blocks_override=8192,
                        step_cost=cost)
    eng = Engine(cfg)
    reqs = [eng.add_request(int(p), int(o), float(t)) for t, p, o in zip(arrivals_s, prompts, outputs)
            if p + o <= MAX_MODEL_LEN]
    eng.run_until_idle()
    ttft = np.array([r.first_token_s - r.arrival_s for r in reqs]) + coef.request_overhead_s
    e2e = np.array([r.finish_s - r.arrival_s for r in reqs]) + coef.request_overhead_s
    n = np.array([r.output_tokens for r in reqs])
    tpot = ((e2e - ttft) / np.maximum(n - 1, 1))[n > 1]
    return {m: dict(zip(QNAMES, map(float, np.quantile(v, QS)))) for m, v in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e))}


# --------------------------------------------------------------------------- measurement


def _server_quantiles(d: WindowDeltas) -> dict:
    out = {}
    for m, key in (("ttft", "ttft"), ("tpot", "tpot"), ("e2e", "e2e")):
        h = d.histograms.get(key)
        out[m] = None if h is None else {q: h.quantile(v) for q, v in zip(QNAMES, QS)}
    return out


async def measure(session, url: str, model: str, name: str, rate_rps: float, duration_s: float, seed: int) -> dict:
    im, icv, om, ocv = WORKLOADS[name]
    before = await scrape(url + "/metrics", timeout_s=30, max_bytes=8 << 20, session=session)
    load0 = os.getloadavg()
    rep = await loadgen.run_load(url, rate_rps=rate_rps, duration_s=duration_s, input_mean=im, input_cv=icv,
                                 output_mean=om, output_cv=ocv, seed=seed, model=model, session=session)
    load1 = os.getloadavg()
    await asyncio.sleep(1.0)  # the engine publishes the last requests' stats
    after = await scrape(url + "/metrics", timeout_s=30, max_bytes=8 << 20, session=session)
    d = window_deltas(before, after)
    ok = [r for r in rep.records if r.ok]
    tpot = [(r.e2e_s - r.ttft_s) / (r.completion_tokens - 1) for r in ok if r.completion_tokens > 1]
    client = {m: dict(zip(QNAMES, map(float, np.quantile(v, QS))))
              for m, v in (("ttft", [r.ttft_s for r in ok]), ("tpot", tpot), ("e2e", [r.e2e_s for r in ok]))}
    return {"sent": rep.sent, "client_tpot_mean_s": float(np.mean(tpot)), "completed": rep.completed, "failed": rep.failed, "errors": rep.errors,
            "elapsed_s": rep.elapsed_s, "achieved_rate_rps": rep.achieved_rate_rps,
            "loadavg_1m": [load0[0], load1[0]], "client": client,
            "server": _server_quantiles(d) if isinstance(d, WindowDeltas) else None,
            "arrivals_s": [r.sent_s for r in rep.records], "prompts": [r.prompt_tokens for r in rep.records],
            "outputs": [r.max_tokens for r in rep.records]}


def trace(rate_rps: float, duration_s: float, name: str, seed: int):
    """The arrivals and lengths loadgen.run_load draws for this seed (same generator order)."""
    im, icv, om, ocv = WORKLOADS[name]
    rng = np.random.default_rng(seed)
    t = loadgen.arrival_times(rng, rate_rps, duration_s)
    return t, loadgen.sample_lengths(rng, t.size, im, icv), loadgen.sample_lengths(rng, t.size, om, ocv)


def seed_that_fits(rate_rps: float, duration_s: float, name: str, start: int) -> int:
    """First seed from ``start`` whose trace fits max_model_len (a 400 would drop a tail sample)."""
    s = start
    while True:
        _, p, o = trace(rate_rps, duration_s, name, s)
        if np.all(p + o <= MAX_MODEL_LEN):
            return s
        s += 1


# --------------------------------------------------------------------------- report


def rel_err(pred, meas):
    if pred is None or meas is None or not meas:
        return None
    return pred / meas - 1.0


def summarise(points: list[dict]) -> list[dict]:
    """Per (workload, fraction): mean measured quantile, run-to-run spread (max − min over
    repetitions, relative to the mean), mean prediction and its relative error."""
    rows = []
    keys = sorted({(p["workload"], p["fraction"]) for p in points}, key=lambda k: (k[0] != "light", k[1]))
    for wl, fr in keys:
        ps = [p for p in points if p["workload"] == wl and p["fraction"] == fr]
        for m in METRICS:
            for q in QNAMES:
                meas = [p["measured"]["client"][m][q] for p in ps]
                srv = [p["measured"]["server"][m][q] for p in ps if p["measured"]["server"] and p["measured"]["server"][m]]
                mean = float(np.mean(meas))
                row = {"workload": wl, "fraction": fr, "rate_rps": float(np.mean([p["rate_rps"] for p in ps])), "metric": m, "quantile": q,
                       "measured_s": mean, "runs": len(ps), "requests": [p["measured"]["completed"] for p in ps],
                       "spread_rel": (max(meas) - min(meas)) / mean if len(meas) > 1 else None,
                       "server_s": float(np.mean(srv)) if srv else None,
                       "loadavg_1m": [round(p["measured"]["loadavg_1m"][1], 2) for p in ps]}
                for model in MODELS:
                    preds = [p["predicted"][model][m][q] for p in ps
                             if model in p["predicted"] and "infeasible" not in p["predicted"][model]]
                    errs = [rel_err(p["predicted"][model][m][q], p["measured"]["client"][m][q]) for p in ps
                            if model in p["predicted"] and "infeasible" not in p["predicted"][model]]
                    row[model + "_s"] = float(np.mean(preds)) if preds else None
                    row[model + "_err"] = float(np.mean(errs)) if errs else None
                rows.append(row)
    return rows


def _pct(v):
    return "—" if v is None else f"{100 * v:+.0f}%"


def _ms(v):
    return "—" if v is None else f"{1e3 * v:.1f}"


def markdown(meta: dict, rows: list[dict], goals: dict) -> str:
    lines = [
        "# GAUSS and the twin against a real vLLM (CPU build): TTFT / TPOT / E2E tails",
        "",
        f"Machine: {meta['machine']}. Engine: vLLM {meta['vllm']} CPU build, random Llama "
        f"(hidden {MODEL_SHAPE['HIDDEN']}, {MODEL_SHAPE['LAYERS']} layers), `{' '.join(SERVER_ARGS)}`. "
        f"Load: Poisson, about {meta['requests_target']} requests per point, {meta['reps']} repetitions; "
        f"wall time {meta['wall_s']:.0f} s. Workloads (log-normal, mean/CV): "
        + "; ".join(f"{k} in {v[0]:.0f}/{v[1]} out {v[2]:.0f}/{v[3]}" for k, v in WORKLOADS.items()) + ".",
        "",
        "Times in ms, client-side (what `kneecap load` measures); `server` is the vLLM histogram "
        "quantile (bucket interpolation). Error = predicted/measured − 1 (mean over repetitions); "
        "spread = (max − min)/mean of the measured quantile over repetitions (measurement noise). "
        "`gauss` is GAUSS with prompt packing, `gauss-paper` the one-prompt-per-step prefill slot; "
        "`anch.` columns rescale the point's calibration so the predicted mean TPOT equals the measured "
        "one (the CPU share the engine got during the point). Load is a fraction of the sustainable rate "
        "GAUSS gives from the calibration taken right before the point.",
        "",
        "| workload | load | rate req/s | metric | q | measured | spread | server | gauss | err | gauss-paper err | twin | err | gauss anch. err | twin anch. err | requests | load avg 1m |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['fraction']:.0%} | {r['rate_rps']:.2f} | {r['metric']} | {r['quantile']} | "
            f"{_ms(r['measured_s'])} | {_pct(r['spread_rel']).lstrip('+')} | {_ms(r['server_s'])} | "
            f"{_ms(r['gauss_s'])} | {_pct(r['gauss_err'])} | {_pct(r['gauss_paper_err'])} | "
            f"{_ms(r['twin_s'])} | {_pct(r['twin_err'])} | {_pct(r['gauss_anchored_err'])} | {_pct(r['twin_anchored_err'])} | "
            f"{'/'.join(map(str, r['requests']))} | "
            f"{'/'.join(map(str, r['loadavg_1m']))} |")
    lines += ["", "## Goals (loads below 85%: p95 TTFT and TPOT within 10%, p99 within 15%; a cell whose spread "
              "over the repetitions exceeds its bound gets no verdict)", ""]
    for k, v in goals.items():
        lines.append(f"- {k}: {v}")
    return "\n".join(lines) + "\n"


def check_goals(rows: list[dict]) -> dict:
    out = {}
    for model in MODELS:
        misses, no_verdict, worst, met = [], [], 0.0, 0
        for r in rows:
            if r["fraction"] >= 0.85 or r["metric"] == "e2e" or r["quantile"] == "p50":
                continue
            bound = 0.10 if r["quantile"] == "p95" else 0.15
            e = r[model + "_err"]
            cell = f"{r['workload']} {r['fraction']:.0%} {r['metric']} {r['quantile']}"
            if e is None:
                misses.append(f"{cell} (no prediction)")
                continue
            if r["spread_rel"] is not None and r["spread_rel"] > bound:  # the measurement moves more than the goal allows
                no_verdict.append(f"{cell} {e:+.0%} (spread {r['spread_rel']:.0%})")
                continue
            worst = max(worst, abs(e))
            if abs(e) > bound:
                misses.append(f"{cell} {e:+.0%}")
            else:
                met += 1
        verdict = ("no cell with a verdict" if not misses and not met else
                   "met" if not misses else f"missed {len(misses)}: " + "; ".join(misses))
        out[model] = (verdict
                      + f" ({met} met; worst |err| with a verdict {worst:.0%})"
                      + (f"; no verdict, the repetitions' spread above the bound: {len(no_verdict)}: "
                         + "; ".join(no_verdict) if no_verdict else ""))
    return out


# --------------------------------------------------------------------------- main


async def run(args) -> dict:
    from kneecap.observe.hf_config import load_hf_config
    from tests.support.vllm_server import start_server

    t_start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="kneecap-tails-"))
    model_dir = build_model(tmp / "model")
    arch = load_hf_config(model_dir)
    engine_cpus, client_cpus = pinning(args.pin)
    server = start_server(model_dir, tmp / "vllm.log", SERVER_ARGS, cpus=client_cpus, engine_cpus=engine_cpus)
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)
    points = []
    try:
        async with loadgen.client_session() as session:
            url = server.base_url
            model = await loadgen.discover_model(session, url)
            await _burst(session, url, model, 64, 16, 8, 0)  # warm-up
            fractions = FRACTIONS if not args.quick else FRACTIONS[:2]
            for rep in range(args.reps):
                order = fractions if rep % 2 == 0 else fractions[::-1]
                for fr in order:
                    for wl in (WORKLOADS if rep % 2 == 0 else list(WORKLOADS)[::-1]):
                        points.append(await run_point(session, url, model, arch, wl, fr, rep, len(points), args))
                        Path(args.out + ".partial.json").write_text(json.dumps(points, default=float))
    finally:
        server.stop()
    vllm_version = next((ln.split("(v")[1].split(")")[0] for ln in server.log_tail(10**6).splitlines()
                         if "V1 LLM engine (v" in ln), "?")
    meta = {"machine": machine(engine_cpus, client_cpus), "vllm": vllm_version,
            "reps": args.reps, "requests_target": args.requests, "wall_s": time.monotonic() - t_start,
            "quick": args.quick, "cores": {"engine": sorted(engine_cpus or ()), "client": sorted(client_cpus or ())}}
    return {"meta": meta, "points": points}


def pinning(pin: bool) -> tuple[frozenset[int] | None, frozenset[int] | None]:
    """(the engine's cores, everything else's): the last core of this process's affinity for
    the engine's compute (vLLM's OpenMP threads: what GAUSS and the twin model, the GPU of a GPU
    deployment), the others for vLLM's API server, the load generator and the predictions, so
    that nothing takes the engine's CPU during a point; (None, None) unpinned or on one core."""
    cores = sorted(os.sched_getaffinity(0))
    if not pin or len(cores) < 2:
        return None, None
    return frozenset(cores[-1:]), frozenset(cores[:-1])


def machine(engine_cpus, client_cpus) -> str:
    import platform

    where = (f"vLLM's engine (OpenMP threads) pinned to core {','.join(map(str, sorted(engine_cpus)))}, its API "
             f"server and the client to {','.join(map(str, sorted(client_cpus)))}" if engine_cpus
             else "unpinned, shared with other jobs")
    return f"{platform.machine()}, {os.cpu_count()} CPUs; {where}"


def stable_rate(coef: gauss.ServiceCoefficients, name: str) -> float:
    """GAUSS's sustainable rate (§3.5, both stages stable) for the workload under ``coef``."""
    moments = gauss.workload_moments(coef, *gauss.sample_workload(workload_of(name), 200_000, np.random.default_rng(3)))
    return gauss.stability_limit_rps(coef, moments)[0]


def scaled(coef: gauss.ServiceCoefficients, factor: float) -> gauss.ServiceCoefficients:
    """Every time coefficient × ``factor``: the same engine on a CPU share ``1/factor`` as fast."""
    from dataclasses import fields, replace

    return replace(coef, **{f.name: getattr(coef, f.name) * factor for f in fields(coef)
                            if f.name not in ("chunk_tokens", "prefill_packing")})


async def run_point(session, url, model, arch, wl: str, fr: float, rep: int, index: int, args) -> dict:
    """Calibrate, load at ``fr`` of the sustainable rate that calibration gives, predict."""
    cal = await calibrate(session, url, model, seed=10_000 + index * 50)
    rate = fr * stable_rate(cal.coef, wl)
    duration = args.requests / rate
    seed = seed_that_fits(rate, duration, wl, 1000 * rep + int(fr * 100) + (0 if wl == "light" else 7))
    meas = await measure(session, url, model, wl, rate, duration, seed)
    trace_ = tuple(meas.pop(k) for k in ("arrivals_s", "prompts", "outputs"))
    pred = {"gauss": gauss_predict(cal.coef, wl, rate, args.samples),
            "gauss_paper": gauss_predict(packing_off(cal.coef), wl, rate, args.samples),
            "twin": twin_predict(cal.coef, arch, *trace_)}
    # anchored: the calibration rescaled so that GAUSS's mean TPOT is the window's (the CPU share
    # the engine had during the point, which a shared machine moves between calibration and load)
    anchor = anchor_factor(cal.coef, wl, rate, meas["client_tpot_mean_s"])
    if anchor is not None:
        pred["gauss_anchored"] = gauss_predict(scaled(cal.coef, anchor), wl, rate, args.samples)
        pred["twin_anchored"] = twin_predict(scaled(cal.coef, anchor), arch, *trace_)
    c, g, t = meas["client"], pred["gauss"], pred["twin"]
    f = lambda d, m, q: d.get(m, {}).get(q, float("nan")) * 1e3  # noqa: E731
    print(f"rep {rep} {wl:5s} {fr:.0%} {rate:.2f}/s n={meas['completed']} load {meas['loadavg_1m'][1]:.2f} "
          f"anchor {anchor if anchor is None else round(anchor, 2)}  TTFT p95 {f(c, 'ttft', 'p95'):.0f} ms "
          f"(gauss {f(g, 'ttft', 'p95'):.0f}, twin {f(t, 'ttft', 'p95'):.0f})  TPOT p95 {f(c, 'tpot', 'p95'):.1f} ms "
          f"(gauss {f(g, 'tpot', 'p95'):.1f}, twin {f(t, 'tpot', 'p95'):.1f})", flush=True)
    return {"rep": rep, "workload": wl, "fraction": fr, "rate_rps": rate, "duration_s": duration, "seed": seed,
            "anchor": anchor, "calibration": asdict(cal), "measured": meas, "predicted": pred}


def anchor_factor(coef, name: str, rate_rps: float, tpot_mean_s: float, samples: int = 10_000) -> float | None:
    """The factor k (geometric bisection) at which GAUSS's mean TPOT under ``scaled(coef, k)``
    equals the measured one; None when no stable k reaches it (the window ran past what any
    uniform slow-down of the calibration sustains)."""
    def mean_tpot(k):
        pred = gauss_predict(scaled(coef, k), name, rate_rps, samples)
        return math.inf if "infeasible" in pred else pred["tpot_mean_s"]

    lo, hi = 0.1, 1.0
    while mean_tpot(hi) < tpot_mean_s:
        lo, hi = hi, hi * 2.0
        if hi > 64:
            return None
    for _ in range(8):  # factor within (hi/lo)^(1/256): well under the measurement spread
        mid = math.sqrt(lo * hi)
        if mean_tpot(mid) < tpot_mean_s:
            lo = mid
        else:
            hi = mid
    return lo if math.isfinite(mean_tpot(lo)) else None


def packing_off(coef: gauss.ServiceCoefficients) -> gauss.ServiceCoefficients:
    """The same coefficients with GAUSS's paper prefill slot (one prompt per step)."""
    from dataclasses import replace

    return replace(coef, prefill_packing=False)


def gauss_vs_twin_h100() -> list[dict]:
    """No measurement noise: GAUSS (packing on and off) against the twin engine on H100 costs
    (Llama-3.1-8B, the twin's roofline read as GAUSS coefficients: roofline.gauss_coefficients),
    4000 Poisson requests in virtual time, short prompts where step costs dominate."""
    from dataclasses import replace

    from kneecap.model.arch import get_arch
    from kneecap.model.hardware import get_gpu
    from kneecap.sim.engine import Engine, engine_config
    from kneecap.sim.roofline import gauss_coefficients

    cfg = engine_config(get_arch("llama-3.1-8b"), get_gpu("h100-80gb"), max_num_batched_tokens=CHUNK_TOKENS,
                        max_model_len=8192)
    coef = gauss_coefficients(cfg.arch, cfg.gpu, cfg.max_num_batched_tokens, cfg.step_cost)
    rows = []
    for name, cv in (("light", 0.5), ("heavy", 1.5)):
        wl = gauss.Workload(gauss.LogNormalLength(200, cv), gauss.LogNormalLength(64, cv))
        stable = gauss.simulate(wl, coef, 1.0, rng=np.random.default_rng(0), samples=50_000, replications=4).stable_rate_rps
        for fr in (0.3, 0.6, 0.85):
            rate = fr * stable
            rng = np.random.default_rng(2)
            inp, _, out = gauss.sample_workload(wl, 4000, rng)
            eng = Engine(cfg)
            reqs = [eng.add_request(int(i), int(o), float(a))
                    for i, o, a in zip(inp, out, np.cumsum(rng.exponential(1.0 / rate, inp.size)))]
            eng.run_until_idle()
            reqs = reqs[400:]
            twin = {"ttft": np.array([r.first_token_s - r.arrival_s for r in reqs]),
                    "tpot": np.array([(r.last_token_s - r.first_token_s) / (r.output_tokens - 1)
                                      for r in reqs if r.output_tokens > 1])}
            res = {k: gauss.simulate(wl, c, rate, rng=np.random.default_rng(0), samples=200_000, replications=4)
                   for k, c in (("gauss", coef), ("gauss_paper", replace(coef, prefill_packing=False)))}
            for m, attr in (("ttft", "ttft"), ("tpot", "tbt")):
                tq = np.quantile(twin[m], QS)
                rows.append({"workload": name, "fraction": fr, "metric": m, "twin_s": dict(zip(QNAMES, map(float, tq))),
                             **{k + "_err": {q: getattr(getattr(r, attr), q) / t - 1.0 for q, t in zip(QNAMES, tq)}
                                for k, r in res.items()}})
    return rows


def twin_check_markdown(rows: list[dict]) -> str:
    lines = ["", "## GAUSS against the twin engine, no measurement noise (H100 costs, Llama-3.1-8B)", "",
             "Prompts 200 tokens (log-normal), outputs 64; 4000 Poisson requests in virtual time. Error of "
             "GAUSS with packing (`gauss`) and with the paper's one-prompt-per-step slot (`paper`) against the twin.",
             "", "| workload | load | metric | twin p50 / p95 / p99 ms | gauss p50 / p95 / p99 | paper p50 / p95 / p99 |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['fraction']:.0%} | {r['metric']} | "
                     + " / ".join(f"{1e3 * r['twin_s'][q]:.1f}" for q in QNAMES) + " | "
                     + " / ".join(_pct(r["gauss_err"][q]) for q in QNAMES) + " | "
                     + " / ".join(_pct(r["gauss_paper_err"][q]) for q in QNAMES) + " |")
    return "\n".join(lines) + "\n"


def _stop_on_term(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through run()'s finally: the vLLM server stops too


def main(argv=None) -> int:
    import platform
    import signal

    signal.signal(signal.SIGTERM, _stop_on_term)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="two loads, one repetition, fewer requests")
    ap.add_argument("--reps", type=int, default=2, help="repetitions of every point")
    ap.add_argument("--requests", type=int, default=300, help="expected requests per point (p99 from ~3 above it)")
    ap.add_argument("--samples", type=int, default=100_000, help="GAUSS samples per prediction")
    ap.add_argument("--out", help="results path without suffix (default benchmarks/results/tails_real_vllm, "
                                  "or tails_real_vllm_quick with --quick)")
    ap.add_argument("--from-partial", metavar="VLLM_VERSION",
                    help="write the tables from the points an interrupted run saved (.partial.json)")
    ap.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None,
                    help="vLLM's engine on the last core, its API server and the client on the others "
                         f"(default: on with at least {PIN_MIN_CORES} cores; on 2 the one host core saturates, "
                         "benchmarks/results/tails_real_vllm_pinned.md)")
    ap.add_argument("--twin-check-only", action="store_true",
                    help="recompute the noise-free GAUSS-vs-twin section of existing results")
    args = ap.parse_args(argv)
    if args.pin is None:
        args.pin = len(os.sched_getaffinity(0)) >= PIN_MIN_CORES
    if args.quick:
        args.reps, args.requests = 1, min(args.requests, 200)
    args.out = args.out or str(RESULTS / ("tails_real_vllm_quick" if args.quick else "tails_real_vllm"))
    if args.twin_check_only:
        result = json.loads(Path(args.out + ".json").read_text())
    elif args.from_partial:
        points = json.loads(Path(args.out + ".partial.json").read_text())
        rows = summarise(points)
        meta = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs shared with other jobs",
                "vllm": args.from_partial, "reps": max(p["rep"] for p in points) + 1, "requests_target": args.requests,
                "wall_s": float("nan"), "quick": False, "partial": True}
        result = {"meta": meta, "points": points, "rows": rows, "goals": check_goals(rows)}
    else:
        result = asyncio.run(run(args))
        rows = summarise(result["points"])
        result["rows"], result["goals"] = rows, check_goals(rows)
    result["gauss_vs_twin_h100"] = gauss_vs_twin_h100()
    md = markdown(result["meta"], result["rows"], result["goals"]) + twin_check_markdown(result["gauss_vs_twin_h100"])
    Path(args.out + ".json").write_text(json.dumps(result, indent=1, default=float))
    Path(args.out + ".md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
