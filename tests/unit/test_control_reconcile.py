"""Pure parts of reconcile: drift detection, who owns replicas, rollouts, metrics URLs."""

from __future__ import annotations

from kneecap.control import manifests, reconcile
from kneecap.control.spec import parse_spec

SPEC = parse_spec({"model": {"name": "facebook/opt-1.3b"}, "accelerator": {"type": "h100-64gb"},
                   "engine": {"image": "vllm"}})
OWNER = {"metadata": {"name": "m", "namespace": "ns", "uid": "u1"}}


def deploy(**meta):
    d = manifests.deployment(OWNER, SPEC, manifests.Pool("server", "m"), manifests.initial_settings(SPEC, "server"))
    d["metadata"].update(meta)
    return d


def test_owns_needs_kneecaps_label_and_an_owner_reference_to_this_uid():
    ours = deploy()
    assert reconcile.owns(OWNER, ours)
    other_uid = {"metadata": {"name": "m", "namespace": "ns", "uid": "u2"}}
    assert not reconcile.owns(other_uid, ours)  # an LLMDeployment of the same name, recreated
    unlabelled = deploy(labels={"app": "payments"})
    assert not reconcile.owns(OWNER, unlabelled)
    no_ref = deploy(ownerReferences=[])
    assert not reconcile.owns(OWNER, no_ref)
    c = reconcile._conflict(OWNER, "Deployment", unlabelled)
    assert (c.kind, c.name) == ("Deployment", "m")
    assert "ns/m" in c.message and "app.kubernetes.io/managed-by=kneecap" in c.message
    assert "u1" in reconcile._conflict(OWNER, "Deployment", no_ref).message


def test_replicas_owner():
    assert reconcile.replicas_owner(SPEC, None, []).replicas_owner == "kneecap"
    ext = parse_spec({**{"model": {"name": "facebook/opt-1.3b"}, "accelerator": {"type": "h100-64gb"},
                         "engine": {"image": "vllm"}}, "topology": {"replicasManagedBy": "external"}})
    assert reconcile.replicas_owner(ext, deploy(), []).external
    hpa = {"metadata": {"name": "m-hpa"}, "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "m"}}}
    other = {"metadata": {"name": "x"}, "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "other"}}}
    assert reconcile.replicas_owner(SPEC, deploy(), [other, hpa]).replicas_owner == "hpa/m-hpa"
    assert not reconcile.replicas_owner(SPEC, deploy(), [other]).external
    mf = [{"manager": "kneecap", "fieldsV1": {"f:spec": {"f:replicas": {}, "f:template": {}}}},
          {"manager": "kubectl-scale", "fieldsV1": {"f:spec": {"f:replicas": {}}}}]
    assert reconcile.replicas_owner(SPEC, deploy(managedFields=mf), []).replicas_owner == "manager/kubectl-scale"
    assert not reconcile.replicas_owner(SPEC, deploy(managedFields=mf[:1]), []).external


def test_rollout_in_progress():
    d = deploy(generation=3)
    st = reconcile.PoolState(manifests.Pool("server", "m"), d, manifests.initial_settings(SPEC, "server"),
                             reconcile.Ownership("kneecap"))
    assert not st.rollout_in_progress  # no status yet: nothing known to be rolling
    d["status"] = {"observedGeneration": 2, "updatedReplicas": 1}
    assert st.rollout_in_progress
    d["status"] = {"observedGeneration": 3, "updatedReplicas": 1, "replicas": 1}
    assert not st.rollout_in_progress
    d["spec"]["replicas"] = 3
    d["status"] = {"observedGeneration": 3, "updatedReplicas": 2}
    assert st.rollout_in_progress


def test_metrics_url_only_on_the_pods_own_ip():
    pod = {"metadata": {"annotations": {}}, "status": {"podIP": "10.0.0.7"}}
    assert reconcile.metrics_url(pod, 8000) == "http://10.0.0.7:8000/metrics"
    for url, ok in [("http://10.0.0.7:9100/metrics", True), ("https://10.0.0.7/m", True),
                    ("http://169.254.169.254/latest/meta-data/", False), ("http://twin:9/metrics", False),
                    ("http://10.0.0.8:8000/metrics", False), ("http://10.0.0.7@evil:80/", False),
                    ("http://u@10.0.0.7:80/", False), ("file:///etc/passwd", False), ("http://10.0.0.7:x/", False)]:
        pod["metadata"]["annotations"]["kneecap.io/metrics-url"] = url
        assert reconcile.metrics_url(pod, 8000) == (url if ok else "http://10.0.0.7:8000/metrics"), url
    v6 = {"metadata": {"annotations": {"kneecap.io/metrics-url": "http://[fd00::7]:9/metrics"}},
          "status": {"podIP": "fd00::7"}}
    assert reconcile.metrics_url(v6, 8000) == "http://[fd00::7]:9/metrics"
    v6["metadata"]["annotations"] = {}
    assert reconcile.metrics_url(v6, 8000) == "http://[fd00::7]:8000/metrics"
    assert reconcile.metrics_url({"metadata": {}, "status": {}}, 8000) is None


def test_pods_of_follows_controller_references_from_pod_to_replicaset_to_deployment():
    from kneecap.control.informer import pods_of

    def obj(name, uid, owner_uid=None, controller=True):
        refs = [{"uid": owner_uid, "controller": controller}] if owner_uid else []
        return {"metadata": {"name": name, "uid": uid, "ownerReferences": refs}}

    dep = obj("m", "d1")
    rs = [obj("m-new", "r1", "d1"), obj("m-old", "r0", "d1"), obj("other-rs", "r9", "d9"),
          obj("adopted", "r5", "d1", controller=False)]
    pods = [obj("a", "p1", "r1"), obj("b", "p2", "r0"), obj("fake", "p3"), obj("c", "p4", "r9"),
            obj("d", "p5", "r5"), obj("e", "p6", "d1")]
    assert [p["metadata"]["name"] for p in pods_of(dep, rs, pods)] == ["a", "b"]
    assert pods_of(None, rs, pods) == []
