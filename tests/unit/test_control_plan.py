"""The tick's decision as a table: what was gathered + status + spec + time → status, Events,
metric updates and patches (kneecap.control.plan). Observations are real H100 operating points
(data/real-h100/profiles.csv, Llama-2-7B), the live objects what manifests.py builds."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kneecap.control import applied as applied_record, plan, reconcile, replica_stabilisation
from kneecap.control import status as status_helpers, status_codec, tick, vllm_args
from kneecap.control.kube import ApiError, ApiFailure
from kneecap.control.metric_series import Series
from kneecap.control.spec import parse_spec
from kneecap.control.status_codec import calibration_from_status
from tests.support.plan_inputs import LABELS, NOW, RAW, SPEC, cond, gathered, live_pool, ring_status
from tests.support.profile_observations import observation

WINDOW = 60.0


def updates(planned: plan.Plan, series: Series) -> list[plan.MetricUpdate]:
    return [u for u in planned.metrics if u.series is series]


def test_a_fresh_window_in_enforce_patches_once_with_the_applied_record_in_the_same_patch(curve):
    status, ring = ring_status(curve)
    obs = replace(observation(curve[32]), t_end_s=NOW)
    p = plan.plan(gathered(plan.PoolWindow("server", live_pool(), plan.OBSERVED, observation=obs), ring), status,
                  SPEC, NOW)
    (patch,) = p.patches
    record = json.loads(patch.body["metadata"]["annotations"][applied_record.APPLIED_ANNOTATION])
    c = patch.body["spec"]["template"]["spec"]["containers"][0]
    assert record["maxNumSeqs"] == 64 == int(vllm_args.container_flag(c, "--max-num-seqs"))  # ×2 step
    assert record["time"] == status_helpers.iso(NOW) and record["reason"] == "Recommended" and record["restart"] is True
    assert p.status["applied"] == {**record, "pool": "server"}
    assert p.status["lastDecision"]["reason"] == "Applied"
    # the Applied Event and the restart counter wait for the patch; the hold it replaces is the rollback
    assert [e.reason for e in patch.events] == ["Applied"] and "Applied" not in [e.reason for e in p.events]
    assert plan.MetricUpdate("inc", Series.RESTARTS, (*LABELS, "Recommended"), 1.0) in patch.metrics
    assert patch.rollback["applied"]["maxNumSeqs"] == 32 and "time" not in patch.rollback["applied"]
    assert cond(p.status, "Degraded")["status"] == "False" and cond(p.status, "ApiError") == {}  # none failed yet
    assert len(p.status["observations"]) == 4 and p.status["lastWindow"]["outcome"] == plan.OBSERVED
    assert "observationFailures" not in p.status
    assert updates(p, Series.OBSERVATION_CONSECUTIVE_FAILURES) == [
        plan.MetricUpdate("set", Series.OBSERVATION_CONSECUTIVE_FAILURES, LABELS, 0.0)]


def test_replicas_are_sized_by_gauss_at_the_cap_and_memory_recommended(curve):
    from kneecap.control import decide

    status, ring = ring_status(curve)
    obs = replace(observation(curve[32]), t_end_s=NOW)
    p = plan.plan(gathered(plan.PoolWindow("server", live_pool(), plan.OBSERVED, observation=obs), ring), status,
                  SPEC, NOW)
    rec, alloc = p.status["recommendation"], p.status["allocation"]
    assert alloc["gaussMaxNumSeqs"] == rec["maxNumSeqs"] != 32  # the recommended cap, not the live one
    assert alloc["gaussKvCacheTokens"] == decide._kv_capacity_tokens(SPEC, obs, rec["gpuMemoryUtilization"],
                                                                     rec["maxNumSeqs"])


@pytest.mark.parametrize("outcome, message, reason", [
    (plan.UNUSABLE, "http://10.0.0.1:8000/metrics: invalid_value:vllm:num_requests_running", "MetricsUnusable"),
    (plan.UNUSABLE, "http://10.0.0.1:8000/metrics: truncated:vllm:e2e_request_latency_seconds_bucket",
     "MetricsUnusable"),
    (plan.UNUSABLE, "http://10.0.0.1:8000/metrics: missing_metric:vllm:time_to_first_token_seconds_bucket",
     "MetricsUnusable"),
    (plan.UNUSABLE, "http://10.0.0.1:8000/metrics: counter_reset:process restarted", "MetricsUnusable"),
    (tick.SCRAPE_FAILED, "http://10.0.0.1:8000/metrics: HTTP 500", "ScrapeFailed"),
])
def test_an_unusable_window_holds_sets_degraded_counts_it_and_leaves_the_ring(curve, outcome, message, reason):
    status, ring = ring_status(curve)
    status["observationFailures"] = {"consecutive": 0, "lastReason": "ScrapeFailed",
                                     "lastTime": status_helpers.iso(NOW - 600)}
    w = plan.PoolWindow("server", live_pool(), outcome, message, scrape_errors=int(outcome == tick.SCRAPE_FAILED))
    p = plan.plan(gathered(w, ring), status, SPEC, NOW)
    assert p.patches == ()
    d = cond(p.status, "Degraded")
    assert d["status"] == "True" and d["reason"] == reason and message in d["message"]
    assert p.status["phase"] == "Degraded"
    assert p.status["observationFailures"] == {"consecutive": 1, "lastReason": reason,
                                               "lastMessage": f"server: {message}", "lastTime": status_helpers.iso(NOW)}
    assert "observations" not in p.status and "workload" not in p.status  # the ring is unchanged
    assert p.status["lastDecision"]["reason"] == reason and p.status["lastDecision"]["action"] == "hold"
    assert plan.MetricUpdate("inc", Series.OBSERVATION_FAILURES, (*LABELS, reason), 1.0) in p.metrics
    assert plan.MetricUpdate("set", Series.OBSERVATION_CONSECUTIVE_FAILURES, LABELS, 1.0) in p.metrics
    assert [(e.type, e.reason) for e in p.events] == [("Warning", reason)]


def test_after_a_failure_the_open_window_still_holds_and_a_usable_one_clears_it(curve):
    status, ring = ring_status(curve)
    status["observationFailures"] = {"consecutive": 2, "lastReason": plan.UNUSABLE, "lastMessage": "server: nan",
                                     "lastTime": status_helpers.iso(NOW - 30)}
    held = plan.plan(gathered(plan.PoolWindow("server", live_pool(), tick.OPEN, "window open: 30s of 60s"), ring),
                     status, SPEC, NOW)
    assert held.patches == () and cond(held.status, "Degraded")["reason"] == plan.UNUSABLE
    assert "2 failed observation(s)" in cond(held.status, "Degraded")["message"]
    assert "observationFailures" not in held.status  # unchanged: not re-sent, not counted again
    assert not updates(held, Series.OBSERVATION_FAILURES)
    obs = replace(observation(curve[32]), t_end_s=NOW)
    ok = plan.plan(gathered(plan.PoolWindow("server", live_pool(), plan.OBSERVED, observation=obs), ring), status,
                   SPEC, NOW)
    assert ok.status["observationFailures"]["consecutive"] == 0 and len(ok.patches) == 1
    assert cond(ok.status, "Degraded")["status"] == "False"


def test_no_usable_window_within_max_observation_age_holds_as_stale(curve):
    status, ring = ring_status(curve)
    assert SPEC.control.max_observation_age_s == 3 * WINDOW
    status["lastWindow"]["usableTime"] = status_helpers.iso(NOW - 3 * WINDOW - 1)
    p = plan.plan(gathered(plan.PoolWindow("server", live_pool(), tick.NO_PODS, "no ready pod"), ring), status,
                  SPEC, NOW)
    assert p.patches == ()
    d = cond(p.status, "Degraded")
    assert (d["status"], d["reason"]) == ("True", "ObservationStale") and "181s ago" in d["message"]
    assert plan.MetricUpdate("set", Series.OBSERVATION_AGE, LABELS, 181.0) in p.metrics
    # one second younger: fresh enough to decide
    status["lastWindow"]["usableTime"] = status_helpers.iso(NOW - 3 * WINDOW + 1)
    fresh = plan.plan(gathered(plan.PoolWindow("server", live_pool(), tick.OPEN, "window open"), ring), status,
                      SPEC, NOW)
    assert cond(fresh.status, "Degraded")["reason"] == "Healthy" and len(fresh.patches) == 1


def test_idle_windows_are_not_failures_but_old_traffic_is_not_decided_on(curve):
    status, ring = ring_status(curve)
    for e in status["observations"]:
        e["windowEndUnixSeconds"] -= 600  # the last traffic was ten minutes ago
    status["workload"]["windowEndUnixSeconds"] -= 600
    ring = status_codec.parse_ring(status["observations"], "server")
    p = plan.plan(gathered(plan.PoolWindow("server", live_pool(), plan.IDLE, "idle"), ring), status, SPEC, NOW)
    assert p.patches == () and p.status["lastDecision"]["reason"] == "Idle"
    assert cond(p.status, "Degraded")["status"] == "False" and "observationFailures" not in p.status
    assert p.status["lastWindow"] == {"pool": "server", "outcome": plan.IDLE, "time": status_helpers.iso(NOW),
                                      "usableTime": status_helpers.iso(NOW)}
    assert plan.MetricUpdate("drop", Series.BATCHING_EFFICIENCY, (*LABELS, "server")) in p.metrics


def test_the_deployment_record_keeps_the_cooldown_when_the_status_lost_it(curve):
    status, ring = ring_status(curve)
    # the write after failed
    status["applied"] = {"maxNumSeqs": 16, "pool": "server", "time": status_helpers.iso(NOW - 5000)}
    record = {"maxNumSeqs": 32, "gpuMemoryUtilization": 0.9, "replicas": 1, "time": status_helpers.iso(NOW - 100),
              "reason": "Recommended", "restart": True}
    obs = replace(observation(curve[32]), t_end_s=NOW)
    p = plan.plan(gathered(plan.PoolWindow("server", live_pool(record), plan.OBSERVED, observation=obs), ring),
                  status, SPEC, NOW)
    # the flags wait out the cooldown the record dates (500 s left, not the status's long-past
    # change); the replicas are sized at the cap the pool runs, 32, where one pod is too few
    assert "flags held (Cooldown): cooldown: 500s left" in p.status["lastDecision"]["message"]
    assert p.status["lastDecision"]["target"] == {"maxNumSeqs": 32, "gpuMemoryUtilization": 0.9, "replicas": 2}
    (patch,) = p.patches
    assert patch.body["spec"]["replicas"] == 2
    assert patch.body["spec"]["template"]["spec"]["containers"][0]["args"][2:] == [
        "--max-num-seqs=32", "--gpu-memory-utilization=0.9"]
    assert p.status["applied"]["restart"] is False and p.status["applied"]["maxNumSeqs"] == 32
    # an older record than status changes nothing
    assert applied_record.newest({"time": status_helpers.iso(NOW)}, record)["time"] == status_helpers.iso(NOW)
    unreadable = {"metadata": {"annotations": {applied_record.APPLIED_ANNOTATION: "{not json"}}}
    assert applied_record.from_deployment(unreadable) is None


def test_a_failed_reconcile_write_is_visible_and_stops_acting_but_not_observing(curve):
    status, ring = ring_status(curve)
    failure = ApiFailure.of(ApiError(422, {"message": 'Service "llm" is invalid: metadata.name: Invalid value'},
                                     "POST /api/v1/namespaces/serving/services"))
    obs = replace(observation(curve[32]), t_end_s=NOW)
    g = gathered(plan.PoolWindow("server", live_pool(), plan.OBSERVED, observation=obs), ring,
                 api_failures=(failure,), reconcile_failed=True)
    p = plan.plan(g, status, SPEC, NOW)
    assert p.patches == ()
    c = cond(p.status, "ApiError")
    assert (c["status"], c["reason"]) == ("True", "CreateFailed")
    assert c["message"] == 'create services: HTTP 422: Service "llm" is invalid: metadata.name: Invalid value'
    assert plan.MetricUpdate("inc", Series.API_ERRORS, ("create", "services", "422"), 1.0) in p.metrics
    assert ("Warning", "CreateFailed") in [(e.type, e.reason) for e in p.events]
    assert p.status["lastDecision"]["reason"] == "ReconcileFailed" and "HTTP 422" in p.status["lastDecision"]["message"]
    assert len(p.status["observations"]) == 4 and p.status["recommendation"]["maxNumSeqs"] > 32  # still observing
    # the same failure on the next tick: the condition stands, no second Event
    again = plan.plan(g, {**status, **p.status}, SPEC, NOW + 30)
    assert "CreateFailed" not in [e.reason for e in again.events] and updates(again, Series.API_ERRORS)
    # writes succeed again: False
    ok = plan.plan(gathered(plan.PoolWindow("server", live_pool(), tick.OPEN, "window open"), ring),
                   {**status, **p.status}, SPEC, NOW + 60)
    assert cond(ok.status, "ApiError")["status"] == "False"


def test_a_status_write_that_failed_last_tick_shows_in_api_error_without_counting_twice(curve):
    status, ring = ring_status(curve)
    failure = ApiFailure.of(ApiError(500, {"message": "etcdserver: request timed out"},
                                     "PATCH /apis/kneecap.io/v1alpha1/namespaces/serving/llmdeployments/llm/status"))
    g = gathered(plan.PoolWindow("server", live_pool(), tick.OPEN, "window open"), ring, status_write_failure=failure)
    p = plan.plan(g, status, SPEC, NOW)
    c = cond(p.status, "ApiError")
    assert (c["status"], c["reason"]) == ("True", "StatusWriteFailed") and "llmdeployments/status llm" in c["message"]
    assert not updates(p, Series.API_ERRORS) and "StatusWriteFailed" not in [e.reason for e in p.events]


def test_a_failed_patch_rolls_back_what_it_would_have_changed(curve):
    status, ring = ring_status(curve)
    obs = replace(observation(curve[32]), t_end_s=NOW)
    p = plan.plan(gathered(plan.PoolWindow("server", live_pool(), plan.OBSERVED, observation=obs), ring), status,
                  SPEC, NOW)
    failure = ApiFailure.of(ApiError(422, {"message": "spec.template.spec.containers[0].env[0].name: Required value"},
                                     "PATCH /apis/apps/v1/namespaces/serving/deployments/llm"))
    out, event, counters = p.patches[0].if_failed.outcome(failure)
    assert out["applied"] == p.patches[0].rollback["applied"] and "time" not in out["applied"]
    assert out["lastDecision"]["reason"] == "ApplyFailed" and "env[0].name" in out["lastDecision"]["message"]
    c = cond(out, "ApiError")
    assert (c["status"], c["reason"]) == ("True", "PatchFailed") and "patch deployments llm: HTTP 422" in c["message"]
    assert (event.type, event.reason) == ("Warning", "PatchFailed")
    assert counters[0] == plan.MetricUpdate("inc", Series.API_ERRORS, ("patch", "deployments", "422"), 1.0)
    # the same refusal on the next tick: counted, no second Event
    next_tick = replace(p.patches[0].if_failed, status={**p.status, **out}, now_s=NOW + 30)
    _, again, counted = next_tick.outcome(failure)
    assert again is None and counted == counters


def test_a_pool_left_out_for_a_conflict_is_not_acted_on(curve):
    status, _ = ring_status(curve)
    g = plan.TickInput("serving", "llm", 2, (),
                       conflicts=(reconcile.Conflict("Deployment", "llm", "not owned by kneecap"),))
    p = plan.plan(g, status, SPEC, NOW)
    assert p.patches == () and p.status["lastDecision"]["reason"] == "OwnershipConflict"
    assert "not owned by kneecap" in p.status["lastDecision"]["message"]
    assert cond(p.status, "Ready")["status"] == "False"


def test_a_full_ring_drops_its_oldest_window_for_the_new_one(curve):
    status, ring = ring_status(curve)
    spec = parse_spec({**RAW, "control": {**RAW["control"], "observationHistory": 3}})
    obs = replace(observation(curve[64]), t_end_s=NOW)
    p = plan.plan(gathered(plan.PoolWindow("server", live_pool(), plan.OBSERVED, observation=obs), ring), status,
                  spec, NOW)
    got = [e["windowEndUnixSeconds"] for e in p.status["observations"]]
    assert got == [NOW - 60.0, NOW - 30.0, NOW]  # the oldest went, the tick's own window is last
    assert p.status["observations"][-1]["meanBatch"] == pytest.approx(float(curve[64]["batch"]), rel=1e-5)


def test_inline_model_and_gpu_shapes_decide_as_their_catalog_entries_do(curve):
    """A spec that spells Llama-2-7B and the data's H100 inline (spec.model.shape,
    spec.accelerator.shape) takes the same decision as the catalog keys, and its calibration,
    fitted on a GPU no catalog knows, survives the round trip through status."""
    inline = parse_spec({**RAW, "model": {"name": "meta-llama/Llama-2-7b-hf", "shape": {
        "hiddenSize": 4096, "numLayers": 32, "numAttentionHeads": 32, "intermediateSize": 11008, "vocabSize": 32000,
        "parameterCount": 6.738e9, "maxPositionEmbeddings": 4096}},
        "accelerator": {"shape": {"name": "lab-h100", "memoryGiB": 63.43, "bandwidthGBps": 1620, "peakDenseTFLOPS": 989}}})
    assert inline.model.architecture.key == "llama-2-7b-hf" and inline.accelerator.gpu.key == "lab-h100"
    status, ring = ring_status(curve)
    obs = replace(observation(curve[32]), t_end_s=NOW)
    window = plan.PoolWindow("server", live_pool(), plan.OBSERVED, observation=obs)
    by_key, by_shape = (plan.plan(gathered(window, ring), status, s, NOW) for s in (SPEC, inline))
    rec_key, rec_shape = by_key.status["recommendation"], by_shape.status["recommendation"]
    for k in ("maxNumSeqs", "gpuMemoryUtilization", "predictedThroughputTokensPerSecond"):
        assert rec_shape[k] == pytest.approx(rec_key[k], rel=1e-6), k
    assert [p_.body for p_ in by_shape.patches] == [p_.body for p_ in by_key.patches] != []
    cal = by_shape.status["calibration"]
    assert cal["gpu"] == "lab-h100" and cal["models"] == ["llama-2-7b-hf"]
    back = status_codec.calibration_from_status(cal)
    assert back is not None and back.params == pytest.approx(
        status_codec.calibration_from_status(by_key.status["calibration"]).params)


# ---------------------------------------------------------------- replica stabilisation (HPA semantics)

def rec(t_s: float, replicas, up: bool = False) -> dict:
    """One entry of status.scaleDownRecommendations."""
    return {"recommendedUnixSeconds": t_s, "replicas": replicas, **({"scaleUp": True} if up else {})}


@pytest.mark.parametrize("want,want_down,history,current,replicas,kept", [
    (6, 6, [], 4, 6, [rec(NOW, 6, True)]),  # a scale-up at once, kept for the cooldown
    (2, 3, [rec(NOW - 50, 4), rec(NOW - 80, 5)], 4, 4, [rec(NOW - 50, 4), rec(NOW, 3)]),  # the highest of the window
    (2, 3, [rec(NOW - 50, 3), rec(NOW - 100, 5)], 4, 3, [rec(NOW - 50, 3), rec(NOW, 3)]),  # older than the window: gone
    (2, 2, [rec(NOW - 200, 4, True)], 4, 4, [rec(NOW - 200, 4, True), rec(NOW, 2)]),  # no scale-down within the
    # cooldown of a scale-up
    (2, 2, [rec(NOW - 10, "x"), "garbage", {"replicas": 3}, rec(NOW + 5, 9)], 4, 2, [rec(NOW, 2)]),  # unreadable
    # or future entries dropped
    (2, 2, [[NOW - 200, 4, 1], [NOW - 30, 3]], 4, 4, [rec(NOW - 200, 4, True), rec(NOW - 30, 3), rec(NOW, 2)]),  # an
    # earlier version's positional entries are read
])
def test_a_scale_up_is_immediate_and_a_scale_down_waits_for_the_window(want, want_down, history, current,
                                                                       replicas, kept):
    n, hist = replica_stabilisation.stabilised_replicas(want, want_down, history, current, NOW, 60.0, 300.0)
    assert n == replicas and hist == kept


def test_a_scale_down_waits_for_a_window_of_recommendations():
    """A pool just taken over (or whose history was lost) does not shrink on one window: the
    scale-down window must hold ``min_recommendations``; a scale-up never waits."""
    args = (NOW, 45.0, 300.0)
    assert replica_stabilisation.stabilised_replicas(2, 2, [], 4, *args, min_recommendations=3) == (4, [rec(NOW, 2)])
    two = [rec(NOW - 15, 2)]
    assert replica_stabilisation.stabilised_replicas(2, 2, two, 4, *args, min_recommendations=3)[0] == 4
    three = [rec(NOW - 30, 3), rec(NOW - 15, 2)]
    assert replica_stabilisation.stabilised_replicas(2, 2, three, 4, *args, min_recommendations=3)[0] == 3
    assert replica_stabilisation.stabilised_replicas(6, 6, [], 4, *args, min_recommendations=3)[0] == 6
    spec = parse_spec({**RAW, "control": {**RAW["control"], "interval": "15s", "cooldown": "300s"}})
    assert replica_stabilisation.min_scale_down_recommendations(spec, 37.5) == 20  # one per 15 s of the 300 s
    fast = parse_spec({**RAW, "control": {**RAW["control"], "interval": "15s", "cooldown": "0s"}})
    assert replica_stabilisation.min_scale_down_recommendations(fast, 37.5) == 3
    assert replica_stabilisation.min_scale_down_recommendations(fast, 90.0) == 6


def test_a_pool_is_not_shrunk_before_it_was_watched_for_a_cooldown():
    from types import SimpleNamespace

    spec = parse_spec({**RAW, "control": {**RAW["control"], "interval": "15s", "cooldown": "300s",
                                          "observationHistory": 24}})
    ring = [SimpleNamespace(t_end_s=NOW - 15 * k, window_s=15.0) for k in range(10)]  # 150 s watched
    assert not replica_stabilisation.watched_long_enough(spec, ring, NOW)
    assert not replica_stabilisation.watched_long_enough(spec, [], NOW)
    ring = [SimpleNamespace(t_end_s=NOW - 15 * k, window_s=15.0) for k in range(20)]  # 300 s
    assert replica_stabilisation.watched_long_enough(spec, ring, NOW)
    short = parse_spec({**RAW, "control": {**RAW["control"], "interval": "15s", "cooldown": "300s",
                                           "observationHistory": 5, "minObservations": 3}})
    assert replica_stabilisation.watched_long_enough(short, ring[:5], NOW)  # a full ring is as far back as it can see


def test_the_scale_down_window_is_the_cooldown_at_least_a_restart_and_three_windows():
    spec = parse_spec({**RAW, "control": {**RAW["control"], "interval": "15s", "cooldown": "300s"}})
    assert replica_stabilisation.scale_down_window_s(spec, 37.5) == 300.0  # a burst back within 5 min finds its pods
    assert replica_stabilisation.scale_down_window_s(spec, 900.0) == 900.0  # a pod that takes 15 min to come back
    fast = parse_spec({**RAW, "control": {**RAW["control"], "interval": "15s", "cooldown": "0s"}})
    assert replica_stabilisation.scale_down_window_s(fast, 37.5) == 45.0  # three 15 s windows
    assert replica_stabilisation.scale_down_window_s(fast, 90.0) == 90.0  # as long as a pod takes to come back


def test_a_replica_change_does_not_wait_for_the_cooldown_but_a_flag_change_does(curve):
    status, ring = ring_status(curve)
    applied = {"maxNumSeqs": 32, "gpuMemoryUtilization": 0.9, "replicas": 1, "time": status_helpers.iso(NOW - 60),
               "reason": "Recommended", "restart": True}
    obs = replace(observation(curve[32]), t_end_s=NOW, request_rate_rps=50.0)  # GAUSS wants more pods
    spec = parse_spec({**RAW, "topology": {"replicas": {"min": 1, "max": 4}}})
    p = plan.plan(gathered(plan.PoolWindow("server", live_pool(applied), plan.OBSERVED, observation=obs), ring),
                  status, spec, NOW)
    d = p.status["lastDecision"]
    assert d["reason"] == "Applied" and d["target"]["maxNumSeqs"] == 32 and d["target"]["replicas"] > 1
    assert "flag changes wait (cooldown: 540s left" in d["message"]
    # the recommended cap waits, so the pods are sized by GAUSS at the live cap they keep running
    from kneecap.control import decide
    from kneecap.control.manifests import EngineSettings

    assert p.status["recommendation"]["maxNumSeqs"] != 32 and p.status["allocation"]["gaussMaxNumSeqs"] == 32
    cal = calibration_from_status(p.status["calibration"])
    live_n, _, live = decide.colocated_replicas(spec, cal, obs, settings=EngineSettings(32, 0.9, None, 1))
    assert p.status["allocation"]["sustainableRequestsPerSecondPerReplica"] == live[
        "sustainableRequestsPerSecondPerReplica"]
    assert d["target"]["replicas"] == min(live_n, 2)  # ×maxStepFactor 2 a step
    (patch,) = p.patches
    assert patch.body["spec"]["replicas"] == d["target"]["replicas"]
    live = live_pool(applied).deployment["spec"]["template"]["spec"]["containers"]
    assert patch.body["spec"]["template"]["spec"]["containers"] == live  # the same template: no pod restarts


def test_a_foreign_metrics_url_is_a_warning_condition_not_dropped_silently():
    """A pod annotation naming another host is ignored (the pod's IP is scraped) and said so:
    a Warning Event once, MetricsURLIgnored True while it lasts, False once it is gone."""
    ignored = "pod p-0: kneecap.io/metrics-url='http://169.254.169.254/'"
    w = plan.PoolWindow("server", live_pool(), tick.OPEN, "window open", ignored_metrics_url=ignored)
    first = plan.plan(gathered(w), {}, SPEC, NOW)
    cond = status_helpers.get_condition(first.status["conditions"], status_helpers.METRICS_URL_IGNORED)
    assert cond["status"] == "True" and cond["reason"] == "ForeignHost" and "169.254.169.254" in cond["message"]
    assert [e.reason for e in first.events if e.type == "Warning"] == [status_helpers.METRICS_URL_IGNORED]
    again = plan.plan(gathered(w), first.status, SPEC, NOW + 30)
    assert status_helpers.METRICS_URL_IGNORED not in [e.reason for e in again.events]
    gone = plan.plan(gathered(plan.PoolWindow("server", live_pool(), tick.OPEN, "window open")), again.status, SPEC,
                     NOW + 60)
    assert status_helpers.get_condition(gone.status["conditions"],
                                        status_helpers.METRICS_URL_IGNORED)["status"] == "False"
    never = plan.plan(gathered(plan.PoolWindow("server", live_pool(), tick.OPEN, "window open")), {}, SPEC, NOW)
    assert status_helpers.get_condition(never.status["conditions"], status_helpers.METRICS_URL_IGNORED) is None


def test_pods_the_scheduler_cannot_place_make_ready_false_with_its_message():
    pending = {"metadata": {"name": "p-0"}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/5 nodes are available: 4 node(s) had untolerated taint(s)."}]}}
    why = reconcile.unschedulable([{"metadata": {"name": "p-1"}, "status": {"phase": "Running"}}, pending])
    assert why == "pod p-0 cannot be scheduled: 0/5 nodes are available: 4 node(s) had untolerated taint(s)."
    pool = live_pool()
    pool.deployment["status"] = {"readyReplicas": 0}
    p = plan.plan(gathered(plan.PoolWindow("server", pool, tick.NO_PODS, "no ready pod", unschedulable=why)), {},
                  SPEC, NOW)
    ready = status_helpers.get_condition(p.status["conditions"], status_helpers.READY)
    assert (ready["status"], ready["reason"]) == ("False", "PodsUnschedulable")
    assert ready["message"] == f"server: {why}" and p.status["phase"] == "Pending"


def test_ready_is_one_rule_for_the_handlers_the_tick_and_virtual_time():
    up, down = {"status": {"readyReplicas": 1}}, {"status": {}}
    assert status_helpers.ready([up, up]) == (True, "PodsReady", "every pool has a ready replica")
    assert status_helpers.ready([up, down]) == (False, "PodsNotReady", "a pool has no ready replica")
    assert status_helpers.ready([]) == (False, "PodsNotReady", "a pool has no ready replica")
    # someone else's Deployment for a pool: not ready, though every pool kneecap runs is
    assert status_helpers.ready([up], conflicts=[reconcile.Conflict("Deployment", "llm", "not owned")])[:2] == (False, "PodsNotReady")
    # someone else's Service: the pools still serve
    assert status_helpers.ready([up], conflicts=[reconcile.Conflict("Service", "llm", "not owned")])[:2] == (True, "PodsReady")
    assert status_helpers.ready([up], missing=["Deployment serving/llm not found"]) == (
        False, "TargetMissing", "Deployment serving/llm not found")
    assert status_helpers.ready([down], unschedulable=["server: 0/5 nodes"]) == (
        False, "PodsUnschedulable", "server: 0/5 nodes")
    # a surge pod Pending
    assert status_helpers.ready([up], unschedulable=["server: 0/5 nodes"])[:2] == (True, "PodsReady")
    assert status_helpers.ready([up], detail="server: in sync") == (True, "PodsReady", "server: in sync")


def _keys(value, path: str = "status"):
    """Every (path, key) of a status document, lists' items included."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield path, k
            yield from _keys(v, f"{path}.{k}")
    elif isinstance(value, list):
        for item in value:
            yield from _keys(item, f"{path}[]")


def test_the_status_written_is_declared_in_the_crd_in_full_words_and_base_units(curve):
    """The status a tick writes (and a failed patch's) passes the CRD's status schema as the API
    server checks it, with nothing pruned and every top-level field declared; its keys follow the
    API conventions: camelCase, no abbreviations (mapePct, nPoints, ...), bytes not GiB."""
    import re

    from kneecap.control import validation
    from kneecap.control.spec import resource_schema

    schema = resource_schema()["properties"]["status"]
    status, ring = ring_status(curve)
    obs = replace(observation(curve[32]), t_end_s=NOW)
    p = plan.plan(gathered(plan.PoolWindow("server", live_pool(), plan.OBSERVED, observation=obs), ring), status,
                  SPEC, NOW)
    failed, _, _ = p.patches[0].if_failed.outcome(ApiFailure.of(ApiError(422, {"message": "no"}, "PATCH /x")))
    assert {"calibration", "recommendation", "allocation", "workload", "lastDecision"} <= set(p.status)
    for written in (p.status, failed, {**p.status, "invalidField": "spec.engine.image"}):
        pruned, causes, unknown = validation.check(json.loads(json.dumps(written)), schema, "status")
        assert causes == [] and unknown == []
        assert set(written) <= set(schema["properties"]), set(written) - set(schema["properties"])
        # nothing dropped but the nulls merge-patch deletes with
        assert pruned == json.loads(json.dumps(written, default=str), object_hook=lambda d: {
            k: v for k, v in d.items() if v is not None})
    banned = {"len", "pred", "pct", "mape", "cv", "std", "n", "gib"}
    for path, key in _keys(p.status):
        words = {w.lower() for w in re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", key)}
        assert re.fullmatch(r"[a-z][A-Za-z0-9]*", key) and not words & banned and "GiB" not in key, (path, key)


def test_advise_mode_keeps_its_advice_until_enforce_mode_would_have_acted(curve):
    """Advise mode guards each advice against the last one as enforce mode guards against what it
    applied: inside the cooldown the advice stands (same target, no second Event) however the
    windows move; after it, the next advice steps from the advised cap, not from the live one;
    once the pool runs other settings than it was advised from, the advice is dropped."""
    spec = parse_spec({**RAW, "control": {**RAW["control"], "mode": "advise"}})
    status, ring = ring_status(curve)

    def advise(at_s, cap_seen, status, pool=None):
        obs = replace(observation(curve[cap_seen]), t_end_s=at_s)
        return plan.plan(gathered(plan.PoolWindow("server", pool or live_pool(), plan.OBSERVED, observation=obs), ring),
                         status, spec, at_s)

    first = advise(NOW, 32, status)
    d1 = first.status["lastDecision"]
    assert first.patches == () and d1["reason"] == "Advised" and d1["target"]["maxNumSeqs"] == 64
    assert [e.reason for e in first.events].count("Advised") == 1
    advised = first.status["advised"]
    assert advised["from"]["maxNumSeqs"] == 32 and advised["target"] == d1["target"]
    assert advised["time"] == status_helpers.iso(NOW)
    status = {**status, **first.status}
    for k, (cap_seen, dt_s) in enumerate(((16, 30.0), (32, 60.0), (8, 90.0), (32, 570.0))):
        p = advise(NOW + dt_s, cap_seen, status)
        d = p.status["lastDecision"]
        assert p.patches == () and d["reason"] == "Advised" and d["target"] == d1["target"], (k, d)
        assert "Cooldown" in d["message"] and "Advised" not in [e.reason for e in p.events], (k, d)
        assert "advised" not in p.status  # kept as written (a merge patch leaves it)
        status = {**status, **p.status}
    later = advise(NOW + 630.0, 32, status)
    d = later.status["lastDecision"]
    assert d["reason"] == "Advised" and d["target"]["maxNumSeqs"] > 64 and "cap 64->" in d["message"]
    assert [e.reason for e in later.events].count("Advised") == 1 and later.status["advised"]["from"]["maxNumSeqs"] == 32
    # the user applied the advice by hand: advised from settings the pool no longer runs
    moved = replace(live_pool(), settings=replace(live_pool().settings, max_num_seqs=64))
    gone = advise(NOW + 60.0, 32, {**status, **first.status}, pool=moved)
    assert "advised" in gone.status and gone.status["advised"] is None  # deleted by the merge patch
    assert "advised 20" not in gone.status["lastDecision"]["message"]
