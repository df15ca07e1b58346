"""The control loop driven by a real vLLM (CPU build, tiny Llama; fixture in conftest.py)."""

from __future__ import annotations

import time

import pytest

from kneecap.control.handlers import OperatorConfig
from kneecap.demo.kubelet import add_owned_pod
from tests.integration.conftest import BLOCK_SIZE, NUM_GPU_BLOCKS
from tests.support.kmock_api import LLMD, KubeAPIThread
from tests.support.operator_harness import DEPLOY, NS, condition, llmd, operator, status, wait_for
from tests.support.twins import load

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture()
def kube():
    with KubeAPIThread() as k:
        k.add_namespace(NS)
        yield k


def test_loop_observes_a_real_vllm_pod(kube, vllm_server):
    # The tiny CPU model has no catalog shape; the spec names a small one so the models can run.
    res = llmd("real", model="tiny", gpu="l4", engine={"maxNumSeqs": 4, "extraArgs": []},
               control={"mode": "advise", "interval": "1s", "window": "1s", "minObservations": 2})
    res["spec"]["model"] = {"name": "tiny", "architecture": "opt-125m"}
    procs = []
    try:
        with operator(kube, OperatorConfig(tick_s=0.1, scrape_timeout_s=10)) as runner:
            kube.create(LLMD, res)
            add_owned_pod(kube, "real", "real-0", namespace=NS,
                          annotations={"kneecap.io/metrics-url": vllm_server.base_url + "/metrics"})
            procs.append(load(vllm_server.base_url, rate=2, duration_s=4, input_mean=64, output_mean=32, seed=4))
            time.sleep(4)
            procs.append(load(vllm_server.base_url, rate=8, duration_s=5, input_mean=64, output_mean=32, seed=5))
            st = wait_for(lambda: (lambda s: s if len(s.get("observations") or []) >= 2 and s.get("workload")
                                   else None)(status(kube, "real")), timeout_s=90, what="observations")
            time.sleep(1.5)
            st = status(kube, "real")
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
            p.wait(10)
    assert runner.exit_code == 0, runner.output
    obs = st["observations"]
    assert all(o["inputLengthMean"] == pytest.approx(64, rel=0.15) for o in obs)
    assert all(o["outputLengthMean"] == pytest.approx(32, rel=0.15) for o in obs)
    assert all(o["kvCapacityTokens"] == NUM_GPU_BLOCKS * BLOCK_SIZE for o in obs)
    # the tiny model finishes a request in ~0.1 s: gauge samples often see an empty batch, the
    # time integral (Little's law, what the fit uses) does not
    assert all(o["engine"]["maxNumSeqs"] == 4 and o["maxBatch"] <= 4 and 0 < o["meanBatchLittle"] <= 4 for o in obs)
    assert st["workload"]["requestsPerSecond"] > 0
    # the calibration step ran on real data and said what it made of it
    assert condition(st, "Calibrated").get("reason")
    assert st["lastDecision"]["reason"]
    assert len(kube.history(DEPLOY, NS, "real")) == 1  # advise: never patched
