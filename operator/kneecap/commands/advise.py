"""`kneecap advise`: the BCA cap (max_num_seqs) and the memory setting that holds it."""

from __future__ import annotations

import json

from kneecap.commands import common
from kneecap.commands.predict import load_calibration
from kneecap.errors import InputError
from kneecap.model import bca, memory
from kneecap.model.arch import GIB, get_arch
from kneecap.model.hardware import get_gpu

HELP = "recommend max_num_seqs (BCA, eq. 13) and gpu_memory_utilization from a calibration"


def add_arguments(p):
    p.add_argument("calibration", metavar="CALIB.json")
    p.add_argument("--model", required=True, help="model catalog key")
    p.add_argument("--input-len", type=float, required=True, help="mean input tokens per request")
    p.add_argument("--output-len", type=float, required=True, help="mean output tokens per request")
    p.add_argument("--slo-e2e-s", type=float, default=None, help="E2E latency SLO in seconds (SLIM's batch E2E)")
    p.add_argument("--epsilon", type=float, default=0.1, help="batching-efficiency floor ε (eq. 13)")
    p.add_argument("--min-cap", type=int, default=1)
    p.add_argument("--max-cap", type=int, default=1024)
    p.add_argument("--output-cv", type=float, default=None,
                   help="output-length coefficient of variation (default: the calibration's workload estimate, else 0)")
    p.add_argument("--length-std", type=float, default=0.0, help="std of request length (tokens) for the KV tail margin")
    p.add_argument("--kv-capacity-tokens", type=int, default=None,
                   help="KV capacity to stay within (default: vLLM's at gpu_memory_utilization 0.9)")
    p.add_argument("--chunked-prefill-tokens", type=int, default=None, metavar="T",
                   help="chunked prefill on with this max_num_batched_tokens (caps the running batch)")
    p.add_argument("--plot", metavar="PNG", default=None, help="write throughput and latency vs batch")
    common.add_tensor_parallel(p)
    common.add_json(p)


def run(args) -> int:
    cal = load_calibration(args.calibration)
    arch, gpu = get_arch(args.model), get_gpu(cal.gpu)
    tp = common.tensor_parallel(args, arch)
    if args.output_cv is not None and not args.output_cv >= 0:
        raise InputError("--output-cv", f"expected ≥ 0, got {args.output_cv}")
    if args.length_std < 0:
        raise InputError("--length-std", f"expected ≥ 0, got {args.length_std}")
    cv = args.output_cv
    if cv is None:
        known = cal.notes.get("output_cv_by_dataset", {}) or {}
        cv = float(max(known.values())) if len(known) == 1 else 0.0
    res = bca.advise(cal, arch, gpu, args.input_len, args.output_len, slo_e2e_s=args.slo_e2e_s,
                     epsilon=args.epsilon, min_cap=args.min_cap, max_cap=args.max_cap,
                     kv_capacity_tokens=args.kv_capacity_tokens, output_cv=cv, length_std_tok=args.length_std,
                     max_num_batched_tokens=args.chunked_prefill_tokens, tensor_parallel_size=tp)
    kv_tokens = int(memory.kv_tokens_for_cap(res.cap, args.input_len + args.output_len, args.length_std))
    budget = args.chunked_prefill_tokens
    split = memory.utilization_for_kv_tokens(arch, gpu, kv_tokens, res.cap, budget, tensor_parallel_size=tp)
    default = memory.memory_split(arch, gpu, memory.DEFAULT_UTILIZATION, res.cap, budget, tensor_parallel_size=tp)
    out = {
        "model": arch.key, "gpu": gpu.key, "form": cal.form,
        "max_num_seqs": res.cap, "gpu_memory_utilization": split.gpu_memory_utilization,
        "tensor_parallel_size": tp, "gpus_per_replica": tp,
        "kv_tokens": kv_tokens, "kv_gib": kv_tokens * split.kv_bytes_per_token / GIB,  # per GPU
        "released_gib": memory.released_bytes(default, split) / GIB,
        "pred_throughput_tok_s": res.pred_throughput_tok_s, "pred_e2e_s": res.pred_e2e_s,
        "efficiency": res.efficiency, "knee_batch": res.knee_batch, "binding": res.binding,
        "feasible": res.feasible, "kv_limit_batch": res.kv_limit_batch, "epsilon": args.epsilon,
        "model_in_calibration": arch.key in cal.models,
        "slo_e2e_s": args.slo_e2e_s,
    }
    if args.plot:
        out["plot"] = plot(res, args, out)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{arch.key} on {gpu.key}, IL={args.input_len:g} OL={args.output_len:g}: "
          f"--max-num-seqs {res.cap} ({res.binding} binds; knee at {res.knee_batch})")
    print(f"  predicted {res.pred_throughput_tok_s:.0f} tok/s, E2E {res.pred_e2e_s:.2f} s, efficiency {res.efficiency:.3f}")
    per_gpu = f" per GPU, --tensor-parallel-size {tp}" if tp > 1 else ""
    print(f"  --gpu-memory-utilization {split.gpu_memory_utilization:.3f}: KV {out['kv_gib']:.2f} GiB, "
          f"releases {out['released_gib']:.2f} GiB vs 0.9{per_gpu}")
    if arch.key not in cal.models:
        print(f"  note: {arch.key} was not among the calibrated models ({', '.join(cal.models)}): transferred")
    if not res.feasible:
        print("  warning: no batch meets the SLO; the cap is the minimum")
    return 0


def plot(res, args, out) -> str:
    from kneecap.plotting import pyplot

    plt = pyplot()

    b = res.curve_batch
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(b, res.curve_throughput_tok_s, color="tab:blue", label="throughput (pred.)")
    ax.set_xlabel("batch (running sequences)")
    ax.set_ylabel("throughput [tok/s]", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(b, res.curve_e2e_s, color="tab:red", label="E2E (pred.)")
    ax2.set_ylabel("E2E latency [s]", color="tab:red")
    ax.axvline(res.knee_batch, color="gray", ls=":", label=f"knee B={res.knee_batch}")
    ax.axvline(res.cap, color="black", ls="--", label=f"cap B={res.cap} ({res.binding})")
    if res.kv_limit_batch < b[-1]:
        ax.axvline(res.kv_limit_batch, color="tab:purple", ls="-.", label=f"KV limit B={res.kv_limit_batch}")
    if args.slo_e2e_s is not None:
        ax2.axhline(args.slo_e2e_s, color="tab:red", ls=":", label=f"SLO {args.slo_e2e_s:g} s")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="lower right", fontsize=8)
    ax.set_title(f"{out['model']} IL={args.input_len:g} OL={args.output_len:g}: max_num_seqs={res.cap}")
    fig.tight_layout()
    try:
        fig.savefig(args.plot, dpi=110)
    except OSError as exc:
        raise InputError("--plot", f"cannot write {args.plot}: {exc}") from None
    finally:
        plt.close(fig)
    return str(args.plot)
