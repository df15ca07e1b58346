"""reconcile.plan_reconcile decides the writes from what was read (pure), and a tick's plan
carries them as actions before its own patches, each with the status to report if it fails."""

from __future__ import annotations

import copy

from kneecap.control import manifests, plan, reconcile, tick
from kneecap.control.kube import ApiError, ApiFailure, deployments_path, services_path
from kneecap.control.metric_series import Series
from tests.support.plan_inputs import OWNER, SPEC, cond, gathered, live_pool

NS = "serving"


def _service() -> dict:
    (pool,) = manifests.pools("llm", SPEC)
    return manifests.service(OWNER, SPEC, pool)


def _live(deploy: dict | None, *, full: bool = False, service: dict | None = None, owned=()) -> reconcile.LiveObjects:
    if not full:
        return reconcile.LiveObjects((), {"llm": deploy})
    return reconcile.LiveObjects((), {"llm": deploy}, {"llm": service}, tuple(owned))


def test_a_missing_deployment_and_service_are_planned_as_creates_of_what_the_spec_makes():
    result = reconcile.plan_reconcile(OWNER, SPEC, _live(None, full=True, service=None))
    assert [(w.verb, w.kind, w.name, w.path) for w in result.writes] == [
        ("create", "Deployment", "llm", deployments_path(NS)), ("create", "Service", "llm", services_path(NS))]
    (state,) = result.pools
    assert state.created and state.deployment is result.writes[0].body
    assert manifests.vllm_container(state.deployment)["image"] == "vllm"
    assert [w.change for w in result.writes] == ["llm created", "Service/llm created"]


def test_a_deployment_in_sync_plans_nothing_and_a_drifted_one_one_patch_that_holds_decisions():
    deploy = live_pool().deployment
    quiet = reconcile.plan_reconcile(OWNER, SPEC, _live(deploy))
    assert quiet.writes == [] and not quiet.pools[0].rollout_in_progress
    drifted = copy.deepcopy(deploy)
    manifests.vllm_container(drifted)["image"] = "someone-elses-image"
    before = copy.deepcopy(drifted)
    result = reconcile.plan_reconcile(OWNER, SPEC, _live(drifted))
    (write,) = result.writes
    assert (write.verb, write.path, write.change) == ("patch", deployments_path(NS, "llm"), "llm patched")
    assert write.body["spec"]["template"]["spec"]["containers"][0]["image"] == "vllm"
    assert drifted == before  # planning changed nothing it read
    # its rollout starts once the patch is sent: the decision waits (as the patched object showed before)
    assert result.pools[0].patched and result.pools[0].rollout_in_progress


def test_someone_elses_deployment_is_a_conflict_and_never_written():
    foreign = copy.deepcopy(live_pool().deployment)
    foreign["metadata"]["ownerReferences"] = []
    result = reconcile.plan_reconcile(OWNER, SPEC, _live(foreign, full=True, service=_service()))
    assert result.writes == [] and result.pools == []
    assert [c.kind for c in result.conflicts] == ["Deployment"]


def test_a_full_pass_prunes_owned_objects_the_spec_no_longer_names():
    old = copy.deepcopy(live_pool().deployment)
    old["metadata"]["name"] = "llm-old"
    result = reconcile.plan_reconcile(OWNER, SPEC, _live(live_pool().deployment, full=True, service=_service(),
                                                         owned=[("Deployment", old)]))
    assert [(w.verb, w.path, w.change) for w in result.writes] == [
        ("delete", deployments_path(NS, "llm-old"), "Deployment/llm-old deleted")]


def test_a_failed_reconcile_write_reports_reconcile_failed_with_the_apis_answer():
    state = live_pool()
    window = plan.PoolWindow("server", state, tick.OPEN, "window open")
    p = plan.plan(gathered(window, owner=OWNER, live=_live(None)), {}, SPEC, 1_800_000_000.0)
    (action,) = p.reconcile
    assert action.write.verb == "create" and p.patches == ()
    failure = ApiFailure.of(ApiError(403, {"message": "deployments.apps is forbidden"}, "POST " + deployments_path(NS)))
    status, event, counters = action.if_failed.outcome(failure)
    c = cond(status, "ApiError")
    assert (c["status"], c["reason"]) == ("True", "CreateFailed") and "forbidden" in c["message"]
    assert status["lastDecision"]["reason"] == "ReconcileFailed"
    assert "the create of Deployment llm failed" in status["lastDecision"]["message"]
    assert (event.type, event.reason) == ("Warning", "CreateFailed")
    assert counters[1] == plan.MetricUpdate("inc", Series.DECISIONS, ("serving", "llm", "ReconcileFailed"), 1.0)
    # the plan's own status is the one written when the write succeeds
    assert p.status["lastDecision"]["reason"] != "ReconcileFailed"


def test_a_deployment_found_in_sync_is_remembered_by_the_cache_and_a_new_resource_version_compares_again():
    deploy = copy.deepcopy(live_pool().deployment)
    deploy["metadata"]["resourceVersion"] = "41"
    cache = reconcile.InSyncCache()
    first = reconcile.plan_reconcile(OWNER, SPEC, _live(deploy), cache)
    assert first.writes == [] and len(first.found_in_sync) == 1 and len(cache) == 0  # planning only reads it
    cache.record(first.found_in_sync)
    again = reconcile.plan_reconcile(OWNER, SPEC, _live(deploy), cache)
    assert again.writes == [] and again.found_in_sync == []  # not compared again
    # drifted at a new resourceVersion: compared, and patched
    drifted = copy.deepcopy(deploy)
    drifted["metadata"]["resourceVersion"] = "42"
    manifests.vllm_container(drifted)["image"] = "someone-elses-image"
    (write,) = reconcile.plan_reconcile(OWNER, SPEC, _live(drifted), cache).writes
    assert write.verb == "patch" and write.body["spec"]["template"]["spec"]["containers"][0]["image"] == "vllm"


def test_the_in_sync_cache_is_bounded_and_starts_over_when_full():
    cache = reconcile.InSyncCache(max_entries=3)
    cache.record([("a",), ("b",), ("c",)])
    assert len(cache) == 3 and ("a",) in cache
    cache.record([("d",)])
    assert len(cache) == 1 and ("d",) in cache and ("a",) not in cache
