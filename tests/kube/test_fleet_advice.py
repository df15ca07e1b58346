"""The fleet advice (issue 24, item 3) on the real control plane: the operator in process as the
chart's ServiceAccount, two small LLMDeployments whose declared loads (spec.placement.workload)
pack onto one GPU. Advice first: status.placement, kneecap_fleet_* and one FleetRecommendation
Event each, while every pod keeps a whole nvidia.com/gpu; co-located (the pod template asks for
the device plugin's shared resource at the advised memory share) only once spec.placement
names time-slicing, then a DRA ResourceClaim the two reference. No engine runs here: every
scrape fails, the advice needs none."""

from __future__ import annotations

import time

from kneecap.control import fleet, vllm_args
from kneecap.control.handlers import OperatorConfig
from kneecap.control.metrics import OperatorMetrics
from kneecap.observe.scrape import ScrapeError
from tests.support.sim_operator import (DEPLOY, LLMD, container, events, resource, sim_operator, status,
                                        wait_for)

NS = "fleet-advice"
LIGHT = {"requestsPerSecond": 0.5, "inputLengthMean": 512, "outputLengthMean": 128}
SHARED = "nvidia.com/gpu.shared"


async def no_engine(url: str):
    raise ScrapeError(url, "no engine runs in this test")


def light(name: str) -> dict:
    return resource(NS, name, "advise", control={"interval": "1s"}, accelerator={"costPerHour": 2.5},
                    slo={"quantile": 0.95, "ttftSeconds": 1.0, "tpotSeconds": 0.05}, placement={"workload": LIGHT})


def advised(admin, name: str, **want):
    block = status(admin, NS, name).get("placement") or {}
    return block if block.get("included") and all(block.get(k) == v for k, v in want.items()) else None


def gpu_limits(admin, name: str) -> dict:
    return container(admin, NS, name)["resources"]["limits"]


def pods_limits(admin, name: str) -> list[dict]:
    pods = admin.list("v1/pods", NS, f"app.kubernetes.io/instance={name}")
    return [p["spec"]["containers"][0]["resources"]["limits"] for p in pods]


def test_fleet_advice_then_co_location_only_with_spec_placement(control_plane, token):
    admin, metrics = control_plane.admin, OperatorMetrics()
    cfg = OperatorConfig(tick_s=0.5, fleet_s=0.5, scrape=no_engine, metrics=metrics)
    with sim_operator(control_plane.url, control_plane, token, NS, cfg) as runner:
        for name in ("a", "b"):
            admin.create(LLMD, light(name))
        a = wait_for(lambda: advised(admin, "a", sharedWith=[f"{NS}/b"]), timeout_s=60, what="a's fleet advice")
        b = wait_for(lambda: advised(admin, "b", sharedWith=[f"{NS}/a"]), timeout_s=60, what="b's fleet advice")
        for block in (a, b):
            assert block["fleet"] == {"deployments": 2, "gpusCurrent": 2, "gpusRecommended": 1,
                                      "costPerHourCurrent": 5.0, "costPerHourRecommended": 2.5}
            assert block["shared"] and block["gpu"] == "h100-64gb" and block["sloMet"]
            assert 0 < block["gpuMemoryUtilization"] <= 0.5 and block["predicted"]["quantile"] == 0.95
            assert block["mechanism"] == "none" and block["enforced"] is False
        text = metrics.exposition().decode()
        assert "kneecap_fleet_gpus_recommended 1.0" in text and "kneecap_fleet_gpus_current 2.0" in text
        assert "kneecap_fleet_cost_recommended_dollars_per_hour 2.5" in text
        # one Event each, and no other over ten more fleet periods (the advice is unchanged)
        wait_for(lambda: all(events(admin, NS, fleet.EVENT_REASON, n) for n in ("a", "b")), timeout_s=30,
                 what="the FleetRecommendation Events")
        end = time.monotonic() + 10 * cfg.fleet_s
        while time.monotonic() < end:
            assert [len(events(admin, NS, fleet.EVENT_REASON, n)) for n in ("a", "b")] == [1, 1]
            time.sleep(cfg.fleet_s)
        [event] = events(admin, NS, fleet.EVENT_REASON, "a")
        assert "2 -> 1 GPUs" in event["message"] and "advice only" in event["message"]
        # advice only: every pod keeps a whole GPU, nothing is co-located
        for name in ("a", "b"):
            assert gpu_limits(admin, name) == {"nvidia.com/gpu": "1"}
            assert vllm_args.container_flag(container(admin, NS, name), "--gpu-memory-utilization") == "0.9"
            pods = wait_for(lambda: pods_limits(admin, name), timeout_s=60, what=f"{name}'s pod")
            assert pods == [{"nvidia.com/gpu": "1"}]

        # the user opts in: time-slicing through the device plugin's shared resource
        for name in ("a", "b"):
            admin.patch(LLMD, NS, name, {"spec": {"placement": {"mechanism": "time-slicing", "resourceName": SHARED}}})
        enforced = wait_for(lambda: advised(admin, "a", enforced=True), timeout_s=60, what="a's advice enforced")
        share = enforced["enforcedGpuMemoryUtilization"]
        assert enforced["mechanism"] == "time-slicing" and 0 < share <= min(enforced["gpuMemoryUtilization"], 0.475)
        wait_for(lambda: SHARED in gpu_limits(admin, "a"), timeout_s=60, what="a's template on the shared resource")
        assert gpu_limits(admin, "a") == {SHARED: "1"}
        assert float(vllm_args.container_flag(container(admin, NS, "a"), "--gpu-memory-utilization")) == share
        assert len(events(admin, NS, fleet.EVENT_REASON, "a")) == 2  # the advice changed: enforced

        # DRA: both name one ResourceClaim, whose device their pods then share (the claim is the
        # user's: kneecap references it, and the pods wait for it)
        for name in ("a", "b"):
            admin.patch(LLMD, NS, name, {"spec": {"placement": {"mechanism": "dra", "resourceName": None,
                                                                "resourceClaimName": "gpu-0"}}})
        wait_for(lambda: "resourceClaims" in admin.get(DEPLOY, NS, "a")["spec"]["template"]["spec"], timeout_s=60,
                 what="a's template on the shared ResourceClaim")
        pod = admin.get(DEPLOY, NS, "a")["spec"]["template"]["spec"]
        assert pod["resourceClaims"] == [{"name": "kneecap-shared-gpu", "resourceClaimName": "gpu-0"}]
        assert pod["containers"][0]["resources"] == {"claims": [{"name": "kneecap-shared-gpu"}]}
        assert advised(admin, "a", enforced=True, mechanism="dra", resourceClaimName="gpu-0")
    assert runner.exit_code == 0, runner.output


def test_an_operator_inventory_advises_a_cheaper_gpu_type_and_changes_nothing(control_plane, token):
    """`kneecap run --fleet-inventory`: the advice may put a deployment (a lone one too) on a
    cheaper GPU type; status.placement and the metrics say so, while its spec, template and pod
    keep their own GPU type (advice only)."""
    from kneecap.commands.pack import parse_gpus
    from tests.kube.conftest import clear_namespace

    admin, metrics = control_plane.admin, OperatorMetrics()
    clear_namespace(admin, NS)  # the test above's deployments
    cfg = OperatorConfig(tick_s=0.5, fleet_s=0.5, scrape=no_engine, metrics=metrics,
                         fleet_inventory=parse_gpus("h100-64gb=2,l40s=2,l4=2", "--fleet-inventory"))
    with sim_operator(control_plane.url, control_plane, token, NS, cfg) as runner:
        admin.create(LLMD, light("c"))
        block = wait_for(lambda: advised(admin, "c"), timeout_s=60, what="c's fleet advice")
        assert block["gpu"] in ("l4", "l40s") and block["shared"] is False and block["sloMet"]
        assert block["fleet"]["costPerHourCurrent"] == 2.5 and block["fleet"]["costPerHourRecommended"] < 2.5
        assert f"on {block['gpu']} instead of its h100-64gb" in block["message"]
        wait_for(lambda: events(admin, NS, fleet.EVENT_REASON, "c"), timeout_s=30, what="c's FleetRecommendation")
        text = metrics.exposition().decode()
        assert f"kneecap_fleet_cost_recommended_dollars_per_hour {block['fleet']['costPerHourRecommended']}" in text
        # advice only: the spec keeps its GPU type and the pod a whole GPU of it
        assert admin.get(LLMD, NS, "c")["spec"]["accelerator"]["type"] == "h100-64gb"
        assert gpu_limits(admin, "c") == {"nvidia.com/gpu": "1"}
    assert runner.exit_code == 0, runner.output
