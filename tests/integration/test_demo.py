"""`kneecap demo`'s harness end to end: a short run, its summary checked against the API's objects.

The run is real: the emulated API, the operator (kopf, enforce mode), `kneecap twin` pods run
by the demo's node, `kneecap load` through the router. Simulated time runs 5× the wall clock
when the CPU keeps up; on a busy machine the twins' clocks fall behind and the whole demo
follows them, so what is asserted here does not depend on how busy the machine is (only the
wall time does).
"""

from __future__ import annotations

import json

import pytest

from kneecap.control import vllm_args
from kneecap.control.manifests import vllm_container
from kneecap.demo.harness import DemoConfig, run_demo
from kneecap.demo.twin_node import twin_argv
from kneecap.emulation.workloads import template_hash
from kneecap.demo.report import plot, row_line, summary_text, template_changes
from kneecap.errors import InputError

pytestmark = pytest.mark.slow


def flags(deploy: dict) -> tuple[int, float]:
    c = vllm_container(deploy)
    return (int(vllm_args.container_flag(c, "--max-num-seqs")),
            float(vllm_args.container_flag(c, "--gpu-memory-utilization")))


def test_short_demo_summary_matches_the_api_objects(tmp_path):
    cfg = DemoConfig(duration_s=160.0, time_scale=5.0, interval_s=10.0, cooldown_s=120.0, warmup_intervals=2)
    lines, warnings = [], []
    res = run_demo(cfg, on_row=lambda r: lines.append(row_line(r)), log_dir=tmp_path, on_warning=warnings.append)
    s = res.summary
    print(summary_text(s))
    # the summary's converged settings are the Deployment's args at the end
    assert (s["converged_max_num_seqs"], s["converged_gpu_memory_utilization"]) == flags(res.deployment)
    assert (s["start_max_num_seqs"], s["start_gpu_memory_utilization"]) == (256, 0.9)
    assert flags(res.deployment_history[0]) == (256, 0.9)
    # the loop acted: the operator changed the Deployment and the shim restarted the pod for each change
    assert s["deployment_changes"] == template_changes(res.deployment_history) >= 1
    assert s["restarts"] == res.kubelet_restarts == s["deployment_changes"]
    assert sum(1 for e in res.kubelet_events if e["event"] == "restart") == res.kubelet_restarts
    assert s["converged_max_num_seqs"] < 256 and s["released_gib"] == pytest.approx(
        (0.9 - s["converged_gpu_memory_utilization"]) * s["gpu_memory_gib"], abs=1e-3)
    st = res.llmd["status"]
    assert st["applied"]["maxNumSeqs"] == s["converged_max_num_seqs"]
    # each twin ran with the args its Deployment version carried
    ready = [e for e in res.kubelet_events if e["event"] == "ready"]
    assert f"--max-num-seqs={s['converged_max_num_seqs']}" in ready[-1]["argv"]
    assert ready[-1]["template"] == template_hash(res.deployment["spec"]["template"])
    # rows: one per decision, with observed numbers once the window closed
    assert len(lines) == len(res.rows) >= 8
    assert any(r.decision == "Applied" for r in res.rows)
    assert any(r.throughput_tok_s and r.throughput_tok_s > 500 for r in res.rows)
    # rates are on the twins' clock: at full load the H100 twin at cap 256 serves ~18k tok/s (60 req/s
    # of 400 tokens offered); rates on a wall clock the twin lagged behind read far lower
    assert max(r.throughput_tok_s or 0 for r in res.rows if r.phase == "steady") > 12_000
    # the demo says whether the twins kept up: one warning line during the run and the summary's last line
    assert 0 < s["twin_time_ratio"] <= 1.05 and s["twin_behind_s"] >= 0
    assert s["twins_fell_behind"] == (s["twin_time_ratio"] < 0.95) == ("twins fell behind" in summary_text(s))
    assert len(warnings) <= 1 and (not warnings or "fell behind" in warnings[0])
    assert s["throughput_converged_tok_s"] is None or s["throughput_converged_tok_s"] > 0
    assert "GiB released" in summary_text(s)
    json.dumps(res.to_json())
    assert plot(res, tmp_path / "t.png").stat().st_size > 10_000


def test_twin_argv_replaces_host_and_port_and_keeps_vllm_flags():
    c = {"args": ["facebook/opt-1.3b", "--port=8000", "--max-num-seqs=64", "--gpu-memory-utilization=0.2",
                  "--host", "0.0.0.0", "--enforce-eager"]}
    argv = twin_argv(c, "opt-1.3b", "h100-64gb", 1234, 5.0)
    assert argv[:4] == ["facebook/opt-1.3b", "--max-num-seqs=64", "--gpu-memory-utilization=0.2", "--enforce-eager"]
    assert argv[4:] == ["--host", "127.0.0.1", "--port", "1234", "--arch", "opt-1.3b", "--gpu", "h100-64gb",
                        "--time-scale", "5"]


@pytest.mark.parametrize("over, field", [({"rate_rps": 0}, "rate_rps"), ({"gpu": "tpu-v9"}, "spec.accelerator.type"),
                                         ({"duration_s": 20.0}, "duration_s"),
                                         ({"max_num_seqs": 5000}, "spec.engine.maxNumSeqs")])
def test_bad_config_names_the_field(over, field):
    with pytest.raises(InputError) as exc:
        DemoConfig(**over).check()
    assert exc.value.field == field


MANAGED = ("--max-num-seqs", "--gpu-memory-utilization")


def test_adopt_demo_tunes_the_users_deployment_and_changes_nothing_else(tmp_path):
    """`kneecap demo --adopt`: the user's Deployment (labels, a toleration, a volume, its own args
    with --max-num-seqs 256) serves first; kneecap, pointed at it by spec.targetRef, moves the cap
    and leaves every other field of the pod template as the user wrote it."""
    # a 120 s cooldown is the horizon a restart (31 s modelled) must pay over: over 30 s it does not
    cfg = DemoConfig(duration_s=160.0, time_scale=5.0, interval_s=10.0, cooldown_s=120.0, warmup_intervals=2,
                     adopt=True)
    res = run_demo(cfg, log_dir=tmp_path)
    s = res.summary
    print(summary_text(s))
    before, after = res.user_deployment, res.deployment
    assert before["metadata"]["name"] == after["metadata"]["name"] == "opt-serving"
    # kneecap made nothing and owns nothing: the only Deployment is the user's, no Service, no ownerReference
    assert res.objects == {"apps/v1/deployments": ["opt-serving"], "v1/services": []}
    assert "ownerReferences" not in after["metadata"]
    assert after["metadata"]["labels"] == before["metadata"]["labels"]
    assert after["spec"]["replicas"] == before["spec"]["replicas"] == 1
    assert after["spec"]["selector"] == before["spec"]["selector"]

    # the pod template, field by field: everything but the managed flags' values is as the user wrote it
    t0, t1 = before["spec"]["template"], after["spec"]["template"]
    assert t1["metadata"] == t0["metadata"]
    assert {k: v for k, v in t1["spec"].items() if k != "containers"} == \
        {k: v for k, v in t0["spec"].items() if k != "containers"}
    assert t1["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    (c0,), (c1,) = t0["spec"]["containers"], t1["spec"]["containers"]
    assert {k: v for k, v in c1.items() if k != "args"} == {k: v for k, v in c0.items() if k != "args"}
    assert len(c1["args"]) == len(c0["args"])  # same tokens, same places, same spellings
    values = {i + 1 for i, tok in enumerate(c0["args"]) if tok in MANAGED}
    assert [t for i, t in enumerate(c1["args"]) if i not in values] == [t for i, t in enumerate(c0["args"])
                                                                        if i not in values]
    assert s["adopted_unmanaged_changed_paths"] == []
    assert set(s["adopted_template_changed_paths"]) <= {f".spec.containers[0].args[{i}]" for i in values}

    # the cap moved, in the user's Deployment, through the guarded loop
    cap0, cap1 = (int(vllm_args.container_flag(c, "--max-num-seqs")) for c in (c0, c1))
    assert cap0 == 256 and cap1 < 256 and cap1 == s["converged_max_num_seqs"]
    assert res.llmd["status"]["applied"]["maxNumSeqs"] == cap1
    assert any(r.decision == "Applied" for r in res.rows)
    assert s["adopted_writes"] == s["deployment_changes"] >= 1 and s["restarts"] == s["deployment_changes"]
    assert "kneecap.io/applied" in after["metadata"]["annotations"]
    st = res.llmd["status"]
    assert st["ownership"]["server"]["target"] == {"deployment": "opt-serving", "container": "vllm",
                                                   "adviseOnly": False, "tensorParallelSize": 1}
    assert next(c for c in st["conditions"] if c["type"] == "Advisory")["status"] == "False"
    # every twin ran the user's Deployment's argv
    ready = [e for e in res.kubelet_events if e["event"] == "ready"]
    assert {e["deployment"] for e in ready} == {"opt-serving"}
    assert ready[-1]["argv"][ready[-1]["argv"].index("--max-num-seqs") + 1] == str(cap1)
    assert "every other field of its pod template" in summary_text(s) and "is unchanged" in summary_text(s)
def test_disaggregated_demo_routes_prefill_then_decode_and_tunes_the_decode_pool(tmp_path):
    """`kneecap demo --disaggregated`: two pools (prefill twins kv_producer, decode twins
    kv_consumer) behind the P/D router; every completed request went prefill -> KV -> decode, the
    operator observes both pools (the prefill pool's windows have no inter-token interval) and
    moves the decode pool's cap."""
    cfg = DemoConfig(duration_s=160.0, time_scale=5.0, interval_s=10.0, cooldown_s=120.0, warmup_intervals=2,
                     disaggregated=True)
    res = run_demo(cfg, log_dir=tmp_path, on_warning=lambda line: None)
    s = res.summary
    print(summary_text(s))
    assert s["disaggregated"] and s["pool"] == "opt-decode" and res.deployment["metadata"]["name"] == "opt-decode"
    ready = [e for e in res.kubelet_events if e["event"] == "ready"]
    roles = {e["deployment"]: json.loads(next(a.split("=", 1)[1] for a in e["argv"]
                                              if a.startswith("--kv-transfer-config=")))["kv_role"] for e in ready}
    assert roles == {"opt-prefill": "kv_producer", "opt-decode": "kv_consumer"}
    # the load went through both pools (8400 requests offered in the steady phase; how many the load
    # process sends before the end depends on the machine: 3910 to 4994 seen here)
    assert s["requests_prefill_then_decode"] >= 1000
    assert "P/D path" in summary_text(s)
    assert not any("invalid_value:itl" in r.message for r in res.rows)
    assert any(r.decision == "Applied" for r in res.rows) and s["converged_max_num_seqs"] < 256
