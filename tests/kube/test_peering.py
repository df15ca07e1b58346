"""Two `kneecap run` replicas with the chart's arguments (kopf peering through the chart's
ClusterKopfPeering) on the real API: one acts, the other takes over at once when it stops cleanly.

Each replica has a TokenRequest token of its own, so the audit log's credential id tells their
requests apart (as in test_leader_restart.py, whose SIGKILL case waits out the peering lifetime).
A clean stop (SIGTERM) removes the leader's entry from the peering object; the follower resumes
on that watch event, long before the 30 s lifetime of the leader's last keep-alive has run out.
"""

from __future__ import annotations

import copy
import datetime
import time

from kneecap.control.handlers import PEERING_LIFETIME_S
from tests.kube.conftest import (OPERATOR_USER, SERVICE_ACCOUNT, service_account_kubeconfig, start_chart_operator,
                                 tick_writes)
from tests.support.control_plane import ControlPlane, audit_time, audit_writes, credential_id
from tests.support.examples import ROOT, llmdeployment

NS = "peering"
LLMD = "kneecap.io/v1alpha1/llmdeployments"
PEERINGS = "kopf.dev/v1/clusterkopfpeerings"
PEERING_RESOURCES = ("clusterkopfpeerings", "kopfpeerings")
TICK = ["--tick", "0.5"]
RESUME_SLACK_S = 20.0  # the follower's resume (watch event, list, resume handler) on a loaded 2-core machine


def peers(admin) -> dict:
    return (admin.get(PEERINGS, None, SERVICE_ACCOUNT) or {}).get("status") or {}


def unix(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_one_replica_acts_and_the_other_takes_over_when_it_stops(control_plane: ControlPlane, chart_installed,
                                                                  ns, tmp_path):
    plane, admin = control_plane, control_plane.admin
    assert RESUME_SLACK_S < PEERING_LIFETIME_S - 5  # the bound tells a goodbye from an expiry
    kc_a, cred_a = service_account_kubeconfig(plane, tmp_path / "a.kubeconfig")
    kc_b, cred_b = service_account_kubeconfig(plane, tmp_path / "b.kubeconfig")
    mark = plane.audit_mark()

    def work(cred: str) -> list[dict]:
        """A replica's writes in NS (its peering keep-alives aside)."""
        return [e for e in audit_writes(plane.audit(OPERATOR_USER, since_line=mark), exclude=PEERING_RESOURCES)
                if credential_id(e) == cred and e["objectRef"].get("namespace") == NS]

    doc = copy.deepcopy(llmdeployment(ROOT / "examples" / "colocated.yaml"))
    doc["metadata"] = {"name": "llama", "namespace": NS}
    doc["spec"]["control"].update(interval="1s", window="1s")
    leader = follower = None
    try:
        leader = start_chart_operator(plane, chart_installed, kc_a, tmp_path / "a.log", "peer-a", TICK)
        plane.wait_for(lambda: "peer-a" in peers(admin), 30, "the first replica's keep-alive")
        follower = start_chart_operator(plane, chart_installed, kc_b, tmp_path / "b.log", "peer-b", TICK)
        plane.wait_for(lambda: "peer-b" in peers(admin), 30, "the second replica's keep-alive")
        assert peers(admin)["peer-a"]["priority"] > peers(admin)["peer-b"]["priority"]  # started first: leads
        admin.create(LLMD, doc)
        plane.wait_for(lambda: len(tick_writes(work(cred_a), NS, "llama")) >= 3,
                       60, "the leader's reconcile and ticks")
        # stopped right after a keep-alive: were the follower to wait for that one to expire, it
        # would act 30 s later, not within the few seconds a goodbye takes
        seen = peers(admin)["peer-a"]["lastseen"]
        last_keepalive = unix(plane.wait_for(lambda: (lambda s: s if s != seen else None)(
            peers(admin)["peer-a"]["lastseen"]), PEERING_LIFETIME_S, "the leader's next keep-alive"))
        stopped_at = time.time()
        leader.stop()  # SIGTERM: its handlers under way finish, then kopf says goodbye (entry removed), exits
        exited_at = time.time()
        assert leader.process.returncode == 0, leader.tail()
        assert "handler(s) under way finish before this replica leaves its peers" in leader.log.read_text(), leader.tail()
        gone = plane.wait_for(lambda: "peer-a" not in peers(admin) and peers(admin), 10, "the leader's goodbye")
        try:
            taken = plane.wait_for(lambda: work(cred_b), RESUME_SLACK_S + 10, "the follower's first write")
        except Exception:
            raise AssertionError(f"the follower never acted; its log:\n{follower.tail()}") from None
        took_over_at = min(audit_time(e) for e in taken)
        plane.wait_for(lambda: len(tick_writes(work(cred_b), NS, "llama")) >= 3,
                       60, "the new leader's ticks")
        admin.delete(LLMD, NS, "llama")
        plane.wait_for(lambda: admin.get(LLMD, NS, "llama") is None, 60, "llama deleted (the new leader's finalizer)")
        writes_a, writes_b = work(cred_a), work(cred_b)
    finally:
        for op in (follower, leader):
            if op is not None:
                op.stop()

    print(f"takeover {took_over_at - stopped_at:.1f} s after SIGTERM to the leader (its exit took "
          f"{exited_at - stopped_at:.1f} s); the leader's last keep-alive would have expired "
          f"{last_keepalive + PEERING_LIFETIME_S - took_over_at:.1f} s later")
    # while the leader ran, only it wrote: the Deployment and Service it created, its status ticks
    assert {(e["verb"], e["objectRef"]["resource"]) for e in writes_a} >= {
        ("create", "deployments"), ("create", "services"), ("patch", "llmdeployments")}
    assert [e for e in writes_b if audit_time(e) < stopped_at] == []
    # never both at once: the leader's last write before the follower's first, none after its exit
    late = [(e["verb"], e["objectRef"]["resource"], e["objectRef"].get("name"), round(audit_time(e) - stopped_at, 2))
            for e in writes_a if audit_time(e) > took_over_at]
    assert late == [], f"the leader wrote after the follower's first write (s after SIGTERM): {late}"
    assert [e for e in writes_a if audit_time(e) > exited_at] == []
    # on the goodbye, not on the expiry of the leader's last keep-alive
    assert took_over_at - stopped_at < RESUME_SLACK_S < last_keepalive + PEERING_LIFETIME_S - stopped_at
    assert "peer-b" in gone
    # the new leader removed the finalizer: the delete went through it
    assert any(e["verb"] == "patch" and e["objectRef"]["resource"] == "llmdeployments" for e in writes_b)
