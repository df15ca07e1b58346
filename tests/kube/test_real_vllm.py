"""The control loop observes a real vLLM pod on the real control plane: the operator (the chart's
arguments and ServiceAccount) creates the pool, the real scheduler places its pod, kwok runs it
with an IP in the control plane's loopback pod range, and the session's vLLM (CPU build, tiny Llama; tests/conftest.py)
answers on that IP and the engine port through a TCP forwarder, so the operator scrapes the
pod's own address exactly as in a cluster."""

from __future__ import annotations

import urllib.parse

import pytest

from tests.conftest import BLOCK_SIZE, NUM_GPU_BLOCKS
from tests.kube.conftest import OPERATOR_USER
from tests.support.control_plane import ControlPlane, audit_writes, free_port
from tests.support.forward import Forwarder
from tests.support.twins import load

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LLMD = "kneecap.io/v1alpha1/llmdeployments"
NS = "real-vllm"


def _status(admin) -> dict:
    return (admin.get(LLMD, NS, "real") or {}).get("status") or {}


def _condition(st: dict, type_: str) -> dict:
    return next((c for c in st.get("conditions") or [] if c["type"] == type_), {})


def test_loop_observes_a_real_vllm_pod(control_plane: ControlPlane, operator, vllm_server):
    admin, port = control_plane.admin, free_port()
    # the tiny CPU model has no catalog shape; the spec names a small one so the models can run
    admin.create(LLMD, {"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment",
                        "metadata": {"name": "real", "namespace": NS},
                        "spec": {"model": {"name": "tiny", "architecture": "opt-125m"}, "accelerator": {"type": "l4"},
                                 "engine": {"image": "vllm/vllm-openai:v0.11.0", "port": port, "maxNumSeqs": 4},
                                 "control": {"mode": "advise", "interval": "1s", "window": "1s",
                                             "minObservations": 2}}})
    mark = control_plane.audit_mark()
    pods = control_plane.wait_for(lambda: (p := admin.list("v1/pods", NS, selector="app.kubernetes.io/instance=real"))
                                  and p[0]["status"].get("phase") == "Running" and p[0]["status"].get("podIP") and p,
                                  90, "the pool's pod Running")
    (pod,) = pods
    vllm = urllib.parse.urlsplit(vllm_server.base_url)
    forward = Forwarder(pod["status"]["podIP"], port, (vllm.hostname, vllm.port))
    procs = []
    try:
        procs.append(load(vllm_server.base_url, rate=2, duration_s=60, input_mean=64, output_mean=32, seed=4))
        control_plane.wait_for(lambda: _status(admin).get("observations"), 90, "a first observation")
        procs.append(load(vllm_server.base_url, rate=8, duration_s=60, input_mean=64, output_mean=32, seed=5))
        first = len(_status(admin)["observations"])
        st = control_plane.wait_for(lambda: (s := _status(admin)) and len(s.get("observations") or []) >= first + 2
                                    and s.get("workload") and s, 90, "observations at the second rate")
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
            p.wait(10)
        forward.close()
    assert forward.connections >= 3  # the scrapes came to the pod's own IP and port
    obs = st["observations"]
    assert all(o["inputLengthMean"] == pytest.approx(64, rel=0.15) for o in obs)
    assert all(o["outputLengthMean"] == pytest.approx(32, rel=0.15) for o in obs)
    assert all(o["kvCapacityTokens"] == NUM_GPU_BLOCKS * BLOCK_SIZE for o in obs)
    # the tiny model finishes a request in ~0.1 s: gauge samples often see an empty batch, the
    # time integral (Little's law, what the fit uses) does not
    assert all(o["engine"]["maxNumSeqs"] == 4 and o["maxBatch"] <= 4 and 0 < o["meanBatchLittle"] <= 4 for o in obs)
    assert st["workload"]["requestsPerSecond"] > 0
    # the calibration step ran on real data and said what it made of it
    assert _condition(st, "Calibrated").get("reason")
    assert st["lastDecision"]["reason"]
    # advise: the Deployment created, never patched
    writes = [(e["verb"], e["objectRef"]["resource"]) for e in audit_writes(control_plane.audit(OPERATOR_USER))
              if e["objectRef"].get("namespace") == NS and e["objectRef"].get("resource") == "deployments"]
    assert writes == [("create", "deployments")]
    admin.delete(LLMD, NS, "real")
