"""Leader election and an apiserver restart, on the real control plane (tests/support/control_plane.py).

Both tests run `kneecap run` out of process with the chart's own arguments (free ports, and
`--tick 0.5`) as the chart's ServiceAccount, each operator with a TokenRequest token of its
own: the apiserver's audit log records a bound token's `jti` in
``user.extra["authentication.kubernetes.io/credential-id"]``, so every request is attributed to
one process. The LLMDeployment is examples/colocated.yaml with a 2 s control interval and window;
its pod, placed by the real scheduler and Running under kwok with an IP in the plane's loopback pod_cidr, is a
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
loop has felt it (a failed status write on its api-errors counter) and kopf's watch of
LLMDeployments is in a 13 s retry backoff, then started on the same port: the ticks' own writes
succeed seconds before kopf's watch brings the body up to date (the operator used to rebuild
the ring from that stale body and drop the windows written meanwhile: loop.pending_status).
The operator must write again, follow a spec change made after the restart (its kopf watch
back), re-open its informers' watches, and keep every ring entry and the calibration.
"""

from __future__ import annotations

import copy
import datetime
import re
import time

from kneecap.control.handlers import PEERING_LIFETIME_S
from tests.kube.conftest import (OPERATOR_USER, SERVICE_ACCOUNT, PodTwins, metric_sum, service_account_kubeconfig,
                                 start_chart_operator, tick_writes)
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
    # a window closes every 2-4 s (the tick is due every interval − tick/2, and a window that
    # closes a little short of 2 s is dropped for the next one: loop.trim_window); 200 entries:
    # none falls out of the ring within a test, so every entry written can be looked for
    obj["spec"]["control"].update(interval="2s", window="2s", observationHistory=200)
    return obj


def status_of(admin, ns: str, name: str) -> dict:
    return (admin.get(LLMD, ns, name) or {}).get("status") or {}


class RingRecorder:
    """Reads the LLMDeployment's status, keeping each distinct ring (status.observations) and
    each status it read, in order (the tests poll through it)."""

    def __init__(self, admin, ns: str, name: str):
        self.admin, self.ns, self.name = admin, ns, name
        self.seen: list[list[dict]] = []
        self.statuses: list[tuple[float, dict]] = []  # (read at, status)

    def status(self) -> dict:
        st = status_of(self.admin, self.ns, self.name)
        self.statuses.append((time.time(), st))
        ring = st.get("observations") or []
        if ring and (not self.seen or self.seen[-1] != ring):
            self.seen.append(ring)
        return st

    def ring(self) -> list[dict]:
        return self.status().get("observations") or []

    def assert_nothing_dropped(self) -> None:
        """Each ring read holds every entry of the one read before it, in order (the ring holds
        observationHistory entries: none falls out within a test)."""
        assert len(self.seen) >= 2
        for older, newer in zip(self.seen, self.seen[1:]):
            assert newer[:len(older)] == older, ("a stored ring entry was dropped", windows(older), windows(newer))


def windows(entries: list[dict]) -> list[tuple[float, float]]:
    """(start, end) of each entry's window (for messages)."""
    return [(round(e["windowEndUnixSeconds"] - e["windowSeconds"], 2), e["windowEndUnixSeconds"]) for e in entries]


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
            # ~5 requests/s of 128 + 100 tokens: a batch of 1-8 on the twin (SLIM needs two batch
            # levels to fit), a few % of a core
            self.loads.append(load(twin.url, rate=5.0, duration_s=900, input_mean=128, output_mean=100))
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
    rings = RingRecorder(admin, ns, name)
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
            plane.wait_for(lambda: len(rings.ring()) >= 3, 120, "3 windows observed by the leader")
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
        ring_at_kill = rings.ring()

        def follower_work():
            ev = audit_writes(by(plane.audit(OPERATOR_USER, since_line=mark), cred_b), exclude=PEERING_RESOURCES)
            return ev or None

        try:
            taken = plane.wait_for(follower_work, LIFETIME_S + RESUME_SLACK_S + 10, "the follower's first write")
        except Exception:
            raise AssertionError(f"the follower never acted; its log:\n{follower.tail()}") from None
        first_write_at = min(audit_time(e) for e in taken)
        plane.wait_for(lambda: len(rings.ring()) >= len(ring_at_kill) + 2, 60, "2 windows observed by the new leader")
        final_ring = rings.ring()
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
    # no request with the dead leader's token after the kill; its peering entry removed by the follower
    late = [e for e in by(plane.audit(since_line=mark), cred_a) if audit_time(e) > killed_at]
    assert late == [], summary(late)
    assert "kneecap-a" not in final_peers and "kneecap-b" in final_peers
    cleaned = [e for e in by(events, cred_b) if ref(e).get("resource") == "clusterkopfpeerings"
               and e["verb"] == "patch" and audit_time(e) >= expires_at]
    assert cleaned

    # nothing counted twice, nothing lost: the new leader kept every window the old one counted
    # (no ring entry ever stored was dropped) and counted none of them again (its first window
    # opens with its own first scrape, after the takeover)
    rings.assert_nothing_dropped()
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

# what kopf logs when a watch request of LLMDeployments fails (and it will retry)
KOPF_WATCH_RETRY = re.compile(r"Request attempt #(\d+)/\d+ failed; will retry: GET \S+/apis/kneecap\.io/v1alpha1/"
                              r"llmdeployments\?watch=true")
WATCHED = ("llmdeployments", "clusterkopfpeerings", "deployments", "replicasets", "pods", "horizontalpodautoscalers")


def test_apiserver_restart_mid_run_loses_no_window_and_applies_nothing_twice(
        control_plane: ControlPlane, chart_installed: dict, tmp_path):
    plane, admin = control_plane, control_plane.admin
    ns, name = "apiserver-restart", "llama-restart"
    kubeconfig, cred = service_account_kubeconfig(plane, tmp_path / "operator.kubeconfig")
    mark = plane.audit_mark()
    work = Workload(plane, ns, name)
    rings = RingRecorder(admin, ns, name)
    op = None
    try:
        op = start_chart_operator(plane, chart_installed, kubeconfig, tmp_path / "operator.log", "kneecap-restart",
                                  TICK)
        work.start()
        try:  # a SLIM fit in status: windows at two batch levels at least
            plane.wait_for(lambda: (st := rings.status()).get("calibration") and len(st.get("observations") or []) >= 4,
                           180, "a calibration and 4 windows")
        except Exception:
            raise AssertionError(f"not calibrated; status {status_of(admin, ns, name)}\n"
                                 f"operator log:\n{op.tail()}") from None
        errors = metric_sum(op.metrics_port, "kneecap_api_errors_total")
        before = rings.status()
        stopped_at = time.time()
        plane.stop_apiserver()
        stop_line = plane.audit_mark()
        # down until the operator's loop has felt it (a status write failed: its api-errors
        # counter) and kopf's watch of LLMDeployments has failed 7 times: it waits 13 s before the
        # next try (kopf's error_backoffs 1, 1, 2, 3, 5, 8, 13, 21), so the ticks run seconds on a
        # body from before the outage while their writes succeed again
        plane.wait_for(lambda: metric_sum(op.metrics_port, "kneecap_api_errors_total") > errors, 60,
                       "a status write the operator could not make")
        plane.wait_for(lambda: max(map(int, KOPF_WATCH_RETRY.findall(op.log.read_text(errors="replace"))),
                                   default=0) >= 7, 60, "kopf's 7th failed watch of LLMDeployments")
        plane.start_apiserver()
        ready_at = time.time()
        # (the new apiserver answers requests before its /readyz does: when it first answered)
        serving_at = min(audit_time(e) for e in plane.audit(since_line=stop_line))

        def since_stop() -> list[dict]:
            return by(plane.audit(OPERATOR_USER, since_line=stop_line,
                                  stages=("ResponseStarted", "ResponseComplete", "Panic")), cred)

        step = "a status write after the restart"
        try:
            first = plane.wait_for(lambda: [e for e in audit_writes(since_stop()) if ref(e).get("namespace") == ns
                                            and ref(e).get("resource") == "llmdeployments"
                                            and e["responseStatus"]["code"] < 300], 90, step)
            # a spec change after the restart (not one the Deployment carries) is acted on: kopf's watch is back
            generation = admin.patch(LLMD, ns, name, {"spec": {"slo": {"ttftSeconds": 0.6}}})["metadata"]["generation"]
            step = f"status.observedGeneration {generation}"
            plane.wait_for(lambda: rings.status().get("observedGeneration") == generation, 90, step)
            acted_at = time.time()  # (the tick of a new generation reads the API, not the caches)
            # every watch of the operator started again on the new apiserver
            step = f"the operator's watches of {', '.join(WATCHED)} after the restart"
            watches = plane.wait_for(lambda: first_watches(since_stop(), WATCHED, ns), 120, step)
            back_at = max(audit_time(e) for e in watches.values())
            quiet_from = max(back_at, acted_at) + 0.5
            step = "4 windows more, and 6 s and 2 status writes of the informers serving the ticks"

            plane.wait_for(lambda: len(rings.status().get("observations") or []) >= len(before["observations"]) + 4
                           and time.time() > quiet_from + 6
                           and len(tick_writes(since_stop(), ns, name, after_s=quiet_from)) >= 2, 120, step)
        except Exception as exc:
            raise AssertionError(f"the operator did not recover ({step}: {exc}); status "
                                 f"{status_of(admin, ns, name)}\noperator log:\n{op.tail()}") from None
        final = rings.status()
        events = by(plane.audit(OPERATOR_USER, since_line=mark), cred)
        work.delete()
    finally:
        work.stop()
        if op is not None:
            op.stop()
    first_write_s = min(audit_time(e) for e in first) - serving_at
    # the ticks that wrote before kopf's watch of LLMDeployments was back: on a body from before the outage
    kopf_back = audit_time(watches["llmdeployments"])
    blind = [e for e in events if ref(e).get("subresource") == "status" and ref(e).get("name") == name
             and serving_at <= audit_time(e) < kopf_back and e["responseStatus"]["code"] < 300]
    assert blind, "no tick wrote on a body from before the outage: the case this test is for did not arise"
    print(f"apiserver down {serving_at - stopped_at:.1f} s (ready {ready_at - serving_at:.1f} s after it first "
          f"answered); the operator's first write {first_write_s:.1f} s and its last watch "
          f"{back_at - serving_at:.1f} s after it answered; ring {len(before['observations'])} -> "
          f"{len(final['observations'])} windows over {len(rings.seen)} distinct reads; {len(blind)} status writes "
          f"before kopf's watch was back ({kopf_back - serving_at:.1f} s)")

    # the ring: no entry once stored ever dropped, none twice
    rings.assert_nothing_dropped()
    assert final["observations"][:len(before["observations"])] == before["observations"]
    assert_windows_counted_once(final["observations"])
    # the calibration: kept, or replaced only by a newer fit on at least as many windows
    cal_before, cal_after = before["calibration"], final["calibration"]
    if cal_after["createdTime"] == cal_before["createdTime"]:
        assert cal_after["parameters"] == cal_before["parameters"]
    else:
        assert cal_after["createdTime"] > cal_before["createdTime"] and cal_after["points"] >= cal_before["points"]
    # (and no status read after the stop holds an older fit than the one before it)
    assert all(st["calibration"]["createdTime"] >= cal_before["createdTime"]
               for read_at, st in rings.statuses if read_at > stopped_at and st.get("calibration"))

    # applied once: the Deployment and Service created once, never patched (advise mode, in sync),
    # nothing re-created after the restart; none of the operator's requests refused
    owned = [e for e in audit_writes(events) if ref(e).get("resource") in ("deployments", "services")
             and ref(e).get("namespace") == ns and e["verb"] != "delete"]
    assert sorted((e["verb"], ref(e)["resource"], e["responseStatus"]["code"]) for e in owned) == [
        ("create", "deployments", 201), ("create", "services", 201)], summary(owned)
    # (a starting apiserver answers 403 until its RBAC caches are in: "clusterrole ... not found")
    refused = [e for e in events if e["responseStatus"]["code"] == 403 and not serving_at <= audit_time(e) <= ready_at]
    assert not refused, summary(refused)
    # the informers serve the ticks again: no pod or ReplicaSet read from the API once they are back
    reads = [e for e in events if e["verb"] in ("list", "get") and ref(e).get("resource") in ("pods", "replicasets")
             and ref(e).get("namespace") == ns and audit_time(e) > quiet_from]
    ticks = tick_writes(events, ns, name, after_s=quiet_from)
    assert len(ticks) >= 2 and reads == [], summary(reads)


def first_watches(events: list[dict], resources: tuple[str, ...], namespace: str) -> dict | None:
    """The first watch of each resource among `events`, cluster-wide or in `namespace` (a
    watch's audit event is its ResponseStarted; ResponseComplete only comes when it ends), or
    None until each has one."""
    found = {}
    for e in events:
        if e["verb"] == "watch" and e["responseStatus"]["code"] == 200 and ref(e).get("namespace") in (None, namespace):
            found.setdefault(ref(e).get("resource"), e)
    return found if set(resources) <= set(found) else None
