"""The control loop when the world misbehaves, on the real control plane: the operator in process
as the chart's ServiceAccount (tests/support/sim_operator.py), its pod made by the Deployment
controller and kwok and served by a twin on the pod's own IP.

* /metrics answers 200 with NaN, garbage, a truncated page or a missing histogram family: no
  decision is made on the last good window, Degraded names what was wrong, the ring stands still;
  usable windows bring the decisions back.
* the status write after a Deployment patch fails (500): the cooldown survives (the applied
  record travels in the patch), one restart only.
* the API refuses the Deployment patch (422, as an admission webhook would): ApiError, a Warning
  Event and the counter; the loop keeps observing.
* the API refuses the Service (422): ApiError names it, the loop keeps observing and says why it
  does not act.

Faults are injected where they happen in a cluster: in the page the pod serves (a scrape that
edits the twin's real page) and in the API server's answers, which a real apiserver does not
give on cue: there the operator talks to the apiserver through a `FaultProxy`.
"""

from __future__ import annotations

import asyncio
import re
import ssl

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from kneecap.control import applied, loop, vllm_args
from kneecap.control.handlers import OperatorConfig
from kneecap.control.kube import KubeClient, resource_path
from kneecap.control.loop import WINDOW_FAMILIES
from kneecap.control.metrics import OperatorMetrics
from kneecap.control.spec import GROUP, PLURAL, VERSION
from kneecap.observe.scrape import ParseCache, parse_metrics
from tests.kube.conftest import OPERATOR_USER
from tests.support.fault_proxy import Match, Rule
from tests.support.sim_operator import (DEPLOY, LLMD, PHASES, SimPods, condition, events, resource, sim_operator,
                                        status, templates, wait_for, writes_to)
from tests.support.twins import TwinTime

NS = "operator-faults"
PATCH_ERRORS = ("kneecap_api_errors_total", (("code", "422"), ("resource", "deployments"), ("verb", "patch")))


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
    twin's clock as served (one parse cache, as the operator's own scrapes have)."""
    cache = ParseCache()

    async def scrape(url: str):
        timeout = aiohttp.ClientTimeout(total=sim.scrape_timeout_s)
        async with aiohttp.ClientSession() as s, s.get(url, timeout=timeout) as r:
            text = await r.text()
        page = edit[0](text) if edit[0] else text
        return parse_metrics(page, url=url, t_s=sim.served_time(url, text), keep=WINDOW_FAMILIES, cache=cache)
    return scrape


def config(sim: TwinTime, metrics: OperatorMetrics, edit: list | None = None) -> OperatorConfig:
    return OperatorConfig(tick_s=0.1, now=sim, scrape=editing_scrape(sim, edit or [None]), metrics=metrics)


def patches(plane, name: str) -> list[dict]:
    """The operator's accepted patches of the Deployment (each one applied decision)."""
    return writes_to(plane, OPERATOR_USER, "deployments", name)


def test_unusable_metrics_hold_every_decision_and_degraded_names_them(control_plane, token, sim):
    admin, metrics, edit = control_plane.admin, OperatorMetrics(), [None]
    pods = SimPods(admin, sim, NS, "bad", PHASES)
    try:
        with sim_operator(control_plane.url, control_plane, token, NS, config(sim, metrics, edit)) as runner:
            # a 30 s cooldown (6 ticks): with usable windows the loop would step the cap again (×2)
            # well before the faults are over; a restart (31 s modelled) weighed over a 30 s horizon
            # pays with released memory valued at the most
            admin.create(LLMD, resource(NS, "bad", "enforce", cooldown="30s", control={"releasedMemoryValue": 100},
                                        batching={"efficiencyFloor": 0.02}))
            pods.wait()
            wait_for(lambda: pods.sync() and patches(control_plane, "bad"), timeout_s=180, what="a first patch")
            # the restarted pod (cap 16) serves the pages from here
            wait_for(lambda: pods.sync() and 16 in pods.caps.values(), timeout_s=120,
                     what="the restarted pod's twin")
            seen = []
            for fault, code in FAULT_PAGES:
                edit[0] = fault
                st = wait_for(lambda: pods.sync() and (lambda s: s if code in condition(s, "Degraded").get(
                    "message", "") else None)(
                    status(admin, NS, "bad")), timeout_s=60, what=f"Degraded naming {code}")
                # (a tick that scraped before the edit may still have added a window: count from here)
                n_patches, ring, t_fault = (len(patches(control_plane, "bad")), st["observations"],
                                            st["lastDecision"]["time"])
                wait_for(lambda: status(admin, NS, "bad")["lastDecision"]["time"] > t_fault, timeout_s=60,
                         what="another tick")
                st = status(admin, NS, "bad")
                seen.append((st, n_patches, ring, len(patches(control_plane, "bad"))))
            edit[0] = None
            # a fresh load makes the next windows carry traffic whatever the machine's pace
            pods.loads.extend(sim.load(t.url, [(6.0, 60.0)], seed=2) for t in pods.sync().values())
            # (a decision on the usable windows may restart the pod again: its twin follows it)
            healthy = wait_for(lambda: pods.sync() and (lambda s: s if condition(s, "Degraded").get("reason") == "Healthy"
                                        and s["lastWindow"]["outcome"] == "Observed" else None)(
                status(admin, NS, "bad")), timeout_s=90, what="usable windows again")
    finally:
        pods.stop()
    assert runner.exit_code == 0, runner.output
    for (st, n_patches, ring, n_after), (_, code) in zip(seen, FAULT_PAGES):
        d = condition(st, "Degraded")
        assert d["status"] == "True" and d["reason"] == "MetricsUnusable" and code in d["message"], d
        assert st["phase"] == "Degraded"
        assert st["lastDecision"]["reason"] == "MetricsUnusable"  # no guard ran on the last good window
        assert n_after == n_patches  # nothing patched while the metrics were unusable
        assert st["observations"] == ring  # the ring stood still
        assert st["observationFailures"]["consecutive"] >= 1
        assert st["observationFailures"]["lastReason"] == "MetricsUnusable"
    assert healthy["observationFailures"]["consecutive"] == 0 and healthy["lastWindow"]["outcome"] == "Observed"
    got = series(metrics)
    assert got[("kneecap_observation_failures_total", (("name", "bad"), ("namespace", NS),
                                                       ("reason", "MetricsUnusable")))] >= len(FAULT_PAGES)
    assert events(admin, NS, "MetricsUnusable", "bad")[0]["type"] == "Warning"


def proxied_operator(plane, proxy, token: str, sim: TwinTime, metrics: OperatorMetrics):
    """The operator talking to the apiserver through `proxy` (its token forwarded as it is)."""
    return sim_operator(proxy.url, plane, token, NS, config(sim, metrics))


def test_a_status_write_lost_after_a_patch_keeps_the_cooldown(control_plane, token, sim, fault_proxy):
    admin, metrics = control_plane.admin, OperatorMetrics()
    # the first status write after the Deployment patch that applies a decision fails
    fault_proxy.arm("PATCH", r"/deployments/cool$", [Rule(Match("PATCH", r"/llmdeployments/cool/status$"), 500,
                                                          "etcdserver: request timed out", 1)],
                    body=applied.APPLIED_ANNOTATION)
    pods = SimPods(admin, sim, NS, "cool", PHASES)
    try:
        with proxied_operator(control_plane, fault_proxy, token, sim, metrics) as runner:
            admin.create(LLMD, resource(NS, "cool", "enforce", cooldown="600s", batching={"efficiencyFloor": 0.02}))
            pods.wait()
            wait_for(lambda: pods.sync() and patches(control_plane, "cool"), timeout_s=180, what="a patch")
            wait_for(lambda: events(admin, NS, "StatusWriteFailed", "cool"), timeout_s=60, what="the failed write")
            wait_for(lambda: pods.sync() and 16 in pods.caps.values(), timeout_s=120, what="the restarted pod's twin")
            wait_for(lambda: pods.sync() and (events(admin, NS, "Cooldown", "cool") or status(admin, NS, "cool")
                                              .get("lastDecision", {}).get("reason") == "Cooldown"),
                     timeout_s=90, what="a Cooldown decision",
                     explain=lambda: (status(admin, NS, "cool").get("lastDecision"), pods.caps))
            sim.wait(15.0)  # several more ticks inside the cooldown

            def settled():
                """Status and the Deployment's record read at one point: a replica scale (no restart) may land
                between two reads, so the pair counts only when the record stood still around the status."""
                pods.sync()
                before = applied.from_deployment(admin.get(DEPLOY, NS, "cool"))
                st = status(admin, NS, "cool")
                after = applied.from_deployment(admin.get(DEPLOY, NS, "cool"))
                if after and before == after and st.get("applied", {}).get("time") == after["time"] \
                        and st.get("lastDecision", {}).get("reason") not in (None, "Applied"):
                    return st, after
                return None

            # the lost write's record is read back from the Deployment; the cooldown then holds the cap
            st, record = wait_for(settled, timeout_s=60, what="status agreeing with the Deployment's record",
                                  explain=lambda: (status(admin, NS, "cool").get("applied"),
                                                   applied.from_deployment(admin.get(DEPLOY, NS, "cool"))))
    finally:
        pods.stop()
    assert runner.exit_code == 0, runner.output
    assert [(s.method, s.code) for s in fault_proxy.faulted()] == [("PATCH", 500)]
    assert templates(admin, NS, "cool") == 2, "one restart inside the cooldown"
    deployment = admin.get(DEPLOY, NS, "cool")
    # the record of the last applied decision: the cap's restart, or a later replica scale (no restart)
    # that carries the same cap; one restart either way (the templates above, the restart counter below)
    assert record["maxNumSeqs"] == 16
    assert vllm_args.container_flag(deployment["spec"]["template"]["spec"]["containers"][0], "--max-num-seqs") == "16"
    got = series(metrics)
    assert got[("kneecap_api_errors_total", (("code", "500"), ("resource", "llmdeployments/status"),
                                             ("verb", "patch")))] == 1.0
    assert got[("kneecap_restarts_total", (("name", "cool"), ("namespace", NS), ("reason", "Recommended")))] == 1.0
    assert events(admin, NS, "StatusWriteFailed", "cool")[0]["type"] == "Warning"


def test_a_refused_deployment_patch_is_visible_and_the_loop_keeps_observing(control_plane, token, sim, fault_proxy):
    admin, metrics = control_plane.admin, OperatorMetrics()
    msg = 'admission webhook "policy.example.com" denied the request: containers must not change'
    fault_proxy.fault("PATCH", r"/deployments/deny$", 422, msg, body=applied.APPLIED_ANNOTATION, times=None)
    pods = SimPods(admin, sim, NS, "deny", PHASES)
    try:
        with proxied_operator(control_plane, fault_proxy, token, sim, metrics) as runner:
            admin.create(LLMD, resource(NS, "deny", "enforce", cooldown="600s", batching={"efficiencyFloor": 0.02}))
            pods.wait()
            st = wait_for(lambda: (lambda s: s if condition(s, "ApiError").get("status") == "True" else None)(
                status(admin, NS, "deny")), timeout_s=180, what="ApiError")
            n_obs = len(st["observations"])
            wait_for(lambda: len(status(admin, NS, "deny")["observations"]) > n_obs, timeout_s=60,
                     what="more windows")
            st = status(admin, NS, "deny")
            # every refusal the proxy sent is counted once, read while the operator runs (a patch in
            # flight when it stops is refused by the proxy but never answered to the operator)
            refused = wait_for(lambda: (lambda r: r if series(metrics).get(PATCH_ERRORS) == len(r) else None)(
                fault_proxy.faulted("PATCH", r"/deployments/deny$")), timeout_s=30, what="each refusal counted")
    finally:
        pods.stop()
    assert runner.exit_code == 0, runner.output
    c = condition(st, "ApiError")
    assert c["reason"] == "PatchFailed" and "patch deployments deny: HTTP 422" in c["message"] and msg in c["message"]
    assert refused and {s.code for s in refused} == {422}
    assert patches(control_plane, "deny") == []  # nothing applied: the apiserver never saw the patch
    assert admin.get(DEPLOY, NS, "deny")["metadata"]["generation"] == 1
    assert st["lastDecision"]["reason"] == "ApplyFailed" and "HTTP 422" in st["lastDecision"]["message"]
    assert "time" not in st["applied"] or st["applied"]["time"] is None  # no apply recorded
    ev = events(admin, NS, "PatchFailed", "deny")
    assert ev and ev[0]["type"] == "Warning" and "HTTP 422" in ev[0]["message"]
    got = series(metrics)
    assert got[PATCH_ERRORS] >= len(refused)
    assert got[("kneecap_decisions_total", (("name", "deny"), ("namespace", NS), ("reason", "ApplyFailed")))] >= 1


def test_a_refused_service_is_visible_and_the_loop_observes_without_acting(control_plane, token, sim, fault_proxy):
    admin, metrics = control_plane.admin, OperatorMetrics()
    msg = 'Service "svc" is invalid: metadata.name: Invalid value: must be a DNS-1035 label'
    fault_proxy.fault("POST", r"/namespaces/operator-faults/services$", 422, msg, times=None)
    pods = SimPods(admin, sim, NS, "svc", PHASES)
    try:
        with proxied_operator(control_plane, fault_proxy, token, sim, metrics) as runner:
            admin.create(LLMD, resource(NS, "svc", "enforce", cooldown="600s", batching={"efficiencyFloor": 0.02}))
            pods.wait()
            st = wait_for(lambda: (lambda s: s if len(s.get("observations") or []) >= 4
                                   and s.get("recommendation") else None)(status(admin, NS, "svc")),
                          timeout_s=180, what="observations and a recommendation")
    finally:
        pods.stop()
    assert runner.exit_code == 0, runner.output
    c = condition(st, "ApiError")
    assert (c["status"], c["reason"]) == ("True", "CreateFailed") and msg in c["message"]
    assert st["lastDecision"]["reason"] == "ReconcileFailed" and "HTTP 422" in st["lastDecision"]["message"]
    assert admin.get("v1/services", NS, "svc") is None
    assert patches(control_plane, "svc") == []  # a recommendation, but nothing applied
    assert events(admin, NS, "CreateFailed", "svc")[0]["type"] == "Warning"
    # the spec handler's own failure (kopf retries it) is an Event too
    assert any("reconcile" in e["message"] and "HTTP 422" in e["message"] and e["type"] == "Error"
               for e in events(admin, NS, "Logging", "svc")), events(admin, NS, name="svc")
    refused = fault_proxy.faulted("POST", r"/services$")
    got = series(metrics)
    # every error counted is a refusal the proxy gave (the last may have been answered as the
    # operator stopped, before it counted it)
    counted = got[("kneecap_api_errors_total", (("code", "422"), ("resource", "services"), ("verb", "create")))]
    assert 2 <= counted <= len(refused) <= counted + 1


def test_a_status_write_that_fails_is_merged_into_the_next_and_reported(control_plane, token, fault_proxy):
    admin = control_plane.admin
    admin.create(LLMD, resource(NS, "llm", "advise"))
    fault_proxy.fault("PATCH", r"/llmdeployments/llm/status$", 500, "etcd timed out", times=1)
    path = resource_path(f"{GROUP}/{VERSION}", PLURAL, NS, "llm")
    posted = []

    async def two_ticks():
        client = KubeClient(fault_proxy.url, token=token,
                            ssl_context=ssl.create_default_context(cafile=str(control_plane.pki.ca)))
        ctx = loop.LoopContext(kube=client, metrics=OperatorMetrics(), event=lambda *e: posted.append(e))
        mem = loop.LoopMemory()
        try:
            first = await loop.write_status(ctx, path, {"observations": [{"pool": "server"}], "phase": "Running"}, mem)
            kept = dict(mem.unwritten_status or {})
            second = await loop.write_status(ctx, path, {"phase": "Degraded"}, mem)
            return first, kept, second, mem, ctx.metrics
        finally:
            await client.close()

    mark = control_plane.audit_mark()
    first, kept, second, mem, metrics = asyncio.run(two_ticks())
    st = admin.get(LLMD, NS, "llm")["status"]
    assert (first, second) == (False, True)
    assert kept == {"observations": [{"pool": "server"}], "phase": "Running"}
    assert st == {"observations": [{"pool": "server"}], "phase": "Degraded"}  # the lost ring arrived with the next
    assert [e["responseStatus"]["code"] for e in control_plane.audit(OPERATOR_USER, since_line=mark)
            if e["verb"] == "patch" and e["objectRef"].get("subresource") == "status"] == [200]
    assert mem.unwritten_status is None and mem.status_write_failure is None
    (etype, reason, message), = posted
    assert (etype, reason) == ("Warning", "StatusWriteFailed") and "HTTP 500: etcd timed out" in message
    assert metrics.registry.get_sample_value(
        "kneecap_api_errors_total", {"verb": "patch", "resource": "llmdeployments/status", "code": "500"}) == 1.0
