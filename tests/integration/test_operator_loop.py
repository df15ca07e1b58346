"""The disaggregated control loop end to end: operator (KopfRunner) + emulated API + real twin pods
under load (the colocated loop, and the faults, run on the real control plane:
tests/kube/test_operator_loop.py, tests/kube/test_operator_faults.py).

Each test starts `kneecap twin` processes (OPT-1.3B on an H100 64 GB, 10× faster than real time)
as the pods of an LLMDeployment, registers them in the emulated API with their
`kneecap.io/metrics-url`, drives them with `kneecap load`, and lets the operator scrape them
over HTTP. The operator, the load and the waits run on the twins' own clock, which falls
behind the wall clock on a busy machine (`TwinTime`, tests/support/twins.py); wall-clock
timeouts only bound a hang.
"""

from __future__ import annotations

import pytest

from kneecap.control import manifests as M, vllm_args as V
from kneecap.control.handlers import OperatorConfig
from kneecap.control.metrics import OperatorMetrics
from kneecap.demo.kubelet import add_owned_pod
from tests.support.kmock_api import LLMD, KubeAPIThread
from tests.support.operator_harness import DEPLOY, NS, llmd, operator, status, wait_for
from tests.support.twins import Twin, TwinTime

pytestmark = pytest.mark.slow

SCALE = 10.0
MODEL, ARCH, GPU = "facebook/opt-1.3b", "opt-1.3b", "h100-64gb"


@pytest.fixture()
def kube():
    with KubeAPIThread() as k:
        k.add_namespace(NS)
        yield k


@pytest.fixture()
def sim():
    clock = TwinTime(SCALE)
    yield clock
    clock.close()


@pytest.fixture()
def twin(sim):
    t = sim.start(Twin(MODEL, ARCH, GPU, max_num_seqs=8, time_scale=SCALE))
    yield t
    t.stop()


def config(sim: TwinTime, metrics: OperatorMetrics | None = None) -> OperatorConfig:
    return OperatorConfig(tick_s=0.1, now=sim, scrape=sim.scrape(), metrics=metrics or OperatorMetrics())


def resource(name: str, mode: str, cooldown: str = "600s", control: dict | None = None, **over) -> dict:
    """One twin pod: a restart is downtime, which these resources allow."""
    return llmd(name, model=MODEL, gpu=GPU,
                engine={"maxNumSeqs": 8, "extraArgs": []},
                control={"mode": mode, "interval": "5s", "window": "5s", "cooldown": cooldown, "minObservations": 3,
                         "maxFitError": 0.5, "allowDowntime": True, **(control or {})},
                **over)


def add_pod(kube, name: str, twin: Twin, role: str = "server", pod: str | None = None) -> None:
    """A ready pod of the pool's Deployment (through its ReplicaSet) whose metrics are `twin`'s."""
    add_owned_pod(kube, M.pool_name(name, role), pod or f"{name}-0", namespace=NS,
                  annotations={"kneecap.io/metrics-url": twin.url + "/metrics"})


def drive(sim: TwinTime, twin: Twin):
    """Low then high load, so the pool runs at two batch levels (SLIM needs more than one); returns
    10 s (on the twin's clock) before the high load starts."""
    procs = [sim.load(twin.url, [(0.6, 25.0), (6.0, 60.0)], seed=1)]
    sim.wait(15.0)
    return procs


def stop(procs):
    for p in procs:
        if p.poll() is None:
            p.terminate()
        p.wait(10)


def applied_snapshot(kube, name: str):
    """(status, decode Deployment, prefill Deployment) once an apply is recorded, read twice alike."""
    read = lambda: (status(kube, name), kube.get(DEPLOY, NS, f"{name}-decode"),  # noqa: E731
                    kube.get(DEPLOY, NS, f"{name}-prefill"))
    first = read()
    return first if (first[0].get("applied") or {}).get("time") and read() == first else None


def test_disaggregated_enforce_sets_decode_cap_and_sara_prefill_pool(kube, sim, twin):
    from kneecap.control.policy import step_limit

    prefill = sim.start(Twin(MODEL, ARCH, GPU, max_num_seqs=8, time_scale=SCALE))
    procs = [sim.load(prefill.url, [(0.6, 80.0)], seed=7)] + drive(sim, twin)
    try:
        with operator(kube, config(sim)) as runner:
            kube.create(LLMD, resource("dis", "enforce", cooldown="600s",
                                       batching={"efficiencyFloor": 0.02},
                                       slo={"ttftSeconds": 2.0, "tpotSeconds": 0.1},
                                       topology={"mode": "disaggregated", "prefill": {"min": 1, "max": 4},
                                                 "decode": {"min": 1, "max": 4}, "kvTransfer": {}}))
            wait_for(lambda: kube.get(DEPLOY, NS, "dis-prefill"), what="prefill pool")
            # over-provisioned by an earlier decision of kneecap's (its field manager): a scale by
            # another manager would make that manager the owner of replicas, which kneecap then leaves alone
            code, _ = kube.request("PATCH", kube.path(DEPLOY, NS, "dis-prefill") + "?fieldManager=kneecap",
                                   {"spec": {"replicas": 3}})
            assert code == 200
            add_pod(kube, "dis", twin, role="decode")
            add_pod(kube, "dis", prefill, role="prefill", pod="dis-p-0")
            st = wait_for(lambda: (lambda s: s if (s.get("allocation") or {}).get("prefillDecision") else None)(
                status(kube, "dis")), timeout_s=120, what="a SARA allocation")
            # the first apply's status and Deployments, read with no write in between: the load keeps
            # changing, and a later tick may size the prefill pool again
            st, dec, pre_deploy = wait_for(lambda: applied_snapshot(kube, "dis"), timeout_s=60, what="apply")
    finally:
        stop(procs)
        prefill.stop()
    assert runner.exit_code == 0, runner.output
    alloc = st["allocation"]
    assert alloc["prefillReplicas"] >= 1 and alloc["decodeReplicas"] >= 1 and alloc["kvBandwidthGiBps"] > 0
    assert set(alloc["binding"]) >= {"prefill", "kv", "decode"}
    assert V.container_flag(dec["spec"]["template"]["spec"]["containers"][0], "--max-num-seqs") == "16"
    expected = step_limit(3, min(max(alloc["prefillReplicas"], 1), 4), 2)
    assert pre_deploy["spec"]["replicas"] == expected
    pre = pre_deploy["spec"]["template"]["spec"]["containers"][0]
    assert V.container_flag(pre, "--max-num-seqs") == "8"  # BCA sets the decode pool's cap only
    if expected != 3:
        assert st["applied"]["prefill"]["replicas"] == expected and alloc["prefillDecision"]["reason"] == "Applied"
