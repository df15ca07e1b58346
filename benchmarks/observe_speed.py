"""Observe-path speed: µs per call of the operator's per-pod work each interval.

Per pod and interval the operator parses one /metrics page with the window filter
(``parse_metrics(text, keep=WINDOW_FAMILIES)``), and per window it turns each pod's scrapes into
deltas (``window_deltas(prev, cur, between, cache=)``, its bucket plans kept across windows) and
merges a pool's pods (``combine``). Timed on

- ``vllm``: the real vLLM 0.32 captures (tests/fixtures/vllm-metrics). Each capture is a
  server's totals since start; its window opens on a copy with every vLLM sample zeroed (the same
  series, counters advanced to the capture, as in tests/unit/test_observe_window.py), with the
  capture itself as the one scrape in between. The pool: the three captures + the first again.
- ``twin``: /metrics text of four digital-twin engines (kneecap.sim, opt-1.3b on h100-64gb,
  max_num_seqs 32/64/128/256, the engines benchmarks/operator_scale.py serves) fed the same
  Poisson requests in simulated time, rendered at 30 s (prev), 45 s (between) and 60 s (cur).

Steady state: every page is parsed once before timing (the series cache is warm, as in the
operator after its first interval). Each figure is the median over repeats of the mean of a
batch of calls. ``--label before|after`` stores the run under that label in
benchmarks/results/observe_speed.json (other labels kept) and writes the table of all labels to
observe_speed.md; each run also stores the observations it computed and a digest of its pages,
and a run whose observations differ from the stored ``before`` ones on the same pages says so
(and exits 1). To time older code under the same load, run this script from an export of that
commit (``git archive <commit> operator benchmarks tests``, with this file and
tests/support/capture_windows.py copied in) with ``--label before --code <commit>`` and move
that run into this results file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from _paths import RESULTS, VLLM_CAPTURES  # noqa: E402

from kneecap.control.loop import WINDOW_FAMILIES  # noqa: E402
from kneecap.model.arch import get_arch  # noqa: E402
from kneecap.model.hardware import get_gpu  # noqa: E402
from kneecap.observe.scrape import ParseCache, parse_metrics  # noqa: E402
from kneecap.observe.window import HistogramCache, NoObservation, combine, window_deltas  # noqa: E402
from kneecap.sim.engine import Engine, engine_config  # noqa: E402
from kneecap.sim.metrics import TwinMetrics  # noqa: E402
from tests.support.capture_windows import zeroed  # noqa: E402

CAPTURES = ("vllm-0.32-cpu-20req.txt", "vllm-0.32-cpu-kv-saturated.txt", "vllm-0.32-cpu-run4.txt")
T0_S, T1_S = 1000.0, 1010.0


def vllm_pods() -> list[tuple[str, str, str]]:
    """(prev, between, cur) page texts of four pods from the real captures."""
    texts = [(VLLM_CAPTURES / n).read_text() for n in CAPTURES]
    return [(zeroed(t), t, t) for t in (*texts, texts[0])]


def twin_pods(rate_rps: float = 20.0, seed: int = 0) -> list[tuple[str, str, str]]:
    """(prev, between, cur) /metrics texts of four twin engines at 30, 45 and 60 s simulated."""
    rng = np.random.default_rng(seed)
    n = rng.poisson(rate_rps * 60.0)
    arrivals_s = np.sort(rng.uniform(0.0, 60.0, n))
    prompts, outputs = rng.integers(100, 300, n), rng.integers(100, 300, n)
    pods = []
    for cap in (32, 64, 128, 256):
        cfg = engine_config(get_arch("opt-1.3b"), get_gpu("h100-64gb"), max_num_seqs=cap)
        engine, metrics = Engine(cfg), TwinMetrics("facebook/opt-1.3b", cfg)
        for a, p, o in zip(arrivals_s, prompts, outputs):
            metrics.on_request(engine.add_request(int(p), int(o), arrival_s=float(a)))
        pages = []
        for until_s in (30.0, 45.0, 60.0):
            while engine.has_work() and engine.now_s < until_s:
                res = engine.step()
                if res is not None:
                    metrics.on_step(res)
            pages.append(metrics.render(engine).decode())
        pods.append(tuple(pages))
    return pods


def per_call_us(fn, calls: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean µs of ``calls`` calls of ``fn``."""
    out = []
    for _ in range(repeats):
        t = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter_ns() - t) / calls / 1e3)
    return statistics.median(out)


def _plain(o) -> dict | str:
    return o.code if isinstance(o, NoObservation) else {k: v for k, v in o.__dict__.items()}


def measure(pods: list[tuple[str, str, str]], repeats: int) -> dict:
    texts = [t for pod in pods for t in pod]
    cache = ParseCache()  # the loop's: one for every scrape
    plans = HistogramCache()  # the loop's: one for every window
    snaps = [tuple(parse_metrics(t, t_s=ts, keep=WINDOW_FAMILIES, cache=cache)
                   for t, ts in zip(pod, (T0_S, (T0_S + T1_S) / 2, T1_S)))
             for pod in pods]  # also warms the series cache
    size = statistics.mean(len(t.encode()) for t in texts)

    def parse_all():
        for t in texts:
            parse_metrics(t, t_s=T1_S, keep=WINDOW_FAMILIES, cache=cache)

    def deltas_all():
        return [window_deltas(p, c, (b,), cache=plans) for p, b, c in snaps]

    parts = deltas_all()
    bad = [d.code for d in parts if isinstance(d, NoObservation)]
    if bad:
        raise SystemExit(f"window_deltas gave no window: {bad}")

    def pool():
        return combine(deltas_all())

    parse_us = per_call_us(parse_all, 5, repeats) / len(texts)
    deltas_us = per_call_us(deltas_all, 10, repeats) / len(pods)
    combine_us = per_call_us(lambda: combine(parts), 20, repeats)
    pool_us = per_call_us(pool, 10, repeats)
    return {
        "pods": len(pods),
        "page_bytes": round(size),
        "pages_sha256": hashlib.sha256("\0".join(texts).encode()).hexdigest(),
        "kept_series": sum(len(s) for s in snaps[0][2].series.values()),
        "parse_us": round(parse_us, 1),
        "window_deltas_us": round(deltas_us, 1),
        "combine_pool_us": round(combine_us, 1),
        "window_per_pod_us": round(pool_us / len(pods), 1),  # 4 window_deltas + combine, / 4
        "observe_per_pod_us": round(parse_us + pool_us / len(pods), 1),
        "observation": _plain(pool()),
    }


def same_pages(a: dict, b: dict) -> bool:
    """Whether two runs read the same pages (by digest; a run stored without one, by size)."""
    if "pages_sha256" in a and "pages_sha256" in b:
        return a["pages_sha256"] == b["pages_sha256"]
    return a["page_bytes"] == b["page_bytes"]


COLUMNS = (("parse_us", "parse µs"), ("window_deltas_us", "window_deltas µs"),
           ("combine_pool_us", "combine(4) µs"), ("window_per_pod_us", "window µs/pod"),
           ("observe_per_pod_us", "parse+window µs/pod"))


def table(runs: dict) -> str:
    head = "| data | label | " + " | ".join(c for _, c in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (2 + len(COLUMNS))]
    for data in ("vllm", "twin"):
        for label, run in runs.items():
            r = run["data"][data]
            lines.append(f"| {data} | {label} | " + " | ".join(f"{r[k]:.1f}" for k, _ in COLUMNS) + " |")
        if "before" in runs and len(runs) > 1:
            b = runs["before"]["data"][data]
            for label, run in runs.items():
                if label != "before":
                    r = run["data"][data]
                    lines.append(f"| {data} | speed-up {label} | "
                                 + " | ".join(f"{b[k] / r[k]:.2f}×" for k, _ in COLUMNS) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--label", default="after", help="name this run is stored under (before, after, ...)")
    ap.add_argument("--repeats", type=int, default=31)
    ap.add_argument("--code", default="", help="which code this run timed (e.g. a commit), stored with it")
    args = ap.parse_args(argv)
    data = {"vllm": measure(vllm_pods(), args.repeats), "twin": measure(twin_pods(), args.repeats)}
    path = RESULTS / "observe_speed.json"
    runs = json.loads(path.read_text())["runs"] if path.exists() else {}
    runs[args.label] = {"data": data, "python": sys.version.split()[0], "code": args.code,
                        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    identical = {d: (runs["before"]["data"][d]["observation"] == data[d]["observation"]
                     if same_pages(runs["before"]["data"][d], data[d]) else None)
                 for d in data} if "before" in runs else {}
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"runs": runs, "identical_to_before": identical}, indent=1) + "\n")
    md = table(runs)
    note = ("µs per call, median of repeats, warm series cache. parse: one page with the window filter; "
            "window µs/pod: (4 × window_deltas + combine of the 4) / 4. "
            f"Pages: vllm {data['vllm']['page_bytes']} B, twin {data['twin']['page_bytes']} B (mean). "
            f"Observations identical to 'before': {identical or 'n/a'} (None: the pages differ from the ones "
            "'before' read, rendered by a twin that has changed since, so there is nothing to compare). "
            + " ".join(f"{label}: {run['code']}." for label, run in runs.items() if run.get("code")))
    (RESULTS / "observe_speed.md").write_text("# Observe-path speed\n\n" + md + "\n\n" + note + "\n")
    print(md)
    print(note)
    return 1 if False in identical.values() else 0


if __name__ == "__main__":
    raise SystemExit(main())
