"""The disaggregated control loop end to end on the real control plane: the operator in process as
the chart's ServiceAccount (tests/support/sim_operator.py), its prefill and decode pools' pods made
by the Deployment controller and kwok, each served by a `kneecap twin` on the pod's own IP under
`kneecap load`, on the twins' clock. BCA sets the decode pool's cap and SARA sizes the prefill
pool (DESIGN §5), each within its step limit; what the operator wrote is read from the stored
Deployments and the audit log.
"""

from __future__ import annotations

import re

from kneecap.control import vllm_args
from kneecap.control.handlers import OperatorConfig
from kneecap.control.metrics import OperatorMetrics
from kneecap.control.policy import step_limit
from tests.kube.conftest import OPERATOR_USER, RELEASE_NS, SERVICE_ACCOUNT
from tests.support.control_plane import KubeClient
from tests.support.sim_operator import (DEPLOY, LLMD, SimPods, events, resource, sim_operator, status,
                                        wait_for, writes_to)

NS = "operator-disaggregated"
DECODE_PHASES = [(0.6, 25.0), (6.0, 60.0)]  # two batch levels on the decode pool (SLIM needs more than one)
PREFILL_PHASES = [(0.6, 80.0)]
OVERPROVISIONED = 3  # prefill replicas before kneecap's first decision


def applied_snapshot(admin: KubeClient, name: str):
    """(status, decode Deployment, prefill Deployment) once an apply is recorded, read twice alike
    (no write in between: the load keeps changing and a later tick may size the prefill pool again)."""
    read = lambda: (status(admin, NS, name), admin.get(DEPLOY, NS, f"{name}-decode"),  # noqa: E731
                    admin.get(DEPLOY, NS, f"{name}-prefill"))
    first = read()
    return first if (first[0].get("applied") or {}).get("time") and read() == first else None


def prefill_steps(admin: KubeClient) -> list[dict]:
    """The Applied Events of prefill scale steps, in write order: etcd's revision (creationTimestamp
    has whole seconds, and two steps may share one)."""
    return [e for e in sorted(events(admin, NS, "Applied", "dis"), key=lambda e: int(e["metadata"]["resourceVersion"]))
            if "prefill pool dis-prefill" in e["message"]]


def test_disaggregated_enforce_sets_decode_cap_and_sara_prefill_pool(control_plane, chart_installed, ns, sim):
    admin = control_plane.admin
    token = control_plane.token(RELEASE_NS, SERVICE_ACCOUNT)
    config = OperatorConfig(tick_s=0.1, now=sim, scrape=sim.scrape(), metrics=OperatorMetrics())
    decode = SimPods(admin, sim, NS, "dis-decode", DECODE_PHASES, seed=1)
    prefill = SimPods(admin, sim, NS, "dis-prefill", PREFILL_PHASES, seed=7)
    mark = control_plane.audit_mark()
    try:
        with sim_operator(control_plane.url, control_plane, token, NS, config) as runner:
            admin.create(LLMD, resource(NS, "dis", "enforce", cooldown="600s",
                                        batching={"efficiencyFloor": 0.02},
                                        slo={"ttftSeconds": 2.0, "tpotSeconds": 0.1},
                                        topology={"mode": "disaggregated", "prefill": {"min": 1, "max": 4},
                                                  "decode": {"min": 1, "max": 4}, "kvTransfer": {}}))
            wait_for(lambda: admin.get(DEPLOY, NS, "dis-prefill"), what="the prefill pool")
            # over-provisioned by an earlier decision of kneecap's own field manager: a scale by another
            # manager would make that manager the owner of replicas, which kneecap then leaves alone
            code, body = admin.request("PATCH", admin.path(DEPLOY, NS, "dis-prefill") + "?fieldManager=kneecap",
                                       {"spec": {"replicas": OVERPROVISIONED}})
            assert code == 200, body
            decode.wait()
            wait_for(lambda: len(prefill.sync()) == OVERPROVISIONED, timeout_s=180, what="three prefill twins")
            wait_for(lambda: decode.sync() and prefill.sync()
                     and (status(admin, NS, "dis").get("allocation") or {}).get("prefillDecision"),
                     timeout_s=240, what="a SARA allocation")
            # the decode pool's apply and a prefill step are separate writes (the step's Event after its
            # patch): the snapshot is taken once both are there
            st, dec, pre_deploy = wait_for(lambda: decode.sync() is not None and prefill_steps(admin)
                                           and applied_snapshot(admin, "dis"), timeout_s=120, what="the apply")
    finally:
        decode.stop()
        prefill.stop()
    assert runner.exit_code == 0, runner.output
    alloc = st["allocation"]
    assert alloc["prefillReplicas"] >= 1 and alloc["decodeReplicas"] >= 1 and alloc["kvBandwidthBytesPerSecond"] > 0
    assert set(alloc["binding"]) >= {"prefill", "kv", "decode"}
    # BCA's cap on the decode pool, ×2 from 8 by the step limit; the prefill pool keeps its cap
    assert vllm_args.container_flag(dec["spec"]["template"]["spec"]["containers"][0], "--max-num-seqs") == "16"
    pre = pre_deploy["spec"]["template"]["spec"]["containers"][0]
    assert vllm_args.container_flag(pre, "--max-num-seqs") == "8"
    # every prefill scale is SARA's size within the ×2 step limit, from the over-provisioned 3
    steps = [tuple(int(x) for x in re.search(r"replicas (\d+)->(\d+) \(SARA wants (\d+)\)", e["message"]).groups())
             for e in prefill_steps(admin)]
    assert steps, "no prefill decision applied"
    assert steps[0][0] == OVERPROVISIONED
    assert all(b == step_limit(a, want, 2) and b != a for a, b, want in steps), steps
    assert all(later[0] == earlier[1] for earlier, later in zip(steps, steps[1:])), steps
    assert pre_deploy["spec"]["replicas"] == steps[-1][1] == st["applied"]["prefill"]["replicas"]
    # what reached the apiserver: one accepted patch of the prefill pool per applied step, and the
    # decode pool's cap patched
    pre_patches = writes_to(control_plane, OPERATOR_USER, "deployments", "dis-prefill", since_line=mark)
    assert len(pre_patches) == len(steps)
    assert writes_to(control_plane, OPERATOR_USER, "deployments", "dis-decode", since_line=mark)
