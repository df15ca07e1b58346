"""Replays in virtual time: the real operator closes the loop on twin pods, deterministically."""

from __future__ import annotations

import json

import pytest

from kneecap import cli
from kneecap.control import manifests, vllm_args
from kneecap.control.kube import deployments_path
from kneecap.control.spec import parse_spec
from kneecap.sim.cluster import llmd_path, tick_summary
from kneecap.sim.replay import NAME, ReplayConfig, run_policy, score
from kneecap.sim.trace import read_trace
from tests.support.replay_traces import replay_json, write_trace


def test_operator_moves_the_cap_down_from_256_with_one_restart(tmp_path):
    """One replica under steady load: the operator, on the virtual clock, fits SLIM on windows
    it scraped from the twin, applies a BCA cap below vLLM's 256 with the memory that holds it;
    the kubelet replaces the pod once and the new pod serves with the new flags (the spec allows
    the one pod's downtime and values the memory it releases)."""
    trace = read_trace(write_trace(tmp_path, 20.0, 150.0))
    cfg = ReplayConfig(min_replicas=1, max_replicas=1, interval_s=15.0, cooldown_s=300.0, allow_downtime=True,
                       released_memory_value=1.0)
    run = run_policy(trace, cfg, "kneecap")
    api, ns = run.cluster.api, run.cluster.namespace
    applied = [d for d in run.decisions if d["applied"]]
    assert applied, run.operator_events
    first = applied[0]["target"]
    assert first["maxNumSeqs"] < 256 and first["gpuMemoryUtilization"] < 0.9
    deploy = api.peek(deployments_path(ns, NAME))
    live = int(vllm_args.container_flag(manifests.vllm_container(deploy), manifests.MAX_NUM_SEQS))
    assert live == applied[-1]["target"]["maxNumSeqs"] < 256
    assert run.cluster.node.stats.restarts <= 1
    (pod,) = run.cluster.ready_pods()
    assert pod.config.max_num_seqs == live  # the pod serving at the end runs the applied cap
    status = api.peek(llmd_path(ns, NAME))["status"]
    assert status["applied"]["restart"] is True and status["applied"]["maxNumSeqs"] == live
    # a fit of the new pod's windows was accepted after the restart, within maxFitError (the last
    # window, the trace's drain at half the batch, may be refused by a refit: the previous fit is kept)
    cal = status["calibration"]
    assert cal["acceptedTime"] > status["applied"]["time"] and cal["fitErrorPercent"] < 30.0
    assert any(c["type"] == "Calibrated" and (c["status"] == "True" or c["reason"] == "FitRejected")
               for c in status["conditions"])
    s = score(cfg, run, trace.span_s)
    assert s["restarts"] <= 1 and s["mean_memory_released_gib"] > 0
    assert s["completed"] + s["lost"] == s["requests"]
    # the report says what each control tick sized and why: one entry a tick, the applied one with
    # the flags it applied, GAUSS's λ* per replica and the rate it sized the one replica for
    ticks = s["ticks"]
    assert [t["t_s"] for t in ticks] == [15.0 * (i + 1) for i in range(len(ticks))] and len(ticks) >= 9
    assert [t["t_s"] for t in ticks if t["decision"] == "Applied"] == [d["t_s"] for d in applied]
    at = next(t for t in ticks if t["t_s"] == applied[0]["t_s"])
    assert at["target"] == at["live"] == first and at["replicas_sized"] >= 1  # the spec bounds it to 1
    assert at["sustainable_rps_per_replica"] > 0 and at["observed_rps"] > 0 and at["calibration_error_pct"] < 30.0
    assert ticks[-1]["live"]["maxNumSeqs"] == live
    # the stabilisation never sizes a pool below the highest count its history keeps
    sized = [t for t in ticks if t["replicas_sized"] is not None]
    assert sized and all(t["scale_down_floor"] >= t["replicas_sized"] for t in sized)


def test_a_tick_says_the_fewest_replicas_its_scale_down_history_allows():
    """The highest count kept in status.scaleDownRecommendations, a scale-up kept for the cooldown
    included: what holds a pool larger than its rate needs (None: no history)."""
    history = [{"recommendedUnixSeconds": 100.0, "replicas": 4}, {"recommendedUnixSeconds": 115.0, "replicas": 3},
               {"recommendedUnixSeconds": 90.0, "replicas": 5, "scaleUp": True}]
    assert tick_summary(120.0, {"scaleDownRecommendations": history})["scale_down_floor"] == 5
    assert tick_summary(120.0, {"scaleDownRecommendations": history[:2]})["scale_down_floor"] == 4
    assert tick_summary(120.0, {"scaleDownRecommendations": [None, {"replicas": "x"}, {"replicas": True}]}
                        )["scale_down_floor"] is None
    assert tick_summary(120.0, {})["scale_down_floor"] is None


def test_replay_cli_bad_input_names_the_field(tmp_path, capsys):
    p = write_trace(tmp_path, 5.0, 10.0)
    assert cli.main(["replay", str(p), "--compress", "0"]) == 2
    assert "compress" in capsys.readouterr().err
    assert cli.main(["replay", str(p), "--min-replicas", "3", "--max-replicas", "2"]) == 2
    assert "min-replicas" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,input_tokens,output_tokens\n0,1,x\n")
    assert cli.main(["replay", str(bad), "--json"]) == 2
    err = capsys.readouterr().err
    assert json.loads(err.splitlines()[0])["field"] == f"{bad}:2 column output_tokens"
    with pytest.raises(SystemExit) as e:
        cli.main(["replay", str(p), "--policy", "magic"])
    assert e.value.code == 2


@pytest.mark.parametrize("flags, field", [(["--seed", "-1"], "seed"), (["--interval", "0"], "interval"),
                                          (["--quantile", "1.5"], "quantile"), (["--cooldown", "-5"], "cooldown"),
                                          (["--start-replicas", "9"], "start-replicas"),
                                          (["--gpu", "tpu-v9"], "spec.accelerator.type"),
                                          (["--hpa-target", "0"], "hpa.target")])
def test_replay_options_are_checked_before_any_run(tmp_path, capsys, flags, field):
    p = write_trace(tmp_path, 5.0, 10.0)
    try:
        rc = cli.main(["replay", str(p), *flags, "--json"])
    except SystemExit as exc:  # a flag's type (--quantile) is argparse's to check
        rc = exc.code
    assert rc == 2
    assert json.loads(capsys.readouterr().err.splitlines()[0])["field"] == field


def test_compression_for_peak_is_the_least_factor_that_needs_the_replicas(tmp_path):
    """The factor found is the edge: at it the defaults on N − 1 pods miss the SLO over the trace,
    one less and they meet it (so the peak-sized pool grows to N exactly there)."""
    from kneecap.sim.replay import DEFAULT_CAP, DEFAULT_MEMORY, compression_for_peak, slo_met
    from kneecap.sim.trace import compress

    trace = read_trace(write_trace(tmp_path, 6.0, 60.0))
    cfg = ReplayConfig(max_replicas=4)
    k = compression_for_peak(trace, cfg, 2)
    assert k > 1

    def met(factor: int, replicas: int) -> bool:
        return slo_met(cfg, run_policy(compress(trace, factor), cfg, "static",
                                       static=(DEFAULT_CAP, DEFAULT_MEMORY, replicas)).requests)
    assert not met(k, 1) and met(k - 1, 1)
    assert met(k, 2)  # two pods serve it: the peak needs exactly two
    assert compression_for_peak(trace, cfg, 1) == 1


def test_replay_variant_option_replays_the_trace_changed_in_one_property(tmp_path):
    p = write_trace(tmp_path, 6.0, 60.0)
    plain = json.loads(replay_json([str(p), "--policy", "defaults"]))
    longer = json.loads(replay_json([str(p), "--policy", "defaults", "--variant", "long-prompts"]))
    assert longer["trace"]["requests"] == plain["trace"]["requests"]
    assert "prompts ×4" in longer["trace"]["source"]
    assert longer["trace"]["input_tokens_mean"] == pytest.approx(4 * plain["trace"]["input_tokens_mean"], rel=0.01)
    with pytest.raises(SystemExit) as e:
        cli.main(["replay", str(p), "--variant", "sideways"])
    assert e.value.code == 2


def test_replay_peak_replicas_option(tmp_path, capsys):
    p = write_trace(tmp_path, 6.0, 60.0)
    report = json.loads(replay_json([str(p), "--peak-replicas", "2", "--policy", "defaults", "--max-replicas", "4"]))
    assert report["compress"] > 1 and report["compress_for_peak_replicas"] == 2
    assert report["policies"]["defaults"]["settings"]["replicas"] >= 2
    with pytest.raises(SystemExit) as e:  # one way to say the compression
        cli.main(["replay", str(p), "--compress", "2", "--peak-replicas", "2"])
    assert e.value.code == 2
    assert cli.main(["replay", str(p), "--peak-replicas", "5", "--max-replicas", "4", "--json"]) == 2
    assert json.loads(capsys.readouterr().err.splitlines()[-1])["field"] == "peak-replicas"


def test_the_ablations_hold_one_lever_each(tmp_path):
    """kneecap:replicas-only never moves the cap off 256; kneecap:knobs-only never moves the
    replicas off the starting pool; both run the real operator on the same arrivals."""
    from kneecap.sim.replay import DEFAULT_CAP, llmd_spec

    cfg = ReplayConfig(min_replicas=1, max_replicas=4, interval_s=15.0, cooldown_s=300.0, allow_downtime=True,
                       released_memory_value=1.0)
    spec = parse_spec(llmd_spec(cfg, "kneecap:replicas-only"))
    assert spec.batching.min_max_num_seqs == spec.batching.max_max_num_seqs == DEFAULT_CAP
    held = parse_spec(llmd_spec(cfg, "kneecap:knobs-only", start_replicas=2)).topology.replicas
    assert (held.min, held.max) == (2, 2)
    trace = read_trace(write_trace(tmp_path, 20.0, 150.0))
    replicas_only = run_policy(trace, cfg, "kneecap:replicas-only", start_replicas=1)
    assert all((d.get("target") or {}).get("maxNumSeqs", DEFAULT_CAP) == DEFAULT_CAP for d in replicas_only.decisions)
    assert all(s.max_num_seqs in (None, DEFAULT_CAP) for s in replicas_only.samples)
    knobs_only = run_policy(trace, cfg, "kneecap:knobs-only", start_replicas=1)
    assert all(s.ready <= 1 for s in knobs_only.samples)  # (a replaced pod terminates beside its successor)
    deploy = knobs_only.cluster.api.peek(deployments_path(knobs_only.cluster.namespace, NAME))
    assert deploy["spec"]["replicas"] == 1
    assert all((d.get("target") or {}).get("replicas", 1) == 1 for d in knobs_only.decisions)
    assert any((d.get("target") or {}).get("maxNumSeqs", DEFAULT_CAP) < DEFAULT_CAP for d in knobs_only.decisions)


def test_replay_cuts_the_trace_as_recorded_before_compressing(tmp_path, capsys):
    """--trace-start/--trace-seconds replay a slice of a long trace (a day of a week): the
    requests of those recorded seconds, shifted to 0, then compressed."""
    p = write_trace(tmp_path, 6.0, 60.0)
    whole = read_trace(p)
    inside = int(((whole.arrival_s >= 20.0) & (whole.arrival_s < 35.0)).sum())
    report = json.loads(replay_json([str(p), "--policy", "defaults", "--trace-start", "20", "--trace-seconds", "15",
                                     "--compress", "2"]))
    assert report["trace"]["requests"] == inside and 0 < inside < len(whole)
    assert report["trace"]["span_s"] < 7.5 and "[from 20 s for 15 s]" in report["trace"]["source"]
    assert cli.main(["replay", str(p), "--trace-start", "600", "--json"]) == 2  # past its last request
    assert json.loads(capsys.readouterr().err.splitlines()[-1])["field"] == "trace-start"
    assert cli.main(["replay", str(p), "--trace-seconds", "0", "--json"]) == 2
    assert json.loads(capsys.readouterr().err.splitlines()[-1])["field"] == "trace-seconds"


def test_replay_reads_a_mooncake_trace_as_published(tmp_path):
    """A Mooncake JSON-lines trace (milliseconds) replays as the same requests in CSV seconds do."""
    trace = read_trace(write_trace(tmp_path, 4.0, 30.0))
    jsonl = tmp_path / "mooncake.jsonl"
    jsonl.write_text("".join(json.dumps({"timestamp": round(t * 1000), "input_length": int(i),
                                         "output_length": int(o), "hash_ids": [0]}) + "\n"
                             for t, i, o in zip(trace.arrival_s, trace.input_tokens, trace.output_tokens)))
    csv = tmp_path / "same.csv"
    csv.write_text("arrival_s,input_tokens,output_tokens\n" + "".join(
        f"{round(t * 1000) / 1000},{i},{o}\n" for t, i, o in zip(trace.arrival_s, trace.input_tokens,
                                                                 trace.output_tokens)))
    a = json.loads(replay_json([str(jsonl), "--policy", "defaults"]))
    b = json.loads(replay_json([str(csv), "--policy", "defaults"]))
    assert a["policies"] == b["policies"] and a["trace"]["requests"] == len(trace)


def test_the_oracle_tries_the_most_memory_only_where_the_kv_cache_bounds_the_batch(tmp_path):
    """The hindsight-best static pool may reserve what the operator may (0.95) where vLLM's 0.9
    leaves fewer KV tokens than the cap's sequences at the trace's mean context: a TP-2 70B on
    H100s at every cap above the twenty conversations its cache holds, never an 8B."""
    from kneecap.sim.replay import DEFAULT_MEMORY, ORACLE_CAPS, oracle_memories

    trace = read_trace(write_trace(tmp_path, 5.0, 60.0))
    small = ReplayConfig()
    assert all(oracle_memories(small, trace, cap)[0] <= DEFAULT_MEMORY for cap in ORACLE_CAPS)
    assert all(len(oracle_memories(small, trace, cap)) == 1 for cap in ORACLE_CAPS)
    large = ReplayConfig(model="meta-llama/Llama-3.1-70B-Instruct", architecture="llama-3.1-70b",
                         tensor_parallel_size=2)
    assert oracle_memories(large, trace, 256) == (DEFAULT_MEMORY, 0.95)
    (sized,) = oracle_memories(large, trace, 16)  # 16 conversations fit under 0.9
    assert 0.85 < sized <= DEFAULT_MEMORY


def test_a_tp2_70b_pool_bound_by_its_kv_cache_is_given_the_memory_that_saves_replicas(tmp_path):
    """Llama-3.1-70B at TP 2 on H100s: at vLLM's 0.9 the KV cache holds twenty conversations. The
    operator, on windows it scraped from the twin, raises the memory to 0.95 (twice the cache)
    because GAUSS sizes fewer replicas there; the restart is paid for by the replicas saved, the
    pods come back with the new flag. The replicas-only ablation, its memory ceiling at 0.9,
    never moves it."""
    from kneecap.sim.replay import run_policy

    trace = read_trace(write_trace(tmp_path, 8.0, 150.0))  # 2 req/s per pod: the cache fills
    cfg = ReplayConfig(model="meta-llama/Llama-3.1-70B-Instruct", architecture="llama-3.1-70b",
                       tensor_parallel_size=2, min_replicas=1, max_replicas=8, interval_s=15.0, cooldown_s=300.0)
    run = run_policy(trace, cfg, "kneecap", start_replicas=4)
    applied = [d for d in run.decisions if d["applied"]]
    assert applied and applied[0]["target"]["gpuMemoryUtilization"] == 0.95, run.decisions
    status = run.cluster.api.peek(llmd_path(run.cluster.namespace, NAME))["status"]
    assert status["applied"]["gpuMemoryUtilization"] == 0.95
    deploy = run.cluster.api.peek(deployments_path(run.cluster.namespace, NAME))
    assert float(vllm_args.container_flag(manifests.vllm_container(deploy), manifests.GPU_MEMORY_UTILIZATION)) == 0.95
    assert any("replica(s) for the SLO at the new flags" in e["message"] for e in run.operator_events
               if e.get("reason") == "Applied"), run.operator_events
    held = run_policy(trace, cfg, "kneecap:replicas-only", start_replicas=4)
    assert all((d.get("target") or {}).get("gpuMemoryUtilization", 0.9) == 0.9 for d in held.decisions)


def _without_nulls(value):
    """What a merge patch leaves of ``value`` in the object (RFC 7386: null deletes)."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


def test_the_status_shows_each_tick_s_objects_with_nothing_left_from_earlier_ticks(tmp_path, monkeypatch):
    """The status is written as a merge patch, which keeps what it does not name: a field a tick
    no longer sets (the restart cost of an applied decision, a hold that ended, a p95 a window did
    not measure) must still leave the stored status, so every object the planner wrote is stored
    exactly as planned after each tick of a replay with a restart."""
    from kneecap.control import loop
    from kneecap.sim import cluster

    planned, mismatches, ticks = [], [], []
    real_plan, real_tick = loop.planner.plan, cluster.OperatorDriver.tick

    def plan(*args, **kwargs):
        out = real_plan(*args, **kwargs)
        planned.append(out.status)
        return out

    def tick(self, t_s):
        n = len(planned)
        real_tick(self, t_s)
        if len(planned) == n:
            return
        stored = self.cluster.api.peek(llmd_path(self.cluster.namespace, self.name))["status"]
        ticks.append(t_s)
        mismatches.extend((t_s, k) for k, v in planned[-1].items()
                          if isinstance(v, dict) and stored.get(k) != _without_nulls(v))

    monkeypatch.setattr(loop.planner, "plan", plan)
    monkeypatch.setattr(cluster.OperatorDriver, "tick", tick)
    trace = read_trace(write_trace(tmp_path, 20.0, 150.0))
    cfg = ReplayConfig(min_replicas=1, max_replicas=1, interval_s=15.0, cooldown_s=300.0, allow_downtime=True,
                       released_memory_value=1.0)
    run = run_policy(trace, cfg, "kneecap")
    assert any(d["applied"] for d in run.decisions) and len(ticks) >= 8
    assert mismatches == [], mismatches[:5]
