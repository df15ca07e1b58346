"""Trace suite: kneecap and the baselines on traffic it was not shaped on, in virtual time.

The trace of `trace_replay.py` (Azure LLM inference 2023, conversation, 19,366 requests in one
hour, data/azure-llm-2023/, CC-BY 4.0) at every whole compression from ×1 to the least that
needs 6 replicas of vLLM's defaults for its peak, and the variants of `kneecap.sim.trace_variants`
derived from it, each changing one property (the table says which and what it stresses), each at
its own least compression for a 3-replica peak (`--peak-replicas 3`). Same model, GPU, SLOs and
policies as `trace_replay.py`, but for the last row: the trace served by Llama-3.1-70B at TP 2 (two
H100s per replica, each counted), whose KV cache at vLLM's memory bounds the batch.

Per trace: good requests per GPU-hour of each policy; kneecap's against the hindsight-best static
setting (oracle) and against the best of the baselines a user runs today (defaults on a
peak-sized pool, the HPA on KV usage or on waiting requests, llm-d's SLO-aware KEDA recipe);
SLO attainment; mean replicas, pods started, restarts; and
whether the knobs moved (applied cap changes, mean memory fraction); and the ablations
(`kneecap:replicas-only`, `kneecap:knobs-only`) as a share of kneecap's good requests per
GPU-hour. Reported as measured.
Writes trace_suite.{json,md} to results/.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import replace
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _paths import RESULTS  # noqa: E402
from trace_replay import CONFIG, TRACE  # noqa: E402

from kneecap.sim.replay import (ABLATIONS, DEFAULT_CAP, DEFAULT_POLICIES, ReplayConfig,  # noqa: E402
                                compression_for_peak, replay)
from kneecap.sim.trace import Trace, compress, read_trace  # noqa: E402
from kneecap.sim.trace_variants import SUITE  # noqa: E402

BASELINES = ("defaults", "defaults+hpa", "defaults+hpa-waiting", "keda-slo")
PEAK_REPLICAS = 3
MOST_REPLICAS = 6


def cap_changes(decisions: list[dict]) -> int:
    """Applied decisions that moved --max-num-seqs."""
    cap, changes = DEFAULT_CAP, 0
    for d in decisions:
        target = d.get("target") or {}
        if d.get("applied") and target.get("maxNumSeqs") not in (None, cap):
            cap, changes = target["maxNumSeqs"], changes + 1
    return changes


def row(name: str, stresses: str, trace: Trace, factor: int, cfg: ReplayConfig = CONFIG) -> dict:
    cpu0 = time.process_time()
    report = replay(compress(trace, factor), cfg, DEFAULT_POLICIES + ABLATIONS)["report"]
    p = report["policies"]
    good = {k: s["good_per_gpu_hour"] or 0.0 for k, s in p.items()}
    best = max(BASELINES, key=lambda k: good[k])
    k = p["kneecap"]
    return {
        "trace": name, "stresses": stresses, "compress": factor, "requests": len(trace),
        "model": cfg.architecture, "tensor_parallel_size": cfg.tensor_parallel_size,
        "good_per_gpu_hour": good,
        "attainment": {q: s["slo_attainment_requests"] for q, s in p.items()},
        "mean_replicas": {q: s["mean_replicas"] for q, s in p.items()},
        "pods_started": {q: s["pods_started"] for q, s in p.items()},
        "best_baseline": best,
        "vs_oracle": round(good["kneecap"] / good["oracle"], 4) if good["oracle"] else None,
        "vs_best_baseline": round(good["kneecap"] / good[best], 4) if good[best] else None,
        # each lever's share: what kneecap with only that lever reaches, against kneecap with both
        "ablations": {a: round(good[a] / good["kneecap"], 4) if good["kneecap"] else None for a in ABLATIONS},
        "kneecap_restarts": k["restarts"], "kneecap_flaps": k["flaps"],
        "kneecap_cap_changes": cap_changes(k["decisions"]),
        "kneecap_mean_memory_fraction": k["mean_memory_fraction"],
        "oracle_settings": p["oracle"]["settings"],
        "cpu_s": round(time.process_time() - cpu0, 1),
    }


def markdown(rows: list[dict]) -> str:
    out = ["# Trace suite", "", __doc__.split("\n\n")[1].replace("\n", " "), "",
           "| trace | stresses | × | kneecap good/GPU-h | vs oracle | vs best baseline (which) | attainment kneecap / "
           "oracle / best | replicas kneecap / oracle | pods started | restarts | cap changes | memory fraction "
           "| replicas-only / knobs-only (× kneecap) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        a, m, b = r["attainment"], r["mean_replicas"], r["best_baseline"]
        out.append(f"| {r['trace']} | {r['stresses']} | {r['compress']} | {r['good_per_gpu_hour']['kneecap']:,.0f} "
                   f"| {r['vs_oracle']} | {r['vs_best_baseline']} ({b}) "
                   f"| {a['kneecap']:.5f} / {a['oracle']:.5f} / {a[b]:.5f} | {m['kneecap']:.2f} / {m['oracle']:.2f} "
                   f"| {r['pods_started']['kneecap']} | {r['kneecap_restarts']} | {r['kneecap_cap_changes']} "
                   f"| {r['kneecap_mean_memory_fraction']} "
                   f"| {r['ablations']['kneecap:replicas-only']} / {r['ablations']['kneecap:knobs-only']} |")
    return "\n".join(out) + "\n"


def code_version() -> str | None:
    """The checkout's short commit, with ``+dirty`` when it has uncommitted changes (None outside git)."""
    import subprocess

    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def merged_rows(parts: list[Path], order: list[str]) -> list[dict]:
    """The rows of partial JSONs (``--part``) written by runs side by side, in ``order`` of trace name."""
    by_name = {r["trace"]: r for part in parts for r in json.loads(part.read_text())["rows"]}
    return [by_name[name] for name in order if name in by_name]


# the trace served by a model whose KV cache, not its cap, bounds the batch at vLLM's memory
LARGE_MODEL = ("azure-conv 70B TP2",
               "Llama-3.1-70B on two H100s per replica (TP 2): vLLM's 0.9 leaves a KV cache of twenty "
               "conversations, 0.95 twice that (the memory knob)",
               replace(CONFIG, model="meta-llama/Llama-3.1-70B-Instruct", architecture="llama-3.1-70b",
                       tensor_parallel_size=2))


def cases(raw: Trace) -> list[tuple[str, str, Trace, int, ReplayConfig]]:
    """(name, what it stresses, trace, compression, config) of every trace of the suite: ``raw`` at
    ×1 to the least factor whose peak needs MOST_REPLICAS of the defaults, each variant at the
    least factor for a PEAK_REPLICAS peak, and ``raw`` served by LARGE_MODEL at its own."""
    out = [(f"azure-conv ×{factor}", "the trace itself at this compression", raw, factor, CONFIG)
           for factor in range(1, compression_for_peak(raw, CONFIG, MOST_REPLICAS) + 1)]
    for name, (stresses, variant) in SUITE.items():
        trace = variant(raw)
        out.append((name, stresses, trace, compression_for_peak(trace, CONFIG, PEAK_REPLICAS), CONFIG))
    name, stresses, cfg = LARGE_MODEL
    out.append((name, stresses, raw, compression_for_peak(raw, cfg, PEAK_REPLICAS), cfg))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--only", nargs="*", default=None, help="trace names to run (default all)")
    ap.add_argument("--part", type=Path, default=None, help="write this partial JSON instead of the results")
    ap.add_argument("--merge", nargs="*", type=Path, default=None, help="partial JSONs to merge into the results")
    args = ap.parse_args(argv)
    raw = read_trace(TRACE)
    suite = cases(raw)
    most = max(factor for name, _, _, factor, cfg in suite if name.startswith("azure-conv") and cfg is CONFIG)
    rows = []
    if args.merge is not None:  # the rows of parts run side by side (--only ... --part FILE), in suite order
        rows = merged_rows(args.merge, [name for name, *_ in suite])
    for name, stresses, trace, factor, cfg in suite if args.merge is None else ():
        if args.only is not None and name not in args.only:
            continue
        rows.append(row(name, stresses, trace, factor, cfg))
        print(json.dumps({k: rows[-1][k] for k in ("trace", "compress", "vs_oracle", "vs_best_baseline",
                                                    "kneecap_cap_changes", "cpu_s")}), flush=True)
    if args.part is not None:
        args.part.write_text(json.dumps({"rows": rows}, indent=1, sort_keys=True, default=str))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "trace_suite.json").write_text(json.dumps({"rows": rows, "most_replicas_compress": most,
                                                           "code": code_version(),
                                                           "config": dataclasses.asdict(CONFIG)},
                                                          indent=1, sort_keys=True, default=str))
    (args.out / "trace_suite.md").write_text(markdown(rows))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
