"""Fleet packing, verified: does `kneecap pack` return GPUs on the example fleet with no SLO
missed when the packing is replayed on the twins?

Setup: examples/fleet.yaml (7 deployments, 12 replicas, each on an H100 80 GB today, $60/h),
the GPUs it may use `h100-80gb=12,l40s=4,l4=4` (catalog prices), margin 10%, seed 0, GAUSS 50,000
requests per engine and check (`kneecap pack`'s defaults). The packing's predictions come from
the co-location model (model/colocation.py); `--verify` replays each packed GPU in virtual time
with its engines' twins time-slicing it (sim/shared_gpu.verify_placement: Poisson arrivals at
each replica's rate, log-normal lengths, the packing's caps and memory shares), one GPU after
another, each with its own seed; every GPU's lightest engine gets at least 1,000 measured
requests unless its busiest would then pass 10,000 (kneecap.sim.pack_verify.VERIFY_REQUESTS).

Reported per deployment (the worst replica, at its SLO quantile): the predicted and verified p95
(p99 for code-7b) TTFT and TPOT against the SLO and the error verified/predicted − 1. Goal: at
least one GPU in three returned on the example fleet with no SLO missed as verified. Not done
here: a fleet replay of several real traces at once (each deployment's own trace, bursts
included); the replay is Poisson at the declared rates. Writes fleet_pack.{json,md,png} to results/.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _paths import RESULTS, ROOT  # noqa: E402

from kneecap.commands.pack import _gpus_flag  # noqa: E402
from kneecap.model import packing  # noqa: E402
from kneecap.sim import pack_verify  # noqa: E402

FLEET = ROOT / "examples" / "fleet.yaml"
GPUS = "h100-80gb=12,l40s=4,l4=4"
SEED = 0
K = {0.5: "p50", 0.95: "p95", 0.99: "p99"}


def run() -> dict:
    deployments = packing.parse_fleet(yaml.safe_load(FLEET.read_text()))
    inventory = packing.parse_inventory(_gpus_flag([GPUS]))
    load0 = os.getloadavg()
    c0, w0 = time.process_time(), time.perf_counter()
    res = packing.pack(deployments, inventory, seed=SEED)
    c1, w1 = time.process_time(), time.perf_counter()
    verified = pack_verify.verify(res, seed=SEED)
    c2, w2 = time.process_time(), time.perf_counter()
    out = pack_verify.verification_dict(res, verified, packing.result_dict(res))
    out["seed"] = SEED
    returned, before = out["gpus_returned"], out["before"]["gpus"]
    out["goal"] = {"text": "at least one GPU in three returned on the example fleet with no SLO missed (verified)",
                   "gpus_returned": returned, "gpus_before": before, "one_in_three": returned * 3 >= before,
                   "no_slo_missed_verified": out["verify"]["all_slo_met"]}
    out["goal"]["met"] = out["goal"]["one_in_three"] and out["goal"]["no_slo_missed_verified"]
    out["timing"] = {"pack_cpu_s": c1 - c0, "pack_wall_s": w1 - w0, "verify_cpu_s": c2 - c1,
                     "verify_wall_s": w2 - w1, "load_average_start": load0, "load_average_end": os.getloadavg(),
                     "cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()}
    out["not_done"] = "a fleet replay of several traces at once (each deployment's own trace); the replay is Poisson"
    return out


def rows(out: dict) -> list[dict]:
    table = []
    for d in out["deployments"]:
        q = K[d["slo"]["quantile"]]
        a, v = d["after"], d["verified"]
        table.append({"name": d["name"], "q": q, "replicas": d["replicas"], "gpus": a["gpus"],
                      "slo_ttft_s": d["slo"]["ttft_s"], "slo_tpot_s": d["slo"]["tpot_s"],
                      "pred_ttft_s": a["ttft_s"][q], "ver_ttft_s": v["ttft_s"][q], "err_ttft": v["error"]["ttft"],
                      "pred_tpot_s": a["tpot_s"][q], "ver_tpot_s": v["tpot_s"][q], "err_tpot": v["error"]["tpot"],
                      "requests": v["requests"], "rejected": v["rejected"], "met": v["slo_met"]})
    return table


def markdown(out: dict) -> str:
    b, a, g, t = out["before"], out["after"], out["goal"], out["timing"]
    ok = lambda x: "**met**" if x else "**not met**"  # noqa: E731
    lines = [
        "# Fleet packing, verified on the twins (`benchmarks/fleet_pack.py`)", "",
        f"`kneecap pack -f examples/fleet.yaml --gpus {GPUS} --verify` (margin {out['margin']:.0%}, seed "
        f"{out['seed']}); the packing's numbers are the co-location model's, the verified ones the twins' "
        "(each packed GPU replayed in virtual time, its engines time-slicing it; deterministic).", "",
        "| | GPUs | $/h | by type |", "| --- | --- | --- | --- |",
        f"| today | {b['gpus']} | {b['cost_per_hour']:.2f} | {b['by_type']} |",
        f"| packed | {a['gpus']} | {a['cost_per_hour']:.2f} | {a['by_type']} |",
        f"| returned / saved | {out['gpus_returned']} | {out['savings_per_hour']:.2f} | |", "",
        f"Goal: {g['text']}: {ok(g['met'])} ({g['gpus_returned']} of {g['gpus_before']} returned; "
        f"{'no SLO missed' if g['no_slo_missed_verified'] else 'SLO missed'} as verified).", "",
        "Per deployment, the worst replica at its SLO quantile (predicted → verified, error = "
        "verified/predicted − 1):",
        "",
        "| deployment | q | TTFT SLO | predicted | verified | error | TPOT SLO | predicted | verified | error | "
        "measured requests | met (verified) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows(out):
        rej = f" ({r['rejected']} refused)" if r["rejected"] else ""
        lines.append(f"| {r['name']} | {r['q']} | {r['slo_ttft_s']:g} s | {r['pred_ttft_s']:.3f} s | "
                     f"{r['ver_ttft_s']:.3f} s | {r['err_ttft']:+.1%} | {r['slo_tpot_s'] * 1e3:g} ms | "
                     f"{r['pred_tpot_s'] * 1e3:.1f} ms | {r['ver_tpot_s'] * 1e3:.1f} ms | {r['err_tpot']:+.1%} | "
                     f"{r['requests']}{rej} | {'yes' if r['met'] else 'NO'} |")
    errs = [abs(r[k]) for r in rows(out) for k in ("err_ttft", "err_tpot")]
    within = sum(e <= 0.10 for e in errs)
    lines += ["", f"Predicted vs verified: {within} of {len(errs)} p95/p99 cells within 10% (worst "
              f"{max(errs):.1%}). Per GPU and engine:", "",
              "| GPU | engine | measured requests | predicted TTFT p95 | verified | predicted TPOT p95 | verified |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for gp in out["verify"]["gpus"]:
        for e in gp["engines"]:
            p = e["predicted"]
            lines.append(f"| {gp['index']} {gp['gpu']} | {e['deployment']}#{e['replica']} | {e['requests']} | "
                         f"{p['ttft_s']['p95']:.3f} s | {e['ttft_s']['p95']:.3f} s | "
                         f"{p['tpot_s']['p95'] * 1e3:.1f} ms | {e['tpot_s']['p95'] * 1e3:.1f} ms |")
    lines += ["", f"Time: pack {t['pack_cpu_s']:.1f} CPU-s ({t['pack_wall_s']:.1f} s wall), verify "
              f"{t['verify_cpu_s']:.1f} CPU-s ({t['verify_wall_s']:.1f} s wall), {t['cpus']} CPUs "
              f"({t['processor']}), load average {t['load_average_start'][0]:.2f} at the start, "
              f"{t['load_average_end'][0]:.2f} at the end.", "",
              f"Not done: {out['not_done']}.", ""]
    return "\n".join(lines)


def plot(out: dict, path: Path) -> None:
    from kneecap.plotting import pyplot

    plt = pyplot()
    table = rows(out)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    y = range(len(table))
    for ax, metric, title in ((axes[0], "ttft", "TTFT"), (axes[1], "tpot", "TPOT")):
        pred = [r[f"pred_{metric}_s"] / r[f"slo_{metric}_s"] for r in table]
        ver = [r[f"ver_{metric}_s"] / r[f"slo_{metric}_s"] for r in table]
        ax.barh([i - 0.2 for i in y], pred, height=0.4, label="predicted (co-location model)")
        ax.barh([i + 0.2 for i in y], ver, height=0.4, label="verified (twins)")
        ax.axvline(1.0, color="red", lw=1, label="SLO")
        ax.axvline(0.9, color="grey", lw=0.8, ls="--", label="SLO·(1 − margin)")
        ax.set_xlabel(f"{title} at the SLO quantile / SLO")
        ax.set_title(f"{title}: packed {out['after']['gpus']} GPUs (from {out['before']['gpus']})")
    axes[0].set_yticks(list(y), [f"{r['name']} ({r['q']})" for r in table])
    axes[0].invert_yaxis()
    axes[1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    out = run()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fleet_pack.json").write_text(json.dumps(out, indent=1, allow_nan=False))
    text = markdown(out)
    (RESULTS / "fleet_pack.md").write_text(text)
    plot(out, RESULTS / "fleet_pack.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
