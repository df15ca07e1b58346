"""The emulations' one kubelet (kneecap.emulation.kubelet) on the store with the emulation's
Deployment and ReplicaSet controllers: which pods it reports new and deleted, which deletions
are restarts, and what it writes to a pod's status. Both nodes (virtual time's engines, the
demo's twin processes) run their pods from these reports."""

from __future__ import annotations

from kneecap.control.kube import deployments_path, pods_path
from kneecap.emulation.controllers import DeploymentController, ReplicaSetController
from kneecap.emulation.kubelet import Kubelet
from kneecap.emulation.store import Store

NS = "ns"
NOW_S = 1_700_000_000.0


def deployment(name: str, replicas: int, cap: int, managed: bool = True) -> dict:
    labels = {"app": name, **({"app.kubernetes.io/managed-by": "kneecap"} if managed else {})}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [
                         {"name": "vllm", "image": "vllm", "args": ["--max-num-seqs", str(cap)]}]}}}}


class Cluster:
    def __init__(self, selector: str | None = None):
        self.api = Store(lambda: NOW_S)
        self.controllers = (DeploymentController(self.api, NS), ReplicaSetController(self.api, NS))
        self.kubelet = Kubelet(self.api, NS, deployment_selector=selector)

    def sync(self):
        for controller in self.controllers:
            controller.sync()
        return self.kubelet.sync()

    def ready_all(self, added) -> None:
        for pod in added:
            self.kubelet.report_started(pod.name, "10.0.0.1")
            assert self.kubelet.report_ready(pod.name, since="2023-11-14T22:13:20Z")

    def pod(self, name: str) -> dict | None:
        return self.api.peek(pods_path(NS, name))


def test_new_pods_are_reported_once_with_their_replicaset_and_deployment_and_their_status_written():
    cl = Cluster()
    cl.api.create_now(deployments_path(NS), deployment("llama", 2, 256))
    added, deleted = cl.sync()
    assert deleted == [] and len(added) == 2
    assert {p.deployment["metadata"]["name"] for p in added} == {"llama"}
    assert all(p.replicaset["metadata"]["name"] == f"llama-{p.template}" for p in added)
    assert cl.sync() == ([], [])  # level-triggered: nothing new, nothing gone
    cl.kubelet.report_started(added[0].name, "10.0.0.7")
    pod = cl.pod(added[0].name)
    assert pod["status"]["phase"] == "Running" and pod["status"]["podIP"] == "10.0.0.7"
    assert {c["type"]: c["status"] for c in pod["status"]["conditions"]} == {"PodScheduled": "True", "Ready": "False"}
    assert cl.kubelet.report_ready(added[0].name, since="2023-11-14T22:13:20Z", annotations={"kneecap.io/x": "1"})
    pod = cl.pod(added[0].name)
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    assert ready == {"type": "Ready", "status": "True", "lastTransitionTime": "2023-11-14T22:13:20Z"}
    assert pod["metadata"]["annotations"]["kneecap.io/x"] == "1"


def test_a_rollout_deletes_pods_as_restarts_and_a_scale_down_as_stops():
    cl = Cluster()
    cl.api.create_now(deployments_path(NS), deployment("llama", 2, 256))
    first, _ = cl.sync()
    cl.ready_all(first)
    cl.api.patch_now(deployments_path(NS, "llama"), {"spec": {"replicas": 1}})
    added, deleted = cl.sync()
    assert added == [] and len(deleted) == 1 and not deleted[0].restart and deleted[0].deployment == "llama"
    cl.api.patch_now(deployments_path(NS, "llama"), {"spec": {"template": deployment("llama", 1, 64)["spec"]["template"]}})
    restarted = []
    for _ in range(6):  # surge one new pod, let it turn Ready, then the old one goes
        added, deleted = cl.sync()
        cl.ready_all(added)
        restarted += deleted
    assert [d.restart for d in restarted] == [True]
    survivors = cl.api.list_now(pods_path(NS))
    assert len(survivors) == 1 and survivors[0]["spec"]["containers"][0]["args"] == ["--max-num-seqs", "64"]


def test_only_the_selected_deployments_pods_run_and_a_forgotten_pod_is_offered_again():
    cl = Cluster(selector="app.kubernetes.io/managed-by=kneecap")
    cl.api.create_now(deployments_path(NS), deployment("ours", 1, 256))
    cl.api.create_now(deployments_path(NS), deployment("theirs", 1, 256, managed=False))
    added, _ = cl.sync()
    assert [p.deployment["metadata"]["name"] for p in added] == ["ours"]
    cl.kubelet.forget(added[0].name)  # its process did not start
    again, deleted = cl.sync()
    assert [p.name for p in again] == [added[0].name] and deleted == []


def test_a_pod_deleted_before_it_turned_ready_is_reported_and_cannot_turn_ready():
    cl = Cluster()
    cl.api.create_now(deployments_path(NS), deployment("llama", 1, 256))
    (pod,), _ = cl.sync()
    cl.api.delete_now(pods_path(NS, pod.name))
    assert not cl.kubelet.report_started(pod.name, "10.0.0.1")
    assert not cl.kubelet.report_ready(pod.name)
    assert cl.pod(pod.name) is None
    _, deleted = cl.sync()
    assert [d.name for d in deleted] == [pod.name] and not deleted[0].restart
