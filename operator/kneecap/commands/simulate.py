"""`kneecap simulate`: GAUSS Monte-Carlo TTFT/TBT percentiles and sustainable request rate.

Two modes:

* engine (default): ``--model``/``--gpu`` catalog keys with ``--calibration CALIB.json``
  (from ``kneecap fit``; without it the uncalibrated SLIM defaults) mapped to GAUSS coefficients
  by ``gauss.coefficients_for``, or explicit cost coefficients (``--prefill-s-per-token`` …, which
  also override catalog values); workload as length mean and CV (log-normal; CV 0 = fixed).
* raw queue (``--service-mean``): a G/G/k FCFS queue for textbook checks; ``ttft_s`` is the
  sojourn W + S and ``tbt_s`` quantiles are null.

The engine's own limits take vLLM's flags and defaults (``common.add_engine_limits``): the
batch cap, the token budget, the KV cache from the memory split and prefix caching; the JSON
reports them (``limits``), the wait they add (``admission_wait_s``) and the preemptions.

Exit codes: 0 ok, 2 bad input, 1 when the rate is at or past the stability limit (the answer
is an ``infeasible: <stage> stage: …`` message; with ``--json`` a JSON object with
``feasible: false``, ``infeasible`` and ``stage``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from kneecap.commands import common
from kneecap.errors import InputError
from kneecap.model import gauss

HELP = "GAUSS: Monte-Carlo TTFT/TBT percentiles, service rate and SLO-sustainable rate"

_COEF_FLAGS = {
    "prefill_s_per_token": "seconds per uncached prompt token (linear prefill cost)",
    "prefill_s_per_attended_token": "seconds per (chunk token × attended context token)",
    "prefill_s_per_chunk": "fixed seconds per prefill chunk step",
    "decode_step_s": "decode step base cost p",
    "decode_s_per_context_token": "decode cost q per mean context token (multiplies C/B)",
    "decode_s_per_seq": "decode cost r per sequence in the batch",
    "decode_s_per_resident_token": "decode cost s per resident context token (multiplies C)",
    "request_overhead_s": "fixed per-request latency added to TTFT (SLIM t_fixed)",
}

def add_arguments(p) -> None:
    g = p.add_argument_group("engine (catalog + calibration or explicit coefficients)")
    g.add_argument("--model", help="model catalog key (e.g. llama-3.1-8b)")
    g.add_argument("--gpu", help="GPU catalog key (e.g. h100-80gb)")
    g.add_argument("--calibration", metavar="CALIB.json", help="SLIM calibration written by `kneecap fit`")
    for name, text in _COEF_FLAGS.items():
        g.add_argument("--" + name.replace("_", "-"), type=float, metavar="S", help=text)
    g.add_argument("--chunk-tokens", dest="max_num_batched_tokens", type=common.human_int,
                   action=common._DeprecatedAlias, new="--max-num-batched-tokens")
    common.add_tensor_parallel(g)
    g.add_argument("--no-prefill-packing", dest="prefill_packing", action="store_false",
                   help="GAUSS's paper prefill slot: one prompt per step (default: waiting prompts share a step, as vLLM)")
    common.add_engine_limits(p.add_argument_group("engine limits (vLLM's flags; engine mode)"))
    w = p.add_argument_group("workload")
    w.add_argument("--rate", type=float, required=True, help="arrival rate, requests/s")
    w.add_argument("--input-mean", type=float, help="mean prompt tokens")
    w.add_argument("--input-cv", type=float, default=1.0, help="prompt length CV (log-normal; 0 = fixed)")
    w.add_argument("--output-mean", type=float, help="mean generated tokens")
    w.add_argument("--output-cv", type=float, default=1.0, help="output length CV (log-normal; 0 = fixed)")
    w.add_argument("--input-histogram", metavar="LE:COUNT,…",
                   help="prompt lengths as a vLLM histogram: cumulative counts per upper bound, e.g. "
                        "'128:10,512:70,2048:98,+Inf:100' (replaces --input-mean/--input-cv)")
    w.add_argument("--output-histogram", metavar="LE:COUNT,…", help="output lengths, same format")
    w.add_argument("--cached-tokens", type=float, default=0.0, help="cached prefix tokens per request")
    w.add_argument("--burst-cv", type=float, default=1.0, help="inter-arrival CV (1 = Poisson; Gamma otherwise)")
    q = p.add_argument_group("raw queue (textbook checks)")
    q.add_argument("--servers", type=int, default=1, help="servers (engines) sharing one FCFS queue")
    q.add_argument("--service-mean", type=float, help="raw queue mode: mean service time, seconds")
    q.add_argument("--service-cv", type=float, help="raw queue: service CV (log-normal unless --service-dist)")
    q.add_argument("--service-dist", choices=("exp", "det", "lognormal", "gamma"), help="raw queue service law")
    s = p.add_argument_group("SLO and sampling")
    common.add_slo(s, old_tpot=("--slo-tbt-s",))  # raw queue: --slo-ttft-s is the sojourn SLO
    common.add_quantile(s)
    s.add_argument("--samples", type=int, default=10**6, help="simulated requests (all replications)")
    s.add_argument("--replications", type=int, default=8, help="independent replications for the CIs")
    s.add_argument("--sweep-points", type=int, default=12, help="rates in the λ sweep (0: none)")
    s.add_argument("--seed", type=int, default=0, help="random seed")
    common.add_json(p)
    p.add_argument("--plot", metavar="PNG", help="write TTFT/TBT distributions and the λ sweep")


def _coefficients(args):
    """(coefficients, where they came from, limits, token budget). Explicit coefficient flags
    override catalog values; the budget is vLLM's for the GPU unless --max-num-batched-tokens."""
    explicit = {n: getattr(args, n) for n in _COEF_FLAGS if getattr(args, n) is not None}
    if args.calibration or args.model or args.gpu:
        from dataclasses import replace

        from kneecap.model.arch import get_arch
        from kneecap.model.calibrate import Calibration
        from kneecap.model.hardware import get_gpu
        from kneecap.model import transfer
        from kneecap.model.slim import SlimParams

        if args.calibration:
            try:
                cal = Calibration.from_json(Path(args.calibration).read_text())
            except OSError as exc:
                raise InputError("calibration", f"cannot read {args.calibration}: {exc.strerror or exc}") from None
            form, params, source = cal.form, cal.slim_params, f"calibration {args.calibration} ({cal.form})"
            model = args.model or (cal.models[0] if len(cal.models) == 1 else None)
            gpu_key = args.gpu or cal.gpu
        else:
            form, params, source = "kneecap", SlimParams(), "uncalibrated SLIM defaults (kneecap form)"
            model, gpu_key = args.model, args.gpu
        if not model:
            raise InputError("model", "a catalog model key is required (--model)")
        if not gpu_key:
            raise InputError("gpu", "a catalog GPU key is required (--gpu)")
        arch, gpu = get_arch(model), get_gpu(gpu_key)
        if args.calibration:
            params, moved = transfer.calibration_on(cal, gpu)
            if moved:
                source += f", transferred from {cal.gpu} to {gpu.key} through the hardware terms (model/transfer.py)"
        tp = common.tensor_parallel(args, arch)
        limits, budget = common.engine_limits(args, arch, gpu, tp)
        coef = gauss.coefficients_for(arch, gpu, params, form=form, chunk_tokens=budget, tensor_parallel_size=tp)
        if tp > 1:
            source += f", tensor parallel {tp} over {gpu.interconnect}"
        return (replace(coef, **explicit, prefill_packing=args.prefill_packing), source, limits, budget,
                common.startup_note(args, arch, limits))
    if not explicit:
        raise InputError("model", "engine mode needs --model/--gpu (optionally --calibration CALIB.json) or explicit "
                         "coefficients (--prefill-s-per-token, --decode-step-s, …); or use --service-mean for a raw queue")
    if args.tensor_parallel_size != 1:
        raise InputError("--tensor-parallel-size", "needs --model and --gpu (the shard sizes and the interconnect); "
                                                   "explicit coefficients are already one replica's")
    limits, budget = common.engine_limits(args)
    coef = gauss.ServiceCoefficients(**{"prefill_s_per_token": 0.0, **explicit}, chunk_tokens=budget,
                                     prefill_packing=args.prefill_packing)
    return coef, "explicit coefficients", limits, budget, None


def _histogram(field: str, text: str) -> gauss.HistogramLength:
    bounds, counts = [], []
    for part in text.split(","):
        le, sep, count = part.strip().partition(":")
        try:
            bounds.append(float("inf") if le.strip().lower() in ("+inf", "inf") else float(le))
            counts.append(float(count))
        except ValueError:
            raise InputError(field, f"expected 'LE:COUNT,…' pairs (cumulative counts), got {part.strip()!r}") from None
        if not sep:
            raise InputError(field, f"expected 'LE:COUNT,…' pairs (cumulative counts), got {part.strip()!r}")
    return gauss.HistogramLength(tuple(bounds), tuple(counts))


def _length(field: str, mean, cv, histogram: str | None = None) -> gauss.LengthDist:
    if histogram is not None:
        return _histogram(field + "_histogram", histogram)
    if mean is None:
        raise InputError(field + "_mean", f"--{field}-mean (or --{field}-histogram) is required in engine mode")
    if not (math.isfinite(mean) and mean >= 1):
        raise InputError(field + "_mean", f"expected ≥ 1 token, got {mean!r}")
    if not (math.isfinite(cv) and cv >= 0):
        raise InputError(field + "_cv", f"expected a non-negative CV, got {cv!r}")
    return gauss.FixedLength(mean) if cv == 0 else gauss.LogNormalLength(mean, cv)


def _check(args) -> None:
    for name in ("rate", "slo_ttft_s", "slo_tpot_s", "service_mean"):
        v = getattr(args, name)
        if v is not None and not (math.isfinite(v) and v > 0):
            raise InputError(name, f"expected a positive number, got {v!r}")
    if args.servers < 1:
        raise InputError("servers", f"expected ≥ 1, got {args.servers}")
    if args.replications < 2:
        raise InputError("replications", f"expected ≥ 2, got {args.replications}")
    if args.samples < 100 * args.replications:
        raise InputError("samples", f"expected ≥ {100 * args.replications} (100 per replication), got {args.samples}")
    if args.sweep_points < 0:
        raise InputError("sweep_points", f"expected ≥ 0, got {args.sweep_points}")
    if not (math.isfinite(args.burst_cv) and args.burst_cv >= 0):
        raise InputError("burst_cv", f"expected a non-negative CV, got {args.burst_cv!r}")
    if args.service_mean is None and (args.service_cv is not None or args.service_dist is not None):
        raise InputError("service_mean", "--service-cv/--service-dist need --service-mean (raw queue mode)")
    if args.service_cv is not None and not (math.isfinite(args.service_cv) and args.service_cv >= 0):
        raise InputError("service_cv", f"expected a non-negative CV, got {args.service_cv!r}")


def _stats(s: gauss.LatencyStats | None) -> dict:
    if s is None:
        return {"mean": None, "p50": None, "p95": None, "p99": None, "ci95_halfwidth": None}
    return s.to_dict()


def _to_json(r: gauss.GaussResult, mode: str, seed: int, coef, budget: int | None = None) -> dict:
    out = {
        "feasible": True, "mode": mode, "rate_rps": r.rate_rps, "servers": r.servers, "quantile": r.quantile,
        "ttft_s": _stats(r.ttft), "tbt_s": _stats(r.tbt), "e2e_s": _stats(r.e2e), "wait_s": _stats(r.wait), "service_s": _stats(r.service),
        "service_rate_rps": r.service_rate_rps, "utilisation": r.utilisation,
        "stable_rate_rps": r.stable_rate_rps, "stable_binding": r.stable_binding,
        "sustainable_rate_rps": r.sustainable_rate_rps, "sustainable_binding": r.sustainable_binding,
        "sustainable_note": r.sustainable_note, "decode_batch": r.decode_batch,
        "samples": r.samples, "replications": r.replications, "seed": seed,
        "sweep": [{"rate_rps": p.rate_rps, "utilisation": p.utilisation,
                   "ttft_s": dict(zip(("p50", "p95", "p99"), p.ttft_s)),
                   "tbt_s": None if p.tbt_s is None else dict(zip(("p50", "p95", "p99"), p.tbt_s))} for p in r.sweep],
    }
    if coef is not None:
        from dataclasses import asdict
        out["coefficients"] = asdict(coef)
    if r.limits is not None:
        out.update(limits=common.limits_json(r.limits, budget), prefill_chunk_tokens=r.prefill_chunk_tokens,
                   admission_wait_s=_stats(r.admission_wait), admission_wait_probability=r.admission_wait_fraction,
                   preempted_fraction=r.preempted_fraction, preemptions_per_request=r.preemptions_per_request,
                   preemption_mean_s=r.preemption_mean_s)
    return out


def _plot(path: str, r: gauss.GaussResult, slo_ttft, slo_tbt) -> None:
    from kneecap.plotting import pyplot

    plt = pyplot()

    q = r.quantile
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, sample, stats, slo, name in ((axes[0], r.ttft_sample_s, r.ttft, slo_ttft, "TTFT"),
                                         (axes[1], r.tbt_sample_s, r.tbt, slo_tbt, "TBT")):
        if sample is None or stats is None:
            ax.text(0.5, 0.5, f"no {name} (raw queue)", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
            continue
        ax.hist(sample, bins=120, range=(float(sample.min()), float(np.quantile(sample, 0.999))), color="#4878a8", alpha=0.8)
        for qq, style in ((0.5, ":"), (0.95, "--"), (0.99, "-.")):
            ax.axvline(stats.quantile(qq), color="k", ls=style, lw=1, label=f"p{round(qq * 100)} {stats.quantile(qq):.3g} s")
        if slo is not None:
            ax.axvline(slo, color="r", lw=1.5, label=f"SLO {slo:.3g} s")
        ax.set_xlabel(f"{name} (s)")
        ax.set_ylabel("requests")
        ax.set_title(f"{name} at {r.rate_rps:.3g} req/s")
        ax.legend(fontsize=8)
    ax = axes[2]
    if r.sweep:
        lam = [p.rate_rps for p in r.sweep]
        for i, lbl in enumerate(("p50", "p95", "p99")):
            ax.plot(lam, [p.ttft_s[i] for p in r.sweep], marker="o", ms=3, label=f"TTFT {lbl}")
        if r.sweep[0].tbt_s is not None:
            ax2 = ax.twinx()
            ax2.plot(lam, [p.tbt_s[1] for p in r.sweep], color="tab:purple", ls="--", label="TBT p95")
            if slo_tbt is not None:
                ax2.axhline(slo_tbt, color="tab:purple", lw=1, ls=":", label="TBT SLO")
            ax2.set_ylabel("TBT (s)")
            ax2.legend(loc="upper center", fontsize=8)
        if slo_ttft is not None:
            ax.axhline(slo_ttft, color="r", lw=1, label="TTFT SLO")
        ax.axvline(r.sustainable_rate_rps, color="g", lw=1.5, label=f"λ* {r.sustainable_rate_rps:.3g} req/s")
        ax.axvline(r.stable_rate_rps, color="gray", ls=":", label=f"stability {r.stable_rate_rps:.3g}")
        ax.set_yscale("log")
        ax.set_xlabel("arrival rate λ (req/s)")
        ax.set_ylabel("TTFT (s)")
        ax.set_title("λ sweep")
        ax.legend(fontsize=8, loc="upper left")
    else:
        ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args) -> int:
    _check(args)
    rng = np.random.default_rng(args.seed)
    coef, source, budget, note = None, "raw queue", None, None
    try:
        if args.service_mean is not None:
            mode = "queue"
            dist = args.service_dist or ("lognormal" if args.service_cv is not None else "exp")
            result = gauss.simulate_queue(
                args.rate, args.service_mean, rng=rng, service_dist=dist, service_cv=args.service_cv,
                servers=args.servers, burst_cv=args.burst_cv, samples=args.samples, replications=args.replications,
                slo_s=args.slo_ttft_s, quantile=args.quantile, sweep_points=args.sweep_points)
        else:
            mode = "engine"
            coef, source, limits, budget, note = _coefficients(args)
            workload = gauss.Workload(
                _length("input", args.input_mean, args.input_cv, args.input_histogram),
                _length("output", args.output_mean, args.output_cv, args.output_histogram),
                gauss.FixedLength(args.cached_tokens) if args.cached_tokens else None)
            result = gauss.simulate(
                workload, coef, args.rate, rng=rng, servers=args.servers, burst_cv=args.burst_cv,
                samples=args.samples, replications=args.replications, slo_ttft_s=args.slo_ttft_s,
                slo_tbt_s=args.slo_tpot_s, quantile=args.quantile, sweep_points=args.sweep_points, limits=limits)
    except gauss.Infeasible as exc:
        if args.json:
            print(json.dumps({"feasible": False, "infeasible": str(exc), "stage": exc.stage, **exc.details,
                              "startup_note": note}))
        else:
            print(str(exc) + (f"\nnote: {note}" if note else ""))
        return 1
    if args.plot:
        _plot(args.plot, result, args.slo_ttft_s, args.slo_tpot_s)
    if args.json:
        print(json.dumps({**_to_json(result, mode, args.seed, coef, budget), "service_model": source,
                          "tensor_parallel_size": args.tensor_parallel_size, "startup_note": note}))
        return 0
    rows = [("TTFT" if mode == "engine" else "sojourn", result.ttft), ("TBT", result.tbt), ("wait", result.wait),
            ("limits", result.admission_wait)]
    q = result.quantile
    levels = (0.5, 0.95, 0.99) if q in gauss.QUANTILES else tuple(sorted((0.5, 0.95, 0.99, q)))
    head = " ".join(f"{gauss.quantile_name(x):>10}" for x in levels)
    print(f"{'metric':8} {'mean':>10} {head}   (s, ±95% CI of {gauss.quantile_name(q)})")
    for name, st in rows:
        if st is not None:
            cells = " ".join(f"{st.quantile(x):10.4g}" for x in levels)
            ci = st.pq_ci if st.q is not None else {0.5: st.p50_ci, 0.95: st.p95_ci, 0.99: st.p99_ci}[q]
            print(f"{name:8} {st.mean:10.4g} {cells}   ±{ci:.2g}")
    print(f"service rate μ·k   {result.service_rate_rps:.4g} req/s   (ρ = {result.utilisation:.3f})")
    print(f"stability limit    {result.stable_rate_rps:.4g} req/s   ({result.stable_binding})")
    print(f"sustainable λ*     {result.sustainable_rate_rps:.4g} req/s   ({result.sustainable_binding})")
    if result.sustainable_note:
        print(result.sustainable_note)
    if result.decode_batch is not None:
        print(f"mean decode batch  {result.decode_batch:.3g}")
    if result.limits is not None:
        lim = result.limits
        kv = "unbounded" if lim.kv_capacity_tokens is None else f"{lim.kv_capacity_tokens} tokens"
        print(f"engine limits      max_num_seqs {lim.slots}, max_num_batched_tokens {budget} (chunks of "
              f"{result.prefill_chunk_tokens:g} beside the decodes), KV cache {kv}, prefix caching "
              f"{'on' if lim.enable_prefix_caching else 'off'}")
        print(f"limits' wait       P(wait) {result.admission_wait_fraction:.3g}; preempted "
              f"{result.preempted_fraction:.3g} of requests ({result.preemptions_per_request:.3g} preemptions per "
              f"request), +{result.preemption_mean_s:.3g} s each")
    print(f"service model      {source}")
    if note:
        print(f"note               {note}")
    print(f"samples            {result.samples} in {result.replications} replications, seed {args.seed}")
    return 0
