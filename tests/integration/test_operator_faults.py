"""The control loop when the world misbehaves: operator (KopfRunner) + emulated API + a real twin pod.

* /metrics answers 200 with NaN, garbage, a truncated page or a missing histogram family: no
  decision is made on the last good window, Degraded names what was wrong, the ring stands still;
  usable windows bring the decisions back.
* the status write after a Deployment patch fails (500): the cooldown survives (the applied
  record travels in the patch), one restart only.
* the API refuses the Deployment patch (422): ApiError, a Warning Event and the counter; the loop
  keeps observing.
* the API refuses the Service (422, full reconcile): ApiError names it, the loop keeps observing
  and says why it does not act.

Faults are injected where they happen in a cluster: in the page the pod serves (a scrape
function that edits the twin's real page) and in the API server's answers (a KubeAPI subclass).
"""

from __future__ import annotations

import re

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kneecap.control import applied as A, vllm_args as V
from kneecap.control.handlers import OperatorConfig
from kneecap.control.loop import WINDOW_FAMILIES
from kneecap.control.metrics import OperatorMetrics
from kneecap.observe.scrape import parse_metrics
from tests.integration.test_operator_loop import add_pod, drive, resource, sim, stop, twin  # noqa: F401 (fixtures)
from tests.support.faulty_api import FaultyAPI
from tests.support.kmock_api import LLMD, KubeAPIThread
from tests.support.operator_harness import DEPLOY, NS, condition, events, operator, status, wait_for
from tests.support.twins import TwinTime

pytestmark = pytest.mark.slow


@pytest.fixture()
def kube():
    FaultyAPI.FAULTS, FaultyAPI.ARM = {}, {}
    with KubeAPIThread(api_class=FaultyAPI) as k:
        k.add_namespace(NS)
        yield k


def series(metrics: OperatorMetrics) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(metrics.exposition().decode()) for s in f.samples}


# --- pages as a pod could serve them (edits of the twin's real page) -----------------------
def nan_running(text: str) -> str:
    return re.sub(r"^(vllm:num_requests_running(\{[^}]*\})?) \S+$", r"\1 NaN", text, flags=re.M)


def garbage(text: str) -> str:
    return "<html><body>502 Bad Gateway</body></html>\n"


def truncated(text: str) -> str:
    return text[: text.index("vllm:e2e_request_latency_seconds_bucket") + 60]


def no_ttft_family(text: str) -> str:
    return "\n".join(line for line in text.split("\n") if "vllm:time_to_first_token_seconds" not in line) + "\n"


FAULT_PAGES = [(nan_running, "invalid_value:vllm:num_requests_running"), (garbage, "missing_metric:"),
               (truncated, "truncated:vllm:e2e_request_latency_seconds"),
               (no_ttft_family, "missing_metric:vllm:time_to_first_token_seconds")]


def editing_scrape(sim: TwinTime, edit: list):
    """A scrape of the twin's real page through ``edit[0]`` (None: as served), stamped with the
    twin's clock as served."""
    async def scrape(url: str):
        timeout = aiohttp.ClientTimeout(total=sim.scrape_timeout_s)
        async with aiohttp.ClientSession() as s, s.get(url, timeout=timeout) as r:
            text = await r.text()
        page = edit[0](text) if edit[0] else text
        return parse_metrics(page, url=url, t_s=sim.served_time(url, text), keep=WINDOW_FAMILIES)
    return scrape


def run_operator(kube, metrics: OperatorMetrics, sim: TwinTime, edit: list | None = None):
    """The operator on ``kube``, scraping through :func:`editing_scrape`, on the twin's clock."""
    return operator(kube, OperatorConfig(tick_s=0.1, now=sim, scrape=editing_scrape(sim, edit or [None]),
                                         metrics=metrics))


def test_unusable_metrics_hold_every_decision_and_degraded_names_them(kube, sim, twin):
    metrics, edit = OperatorMetrics(), [None]
    procs = drive(sim, twin)
    try:
        with run_operator(kube, metrics, sim, edit) as runner:
            # a 30 s cooldown (6 ticks): with usable windows the loop would step the cap again (×2)
            # well before the faults are over; a restart (31 s modelled) weighed over a 30 s horizon
            # pays with released memory valued at the most
            kube.create(LLMD, resource("bad", "enforce", cooldown="30s", control={"releasedMemoryValue": 100},
                                       batching={"efficiencyFloor": 0.02}))
            add_pod(kube, "bad", twin)
            wait_for(lambda: len(kube.history(DEPLOY, NS, "bad")) >= 2, timeout_s=120, what="a first patch")
            seen = []
            for fault, code in FAULT_PAGES:
                edit[0] = fault
                st = wait_for(lambda: (lambda s: s if code in condition(s, "Degraded").get("message", "") else None)(
                    status(kube, "bad")), timeout_s=60, what=f"Degraded naming {code}")
                # (a tick that scraped before the edit may still have added a window: count from here)
                versions, ring, t_fault = (len(kube.history(DEPLOY, NS, "bad")), st["observations"],
                                           st["lastDecision"]["time"])
                wait_for(lambda: status(kube, "bad")["lastDecision"]["time"] > t_fault, timeout_s=60,
                         what="another tick")
                st = status(kube, "bad")
                seen.append((st, versions, ring, len(kube.history(DEPLOY, NS, "bad"))))
            edit[0] = None
            # the drive's load is 85 s of twin time; on a busy machine the faults can outlast it, so
            # a fresh load makes the next windows carry traffic whatever the machine's pace
            procs.append(sim.load(twin.url, [(6.0, 60.0)], seed=2))
            healthy = wait_for(lambda: (lambda s: s if condition(s, "Degraded").get("reason") == "Healthy"
                                        and s["lastWindow"]["outcome"] == "Observed" else None)(
                status(kube, "bad")), timeout_s=60, what="usable windows again")
    finally:
        stop(procs)
    assert runner.exit_code == 0, runner.output
    for (st, versions, ring, versions_after), (_, code) in zip(seen, FAULT_PAGES):
        d = condition(st, "Degraded")
        assert d["status"] == "True" and d["reason"] == "MetricsUnusable" and code in d["message"], d
        assert st["phase"] == "Degraded"
        assert st["lastDecision"]["reason"] == "MetricsUnusable"  # no guard ran on the last good window
        assert versions_after == versions  # nothing patched while the metrics were unusable
        assert st["observations"] == ring  # the ring stood still
        assert st["observationFailures"]["consecutive"] >= 1
        assert st["observationFailures"]["lastReason"] == "MetricsUnusable"
    assert healthy["observationFailures"]["consecutive"] == 0 and healthy["lastWindow"]["outcome"] == "Observed"
    got = series(metrics)
    assert got[("kneecap_observation_failures_total", (("name", "bad"), ("namespace", NS),
                                                       ("reason", "MetricsUnusable")))] >= len(FAULT_PAGES)
    assert events(kube, "MetricsUnusable", "bad")[0]["type"] == "Warning"


def test_a_status_write_lost_after_a_patch_keeps_the_cooldown(kube, sim, twin):
    metrics = OperatorMetrics()
    # the first status write after the Deployment patch that applies a decision fails
    FaultyAPI.ARM[("PATCH", r"/deployments/cool$", A.APPLIED_ANNOTATION)] = {
        ("PATCH", r"/llmdeployments/cool/status$", None): [500, "etcdserver: request timed out", 1]}
    procs = drive(sim, twin)
    try:
        with run_operator(kube, metrics, sim) as runner:
            kube.create(LLMD, resource("cool", "enforce", cooldown="600s", batching={"efficiencyFloor": 0.02}))
            add_pod(kube, "cool", twin)
            wait_for(lambda: len(kube.history(DEPLOY, NS, "cool")) >= 2, timeout_s=120, what="a patch")
            wait_for(lambda: events(kube, "StatusWriteFailed", "cool"), timeout_s=60, what="the failed write")
            st = wait_for(lambda: (lambda s: s if s.get("lastDecision", {}).get("reason") == "Cooldown" else None)(
                status(kube, "cool")), timeout_s=60, what="a Cooldown decision")
            sim.wait(15.0)  # several more ticks inside the cooldown
            st = status(kube, "cool")
    finally:
        stop(procs)
    assert runner.exit_code == 0, runner.output
    versions = kube.history(DEPLOY, NS, "cool")
    assert len(versions) == 2, "one restart inside the cooldown"
    record = A.from_deployment(versions[-1])
    assert record["maxNumSeqs"] == 16 and record["restart"] is True
    c = versions[-1]["spec"]["template"]["spec"]["containers"][0]
    assert V.container_flag(c, "--max-num-seqs") == "16"
    assert st["applied"]["time"] == record["time"]  # read back from the Deployment's record
    assert st["lastDecision"]["reason"] != "Applied"  # (Cooldown, or a gain too small by then)
    got = series(metrics)
    assert got[("kneecap_api_errors_total", (("code", "500"), ("resource", "llmdeployments/status"),
                                             ("verb", "patch")))] == 1.0
    assert got[("kneecap_restarts_total", (("name", "cool"), ("namespace", NS), ("reason", "Recommended")))] == 1.0
    assert events(kube, "StatusWriteFailed", "cool")[0]["type"] == "Warning"


def test_a_refused_deployment_patch_is_visible_and_the_loop_keeps_observing(kube, sim, twin):
    metrics = OperatorMetrics()
    msg = 'admission webhook "policy.example.com" denied the request: containers must not change'
    FaultyAPI.FAULTS[("PATCH", r"/deployments/deny$", A.APPLIED_ANNOTATION)] = [422, msg, None]
    procs = drive(sim, twin)
    try:
        with run_operator(kube, metrics, sim) as runner:
            kube.create(LLMD, resource("deny", "enforce", cooldown="600s", batching={"efficiencyFloor": 0.02}))
            add_pod(kube, "deny", twin)
            st = wait_for(lambda: (lambda s: s if condition(s, "ApiError").get("status") == "True" else None)(
                status(kube, "deny")), timeout_s=120, what="ApiError")
            n_obs = len(st["observations"])
            wait_for(lambda: len(status(kube, "deny")["observations"]) > n_obs, timeout_s=60, what="more windows")
            st = status(kube, "deny")
    finally:
        stop(procs)
    assert runner.exit_code == 0, runner.output
    c = condition(st, "ApiError")
    assert c["reason"] == "PatchFailed" and "patch deployments deny: HTTP 422" in c["message"] and msg in c["message"]
    assert len(kube.history(DEPLOY, NS, "deny")) == 1  # nothing applied
    assert st["lastDecision"]["reason"] == "ApplyFailed" and "HTTP 422" in st["lastDecision"]["message"]
    assert "time" not in st["applied"] or st["applied"]["time"] is None  # no apply recorded
    ev = events(kube, "PatchFailed", "deny")
    assert ev and ev[0]["type"] == "Warning" and "HTTP 422" in ev[0]["message"]
    got = series(metrics)
    assert got[("kneecap_api_errors_total", (("code", "422"), ("resource", "deployments"), ("verb", "patch")))] >= 1
    assert got[("kneecap_decisions_total", (("name", "deny"), ("namespace", NS), ("reason", "ApplyFailed")))] >= 1


def test_a_refused_service_is_visible_and_the_loop_observes_without_acting(kube, sim, twin):
    msg = 'Service "svc" is invalid: metadata.name: Invalid value: must be a DNS-1035 label'
    FaultyAPI.FAULTS[("POST", r"/services$", None)] = [422, msg, None]
    metrics = OperatorMetrics()
    procs = drive(sim, twin)
    try:
        with run_operator(kube, metrics, sim) as runner:
            kube.create(LLMD, resource("svc", "enforce", cooldown="600s", batching={"efficiencyFloor": 0.02}))
            wait_for(lambda: kube.get(DEPLOY, NS, "svc"), timeout_s=60, what="the Deployment")
            add_pod(kube, "svc", twin)
            st = wait_for(lambda: (lambda s: s if len(s.get("observations") or []) >= 4
                                   and s.get("recommendation") else None)(status(kube, "svc")),
                          timeout_s=120, what="observations and a recommendation")
    finally:
        stop(procs)
    assert runner.exit_code == 0, runner.output
    c = condition(st, "ApiError")
    assert (c["status"], c["reason"]) == ("True", "CreateFailed") and msg in c["message"]
    assert st["lastDecision"]["reason"] == "ReconcileFailed" and "HTTP 422" in st["lastDecision"]["message"]
    assert len(kube.history(DEPLOY, NS, "svc")) == 1  # a recommendation, but nothing applied
    assert events(kube, "CreateFailed", "svc")[0]["type"] == "Warning"
    # the spec handler's own failure (kopf retries it) is an Event too
    assert any("reconcile" in e["message"] and "HTTP 422" in e["message"] and e["type"] == "Error"
               for e in events(kube, "Logging", "svc")), events(kube, name="svc")
    got = series(metrics)
    assert got[("kneecap_api_errors_total", (("code", "422"), ("resource", "services"), ("verb", "create")))] >= 2
