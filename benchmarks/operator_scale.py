"""Operator scale: one `kneecap run` process handling ≥ 200 LLMDeployments of 4 pods each.

The API is the embedded emulator (kneecap.demo.kubeapi, in this process); the pods are canned
metrics servers: a separate process runs a few twin engines (kneecap.sim.engine + the twin's
/metrics, fed seeded Poisson requests whose rate swings slowly with simulated time, so the
operator sees several batch levels and runs its whole loop: fit, BCA, GAUSS) on distinct ports.
Before the operator starts, each engine is run ahead in simulated time and its /metrics text
rendered at the end of every round (one control interval of simulated time); a pod's n-th
scrape reads round n. So the windows each resource sees, and with them the operator's SLIM
refits and GAUSS runs, are the same on any machine and in every run; the canned servers spend
no CPU while the operator is measured. Each of the 4·N pods points at one of them through its
`kneecap.io/metrics-url` annotation (`/metrics/<pod>`), so the operator scrapes 4·N URLs per
interval. The operator runs as its own process (`kneecap run --namespace scale`, kubeconfig
login); its CPU time (/proc/PID/stat) and resident memory (VmRSS) are sampled after a warm-up.

Reported: CPU seconds per reconcile interval (all resources), the fraction of one core that
is at a 30 s interval, and RSS, for each of --repeat runs (a fresh API and operator each) and
their median, with the machine (CPU model, cores) and its load average. Targets: ≤ 10% of one
core at 30 s, ≤ 300 MB.
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
import urllib.request
from pathlib import Path
from statistics import median, median_high


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _paths import RESULTS, ROOT  # noqa: E402

from kneecap.demo.clock import free_port  # noqa: E402
from kneecap.control import manifests  # noqa: E402
from kneecap.control.spec import parse_spec  # noqa: E402
from kneecap.demo.kubeapi import LLMD, KubeAPIThread  # noqa: E402
from kneecap.demo.kubelet import DEPLOY, add_owned_pod  # noqa: E402

NS = "scale"
CANNED = r"""
import asyncio, json, sys
import numpy as np
from aiohttp import web
from kneecap.model.arch import get_arch
from kneecap.model.hardware import get_gpu
from kneecap.sim.engine import Engine, engine_config
from kneecap.sim.metrics import TwinMetrics

TICK_S = 0.1  # simulated seconds per arrival batch

def pages(k, rate, round_s, rounds):
    # server k's /metrics text at the end of each round (round r = simulated time r * round_s)
    cfg = engine_config(get_arch("opt-1.3b"), get_gpu("h100-64gb"), max_num_seqs=[32, 64, 128, 256][k % 4])
    engine, metrics = Engine(cfg), TwinMetrics("facebook/opt-1.3b", cfg)
    rng = np.random.default_rng([0, k])
    ticks = round(round_s / TICK_S)
    out = []
    for r in range(rounds):
        if r:
            for i in range((r - 1) * ticks, r * ticks):
                t = i * TICK_S
                # the rate swings slowly (period 40-90 s simulated), so windows see different batch levels
                lam = rate * (0.1 + 0.9 * (1 + np.sin(2 * np.pi * t / (40 + 7 * k))) / 2)
                for a in np.sort(rng.uniform(t, t + TICK_S, rng.poisson(lam * TICK_S))):
                    metrics.on_request(engine.add_request(int(rng.integers(100, 300)), int(rng.integers(100, 300)),
                                                          arrival_s=float(a)))
                while engine.has_work() and engine.now_s < t + TICK_S:
                    metrics.on_step(engine.step())
        metrics.sim_time.set(r * round_s)
        out.append(metrics.render(engine))
    return out

async def main(rate, round_s, rounds, ports):
    seen, late = {}, {"n": 0}
    def server(k):
        book = pages(k, rate, round_s, rounds)
        async def page(request):  # the n-th scrape of a pod reads round n
            pod = request.match_info["pod"]
            n = seen.get(pod, 0)
            seen[pod] = n + 1
            late["n"] += n >= len(book)
            return web.Response(body=book[min(n, len(book) - 1)],
                                headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
        async def reset(request):
            seen.clear(); late["n"] = 0
            return web.Response(text="ok")
        async def stats(request):
            return web.json_response({"pods": len(seen), "scrapes": sum(seen.values()),
                                      "max_per_pod": max(seen.values(), default=0),
                                      "min_per_pod": min(seen.values(), default=0), "past_last_round": late["n"]})
        app = web.Application()
        app.router.add_get("/metrics/{pod}", page)
        app.router.add_post("/reset", reset)
        app.router.add_get("/stats", stats)
        return app
    for k, port in enumerate(ports):
        r = web.AppRunner(server(k), access_log=None); await r.setup()
        await web.TCPSite(r, "127.0.0.1", port).start()
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main(float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), [int(p) for p in sys.argv[4:]]))
"""


# the operator under cProfile on the main thread's CPU clock (wall time would count the
# machine's other load), enabled by SIGUSR1 and written to argv[1] on SIGUSR2
PROFILED = r"""
import cProfile, signal, sys, time
out, profile = sys.argv[1], cProfile.Profile(time.thread_time)
signal.signal(signal.SIGUSR1, lambda *_: profile.enable())
signal.signal(signal.SIGUSR2, lambda *_: (profile.disable(), profile.dump_stats(out)))
from kneecap.cli import main
sys.exit(main(sys.argv[2:]))
"""


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


def machine() -> dict:
    """What the figure was measured on: CPU model, cores, load."""
    model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    return {"cpu_model": model, "nproc": os.cpu_count()}


def canned_get(port: int, path: str, method: str = "GET") -> dict | str:
    with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method),
                                timeout=10) as resp:
        body = resp.read().decode()
    return json.loads(body) if body.startswith("{") else body


def measure(args, ports: list[int], env: dict, tmp: Path, run: int) -> dict:
    """One run: a fresh API with the resources, a fresh operator, warm-up, then the measured intervals."""
    canned_get(ports[0], "/reset", "POST")  # every pod's next scrape reads round 0 again
    op = None
    samples = []
    with KubeAPIThread() as kube:
        try:
            kube.add_namespace(NS)
            kubeconfig = kube.write_kubeconfig(tmp / "kubeconfig", NS, user="bench")
            t = time.monotonic()
            for i in range(args.resources):
                owner = kube.create(LLMD, llmd(i, args.interval))
                # the pool as a previous operator run left it: its Deployment, a ReplicaSet, the pods
                spec = parse_spec(owner["spec"])
                (pool,) = manifests.pools(owner["metadata"]["name"], spec)
                settings = manifests.initial_settings(spec, pool.role)
                deploy = kube.create(DEPLOY, manifests.deployment(owner, spec, pool, settings))
                for j in range(args.pods):
                    port = ports[(i * args.pods + j) % len(ports)]
                    pod = f"m{i:03d}-{j}"
                    add_owned_pod(kube, deploy, pod,
                                  annotations={"kneecap.io/metrics-url": f"http://127.0.0.1:{port}/metrics/{pod}"})
            print(f"{args.resources} LLMDeployments, {args.resources * args.pods} pods in the API "
                  f"[{time.monotonic() - t:.0f}s]", flush=True)
            argv = ["run", "--namespace", NS, "--standalone", *(["--tick", str(args.tick)] if args.tick else [])]
            entry = ["-c", PROFILED, str(args.profile), *argv] if args.profile else ["-m", "kneecap", *argv]
            op = subprocess.Popen([sys.executable, *entry],
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
            if args.profile:
                op.send_signal(signal.SIGUSR1)  # profile the measured intervals only
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
            if args.profile:
                op.send_signal(signal.SIGUSR2)
                time.sleep(5)
            if args.dump:
                dump = args.dump.with_name(f"{args.dump.stem}.run{run + 1}{args.dump.suffix}")
                dump.write_text(json.dumps(items, indent=1))
        finally:
            if op is not None and op.poll() is None:
                op.send_signal(signal.SIGTERM)
                try:
                    op.wait(30)
                except subprocess.TimeoutExpired:
                    op.kill()
    decided = [o for o in items if ((o or {}).get("status") or {}).get("lastDecision")]
    calibrated = [o for o in decided if (o["status"].get("calibration") or {}).get("parameters")]
    cpu_per_interval = (c1 - c0) / ((w1 - w0) / args.interval)
    prev = c0
    for smp in samples:
        smp["cpu_s_interval"], prev = smp["cpu_s"] - prev, smp["cpu_s"]
    return {"measured_wall_s": w1 - w0, "cpu_s_measured": c1 - c0,
            "cpu_s_per_interval": cpu_per_interval, "core_fraction_at_30s": cpu_per_interval / 30.0,
            "rss_mb_max": max(s["rss_mb"] for s in samples), "samples": samples, "warmup_intervals": warmup,
            "resources_with_decision": len(decided), "resources_calibrated": len(calibrated),
            # why each resource's calibration is what it is at the end (refit or kept)
            "calibrated_reasons": _reasons(decided),
            # every pod's n-th scrape reads round n: a pod scraped past the last round reads it again
            "scrapes": canned_get(ports[0], "/stats"),
            # steady state: the ring is full, so each status (re-sent every tick) has its full size
            "observation_ring_median": median_high(len(o["status"].get("observations") or []) for o in decided)
            if decided else 0,
            "status_bytes_median": median_high(len(json.dumps(o["status"])) for o in decided) if decided else 0}


def _tallies(smp: dict) -> str:
    return (", ".join(f"{n} {v}" for v, n in sorted(((v, n) for n, v in smp["calibration"].items()), reverse=True))
            + f" | {smp['gauss']['run']} / {smp['gauss']['reused']}")


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
    ap.add_argument("--repeat", type=int, default=3, help="runs (fresh API and operator each); the median is stated")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for operator_scale.{md,json}")
    ap.add_argument("--profile", type=Path, help="profile the operator's measured intervals (main-thread CPU time), stats to this file")
    ap.add_argument("--tick", type=float, help="the operator's --tick (default: its own default)")
    ap.add_argument("--dump", type=Path,
                    help="write the LLMDeployments as each run ends (JSON) to this file, .runN before the suffix")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat: expected a run count ≥ 1")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "operator"))
    ports = [free_port() for _ in range(args.servers)]
    # rounds of simulated traffic: one per interval, with room for a tick that scrapes twice
    rounds = args.warmup_intervals + args.intervals + 6
    here = {"machine": machine(), "loadavg_start": os.getloadavg()}
    t = time.monotonic()
    canned = subprocess.Popen([sys.executable, "-c", CANNED, "20", str(args.interval), str(rounds), *map(str, ports)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    runs = []
    try:
        if canned.stdout.readline().strip() != "ready":
            raise SystemExit("the canned metrics servers did not start")
        print(f"{args.servers} canned servers, {rounds} rounds of {args.interval:g} s simulated traffic "
              f"[{time.monotonic() - t:.0f}s]", flush=True)
        for r in range(args.repeat):
            tmp = Path(tempfile.mkdtemp(prefix="kneecap-scale-"))
            runs.append(measure(args, ports, env, tmp, r))
            print(f"run {r + 1}: {runs[-1]['cpu_s_per_interval']:.2f} CPU-s per interval, "
                  f"{runs[-1]['rss_mb_max']:.0f} MB", flush=True)
    finally:
        canned.terminate()
        canned.wait(10)
    here["loadavg_end"] = os.getloadavg()
    cpu = median([r["cpu_s_per_interval"] for r in runs])
    rss = median([r["rss_mb_max"] for r in runs])
    out = {"resources": args.resources, "pods_per_resource": args.pods, "canned_servers": args.servers,
           "interval_s": args.interval, "warmup_intervals": args.warmup_intervals, "intervals": args.intervals,
           **here, "repeat": args.repeat,
           "cpu_s_per_interval_median": cpu, "core_fraction_at_30s_median": cpu / 30.0, "rss_mb_max_median": rss,
           "targets": {"core_fraction_at_30s": 0.10, "rss_mb": 300},
           "meets": {"cpu": cpu / 30.0 <= 0.10, "rss": rss <= 300},
           # the counters each resource sees are the same in every run; the window lengths are wall-clock
           "tallies_identical": len({tuple(_tallies(s) for s in r["samples"]) for r in runs}) == 1,
           "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "operator_scale.json").write_text(json.dumps(out, indent=1))
    last = runs[-1]
    md = ["# Operator scale: one `kneecap run` process", "",
          f"{args.resources} LLMDeployments × {args.pods} pods (scraped through {args.servers} canned twin-metrics "
          f"servers), control interval {args.interval:g} s, {args.intervals} intervals measured after "
          f"{args.warmup_intervals} of warm-up; {args.repeat} runs, each with a fresh API and operator. "
          f"Machine: {here['machine']['cpu_model']}, {here['machine']['nproc']} CPUs; load average "
          f"{'/'.join(f'{x:.2f}' for x in here['loadavg_start'])} at the start, "
          f"{'/'.join(f'{x:.2f}' for x in here['loadavg_end'])} at the end.", "",
          "| metric | median of the runs | runs | target | met |", "|---|---|---|---|---|",
          f"| CPU seconds per reconcile interval (all resources) | {cpu:.2f} s | "
          + ", ".join(f"{r['cpu_s_per_interval']:.2f}" for r in runs) + " | | |",
          f"| share of one core at a 30 s interval | {cpu / 30:.1%} | "
          + ", ".join(f"{r['core_fraction_at_30s']:.1%}" for r in runs)
          + f" | ≤ 10% | {'yes' if out['meets']['cpu'] else '**no**'} |",
          f"| resident memory (max) | {rss:.0f} MB | " + ", ".join(f"{r['rss_mb_max']:.0f}" for r in runs)
          + f" | ≤ 300 MB | {'yes' if out['meets']['rss'] else '**no**'} |",
          f"| resources with a decision / calibrated (last run) | {last['resources_with_decision']} / "
          f"{last['resources_calibrated']} of {args.resources} | | | |",
          f"| observation ring / status size (median, last run) | {last['observation_ring_median']} windows / "
          f"{last['status_bytes_median'] / 1024:.1f} KiB | | | |", "",
          "The traffic is a function of simulated time, not of this machine: each canned server's twin engine "
          "is run ahead (seeded Poisson arrivals whose rate swings with simulated time) and its /metrics page "
          "rendered once per round, and a pod's n-th scrape reads round n. So every run sees the same request "
          "counts, lengths and batch levels per window, and the canned servers use no CPU while the operator is "
          "measured. What still follows the wall clock is each window's length (the operator times its scrapes), "
          "so rates differ by the lateness of its ticks, and a decision near a threshold (GAUSS reused within "
          "2.5%, keep or refit) can go either way. Calibration steps and GAUSS runs identical in every run: "
          f"{'yes' if out['tallies_identical'] else '**no**'}; scrapes past the last round: "
          + ", ".join(str(r["scrapes"]["past_last_round"]) for r in runs) + ".", "",
          "Each measured interval's calibration steps and GAUSS runs (from the resources' status at its end), "
          "CPU seconds per run:", "",
          "| interval | CPU s (each run) | calibration | GAUSS run / reused |", "|---|---|---|---|"]
    for k, smp in enumerate(last["samples"]):
        same = all(_tallies(r["samples"][k]) == _tallies(smp) for r in runs)
        md.append(f"| {k + 1} | " + ", ".join(f"{r['samples'][k]['cpu_s_interval']:.2f}" for r in runs)
                  + f" | {_tallies(smp)} |" + ("" if same else " (differs between runs)"))
    md += ["", "CPU per warm-up interval (operator start, scrapes priming, first SLIM fits), each run:", ""]
    md += [f"- run {i + 1}: " + ", ".join(f"{w['cpu_s']:.1f}" for w in r["warmup_intervals"]) + " s"
           for i, r in enumerate(runs)]
    md += ["", "History: 17.7 CPU-s per interval and 462 MB (commit 95e3cf2: half in prometheus-client's parser, "
           "the rest in SLIM refits); 6.5 s at the first landing (438e5fd). Since then: GAUSS runs reused while their "
           "inputs stay within 2.5%; a refit that cannot beat the fit is remembered and a batch beyond the fitted "
           "range refits only when the fit misses it; parse + window 3x cheaper (benchmarks/observe_speed.py); "
           "ticks reconcile Deployments only and parse the spec once per generation; --tick 10 s; the status is "
           "written with one merge patch without reading the object back; observationHistory 24 by default; "
           "uvloop; 2.99 s (10.0%) at bc380fb. Then: ticks read Deployments, pods and HPAs from watch-backed "
           "caches (no API reads per tick) and API bodies are encoded with orjson: 2.35 s (7.8%) in one run and "
           "4.19 s (14.0%) in another on a machine of the same kind, when the canned servers advanced their "
           "engines on the wall clock (so the traffic, and with it the refits and GAUSS runs, depended on how "
           "fast and how busy the machine was) and rendered every page per scrape. With the traffic fixed in simulated time: 3.24 s (10.8%) in one run at "
           "load average < 1; then kneecap's own kopf diff-base storage (kopf deep-copied the whole object, status and "
           "managedFields included, on every watch event) and Deployments found in sync not compared again until "
           "they or the spec change.", ""]
    (args.out / "operator_scale.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
