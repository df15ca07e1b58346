"""The fleet advice (kneecap.control.fleet, issue 24 item 3): computed from LLMDeployments' specs
and statuses with the real packing, written only when it changes, an Event only when the
placement changes, and enforced (a shared resource and the memory share in the pod template) only
where spec.placement names a sharing mechanism."""

from __future__ import annotations

import argparse
import asyncio
import copy
import logging
from pathlib import Path

import pytest
import yaml

from kneecap.control import fleet, manifests, reconcile
from kneecap.control.kube import ApiError
from kneecap.control.lifecycle import Operator, Sink
from kneecap.control.metrics import OperatorMetrics
from kneecap.control.spec import parse_spec
from kneecap.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
BASE = yaml.safe_load((ROOT / "examples" / "colocated.yaml").read_text())
# two small engines that each idle on an H100 today: the packing puts them on one GPU
LIGHT = {"requestsPerSecond": 0.5, "inputLengthMean": 512, "outputLengthMean": 128}


def body(name: str, placement: dict | None = None, model: str = "llama-3.2-1b", status: dict | None = None,
         ns: str = "serving") -> dict:
    obj = copy.deepcopy(BASE)
    obj["metadata"] = {"name": name, "namespace": ns, "uid": f"uid-{name}", "generation": 1}
    spec = obj["spec"]
    spec["model"] = {"name": model, "architecture": model}
    spec["slo"] = {"quantile": 0.95, "ttftSeconds": 1.0, "tpotSeconds": 0.05}
    spec["engine"]["maxNumSeqs"] = 64
    spec["engine"]["extraArgs"] = []
    if placement is not None:
        spec["placement"] = placement
    obj["status"] = status or {}
    return obj


def declared(**extra) -> dict:
    return {"workload": dict(LIGHT), **extra}


TIME_SLICED = {"mechanism": "time-slicing", "resourceName": "nvidia.com/gpu.shared"}


@pytest.fixture(scope="module")
def pair_advice():
    members = [fleet.member(fleet.index_entry(body(n, declared()))) for n in ("a", "b")]
    return fleet.compute(members)


def test_two_light_deployments_pack_onto_one_gpu(pair_advice):
    adv = pair_advice
    assert (adv.gpus_current, adv.gpus_recommended) == (2, 1)
    assert adv.cost_current_per_hour == pytest.approx(10.0) and adv.cost_recommended_per_hour == pytest.approx(5.0)
    block = fleet.status_block(adv, "serving/a")
    assert block["included"] and block["shared"] and block["sharedWith"] == ["serving/b"]
    assert block["gpu"] == "h100-80gb" and block["workloadSource"] == "declared"
    assert 0 < block["gpuMemoryUtilization"] < 0.5 and block["maxNumSeqs"] >= 8
    assert block["predicted"]["quantile"] == 0.95
    assert 0 < block["predicted"]["ttftSeconds"] <= 0.9 and 0 < block["predicted"]["tpotSeconds"] <= 0.045
    assert block["sloMet"] is True
    assert block["fleet"] == {"deployments": 2, "gpusCurrent": 2, "gpusRecommended": 1,
                              "costPerHourCurrent": 10.0, "costPerHourRecommended": 5.0}
    # no spec.placement: advice only, never enforced
    assert block["mechanism"] == "none" and block["enforced"] is False
    assert "enforcedGpuMemoryUtilization" not in block and "advice only" in block["message"]


def test_observed_workload_wins_and_nothing_to_pack_alone():
    observed = {"workload": {"pool": "server", "requestsPerSecond": 0.51234, "inputLengthMean": 500.0,
                             "inputLengthCoefficientOfVariation": 1.0, "outputLengthMean": 130.0,
                             "outputLengthCoefficientOfVariation": 1.0}}
    m = fleet.member(fleet.index_entry(body("a", declared(), status=observed)))
    assert m.workload_source == "observed" and m.deployment.rate_rps == 0.51  # two significant digits
    alone = fleet.compute([m])
    assert alone.result is None and alone.gpus_recommended == alone.gpus_current == 1
    block = fleet.status_block(alone, "serving/a")
    assert block["shared"] is False and "nothing to pack" in block["message"]


@pytest.mark.parametrize("change, why", [
    (lambda b: b["spec"].pop("placement"), "no workload observed yet"),
    (lambda b: b["spec"]["slo"].update(ttftSeconds=None, tpotSeconds=None) or b["spec"]["slo"].clear(),
     "no TTFT or TPOT SLO"),
    (lambda b: b["spec"]["accelerator"].update(count=2) or b["spec"]["engine"].pop("resources"),
     "2 GPUs per replica"),
    (lambda b: b["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z"), "being deleted"),
    (lambda b: b["spec"]["engine"].update(maxNumSeqs=0), "invalid spec (spec.engine.maxNumSeqs)"),
])
def test_a_deployment_left_out_says_why(change, why):
    b = body("a", declared())
    change(b)
    m = fleet.member(fleet.index_entry(b))
    assert m.deployment is None and why in m.excluded
    block = fleet.status_block(fleet.compute([m]), "serving/a")
    assert block["included"] is False and why in block["message"]


def test_placement_spec_validation_names_the_field():
    spec = body("a")["spec"]
    with pytest.raises(InputError) as e:
        parse_spec({**spec, "placement": {"mechanism": "time-slicing"}})
    assert e.value.field == "spec.placement.resourceName"
    with pytest.raises(InputError) as e:
        parse_spec({**spec, "placement": {"mechanism": "hope"}})
    assert e.value.field == "spec.placement.mechanism"
    with pytest.raises(InputError) as e:
        parse_spec({**spec, "placement": {"workload": {"requestsPerSecond": 1.0, "inputLengthMean": 100}}})
    assert e.value.field == "spec.placement.workload.outputLengthMean"
    with pytest.raises(InputError) as e:
        parse_spec({**spec, "placement": {**TIME_SLICED, "replicasPerGpu": 1}})
    assert e.value.field == "spec.placement.replicasPerGpu"
    p = parse_spec({**spec, "placement": TIME_SLICED}).placement
    assert p.shares and p.resource_name == "nvidia.com/gpu.shared" and p.replicas_per_gpu == 2
    assert not parse_spec(spec).placement.shares  # absent: mechanism none


def _template(b: dict) -> dict:
    spec = fleet.effective_spec(b, parse_spec(b["spec"]))
    pool = manifests.pools(b["metadata"]["name"], spec)[0]
    return manifests.deployment(b, spec, pool, manifests.initial_settings(spec, "server"))


def test_nothing_is_co_located_without_spec_placement(pair_advice):
    """The advice says share, but without spec.placement the pods keep a whole GPU each."""
    for placement in (declared(), declared(mechanism="none")):
        b = body("a", placement)
        b["status"]["placement"] = fleet.status_block(pair_advice, "serving/a")
        c = manifests.vllm_container(_template(b))
        assert c["resources"]["limits"] == {"nvidia.com/gpu": "1"}
        assert "--gpu-memory-utilization=0.9" in c["args"]


def test_time_slicing_requests_the_shared_resource_at_the_advised_share():
    members = [fleet.member(fleet.index_entry(body(n, declared(**TIME_SLICED)))) for n in ("a", "b")]
    adv = fleet.compute(members)
    b = body("a", declared(**TIME_SLICED))
    block = fleet.status_block(adv, "serving/a")
    assert block["enforced"] is True and block["mechanism"] == "time-slicing"
    share = block["enforcedGpuMemoryUtilization"]
    assert share <= block["gpuMemoryUtilization"] and share <= 0.95 / 2
    # before the advice is stored: whole GPUs
    assert manifests.vllm_container(_template(b))["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    b["status"]["placement"] = block
    c = manifests.vllm_container(_template(b))
    assert c["resources"] == {"limits": {"nvidia.com/gpu.shared": "1"}}
    assert f"--gpu-memory-utilization={share:g}" in c["args"]
    # the advice no longer shares it (or the user drops spec.placement): whole GPUs again
    b["status"]["placement"] = {**block, "enforced": False, "shared": False}
    assert manifests.vllm_container(_template(b))["resources"]["limits"] == {"nvidia.com/gpu": "1"}


def test_live_deployment_is_patched_to_the_share_and_the_sync_cache_sees_the_change():
    members = [fleet.member(fleet.index_entry(body(n, declared(**TIME_SLICED)))) for n in ("a", "b")]
    block = fleet.status_block(fleet.compute(members), "serving/a")
    b = body("a", declared(**TIME_SLICED))
    live = _template(b)
    live["metadata"].update(resourceVersion="7", uid="dep-uid")
    cache = reconcile.InSyncCache()
    spec = fleet.effective_spec(b, parse_spec(b["spec"]))
    objs = reconcile.LiveObjects(hpas=(), deployments={"a": live})
    first = reconcile.plan_reconcile(b, spec, objs, cache)
    assert not first.writes
    cache.record(first.found_in_sync)
    b["status"]["placement"] = block
    spec = fleet.effective_spec(b, parse_spec(b["spec"]))
    result = reconcile.plan_reconcile(b, spec, objs, cache)
    [w] = result.writes
    c = w.body["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"] == {"nvidia.com/gpu.shared": "1"}


def test_placement_changed_ignores_small_prediction_moves(pair_advice):
    block = fleet.status_block(pair_advice, "serving/a")
    moved = {**block, "predicted": {**block["predicted"], "ttftSeconds": block["predicted"]["ttftSeconds"] * 1.01}}
    assert not fleet.placement_changed(block, moved)
    assert fleet.placement_changed(block, {**block, "sharedWith": []})
    assert fleet.placement_changed(block, {**block, "fleet": {**block["fleet"], "gpusRecommended": 2}})
    assert fleet.placement_changed(None, block)


class FakeKube:
    """Records status patches; fails while `fail` is set (the advice's only write)."""

    def __init__(self):
        self.patches, self.fail = [], False

    async def patch_status(self, path, patch):
        if self.fail:
            raise ApiError(503, {"message": "unavailable"}, f"PATCH {path}")
        self.patches.append((path, patch))


def test_status_written_and_event_posted_only_when_the_advice_changes(pair_advice):
    kube, metrics, events = FakeKube(), OperatorMetrics(), []
    op = Operator(kube=kube, metrics=metrics, now=lambda: 1_800_000_000.0)
    sink = Sink({}, lambda t, r, m: events.append((t, r, m)), logging.getLogger("test_fleet_advice"))
    entries = [fleet.index_entry(body(n, declared())) for n in ("a", "b")]
    advisor, written = fleet.FleetAdvisor(), {}
    a = body("a", declared())

    async def run(n: int, b: dict):
        return [await fleet.advise_resource(op, b, entries, advisor, written, sink) for _ in range(n)]

    kube.fail = True
    assert asyncio.run(run(1, a)) == [None]
    assert [r for _, r, _ in events] == [fleet.WRITE_FAILED_REASON]
    assert 'kneecap_api_errors_total{code="503"' in metrics.exposition().decode()
    kube.fail = False
    first, *rest = asyncio.run(run(5, a))
    assert first is not None and rest == [None] * 4  # written once
    assert [r for _, r, _ in events].count(fleet.EVENT_REASON) == 1
    [(_, reason, message)] = [e for e in events if e[1] == fleet.EVENT_REASON]
    assert "2 -> 1 GPUs" in message and "$10.00/h -> $5.00/h" in message and "serving/b" in message
    assert len(kube.patches) == 1 and kube.patches[0][1]["placement"]["sharedWith"] == ["serving/b"]
    # the watch brings the write back: a fresh memo and the stored status, still no write
    stored = body("a", declared(), status={"placement": first})
    assert asyncio.run(fleet.advise_resource(op, stored, entries, advisor, {}, sink)) is None
    assert advisor.computations == 1  # the same inputs: packed once
    text = metrics.exposition().decode()
    assert "kneecap_fleet_gpus_recommended 1.0" in text and "kneecap_fleet_gpus_current 2.0" in text
    assert "kneecap_fleet_cost_recommended_dollars_per_hour 5.0" in text
    assert "kneecap_fleet_cost_current_dollars_per_hour 10.0" in text
    # b's declared workload is withdrawn: nothing left to pack a with, the advice changes, one new Event
    entries[1] = fleet.index_entry(body("b"))
    again = asyncio.run(fleet.advise_resource(op, stored, entries, advisor, written, sink))
    assert again is not None and again["shared"] is False and "sharedWith" not in again
    assert kube.patches[-1][1]["placement"]["sharedWith"] is None  # the merge patch drops it
    assert [r for _, r, _ in events].count(fleet.EVENT_REASON) == 2


def test_the_advisor_serves_every_timer_of_a_period_from_one_look_at_the_fleet():
    """N resources' timers ask within one fleet period: the advisor looks at the fleet once per
    recheck period (not once per timer: N² spec parses), and rebuilds only a changed member."""
    advisor = fleet.FleetAdvisor(recheck_s=30.0)
    entries = [fleet.index_entry(body(n, declared())) for n in ("a", "b")]

    def untouchable():
        raise AssertionError("the fleet was read again within the recheck period")
        yield

    first = asyncio.run(advisor.advise(iter(entries), 1000.0))
    kept = {key: m for key, (_, m) in advisor._members.items()}
    assert asyncio.run(advisor.advise(untouchable(), 1010.0)) is first
    assert asyncio.run(advisor.advise(untouchable(), 1029.9)) is first
    entries[1] = fleet.index_entry(body("b", {"workload": {**LIGHT, "requestsPerSecond": 2.0}}))
    again = asyncio.run(advisor.advise(iter(entries), 1031.0))  # past the period: read, b rebuilt, a reused
    assert advisor._members["serving/a"][1] is kept["serving/a"]
    assert advisor._members["serving/b"][1] is not kept["serving/b"]
    assert advisor._members["serving/b"][1].deployment.rate_rps == 2.0
    assert again.fingerprint != first.fingerprint and advisor.computations == 2


def test_a_member_s_spec_is_parsed_again_only_when_the_spec_changes(monkeypatch):
    """Every window moves the status keys the advice reads; the spec's schema and CEL check runs
    again only for a changed spec, and an invalid spec stays excluded with its field named on
    every look until it is fixed."""
    parsed = []

    def counting(raw):
        parsed.append(raw)
        return parse_spec(raw)

    monkeypatch.setattr(fleet, "parse_spec", counting)
    advisor = fleet.FleetAdvisor()
    observed = lambda rps: {"workload": {"requestsPerSecond": rps, "inputLengthMean": 512,  # noqa: E731
                                         "inputLengthCoefficientOfVariation": 0.5, "outputLengthMean": 128,
                                         "outputLengthCoefficientOfVariation": 0.5}}
    for t, rps in enumerate((0.5, 0.6, 0.7)):
        entries = [fleet.index_entry(body(n, declared(), status=observed(rps))) for n in ("a", "b")]
        advice = asyncio.run(advisor.advise(entries, 1000.0 + 1000.0 * t))  # (past the CPU budget's wait)
        assert {m.key: m.deployment.rate_rps for m in advice.members} == {"serving/a": rps, "serving/b": rps}
    assert len(parsed) == 2  # once per member, the status moving on every look
    bad = body("b", declared(), status=observed(0.7))
    bad["spec"]["slo"]["quantile"] = 2.0
    for t in range(2):
        advice = asyncio.run(advisor.advise([fleet.index_entry(body("a", declared(), status=observed(0.8 + t))),
                                             fleet.index_entry(bad)], 5000.0 + 1000.0 * t))
        (b,) = [m for m in advice.members if m.key == "serving/b"]
        assert b.deployment is None and b.excluded == "invalid spec (spec.slo.quantile)"
    assert len(parsed) == 3  # the invalid spec once
    advice = asyncio.run(advisor.advise([fleet.index_entry(body(n, declared(), status=observed(0.9)))
                                         for n in ("a", "b")], 9000.0))
    assert len(parsed) == 4 and all(m.deployment is not None for m in advice.members)


def dra(claim: str) -> dict:
    return declared(mechanism="dra", resourceClaimName=claim)


def test_dra_references_the_shared_claim_only_when_its_group_is_the_advised_gpu():
    same = fleet.compute([fleet.member(fleet.index_entry(body(n, dra("gpu-0")))) for n in ("a", "b")])
    block = fleet.status_block(same, "serving/a")
    assert block["enforced"] is True and block["resourceClaimName"] == "gpu-0"
    assert block["enforcedGpuMemoryUtilization"] == pytest.approx(block["gpuMemoryUtilization"], abs=1e-3)
    b = body("a", dra("gpu-0"), status={"placement": block})
    t = _template(b)
    pod = t["spec"]["template"]["spec"]
    assert pod["resourceClaims"] == [{"name": manifests.SHARED_CLAIM, "resourceClaimName": "gpu-0"}]
    assert manifests.vllm_container(t)["resources"] == {"claims": [{"name": manifests.SHARED_CLAIM}]}
    # the user renames the claim: the stored advice is for the other one, whole GPUs until it is redone
    renamed = body("a", dra("gpu-1"), status={"placement": block})
    assert "resourceClaims" not in _template(renamed)["spec"]["template"]["spec"]
    # unshared again: the live template's claim is removed by the reconcile patch
    b["status"]["placement"] = {**block, "enforced": False}
    assert manifests.removed_template_fields(_template(b), t) == {"resourceClaims": None}
    # claims that do not match the advised GPU's engines: advice only
    apart = fleet.compute([fleet.member(fleet.index_entry(body(n, dra(f"gpu-{n}")))) for n in ("a", "b")])
    block = fleet.status_block(apart, "serving/a")
    assert block["shared"] and block["enforced"] is False and "ResourceClaim gpu-a" in block["message"]


# --------------------------------------------------------------- an operator inventory (kneecap run --fleet-inventory)

INVENTORY = "h100-80gb=4,l40s=4,l4=8"  # kneecap pack --gpus syntax, catalog prices ($5, $1.8, $0.8 /h)


def _inventory(spec: str = INVENTORY):
    from kneecap.commands import run as run_cmd

    return run_cmd.fleet_inventory(argparse.Namespace(fleet_inventory=[spec]))


@pytest.fixture(scope="module")
def inventory_advice():
    members = [fleet.member(fleet.index_entry(body(n, declared(**TIME_SLICED)))) for n in ("a", "b")]
    return fleet.compute(members, inventory=_inventory())


def test_an_inventory_moves_a_small_model_to_a_cheaper_gpu_type(pair_advice, inventory_advice):
    # without an inventory: today's type only (pair_advice: both on one h100-80gb, $5/h)
    assert fleet.status_block(pair_advice, "serving/a")["gpu"] == "h100-80gb"
    adv = inventory_advice
    block = fleet.status_block(adv, "serving/a")
    assert block["included"] and block["gpu"] in ("l4", "l40s") and block["sloMet"] is True
    assert f"on {block['gpu']} instead of its h100-80gb" in block["message"]
    assert "never changes spec.accelerator" in block["message"]
    # the fleet's $/h falls below the today's-types packing's, GPUs no more than it
    assert adv.cost_current_per_hour == pytest.approx(10.0)
    assert adv.cost_recommended_per_hour < pair_advice.cost_recommended_per_hour == pytest.approx(5.0)
    assert adv.gpus_recommended <= pair_advice.gpus_recommended
    assert block["fleet"]["costPerHourRecommended"] == pytest.approx(adv.cost_recommended_per_hour, abs=1e-4)
    # time-slicing opted in, but the share is the advice's for another GPU type: not enforced
    assert block["mechanism"] == "time-slicing" and block["enforced"] is False
    assert "another GPU type" in block["message"] and "enforcedGpuMemoryUtilization" not in block
    spec = parse_spec(body("a", declared(**TIME_SLICED))["spec"])
    assert fleet.effective_spec(body("a", declared(**TIME_SLICED), status={"placement": block}),
                                spec).shared_gpu_share is None


def test_an_inventory_advises_a_lone_deployment_and_the_metrics_show_its_price():
    kube, metrics, events = FakeKube(), OperatorMetrics(), []
    op = Operator(kube=kube, metrics=metrics, now=lambda: 1_800_000_000.0)
    sink = Sink({}, lambda t, r, m: events.append((t, r, m)), logging.getLogger("test_fleet_advice"))
    entries = [fleet.index_entry(body("a", declared()))]
    advisor = fleet.FleetAdvisor(inventory=_inventory())
    block = asyncio.run(fleet.advise_resource(op, body("a", declared()), entries, advisor, {}, sink))
    assert block["gpu"] in ("l4", "l40s") and block["shared"] is False and block["enforced"] is False
    assert block["fleet"]["gpusRecommended"] == 1 and block["fleet"]["costPerHourRecommended"] < 5.0
    [(_, reason, message)] = events
    assert reason == fleet.EVENT_REASON and "$5.00/h -> $" in message and f"on {block['gpu']}" in message
    text = metrics.exposition().decode()
    assert "kneecap_fleet_cost_current_dollars_per_hour 5.0" in text
    assert f"kneecap_fleet_cost_recommended_dollars_per_hour {block['fleet']['costPerHourRecommended']}" in text
    # without an inventory a lone deployment has nothing to pack, as before
    alone = fleet.compute([fleet.member(entries[0])])
    assert alone.result is None and alone.cost_recommended_per_hour == pytest.approx(5.0)


def test_an_inventory_price_is_the_one_the_advice_counts():
    members = [fleet.member(fleet.index_entry(body(n, declared()))) for n in ("a", "b")]
    adv = fleet.compute(members, inventory=_inventory("h100-80gb=2,l4=2@0.25"))
    assert fleet.status_block(adv, "serving/a")["gpu"] == "l4"
    assert adv.cost_recommended_per_hour == pytest.approx(0.25 * adv.gpus_recommended)


@pytest.mark.parametrize("spec, needle", [("h100=4", "ambiguous GPU"), ("nosuchgpu=1", "nosuchgpu"),
                                          ("l4=x", "TYPE=COUNT"), ("l4", "TYPE=COUNT"), ("", "non-empty"),
                                          ("l4=1,l4=2", "duplicate"), ("l4=-1", "count")])
def test_a_bad_inventory_names_the_flag(spec, needle):
    with pytest.raises(InputError) as e:
        _inventory(spec)
    assert e.value.field == "--fleet-inventory" and needle in str(e.value)


def _light_at(name: str, rate: float) -> dict:
    return fleet.index_entry(body(name, {"workload": {**LIGHT, "requestsPerSecond": rate}}))


def test_drift_alone_repacks_within_the_cpu_budget_and_a_changed_fleet_at_once():
    """Workload drift (a rate moves) repacks only once the last packing's CPU is cpu_share of the
    time since it began; a change of the fleet (a member added) repacks at once. The GAUSS tails
    are kept across packings: a repack simulates only the engine sets whose inputs moved, and
    gives what a fresh packing gives."""
    advisor = fleet.FleetAdvisor(cpu_share=0.01)
    first = asyncio.run(advisor.advise([_light_at("a", 0.5), _light_at("b", 0.5)], 1000.0))
    assert advisor.computations == 1 and advisor.cpu_s > 0
    wait_s = advisor.cpu_s / 0.01  # the budget: 1% of a core
    drifted = [_light_at("a", 0.6), _light_at("b", 0.5)]
    assert asyncio.run(advisor.advise(drifted, 1000.0 + 0.5 * wait_s)) is first  # put off
    assert advisor.computations == 1 and advisor.deferred == 1
    grown = [*drifted, _light_at("c", 0.5)]
    third = asyncio.run(advisor.advise(grown, 1000.0 + 0.6 * wait_s))  # a new member: at once
    assert advisor.computations == 2 and third.totals()["deployments"] == 3
    hits = advisor.tails_cache.hits
    later = 1000.0 + 0.6 * wait_s + 1.01 * (advisor.cpu_s / 0.01)
    fourth = asyncio.run(advisor.advise([_light_at("a", 0.6), _light_at("b", 0.7), _light_at("c", 0.5)], later))
    assert advisor.computations == 3 and advisor.tails_cache.hits > hits  # a and c's engines alone: kept
    fresh = fleet.compute(fourth.members)
    ran, ran_fresh = fourth.result.pop("evaluations"), fresh.result.pop("evaluations")
    assert fourth.result == fresh.result and fourth.gpus_recommended == fresh.gpus_recommended
    assert ran < ran_fresh  # GAUSS tails simulated, the kept ones not counted


def test_a_packing_past_its_evaluation_bound_is_no_recommendation_said_why():
    members = [fleet.member(_light_at(n, 0.5)) for n in ("a", "b", "c")]
    advice = fleet.compute(members, max_evaluations=2)
    assert advice.result is None and advice.gpus_recommended == advice.gpus_current == 3
    assert "needed more than 2 GAUSS evaluations" in advice.message and "--fleet-max-evaluations" in advice.message
    block = fleet.status_block(advice, "serving/a")
    assert block["included"] is True and "--fleet-max-evaluations" in block["message"]
    with pytest.raises(InputError) as exc:
        fleet.FleetAdvisor(cpu_share=0.0)
    assert exc.value.field == "cpu_share"
