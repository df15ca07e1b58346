"""Operator scale: one `kneecap run` process handling ≥ 200 LLMDeployments of 4 pods each.

The API is the embedded emulator (kneecap.demo.kubeapi, in this process); the pods are canned
metrics servers: a separate process runs a few twin engines (kneecap.sim.engine + the twin's
/metrics, fed Poisson requests in simulated time without HTTP) on distinct ports, so each
pod's /metrics is real twin text whose counters advance (the request rate swings slowly, so
the operator sees several batch levels and runs its whole loop: fit, BCA, GAUSS). Each of the 4·N pods points at one of
them through its `kneecap.io/metrics-url` annotation, so the operator scrapes 4·N URLs per
interval. The operator runs as its own process (`kneecap run --namespace scale`, kubeconfig
login); its CPU time (/proc/PID/stat) and resident memory (VmRSS) are sampled after a warm-up.

Reported: CPU seconds per reconcile interval (all resources), the fraction of one core that
is at a 30 s interval, and RSS. Targets: ≤ 10% of one core at 30 s, ≤ 300 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median_high


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _paths import RESULTS, ROOT  # noqa: E402

from kneecap.demo.clock import free_port  # noqa: E402
from kneecap.control import manifests as M  # noqa: E402
from kneecap.control.spec import parse_spec  # noqa: E402
from kneecap.demo.kubeapi import LLMD, KubeAPIThread  # noqa: E402
from kneecap.demo.kubelet import DEPLOY, add_owned_pod  # noqa: E402

NS = "scale"
CANNED = r'''
import asyncio, sys
import numpy as np
from aiohttp import web
from kneecap.model.arch import get_arch
from kneecap.model.hardware import get_gpu
from kneecap.sim.engine import engine_config
from kneecap.sim.server import TwinServer

async def main(ports, rate, scale):
    runners = []
    for k, port in enumerate(ports):
        cap = [32, 64, 128, 256][k % 4]
        srv = TwinServer(engine_config(get_arch("opt-1.3b"), get_gpu("h100-64gb"), max_num_seqs=cap),
                         ["facebook/opt-1.3b"], time_scale=scale)
        app = srv.app()
        r = web.AppRunner(app, access_log=None); await r.setup()
        await web.TCPSite(r, "127.0.0.1", port).start()
        runners.append(srv)
    rng = np.random.default_rng(0)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    while True:  # Poisson requests straight into each engine (no HTTP), 0.1 s wall ticks
        await asyncio.sleep(0.1)
        t = loop.time() - t0
        for k, srv in enumerate(runners):
            # the rate swings slowly (period 40-90 s), so windows see different batch levels
            lam = rate * (0.1 + 0.9 * (1 + np.sin(2 * np.pi * t / (40 + 7 * k))) / 2)
            for _ in range(rng.poisson(lam * 0.1 * scale)):
                req = srv.engine.add_request(int(rng.integers(100, 300)), int(rng.integers(100, 300)),
                                             arrival_s=srv.sim_now())
                srv.metrics.on_request(req)
            srv._wake.set()

asyncio.run(main([int(p) for p in sys.argv[3:]], float(sys.argv[1]), float(sys.argv[2])))
'''


def llmd(i: int, interval_s: float) -> dict:
    return {"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": f"m{i:03d}", "namespace": NS},
            "spec": {"model": {"name": "facebook/opt-1.3b"}, "accelerator": {"type": "h100-64gb"},
                     "engine": {"image": "vllm/vllm-openai:v0.11.0", "maxNumSeqs": 128},
                     "topology": {"replicas": {"min": 4, "max": 4}},
                     "slo": {"tpotSeconds": 0.05},
                     "control": {"mode": "advise", "interval": f"{interval_s:g}s", "window": f"{interval_s:g}s"}}}


def proc_cpu_s(pid: int) -> float:
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def proc_rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reasons(items: list[dict]) -> dict[str, int]:
    """Each resource's last calibration step: kept (not refitted), or refitted and why."""
    out: dict[str, int] = {}
    for o in items:
        c = next((c for c in (o.get("status") or {}).get("conditions") or [] if c.get("type") == "Calibrated"), {})
        msg = c.get("message") or ""
        if "not refitted" in msg:
            key = "kept, not refitted"
        elif "(refitted: " in msg:
            why = msg.split("(refitted: ", 1)[1]
            trigger = next((t for t in ("error on the ring grew", "beyond the fitted range", "the ring grew",
                                        "is older than", "no fitted batch range") if t in why), why[:40])
            key = f"{c.get('reason')} after a refit ({trigger})"
        else:
            key = str(c.get("reason"))
        out[key] = out.get(key, 0) + 1
    return out


def _gauss_reused(items: list[dict]) -> dict[str, int]:
    """Each resource's last replica decision: GAUSS run, or a previous run reused."""
    out = {"reused": 0, "run": 0}
    for o in items:
        alloc = (o.get("status") or {}).get("allocation") or {}
        if "gaussRunReused" in alloc:
            out["reused" if alloc["gaussRunReused"] else "run"] += 1
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--resources", type=int, default=200)
    ap.add_argument("--pods", type=int, default=4)
    ap.add_argument("--servers", type=int, default=8, help="canned metrics servers (distinct ports)")
    ap.add_argument("--interval", type=float, default=30.0, help="spec.control.interval, seconds")
    ap.add_argument("--intervals", type=int, default=3, help="intervals measured after the warm-up")
    ap.add_argument("--warmup-intervals", type=int, default=26,
                    help="intervals before measuring: the first windows prime the scrapes and fit SLIM from scratch; "
                         "by 26 the observation ring (24 by default) is full, so the status has its steady size")
    ap.add_argument("--profile", type=Path, help="run the operator under cProfile, stats to this file")
    ap.add_argument("--tick", type=float, help="the operator's --tick (default: its own default)")
    ap.add_argument("--dump", type=Path, help="write the LLMDeployments as they end (JSON) to this file")
    args = ap.parse_args(argv)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "operator"))
    ports = [free_port() for _ in range(args.servers)]
    canned = subprocess.Popen([sys.executable, "-c", CANNED, "20", "1", *map(str, ports)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tmp = Path(tempfile.mkdtemp(prefix="kneecap-scale-"))
    op = None
    samples = []
    try:
        with KubeAPIThread() as kube:
            kube.add_namespace(NS)
            kubeconfig = kube.write_kubeconfig(tmp / "kubeconfig", NS, user="bench")
            t = time.monotonic()
            for i in range(args.resources):
                owner = kube.create(LLMD, llmd(i, args.interval))
                # the pool as a previous operator run left it: its Deployment, a ReplicaSet, the pods
                spec = parse_spec(owner["spec"])
                (pool,) = M.pools(owner["metadata"]["name"], spec)
                deploy = kube.create(DEPLOY, M.deployment(owner, spec, pool, M.initial_settings(spec, pool.role)))
                for j in range(args.pods):
                    port = ports[(i * args.pods + j) % len(ports)]
                    add_owned_pod(kube, deploy, f"m{i:03d}-{j}",
                                  annotations={"kneecap.io/metrics-url": f"http://127.0.0.1:{port}/metrics"})
            print(f"{args.resources} LLMDeployments, {args.resources * args.pods} pods in the API "
                  f"[{time.monotonic() - t:.0f}s]", flush=True)
            prof = ["-m", "cProfile", "-o", str(args.profile)] if args.profile else []
            op = subprocess.Popen([sys.executable, *prof, "-m", "kneecap", "run", "--namespace", NS, "--standalone",
                                   *(["--tick", str(args.tick)] if args.tick else [])],
                                  env=dict(env, KUBECONFIG=str(kubeconfig)),
                                  stdout=open(tmp / "operator.log", "wb"), stderr=subprocess.STDOUT)
            t0 = time.monotonic()
            warmup, c_prev = [], 0.0
            for k in range(args.warmup_intervals):  # CPU of each warm-up interval, reported too
                time.sleep(args.interval)
                c = proc_cpu_s(op.pid)
                warmup.append({"t_s": time.monotonic() - t0, "cpu_s": c - c_prev, "rss_mb": proc_rss_mb(op.pid)})
                c_prev = c
                print(f"warm-up interval {k + 1}: cpu {warmup[-1]['cpu_s']:.1f}s, rss {warmup[-1]['rss_mb']:.0f} MB",
                      flush=True)
            c0, w0 = proc_cpu_s(op.pid), time.monotonic()
            for k in range(args.intervals):
                time.sleep(args.interval)
                samples.append({"t_s": time.monotonic() - t0, "cpu_s": proc_cpu_s(op.pid),
                                "rss_mb": proc_rss_mb(op.pid)})
                items = [kube.get(LLMD, NS, f"m{i:03d}") or {} for i in range(args.resources)]
                samples[-1].update(calibration=_reasons(items), gauss=_gauss_reused(items))
                print(f"interval {k + 1}: cpu {samples[-1]['cpu_s'] - c0:.1f}s since warm-up, "
                      f"rss {samples[-1]['rss_mb']:.0f} MB; calibration {samples[-1]['calibration']}, "
                      f"GAUSS {samples[-1]['gauss']}", flush=True)
            c1, w1 = proc_cpu_s(op.pid), time.monotonic()
            if args.dump:
                args.dump.write_text(json.dumps(items, indent=1))
    finally:
        if op is not None and op.poll() is None:
            op.send_signal(signal.SIGTERM)
            try:
                op.wait(30)
            except subprocess.TimeoutExpired:
                op.kill()
        canned.terminate()
        canned.wait(10)
    decided = [o for o in items if ((o or {}).get("status") or {}).get("lastDecision")]
    calibrated = [o for o in decided if (o["status"].get("calibration") or {}).get("parameters")]
    cpu_per_interval = (c1 - c0) / ((w1 - w0) / args.interval)
    out = {"resources": args.resources, "pods_per_resource": args.pods, "canned_servers": args.servers,
           "interval_s": args.interval, "measured_wall_s": w1 - w0, "cpu_s_measured": c1 - c0,
           "cpu_s_per_interval": cpu_per_interval, "core_fraction_at_30s": cpu_per_interval / 30.0,
           "rss_mb_max": max(s["rss_mb"] for s in samples), "samples": samples, "warmup_intervals": warmup,
           "resources_with_decision": len(decided), "resources_calibrated": len(calibrated),
           "targets": {"core_fraction_at_30s": 0.10, "rss_mb": 300},
           # why each resource's calibration is what it is at the end (refit or kept)
           "calibrated_reasons": _reasons(decided),
           # steady state: the ring is full, so each status (re-sent every tick) has its full size
           "observation_ring_median": median_high(len(o["status"].get("observations") or []) for o in decided)
           if decided else 0,
           "status_bytes_median": median_high(len(json.dumps(o["status"])) for o in decided) if decided else 0}
    out["meets"] = {"cpu": out["core_fraction_at_30s"] <= 0.10, "rss": out["rss_mb_max"] <= 300}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "operator_scale.json").write_text(json.dumps(out, indent=1))
    md = ["# Operator scale: one `kneecap run` process", "",
          f"{args.resources} LLMDeployments × {args.pods} pods (scraped through {args.servers} canned twin-metrics "
          f"servers), control interval {args.interval:g} s, {args.intervals} intervals measured after "
          f"{args.warmup_intervals} of warm-up.", "",
          "| metric | measured | target | met |", "|---|---|---|---|",
          f"| CPU seconds per reconcile interval (all resources) | {cpu_per_interval:.2f} s | | |",
          f"| share of one core at a 30 s interval | {out['core_fraction_at_30s']:.1%} | ≤ 10% | "
          f"{'yes' if out['meets']['cpu'] else '**no**'} |",
          f"| resident memory (max) | {out['rss_mb_max']:.0f} MB | ≤ 300 MB | {'yes' if out['meets']['rss'] else '**no**'} |",
          f"| resources with a decision / calibrated | {len(decided)} / {len(calibrated)} of {args.resources} | | |",
          f"| observation ring / status size (median) | {out['observation_ring_median']} windows / "
          f"{out['status_bytes_median'] / 1024:.1f} KiB | | |", "",
          "CPU per warm-up interval (operator start, scrapes priming, first SLIM fits): "
          + ", ".join(f"{w['cpu_s']:.1f}" for w in warmup) + " s.", "",
          "Each measured interval's calibration steps and GAUSS runs (from the resources' status at its end):", "",
          "| interval | CPU s | calibration | GAUSS run / reused |", "|---|---|---|---|"]
    prev = c0
    for k, smp in enumerate(samples):
        md.append(f"| {k + 1} | {smp['cpu_s'] - prev:.2f} | "
                  + ", ".join(f"{n} {v}" for v, n in sorted(((v, n) for n, v in smp['calibration'].items()),
                                                             reverse=True))
                  + f" | {smp['gauss']['run']} / {smp['gauss']['reused']} |")
        prev = smp["cpu_s"]
    md += ["", "History: 17.7 CPU-s per interval and 462 MB (commit 95e3cf2: half in prometheus-client's parser, "
           "the rest in SLIM refits); 6.5 s at the first landing (438e5fd). Since then: GAUSS runs reused while their "
           "inputs stay within 2.5%; a refit that cannot beat the fit is remembered and a batch beyond the fitted "
           "range refits only when the fit misses it; parse + window 3x cheaper (benchmarks/observe_speed.py); "
           "ticks reconcile Deployments only and parse the spec once per generation; --tick 10 s; the status is "
           "written with one merge patch without reading the object back; observationHistory 24 by default; "
           "uvloop; 2.99 s (10.0%) at bc380fb. Then: ticks read Deployments, pods and HPAs from watch-backed "
           "caches (no API reads per tick) and API bodies are encoded with orjson; an earlier run of that code, "
           "3 intervals: 2.67 s (8.9%, 28 refits in its first interval).", ""]
    (RESULTS / "operator_scale.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
