"""Leader election and an apiserver restart, on the real control plane (tests/support/control_plane.py).

Both tests run `kneecap run` out of process with the chart's own arguments (free ports, and
`--tick 0.5`) as the chart's ServiceAccount, each operator with a TokenRequest token of its
own: the apiserver's audit log records a bound token's `jti` in
``user.extra["authentication.kubernetes.io/credential-id"]``, so every request is attributed to
one process. The LLMDeployment is examples/colocated.yaml with a 2 s control interval and window;
its pod, placed by the real scheduler and Running under kwok with an IP in 127.1.0.0/16, is a
`kneecap twin` listening on that IP and the engine port, under a light `kneecap load`, so the
operator's scrapes succeed and status.observations (the ring of control windows SLIM is fitted
on) fills.

Leader kill (SIGKILL). kopf's peering (kopf/_core/engines/peering.py): each replica PATCHes its
entry ``{priority, lifetime, lastseen}`` into the ClusterKopfPeering every ``lifetime − 5..10 s``
(handlers.PEERING_LIFETIME_S = 30 s); a replica that sees a live peer of higher priority pauses
and sleeps until that peer's ``lastseen + lifetime``, then touches its own entry, and on that
event finds the peer dead (``deadline <= now``), deletes its entry and resumes. A leader killed
without a word is therefore replaced no earlier than its ``lastseen + 30 s`` (no overlap of the
two writers, asserted) and, its last keep-alive being at most 25 s old at the kill, 5-30 s after
the kill plus the follower's resume (touch, watch event, clean, list, the resume handler): the
bound is LIFETIME_S + RESUME_SLACK_S (30 + 20 s) after the kill, and RESUME_SLACK_S after
``lastseen + lifetime``; the slack is for a 2-core machine with two CPU burners beside it.

Apiserver restart. kube-apiserver alone is stopped (etcd keeps the state) until the operator's
loop has felt it (a failed status write on its api-errors counter), then started on the same
port; the operator must write again, follow a spec change made after the restart (its kopf
watch back), re-open its informers' watches, and keep every ring entry and the calibration.
"""

from __future__ import annotations

import copy
import datetime
import time

import pytest

from kneecap.control.handlers import PEERING_LIFETIME_S
from tests.kube.conftest import (OPERATOR_USER, SERVICE_ACCOUNT, PodTwins, metric_sum, service_account_kubeconfig,
                                 start_chart_operator)
from tests.support.control_plane import ControlPlane, audit_time, audit_writes, credential_id
from tests.support.examples import ROOT, llmdeployment
from tests.support.twins import load

LLMD = "kneecap.io/v1alpha1/llmdeployments"
PEERINGS = "kopf.dev/v1/clusterkopfpeerings"
PEERING_RESOURCES = ("clusterkopfpeerings", "kopfpeerings")
EXAMPLE = ROOT / "examples" / "colocated.yaml"
ENGINE_PORT = 8000  # the example's spec.engine.port
MODEL, ARCH, GPU = "meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b", "h100-80gb"  # the example's
TICK = ["--tick", "0.5"]
LIFETIME_S = PEERING_LIFETIME_S
RESUME_SLACK_S = 20.0
RING_TOLERANCE_S = 0.01  # ring times are rounded to the millisecond (status.rounded)


# ------------------------------------------------------------------ helpers


def resource(namespace: str, name: str) -> dict:
    obj = copy.deepcopy(llmdeployment(EXAMPLE))
    obj["metadata"] = {"name": name, "namespace": namespace}
    # a window closes every 2-4 s (the tick is due every interval − tick/2); 200 entries: none
    # falls out of the ring within a test, so every entry written can be looked for
    obj["spec"]["control"].update(interval="2s", window="2s", observationHistory=200)
    return obj


def status_of(admin, ns: str, name: str) -> dict:
    return (admin.get(LLMD, ns, name) or {}).get("status") or {}


def ring(admin, ns: str, name: str) -> list[dict]:
    return status_of(admin, ns, name).get("observations") or []


def assert_windows_counted_once(entries: list[dict]) -> None:
    """Each ring entry is one control window [end − windowSeconds, end]: no window in the ring
    twice, none overlapping another (a window two writers both counted would be)."""
    ends = [e["windowEndUnixSeconds"] for e in entries]
    assert ends == sorted(ends) and len(set(ends)) == len(ends), f"window ends not strictly increasing: {ends}"
    for prev, cur in zip(entries, entries[1:]):
        start = cur["windowEndUnixSeconds"] - cur["windowSeconds"]
        assert start >= prev["windowEndUnixSeconds"] - RING_TOLERANCE_S, (
            f"window ending {cur['windowEndUnixSeconds']} ({cur['windowSeconds']} s) overlaps the one ending "
            f"{prev['windowEndUnixSeconds']}")


def pods_running(admin, ns: str, name: str) -> list[dict]:
    pods = admin.list("v1/pods", ns, selector=f"app.kubernetes.io/instance={name}")
    return pods if pods and all(p["status"].get("phase") == "Running" and p["status"].get("podIP")
                                for p in pods) else []


class Workload:
    """The LLMDeployment applied, its pods served by twins on their IPs, a light load on them."""

    def __init__(self, plane: ControlPlane, ns: str, name: str):
        self.plane, self.admin, self.ns, self.name = plane, plane.admin, ns, name
        self.twins = PodTwins(self.admin, ns, f"app.kubernetes.io/instance={name}", ENGINE_PORT,
                              model=MODEL, arch=ARCH, gpu=GPU, max_num_seqs=256)
        self.loads: list = []

    def start(self) -> dict:
        self.admin.add_namespace(self.ns)
        created = self.admin.create(LLMD, resource(self.ns, self.name))
        self.plane.wait_for(lambda: pods_running(self.admin, self.ns, self.name), 120,
                            f"{self.ns}/{self.name}'s pods Running with an IP")
        for twin in self.twins.sync().values():
            # ~3 requests/s of 128 + 100 tokens: a batch of 2-4 on the twin, a few % of a core
            self.loads.append(load(twin.url, rate=3.0, duration_s=900, input_mean=128, output_mean=100))
        return created

    def stop(self) -> None:
        for proc in self.loads:
            if proc.poll() is None:
                proc.terminate()
            proc.wait(10)
        self.twins.stop()

    def delete(self, timeout_s: float = 60) -> None:
        """Delete the LLMDeployment (an operator must run: it removes its finalizer)."""
        self.admin.delete(LLMD, self.ns, self.name)
        self.plane.wait_for(lambda: self.admin.get(LLMD, self.ns, self.name) is None, timeout_s,
                            f"{self.ns}/{self.name} deleted")


def ref(event: dict) -> dict:
    return event.get("objectRef") or {}  # (none on /api, /apis discovery)


def by(events: list[dict], cred: str) -> list[dict]:
    return [e for e in events if credential_id(e) == cred]


def summary(events: list[dict]) -> list[tuple]:
    return [(e["verb"], ref(e).get("resource"), ref(e).get("subresource"),
             ref(e).get("name"), e["responseStatus"]["code"]) for e in events]


def unix(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def peers(admin) -> dict:
    return (admin.get(PEERINGS, None, SERVICE_ACCOUNT) or {}).get("status") or {}


# ------------------------------------------------------------------ leader kill


def test_follower_takes_over_from_a_killed_leader_within_the_peering_lifetime(
        control_plane: ControlPlane, chart_installed: dict, tmp_path):
    plane, admin = control_plane, control_plane.admin
    ns, name = "leader-kill", "llama-leader"
    kc_a, cred_a = service_account_kubeconfig(plane, tmp_path / "a.kubeconfig")
    kc_b, cred_b = service_account_kubeconfig(plane, tmp_path / "b.kubeconfig")
    assert cred_a.startswith("JTI=") and cred_a != cred_b
    mark = plane.audit_mark()
    work = Workload(plane, ns, name)
    leader = follower = None
    try:
        # the first started leads (oldest-first priorities): wait for its keep-alive first
        leader = start_chart_operator(plane, chart_installed, kc_a, tmp_path / "a.log", "kneecap-a", TICK)
        plane.wait_for(lambda: "kneecap-a" in peers(admin), 30, "the leader's keep-alive")
        follower = start_chart_operator(plane, chart_installed, kc_b, tmp_path / "b.log", "kneecap-b", TICK)
        plane.wait_for(lambda: "kneecap-b" in peers(admin), 30, "the follower's keep-alive")
        assert peers(admin)["kneecap-a"]["priority"] > peers(admin)["kneecap-b"]["priority"]
        assert peers(admin)["kneecap-a"]["lifetime"] == LIFETIME_S

        work.start()
        try:
            plane.wait_for(lambda: len(ring(admin, ns, name)) >= 3, 120, "3 windows observed by the leader")
        except Exception:
            raise AssertionError(f"no observations; status {status_of(admin, ns, name)}\n"
                                 f"leader log:\n{leader.tail()}") from None

        lastseen_before = peers(admin)["kneecap-a"]["lastseen"]
        leader.kill()  # SIGKILL: no goodbye in the peering object
        killed_at = time.time()
        # what the dead leader left: its last keep-alive, its ring
        entry = peers(admin)["kneecap-a"]
        lastseen = unix(entry["lastseen"])
        assert lastseen >= unix(lastseen_before)
        expires_at = lastseen + entry["lifetime"]
        ring_at_kill = ring(admin, ns, name)
        kill_line = plane.audit_mark()

        def follower_work():
            ev = audit_writes(by(plane.audit(OPERATOR_USER, since_line=mark), cred_b), exclude=PEERING_RESOURCES)
            return ev or None

        try:
            taken = plane.wait_for(follower_work, LIFETIME_S + RESUME_SLACK_S + 10, "the follower's first write")
        except Exception:
            raise AssertionError(f"the follower never acted; its log:\n{follower.tail()}") from None
        first_write_at = min(audit_time(e) for e in taken)
        plane.wait_for(lambda: len(ring(admin, ns, name)) >= len(ring_at_kill) + 2, 60,
                       "2 windows observed by the new leader")
        final_ring = ring(admin, ns, name)
        plane.wait_for(lambda: "kneecap-a" not in peers(admin), 30, "the dead leader's entry cleaned")
        final_peers = peers(admin)
        events = plane.audit(OPERATOR_USER, since_line=mark)
        work.delete()  # (the new leader removes the finalizer)
    finally:
        work.stop()
        for op in (follower, leader):
            if op is not None:
                op.stop()

    # every request of the operator's user is one of the two tokens'
    assert events and {credential_id(e) for e in events} == {cred_a, cred_b}
    before = [e for e in events if audit_time(e) < killed_at]
    writes_a, writes_b = (audit_writes(by(before, c), exclude=PEERING_RESOURCES) for c in (cred_a, cred_b))
    # while both ran, only the leader wrote: the Deployment and Service it created, its status ticks
    assert writes_b == [], f"the follower wrote while the leader lived: {summary(writes_b)}"
    assert [e for e in by(before, cred_b) if ref(e).get("resource") == "clusterkopfpeerings"
            and e["verb"] == "patch"], "the follower's keep-alives"
    done_a = {(e["verb"], ref(e).get("resource"), ref(e).get("subresource")) for e in writes_a
              if ref(e).get("namespace") == ns and e["responseStatus"]["code"] < 300}
    assert {("create", "deployments", None), ("create", "services", None),
            ("patch", "llmdeployments", "status")} <= done_a, done_a
    status_ticks_a = [e for e in writes_a if ref(e).get("subresource") == "status"
                      and ref(e).get("name") == name]
    assert len(status_ticks_a) >= 3

    # the takeover: never inside the dead leader's lease, within the bound after it
    takeover_s = first_write_at - killed_at
    print(f"takeover: first write {takeover_s:.1f} s after SIGKILL, {first_write_at - expires_at:.1f} s after "
          f"the leader's lease (lastseen + {entry['lifetime']} s) expired; the lease had "
          f"{expires_at - killed_at:.1f} s left at the kill")
    assert first_write_at >= expires_at, "the follower wrote before the dead leader's lease expired"
    assert first_write_at - expires_at <= RESUME_SLACK_S
    assert 0 < takeover_s <= LIFETIME_S + RESUME_SLACK_S
    # nothing with the dead leader's token after the kill; its peering entry removed by the follower
    after = plane.audit(since_line=kill_line)
    assert by(after, cred_a) == [], summary(by(after, cred_a))
    assert "kneecap-a" not in final_peers and "kneecap-b" in final_peers
    cleaned = [e for e in by(events, cred_b) if ref(e).get("resource") == "clusterkopfpeerings"
               and e["verb"] == "patch" and audit_time(e) >= expires_at]
    assert cleaned

    # nothing counted twice: the new leader kept every window the old one counted and counted
    # none of them again (its first window opens with its own first scrape, after the takeover)
    assert final_ring[:len(ring_at_kill)] == ring_at_kill
    assert_windows_counted_once(final_ring)
    new = final_ring[len(ring_at_kill):]
    assert new and all(e["windowEndUnixSeconds"] - e["windowSeconds"] >= first_write_at - RING_TOLERANCE_S
                       for e in new)
    # nothing applied twice: the new leader found the Deployment and Service in sync
    after_b = audit_writes(by(events, cred_b), exclude=PEERING_RESOURCES)
    assert not [e for e in after_b if ref(e).get("resource") in ("deployments", "services")
                and e["verb"] != "delete"], summary(after_b)
    creates = [e for e in events if e["verb"] == "create" and ref(e).get("resource") == "deployments"
               and ref(e).get("namespace") == ns]
    assert len(creates) == 1 and credential_id(creates[0]) == cred_a


# ------------------------------------------------------------------ apiserver restart


@pytest.mark.skip(reason="written next")
def test_apiserver_restart():
    pass
