"""`kneecap load --trace` as a process against a `kneecap twin` process: what the twin counted is the trace."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.support.twins import KNEECAP, ROOT, Twin

TRACE = [(0.0, 40, 6), (0.6, 90, 3), (1.0, 15, 9), (1.9, 64, 4), (2.4, 120, 7)]  # arrival_s, input, output


def _load(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "operator"))
    return subprocess.run([*KNEECAP, "load", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def _samples(url: str) -> dict:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if not s.labels.get("le") and s.labels.get("finished_reason") in (None, "length")}


def test_trace_replay_sends_the_trace_and_bad_traces_exit_2(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n" + "".join(f"{a},{i},{o}\n" for a, i, o in TRACE))
    twin = Twin("facebook/opt-1.3b", "opt-1.3b", "h100-64gb", 8, 10.0).start()
    try:
        done = _load(twin.url, "--trace", str(trace), "--compress", "2", "--time-scale", "10", "--sim-clock",
                     "--json")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        m = _samples(twin.url)
    finally:
        twin.stop()
    assert report["clock"] == "sim" and report["sent"] == report["completed"] == len(TRACE)
    assert report["duration_s"] == 1.2 and report["elapsed_s"] >= 1.2
    assert report["prompt_tokens_total"] == sum(i for _, i, _ in TRACE)
    assert report["completion_tokens_total"] == sum(o for _, _, o in TRACE)
    assert set(report["send_lateness_s"]) == {"p99", "max"}
    # the twin counted exactly the trace's requests and tokens
    assert m["vllm:request_success_total"] == len(TRACE)
    assert m["vllm:prompt_tokens_total"] == sum(i for _, i, _ in TRACE)
    assert m["vllm:generation_tokens_total"] == sum(o for _, _, o in TRACE)
    assert m["vllm:request_params_max_tokens_sum"] == sum(o for _, _, o in TRACE)

    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,input_tokens,output_tokens\n0,10,5\n1,10,five\n")
    done = _load("http://127.0.0.1:9", "--trace", str(bad))
    assert done.returncode == 2 and f"{bad}:3 column output_tokens" in done.stderr and "integer" in done.stderr
