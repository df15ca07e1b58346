"""The control loop end to end: operator (KopfRunner) + emulated API + real twin pods under load.

Each test starts `kneecap twin` processes (OPT-1.3B on an H100 64 GB, 10× faster than real time)
as the pods of an LLMDeployment, registers them in the emulated API with their
`kneecap.io/metrics-url`, drives them with `kneecap load`, and lets the operator scrape them
over HTTP. The operator, the load and the waits run on the twins' own clock, which falls
behind the wall clock on a busy machine (`TwinTime`, tests/support/twins.py); wall-clock
timeouts only bound a hang.
"""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kneecap.control import manifests as M, status as St, vllm_args as V
from kneecap.control.handlers import OperatorConfig
from kneecap.control.metrics import OperatorMetrics
from kneecap.demo.kubelet import add_owned_pod
from tests.support.kmock_api import LLMD, KubeAPIThread
from tests.support.operator_harness import (
    DEPLOY, NS, SERVICE, condition, events, llmd, operator, status, wait_for,
)
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


def calibrated(kube, name):
    st = status(kube, name)
    return st if condition(st, "Calibrated").get("status") == "True" and st.get("recommendation") else None


def test_advise_records_but_never_patches(kube, sim, twin):
    metrics = OperatorMetrics()
    procs = drive(sim, twin)
    try:
        with operator(kube, config(sim, metrics)) as runner:
            kube.create(LLMD, resource("adv", "advise"))
            add_pod(kube, "adv", twin)
            st = wait_for(lambda: calibrated(kube, "adv"), timeout_s=120, what="calibration")
            wait_for(lambda: events(kube, "Advised", "adv"), timeout_s=60, what="an Advised event")
            st = status(kube, "adv")
    finally:
        stop(procs)
    assert runner.exit_code == 0, runner.output
    # never patched: the Deployment has the one version it was created with
    assert len(kube.history(DEPLOY, NS, "adv")) == 1
    c = kube.get(DEPLOY, NS, "adv")["spec"]["template"]["spec"]["containers"][0]
    assert V.container_flag(c, "--max-num-seqs") == "8"
    # status explains the decision from the numbers
    rec, cal = st["recommendation"], st["calibration"]
    assert rec["maxNumSeqs"] > 8 and rec["throughputGain"] > 0.05  # a cap of 8 is far below OPT-1.3B's knee
    assert 0.05 <= rec["gpuMemoryUtilization"] <= 0.95 and rec["kvGiB"] > 0
    assert cal["nPoints"] >= 2 and cal["parameters"]["etaM"] > 0 and cal["fitErrorPct"] < 50
    assert 3 <= len(st["observations"]) <= 50 and all(o["pool"] == "server" for o in st["observations"])
    assert st["workload"]["requestsPerSecond"] > 0 and st["workload"]["outputLengthMean"] == pytest.approx(400, rel=0.05)
    assert st["lastDecision"]["reason"] == "Advised" and st["applied"]["maxNumSeqs"] == 8
    assert st["allocation"]["replicas"] >= 1 and st["phase"] == "Running"
    ev = events(kube, "Advised", "adv")[0]
    assert f"cap 8->{min(16, rec['maxNumSeqs'])}" in ev["message"]
    text = metrics.exposition().decode()
    assert 'kneecap_recommended_max_num_seqs{name="adv",namespace="serving",pool="server"}' in text
    assert 'kneecap_decisions_total{name="adv",namespace="serving",reason="Advised"}' in text
    assert 'kneecap_restarts_total{' not in text
    fam = {f.name: f.samples[0].value for f in text_string_to_metric_families(text) if f.samples}
    pred, seen = fam["kneecap_predicted_throughput_tokens_per_second"], fam["kneecap_observed_throughput_tokens_per_second"]
    assert 0.5 < pred / seen < 2.0  # the fit explains the window it was fitted on
    assert fam["kneecap_recommended_throughput_tokens_per_second"] > seen
    # SLIM's curve, the efficiency at the observed batch, ε, the fit's time and the SLO targets
    got = {(s.name, s.labels.get("batch") or s.labels.get("kind")): s.value
           for f in text_string_to_metric_families(text) for s in f.samples if s.labels.get("name") == "adv"}
    curve = np.array([got[("kneecap_predicted_curve_throughput_tokens_per_second", str(b))]
                      for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)])
    assert np.all(curve > 0) and curve[-1] > 4 * curve[0]  # batching buys throughput on OPT-1.3B
    assert np.all(curve / (np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]) * curve[0]) <= 1.0 + 1e-9)
    eff = got[("kneecap_batching_efficiency_ratio", None)]
    b = max(st["workload"].get("meanBatchLittle") or st["workload"]["meanBatch"], 1.0)
    # cap 8 (Little's-law batch may read a little above it): T(B)/(B·T(1)) falls with B
    assert b <= 16 and curve[4] / (16 * curve[0]) - 1e-9 <= eff <= 1.0 + 1e-9
    assert got[("kneecap_efficiency_floor_ratio", None)] == 0.1 < eff  # a cap of 8 is before the knee
    assert got[("kneecap_calibration_timestamp_seconds", None)] == St.parse_iso(cal["acceptedTime"])
    assert got[("kneecap_slo_quantile_ratio", None)] == 0.95


def test_enforce_patches_within_step_limit_and_respects_cooldown(kube, sim, twin):
    metrics = OperatorMetrics()
    procs = drive(sim, twin)
    try:
        with operator(kube, config(sim, metrics)) as runner:
            # a low efficiency floor puts BCA's cap far above 8, so the ×2 step limit binds
            kube.create(LLMD, resource("enf", "enforce", cooldown="600s", batching={"efficiencyFloor": 0.02}))
            add_pod(kube, "enf", twin)
            wait_for(lambda: len(kube.history(DEPLOY, NS, "enf")) >= 2, timeout_s=120, what="a patch")
            applied_at = sim()
            # keep ticking (interval 5 s) well inside the 600 s cooldown
            wait_for(lambda: events(kube, "Cooldown", "enf"), timeout_s=60, what="a Cooldown decision")
            sim.wait(10.0)
            st = status(kube, "enf")
    finally:
        stop(procs)
    assert runner.exit_code == 0, runner.output
    versions = kube.history(DEPLOY, NS, "enf")
    assert len(versions) == 2, "one change, then the cooldown holds"
    c = versions[-1]["spec"]["template"]["spec"]["containers"][0]
    assert V.container_flag(c, "--max-num-seqs") == "16"  # BCA wants far more; ×2 per step
    assert st["recommendation"]["maxNumSeqs"] > 16
    assert float(V.container_flag(c, "--gpu-memory-utilization")) == pytest.approx(
        st["applied"]["gpuMemoryUtilization"])
    assert st["applied"]["maxNumSeqs"] == 16 and st["applied"]["restart"] is True
    assert "step limited to ×2" in events(kube, "Applied", "enf")[0]["message"]
    assert any("cooldown" in e["message"] for e in events(kube, "Cooldown", "enf"))
    assert sim() - applied_at < 600
    text = metrics.exposition().decode()
    assert 'kneecap_restarts_total{name="enf",namespace="serving",reason="Recommended"} 1.0' in text


def test_scrape_failure_keeps_last_good_state_and_sets_degraded(kube, sim, twin):
    procs = drive(sim, twin)
    try:
        with operator(kube, config(sim)) as runner:
            kube.create(LLMD, resource("deg", "enforce", cooldown="600s"))
            add_pod(kube, "deg", twin)
            good = wait_for(lambda: calibrated(kube, "deg"), timeout_s=120, what="calibration")
            wait_for(lambda: len(kube.history(DEPLOY, NS, "deg")) >= 2, timeout_s=60, what="first patch")
            versions_before = len(kube.history(DEPLOY, NS, "deg"))
            twin.stop()  # the pod stops answering /metrics
            st = wait_for(lambda: (lambda s: s if condition(s, "Degraded").get("reason") == "ScrapeFailed" else None)(
                status(kube, "deg")), timeout_s=60, what="Degraded")
            sim.wait(10.0)
            st = status(kube, "deg")
    finally:
        stop(procs)
    assert runner.exit_code == 0, runner.output
    assert condition(st, "Degraded")["status"] == "True" and st["phase"] == "Degraded"
    assert "127.0.0.1" in condition(st, "Degraded")["message"]
    assert st["calibration"]["parameters"] == status(kube, "deg")["calibration"]["parameters"]
    assert st["calibration"]["createdTime"] >= good["calibration"]["createdTime"]
    assert st["recommendation"]  # kept
    assert len(kube.history(DEPLOY, NS, "deg")) == versions_before  # nothing applied on a failed scrape
    assert events(kube, "ScrapeFailed", "deg")[0]["type"] == "Warning"


def _slow_data_rejected(kube, name, switched_s):
    """The status once a refit is rejected with at least two of the slow engine's windows in the ring."""
    st = status(kube, name)
    after = [o for o in st.get("observations") or [] if o["windowEndUnixSeconds"] > switched_s]
    return st if (condition(st, "Degraded").get("reason") == "BadFit"
                  and condition(st, "Calibrated").get("reason") == "FitRejected" and len(after) >= 2) else None


def test_worse_fit_keeps_last_good_calibration_and_sets_degraded(kube, sim, twin):
    slow = sim.start(Twin(MODEL, ARCH, "l4", max_num_seqs=8, time_scale=SCALE))  # same model, a much slower GPU
    procs = drive(sim, twin)
    try:
        with operator(kube, config(sim)) as runner:
            res = resource("fit", "enforce", cooldown="600s")
            res["spec"]["control"].update(maxFitError=0.3, observationHistory=12)
            kube.create(LLMD, res)
            add_pod(kube, "fit", twin)
            good = wait_for(lambda: calibrated(kube, "fit"), timeout_s=120, what="calibration")
            # the good fit's own decision (cap 8 is far below the knee) lands first; then the cooldown holds
            wait_for(lambda: len(kube.history(DEPLOY, NS, "fit")) >= 2, timeout_s=60, what="first patch")
            versions = len(kube.history(DEPLOY, NS, "fit"))
            stop(procs)
            wait_for(lambda: status(kube, "fit")["lastDecision"]["reason"] == "Idle", timeout_s=90,
                     what="the fast engine idle")
            # the pod now reports the slow engine: the same batches give a fraction of the tokens/s
            switched_s = sim()  # ring windows carry the operator's clock
            kube.patch("v1/pods", NS, "fit-0", {"metadata": {"annotations": {
                "kneecap.io/metrics-url": slow.url + "/metrics"}}})
            procs = [sim.load(slow.url, [(0.3, 80.0)], seed=3)]
            st = wait_for(lambda: _slow_data_rejected(kube, "fit", switched_s), timeout_s=120,
                          what="Degraded BadFit on the slow engine's windows")
    finally:
        stop(procs)
        slow.stop()
    assert runner.exit_code == 0, runner.output
    assert condition(st, "Calibrated")["status"] == "False"
    # the fit kept is the last one accepted: a refit on a ring whose error stays within
    # maxFitError may take in a first slow window (the mean error decides), a rejected one never
    accepted = [v["status"]["calibration"] for v in kube.history(LLMD, NS, "fit")
                if v and condition(v.get("status") or {}, "Calibrated").get("status") == "True"]
    assert st["calibration"]["createdTime"] == accepted[-1]["createdTime"]
    assert st["calibration"]["parameters"] == accepted[-1]["parameters"] and good["calibration"]["parameters"]
    assert st["lastDecision"]["reason"] in ("BadFit", "ScrapeFailed", "WaitingForData")
    assert len(kube.history(DEPLOY, NS, "fit")) == versions  # nothing applied on a rejected fit


def test_restart_keeps_calibration_and_observations_and_does_not_restart_pods(kube, sim, twin):
    procs = drive(sim, twin)
    try:
        with operator(kube, config(sim)) as first:
            kube.create(LLMD, resource("rst", "enforce", cooldown="600s"))
            add_pod(kube, "rst", twin)
            wait_for(lambda: calibrated(kube, "rst"), timeout_s=120, what="calibration")
            wait_for(lambda: len(kube.history(DEPLOY, NS, "rst")) >= 2, timeout_s=60, what="first patch")
        before = status(kube, "rst")
        versions = len(kube.history(DEPLOY, NS, "rst"))
        with operator(kube, config(sim)) as second:  # a fresh process: empty memory
            wait_for(lambda: status(kube, "rst")["lastDecision"]["time"] > before["lastDecision"]["time"]
                     and status(kube, "rst")["lastDecision"]["reason"] not in ("WaitingForData",),
                     timeout_s=60, what="a decision after the restart")
            after = status(kube, "rst")
    finally:
        stop(procs)
    assert first.exit_code == 0 and second.exit_code == 0, second.output
    # the observation ring survived: what was there before is still there, in order
    old = [o["windowEndUnixSeconds"] for o in before["observations"]]
    new = [o["windowEndUnixSeconds"] for o in after["observations"]]
    assert new[:len(old)] == old or set(old[-len(new):]) <= set(new) or old[-1] in new
    # the calibration came back from status (same fit, or a refit on the kept ring)
    assert after["calibration"]["nPoints"] >= before["calibration"]["nPoints"]
    assert condition(after, "Calibrated")["status"] == "True"
    # no pod restart: the pod template was not touched again (cooldown read back from status)
    assert len(kube.history(DEPLOY, NS, "rst")) == versions
    assert after["applied"]["time"] == before["applied"]["time"]


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


def test_delete_cleans_up_owned_objects(kube):
    kube.api.garbage_collect = False  # show the operator's own cleanup, not the emulated GC
    with operator(kube, OperatorConfig(tick_s=0.2)) as runner:
        kube.create(LLMD, llmd("gone", topology={"mode": "disaggregated", "kvTransfer": {}}))
        wait_for(lambda: kube.get(DEPLOY, NS, "gone-decode") and kube.get(SERVICE, NS, "gone-prefill"),
                 what="owned objects")
        wait_for(lambda: (kube.get(LLMD, NS, "gone") or {}).get("metadata", {}).get("finalizers"), what="finalizer")
        kube.delete(LLMD, NS, "gone")
        wait_for(lambda: kube.get(LLMD, NS, "gone") is None, what="the resource to go")
    assert runner.exit_code == 0, runner.output
    for name in ("gone-prefill", "gone-decode"):
        assert kube.get(DEPLOY, NS, name) is None and kube.get(SERVICE, NS, name) is None
