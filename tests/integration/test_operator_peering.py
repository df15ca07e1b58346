"""Two operator replicas with kopf peering: exactly one acts, the other takes over when it stops.

Each replica logs in with its own token, so the emulated API can tell whose request it serves.
The first replica started leads (oldest-first priorities, `handlers.oldest_first_priority`);
the second writes nothing but its peering keep-alives until the leader exits.
"""

from __future__ import annotations

import time

import attrs
import kopf
from kopf.testing import KopfRunner

from kneecap.control.handlers import OperatorConfig, build_registry, oldest_first_priority
from tests.support.kmock_api import LLMD, KubeAPI, KubeAPIThread
from tests.support.operator_harness import DEPLOY, NS, llmd, status, wait_for

PEERINGS = "kopf.dev/v1/clusterkopfpeerings"
WRITES = ("POST", "PATCH", "PUT", "DELETE")


@attrs.define(kw_only=True)
class ByTokenKubeAPI(KubeAPI):
    """Records (time, token, method, path) of every write made with a bearer token."""

    writes: list = attrs.field(factory=list)

    async def __call__(self, raw_request):
        auth = raw_request.headers.get("Authorization", "")
        if raw_request.method in WRITES and auth.startswith("Bearer "):
            self.writes.append((time.monotonic(), auth.removeprefix("Bearer "), raw_request.method, raw_request.path))
        return await super().__call__(raw_request)


def replica(kube, token: str) -> KopfRunner:
    config = OperatorConfig(tick_s=0.2)
    config.connection = kopf.ConnectionInfo(server=kube.url, token=token)
    settings = kopf.OperatorSettings()
    settings.watching.server_timeout = 10
    return KopfRunner(["run", "--namespace", NS, "--peering", "kneecap", "--verbose"],
                      registry=build_registry(config), settings=settings, timeout=60)


def work(writes, token: str, since: float = 0.0) -> list:
    """A replica's writes other than its peering keep-alives."""
    return [w for w in writes if w[1] == token and w[0] >= since and "/kopfpeerings" not in w[3]
            and "/clusterkopfpeerings" not in w[3]]


def test_oldest_first_priority_orders_replicas_by_start_time():
    a, b = oldest_first_priority(1000.0), oldest_first_priority(1000.002)
    assert a > b  # started 2 ms earlier: leads
    assert len({oldest_first_priority(1000.0) for _ in range(50)}) > 1  # a tie-break at the same ms


def peers(kube) -> dict:
    return (kube.get(PEERINGS, None, "kneecap") or {}).get("status") or {}


def test_one_replica_acts_and_the_other_takes_over_when_it_stops():
    with KubeAPIThread(api_class=ByTokenKubeAPI) as kube:
        kube.add_namespace(NS)
        kube.create(PEERINGS, {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering",
                               "metadata": {"name": "kneecap"}})
        api = kube.api
        leader, follower = replica(kube, "leader"), replica(kube, "follower")
        leader.__enter__()
        try:
            wait_for(lambda: len(peers(kube)) == 1, what="the first replica's keep-alive")
            follower.__enter__()
            try:
                wait_for(lambda: len(peers(kube)) == 2, what="the second replica's keep-alive")
                kube.create(LLMD, llmd("llama"))
                wait_for(lambda: kube.get(DEPLOY, NS, "llama"), what="the Deployment")
                first = wait_for(lambda: status(kube, "llama").get("lastDecision"), what="a tick")
                wait_for(lambda: status(kube, "llama")["lastDecision"]["time"] != first["time"], what="ticks")
                time.sleep(2.0)
                before = list(api.writes)
            finally:
                stopped_at = time.monotonic()
                leader.__exit__(None, None, None)
            exited_at = time.monotonic()
            taken = wait_for(lambda: work(api.writes, "follower"), timeout_s=20, what="the follower taking over")
            took_over_at = taken[0][0]
            wait_for(lambda: len(work(api.writes, "follower")) >= 3, what="the new leader's ticks")
        finally:
            follower.__exit__(None, None, None)
        writes = list(api.writes)
        peering_left = peers(kube)
    assert leader.exit_code == 0, leader.output
    assert follower.exit_code == 0, follower.output

    led = work(before, "leader")
    assert {(m, p) for _, _, m, p in led} >= {("POST", f"/apis/apps/v1/namespaces/{NS}/deployments"),
                                              ("PATCH", f"/apis/kneecap.io/v1alpha1/namespaces/{NS}/llmdeployments/llama/status")}
    assert work(before, "follower") == []  # while the leader runs: keep-alives only
    assert any(t == "follower" for _, t, _, _ in before)  # (it was there, and writing them)
    # after the leader's last write, and only then, the follower writes: never both at once
    last_leader = max(w[0] for w in work(writes, "leader"))
    assert last_leader <= took_over_at
    assert work(writes, "leader", since=exited_at) == []
    # a clean exit removes the leader from the peering object; the follower resumes on that event
    assert took_over_at - stopped_at < 5.0, f"takeover took {took_over_at - stopped_at:.1f} s"
    assert peering_left == {}  # both said goodbye (lifetime 0) on a clean exit
