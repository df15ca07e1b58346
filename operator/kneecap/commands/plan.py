"""`kneecap plan`: SARA pool sizing for disaggregated serving under quantile SLOs and a budget.

With ``--colocated-gauss`` it also plans a colocated pool whose per-replica sustainable rate
λ* GAUSS finds for the SLOs with the engine's own limits (vLLM's flags, ``common.add_engine_limits``);
``--max-num-seqs`` also bounds the decode pool's max_num_seqs SARA chooses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from kneecap.commands import common
from kneecap.errors import InputError

HELP = "size prefill/KV/decode pools for p-quantile TTFT/KV/TPOT SLOs under a $/h budget (SARA)"

EXIT_INFEASIBLE = 1


def add_arguments(p):
    p.add_argument("--model", required=True, help="model catalog key (e.g. llama-3.1-8b, qwen2.5-32b, gpt-3-175b)")
    p.add_argument("--gpu", default="a100-80gb", help="GPU catalog key (default a100-80gb, as in SARA)")
    p.add_argument("--calibration", metavar="CALIB.json",
                   help="calibrated SLIM from `kneecap fit`: prefill time at batch 1 from its efficiencies")
    p.add_argument("--prefill-coeffs", metavar="A,B,C",
                   help="explicit prefill time per replica: A + B·IL + C·IL² seconds")
    p.add_argument("--prefill-gpus", type=int, help="GPUs per prefill replica (default: fewest that hold the model)")
    p.add_argument("--input-mean", type=float, default=1024.0, help="mean input length, tokens")
    p.add_argument("--input-cv", type=float, default=1.25, help="input length coefficient of variation")
    p.add_argument("--output-mean", type=float, default=256.0, help="mean output length, tokens")
    p.add_argument("--output-cv", type=float, default=1.0, help="output length CV (1 = exponential)")
    p.add_argument("--tail", choices=("light", "heavy"), default="heavy",
                   help="input length law: heavy = log-normal, light = gamma (exponential at CV 1)")
    common.add_slo(p, ttft=0.5, tpot=0.04)
    p.add_argument("--slo-kv-s", type=float, default=0.15, metavar="S", help="KV-transfer SLO, seconds (default 0.15)")
    common.add_quantile(p)
    p.add_argument("--p-mem", type=float, default=0.99)
    p.add_argument("--p-join", type=float, default=0.99)
    p.add_argument("--budget-per-hour", type=float, required=True, help="cost budget C_max, $/h")
    p.add_argument("--prefill-cost", type=float, help="$/h per prefill GPU (default: the GPU catalog cost)")
    p.add_argument("--decode-cost", type=float, help="$/h per decode GPU (default: the GPU catalog cost)")
    p.add_argument("--kv-cost-per-gibps", type=float, default=0.1, help="$/h per GiB/s of KV link")
    colocated = p.add_mutually_exclusive_group()
    colocated.add_argument("--colocated-rate-per-replica", type=float, metavar="RPS",
                           help="also plan a colocated pool from this per-replica sustainable rate λ* (e.g. GAUSS)")
    colocated.add_argument("--colocated-gauss", action="store_true",
                           help="also plan a colocated pool, λ* per replica from GAUSS (log-normal lengths) with the "
                                "engine limits below")
    p.add_argument("--colocated-gpus", type=int, default=None,
                   help="GPUs per colocated replica (default: --tensor-parallel-size, else 1)")
    common.add_tensor_parallel(p, None, " (default: SARA's fewest prefill GPUs that hold the model, TP 1 for the "
                                        "colocated engine); sets the prefill replica's GPUs, the decode pool's "
                                        "granularity and the colocated replica's GPUs and step time")
    p.add_argument("--exhaustive", action="store_true", help="also run the exhaustive reference and report the gap")
    p.add_argument("--plot", metavar="PNG", help="write goodput vs budget (SARA, and exhaustive if asked)")
    limits = p.add_argument_group("engine limits (vLLM's flags; --colocated-gauss, and --max-num-seqs for SARA)")
    common.add_engine_limits(limits)
    limits.add_argument("--cached-tokens", type=float, default=0.0, help="cached prefix tokens per request")
    limits.add_argument("--samples", type=int, default=200_000, help="--colocated-gauss: simulated requests")
    common.add_json(p)


def _finite(name, value, positive=True):
    if value is None:
        return None
    if not math.isfinite(value) or (positive and value <= 0) or (not positive and value < 0):
        raise InputError(name, f"expected a {'positive' if positive else 'non-negative'} number, got {value!r}")
    return value


def _prefill_from_coeffs(text: str):
    try:
        a, b, c = (float(x) for x in text.split(","))
    except ValueError:
        raise InputError("prefill_coeffs", f"expected three numbers A,B,C, got {text!r}") from None
    if min(a, b, c) < 0 or a + b + c <= 0 or not all(map(math.isfinite, (a, b, c))):
        raise InputError("prefill_coeffs", "expected non-negative finite A,B,C, not all zero")
    return lambda il: a + b * np.asarray(il, dtype=float) + c * np.asarray(il, dtype=float) ** 2


def _calibration(path: str, gpu):
    from kneecap.model import calibrate

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InputError("calibration", f"cannot read {path}: {exc.strerror}") from None
    cal = calibrate.Calibration.from_json(text)
    if cal.gpu != gpu.key:
        raise InputError("calibration", f"calibrated on {cal.gpu}, but --gpu is {gpu.key}")
    return cal


def _prefill_from_calibration(path: str, arch, gpu, m_p: int):
    """Prefill of one request (batch 1) from a calibrated SLIM: F_pre/(η_c·m_p·F_max), floored by
    streaming the weights at η_m·m_p·B_HBM (SLIM eqs 7–8 with B = 1)."""
    from kneecap.model import slim

    params = _calibration(path, gpu).slim_params
    aa = slim.arch_arrays(arch)
    eta_c = float(params.eta_c)
    eta_m = float(getattr(params, "eta_m", 1.0) or 1.0)

    def service(il):
        il = np.asarray(il, dtype=float)
        compute = slim.prefill_flops(aa, 1.0, il) / (eta_c * m_p * gpu.peak_flops)
        return np.maximum(compute, arch.weight_bytes / (eta_m * m_p * gpu.mem_bw_bytes_s))

    return service


def build(args):
    from kneecap.model import sara
    from kneecap.model.arch import get_arch
    from kneecap.model.hardware import get_gpu

    arch = get_arch(args.model)
    gpu = get_gpu(args.gpu)
    _finite("budget_per_hour", args.budget_per_hour)
    _finite("prefill_cost", args.prefill_cost)
    _finite("decode_cost", args.decode_cost)
    _finite("kv_cost_per_gibps", args.kv_cost_per_gibps, positive=False)
    if args.calibration and args.prefill_coeffs:
        raise InputError("calibration", "give --calibration or --prefill-coeffs, not both")
    if not args.colocated_gauss:
        for name in ("max_num_active_seqs", "max_num_batched_tokens", "kv_cache_memory_bytes", "num_gpu_blocks_override"):
            if getattr(args, name) is not None:
                raise InputError(name, f"--{name.replace('_', '-')} applies to the colocated GAUSS plan: add --colocated-gauss")
        if args.cached_tokens:
            raise InputError("cached_tokens", "--cached-tokens applies to the colocated GAUSS plan: add --colocated-gauss")
    if args.max_num_seqs is not None and args.max_num_seqs < 1:
        raise InputError("max_num_seqs", f"expected a positive integer, got {args.max_num_seqs}")
    workload = sara.make_workload(args.input_mean, args.input_cv, args.output_mean, args.output_cv, args.tail)
    slo = sara.SLO(args.slo_ttft_s, args.slo_kv_s, args.slo_tpot_s, args.quantile, args.p_mem, args.p_join)
    costs = sara.Costs(args.prefill_cost or gpu.cost_per_hour, args.decode_cost or gpu.cost_per_hour,
                       args.kv_cost_per_gibps)
    tp = common.tensor_parallel(args, arch) if args.tensor_parallel_size is not None else None
    if tp is not None and args.prefill_gpus is not None and args.prefill_gpus != tp:
        raise InputError("--prefill-gpus", f"{args.prefill_gpus} differs from --tensor-parallel-size {tp}: "
                                           "a prefill replica is one TP engine")
    if tp is not None and args.colocated_gpus is not None and args.colocated_gpus != tp:
        raise InputError("--colocated-gpus", f"{args.colocated_gpus} differs from --tensor-parallel-size {tp}: "
                                             "a colocated replica is one TP engine")
    if tp is not None:
        try:
            need = sara.prefill_gpus_needed(arch, gpu, workload, slo)
        except InputError:
            need = 1
        if need > tp:
            raise InputError("--tensor-parallel-size", f"{tp} GPU(s) of {gpu.key} cannot hold {arch.key}'s weights "
                                                       f"and a p{slo.p_mem * 100:g} prompt's KV: at least {need} needed")
    m_p = args.prefill_gpus or tp or sara.prefill_gpus_needed(arch, gpu, workload, slo)
    service = None
    if args.prefill_coeffs:
        service = _prefill_from_coeffs(args.prefill_coeffs)
    elif args.calibration:
        service = _prefill_from_calibration(args.calibration, arch, gpu, m_p)
    return sara.build_problem(arch, gpu, workload, slo, costs, prefill_service_s=service,
                              prefill_gpus_per_replica=m_p, max_num_seqs_cap=args.max_num_seqs or sara.MAX_NUM_SEQS_CAP,
                              tensor_parallel_size=tp)


def colocated_gauss_rate(args, pb) -> dict:
    """λ* of one colocated replica from GAUSS (what `kneecap simulate` runs) at the SLOs, with the
    calibrated SLIM (or its uncalibrated defaults) and the engine's limits."""
    from kneecap.model import gauss
    from kneecap.model.slim import SlimParams

    form, params = ("kneecap", SlimParams())
    if args.calibration:
        cal = _calibration(args.calibration, pb.gpu)
        form, params = cal.form, cal.slim_params
    tp = pb.decode_gpus_per_replica
    limits, budget = common.engine_limits(args, pb.arch, pb.gpu, tp)
    coef = gauss.coefficients_for(pb.arch, pb.gpu, params, form=form, chunk_tokens=budget, tensor_parallel_size=tp)
    _finite("cached_tokens", args.cached_tokens, positive=False)
    wl = gauss.Workload(gauss.LogNormalLength(args.input_mean, args.input_cv),
                        gauss.LogNormalLength(args.output_mean, args.output_cv),
                        gauss.FixedLength(args.cached_tokens) if args.cached_tokens else None)
    res = gauss.sustainable_rate(wl, coef, rng=np.random.default_rng(0), samples=args.samples,
                                 slo_ttft_s=args.slo_ttft_s, slo_tbt_s=args.slo_tpot_s, quantile=args.quantile,
                                 limits=limits)
    return {"sustainable_rate_per_replica_rps": res.rate_rps, "rate_binding": res.binding,
            "stable_rate_per_replica_rps": res.stable_rate_rps, "note": res.note,
            "limits": common.limits_json(limits, budget), "tensor_parallel_size": tp}


def _plot(path, pb, budget, with_exhaustive):
    from kneecap.plotting import pyplot

    plt = pyplot()

    from kneecap.model import sara

    budgets = np.linspace(budget / 8, budget * 2, 24)
    sara_g = [sara.plan(pb, b).goodput_rps for b in budgets]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(budgets, sara_g, "o-", ms=3, label="SARA")
    if with_exhaustive:  # fewer points: each exhaustive search takes seconds
        few = budgets[::4]
        ax.plot(few, [sara.exhaustive(pb, b, kv_grid_points=1000).goodput_rps for b in few], "x", ms=8,
                label="exhaustive")
    ax.axvline(budget, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("budget ($/h)")
    ax.set_ylabel("goodput (req/s)")
    ax.set_title(f"{pb.arch.key} on {pb.gpu.key}, {pb.workload.tail}-tailed, p{pb.slo.quantile * 100:g}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args) -> int:
    from kneecap.model import sara

    pb = build(args)
    result = sara.plan(pb, args.budget_per_hour)
    out = result.to_dict()
    out["tensor_parallel_size"] = pb.decode_gpus_per_replica if args.tensor_parallel_size is not None else None
    if args.exhaustive:
        ex = sara.exhaustive(pb, args.budget_per_hour)
        out["exhaustive_goodput_rps"] = ex.goodput_rps
        out["exhaustive_seconds"] = ex.solve_seconds
        out["exhaustive_allocation"] = {k: v for k, v in ex.to_dict().items() if k in (
            "prefill_replicas", "decode_replicas", "kv_bandwidth_gibps", "max_num_seqs", "cost_per_hour")}
        out["gap_pct"] = (100.0 * (ex.goodput_rps - result.goodput_rps) / ex.goodput_rps
                          if ex.goodput_rps > 0 else 0.0)
    if args.colocated_rate_per_replica is not None or args.colocated_gauss:
        found = colocated_gauss_rate(args, pb) if args.colocated_gauss else {}
        lam = found.get("sustainable_rate_per_replica_rps", args.colocated_rate_per_replica)
        colo = sara.plan_colocated(lam, args.colocated_gpus or pb.decode_gpus_per_replica, pb.costs.decode_gpu_per_hour,
                                   budget_per_hour=args.budget_per_hour)
        out["colocated"] = {**colo.to_dict(), **found}
    if result.feasible:
        mu, sd = sara.decode_batch_stats(pb, result.goodput_rps, result.allocation.decode_replicas)
        a = result.allocation
        out["predicted"] = {
            "ttft_s": sara.ttft_quantile_s(pb, result.goodput_rps, a.prefill_replicas),
            "kv_s": sara.kv_quantile_s(pb, result.goodput_rps, a.kv_bandwidth_gibps),
            "tpot_s": sara.tpot_quantile_s(pb, result.goodput_rps, a.decode_replicas),
            "quantile": pb.slo.quantile, "decode_batch_mean": mu, "decode_batch_std": sd,
        }
    if args.plot:
        _plot(args.plot, pb, args.budget_per_hour, args.exhaustive)
        out["plot"] = args.plot
    if args.json:
        print(json.dumps(_clean(out), sort_keys=True, allow_nan=False))
    else:
        _print(out, pb)
    return 0 if result.feasible else EXIT_INFEASIBLE


def _clean(x):
    """JSON has no inf/NaN: non-finite numbers become null."""
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _print(out, pb):
    print(f"model {pb.arch.key} on {pb.gpu.key}; {pb.workload.tail}-tailed input "
          f"(mean {pb.workload.input.mean_tok:g}, CV {pb.workload.input.cv:g}), output mean {pb.workload.output.mean_tok:g}")
    if not out["feasible"]:
        print(out["message"])
        return
    print(f"goodput            {out['goodput_rps']:.3f} req/s at {out['cost_per_hour']:.2f} $/h "
          f"(solved in {out['solve_seconds'] * 1e3:.1f} ms)")
    print(f"prefill            {out['prefill_replicas']} replica(s) × {out['prefill_gpus_per_replica']} GPU  "
          f"[{out['binding']['prefill']}]")
    print(f"KV link            {out['kv_bandwidth_gibps']:.2f} GiB/s  [{out['binding']['kv']}]")
    print(f"decode             {out['decode_replicas']} GPU(s), max_num_seqs {out['max_num_seqs']}  "
          f"[{out['binding']['decode']}]")
    pr = out["predicted"]
    print(f"predicted p{pr['quantile'] * 100:g}      TTFT {pr['ttft_s']:.3f} s, KV {pr['kv_s']:.3f} s, "
          f"TPOT {pr['tpot_s'] * 1e3:.1f} ms")
    if "exhaustive_goodput_rps" in out:
        print(f"exhaustive         {out['exhaustive_goodput_rps']:.3f} req/s in {out['exhaustive_seconds']:.2f} s "
              f"(SARA gap {out['gap_pct']:.2f}%)")
    if "colocated" in out:
        c = out["colocated"]
        print(f"colocated          {c['replicas']} replica(s), {c['goodput_rps']:.3f} req/s at {c['cost_per_hour']:.2f} $/h"
              if c["feasible"] else c["message"])
        if "limits" in c:
            lim = c["limits"]
            print(f"colocated λ*       {c['sustainable_rate_per_replica_rps']:.4g} req/s per replica "
                  f"({c['rate_binding']}; GAUSS at max_num_seqs {lim['max_num_seqs']}, KV "
                  f"{lim['kv_capacity_tokens']} tokens)")
