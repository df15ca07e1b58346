"""The CRD and the shipped examples on the real kube-apiserver: structural schema, CEL rules
compiled within their cost budget, hostile specs refused at admission with the field named."""

from __future__ import annotations

import copy

import pytest

from kneecap.control.spec import parse_spec
from kneecap.errors import InputError
from tests.kube.conftest import kubectl
from tests.support.control_plane import KubeClient
from tests.support.examples import EXAMPLES, ROOT, llmdeployment

LLMD = "kneecap.io/v1alpha1/llmdeployments"
NS = "admission"


def test_crd_is_established_structural_and_its_rules_compile(crd_applied: dict):
    conditions = {c["type"]: c for c in crd_applied["status"]["conditions"]}
    assert conditions["Established"]["status"] == "True", conditions
    assert conditions["NamesAccepted"]["status"] == "True", conditions
    # a non-structural schema or a rule over its cost budget is a condition (or a 422 on create)
    assert "NonStructuralSchema" not in conditions, conditions["NonStructuralSchema"]
    version = crd_applied["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    stored = str(version["schema"])
    assert "isQuantity(string(self))" in stored and "self.volumeMounts.all(" in stored


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_accepted_by_server_side_dry_run(control_plane, ns, path):
    namespace, name = llmdeployment(path)["metadata"]["namespace"], llmdeployment(path)["metadata"]["name"]
    control_plane.admin.add_namespace(namespace)
    before = control_plane.admin.get(LLMD, namespace, name)  # (another test may have applied it for real)
    out = kubectl(control_plane, "apply", "--server-side", "--dry-run=server", "--field-manager=kubectl",
                  "-f", str(path)).stdout
    assert f"llmdeployment.kneecap.io/{name} serverside-applied (server dry run)" in out, out
    # a dry run stores nothing
    after = control_plane.admin.get(LLMD, namespace, name)
    assert (after is None) if before is None else after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def _hostile(mutate) -> dict:
    obj = copy.deepcopy(llmdeployment(ROOT / "examples" / "colocated.yaml"))
    obj["metadata"] = {"name": "hostile", "namespace": NS}
    mutate(obj["spec"])
    return obj


def _rejected(admin: KubeClient, obj: dict) -> dict:
    code, body = admin.request("POST", admin.path(LLMD, NS), obj)
    assert code == 422, (code, body)
    assert body["reason"] == "Invalid", body
    assert admin.get(LLMD, NS, obj["metadata"]["name"]) is None, "a rejected object was stored"
    return body


def _engine(spec: dict) -> dict:
    return spec.setdefault("engine", {})


@pytest.mark.parametrize(("field", "bad", "mutate"), [
    ("spec.engine.resources.limits[nvidia.com/gpu]", "one", lambda s: _engine(s).update(
        resources={"limits": {"nvidia.com/gpu": "one"}})),
    ("spec.engine.resources.requests[memory]", "16 gigs", lambda s: _engine(s).update(
        resources={"requests": {"cpu": "4", "memory": "16 gigs"}})),
])
def test_garbage_resource_quantity_is_refused_naming_the_key(admin, ns, field, bad, mutate):
    body = _rejected(admin, _hostile(mutate))
    (cause,) = [c for c in body["details"]["causes"] if c["field"] == field]
    assert cause["message"] == f'Invalid value: "{bad}": {bad} is not a resource quantity (e.g. 1, 500m, 16Gi)', cause
    # the operator's own parser (which runs the same CRD rules) refuses it on the same field
    with pytest.raises(InputError) as exc:
        parse_spec(_hostile(mutate)["spec"])
    assert exc.value.field == field and f"{bad} is not a resource quantity" in str(exc.value)


def test_a_valid_quantity_in_either_form_is_accepted(admin, ns):
    obj = _hostile(lambda s: _engine(s).update(resources={"limits": {"nvidia.com/gpu": 1, "memory": "64Gi"},
                                                         "requests": {"cpu": "500m"}}))
    obj["metadata"]["name"] = "quantities-ok"
    code, body = admin.request("POST", admin.path(LLMD, NS) + "?dryRun=All", obj)
    assert code == 201, body
    assert body["spec"]["engine"]["resources"]["limits"] == {"nvidia.com/gpu": 1, "memory": "64Gi"}


@pytest.mark.parametrize("flag", ["--max-num-seqs=8", "--gpu_memory_utilization=0.5", "--max-num-se", "--port"])
def test_managed_flag_in_extra_args_is_refused(admin, ns, flag):
    body = _rejected(admin, _hostile(lambda s: _engine(s).update(extraArgs=["--enforce-eager", flag])))
    fields = {c["field"]: c["message"] for c in body["details"]["causes"]}
    assert "spec.engine.extraArgs[1]" in fields, fields
    assert "sets a vLLM flag that kneecap manages" in fields["spec.engine.extraArgs[1]"]


def test_strict_field_validation_names_an_unknown_field(admin, ns):
    obj = _hostile(lambda s: s.update(colour="blue"))
    code, body = admin.request("POST", admin.path(LLMD, NS) + "?fieldValidation=Strict", obj)
    assert code == 400 and 'unknown field "spec.colour"' in body["message"], (code, body)


@pytest.mark.parametrize(("field", "mutate"), [
    ("spec.engine.podAnnotations", lambda s: _engine(s).update(
        podAnnotations={"kneecap.io/metrics-url": "http://169.254.169.254/latest/meta-data"})),
    ("spec.engine.podTemplate.metadata.annotations", lambda s: _engine(s).update(
        podTemplate={"metadata": {"annotations": {"kneecap.io/metrics-url": "http://10.0.0.9:9000/metrics"}}})),
])
def test_a_metrics_url_the_operator_would_ignore_is_refused(admin, ns, field, mutate):
    body = _rejected(admin, _hostile(mutate))
    (cause,) = [c for c in body["details"]["causes"] if c["field"] == field]
    assert "must name the pod's own IP" in cause["message"], cause


def test_the_status_the_operator_writes_is_stored_whole_and_earlier_keys_are_pruned(admin, ns, curve):
    """A tick's status, merge-patched over one an earlier version wrote (abbreviated keys), is
    stored as written: every field declared, the earlier keys pruned where the schema is closed."""
    import json
    from dataclasses import replace

    from kneecap.control import plan
    from tests.support.plan_inputs import NOW, SPEC, gathered, live_pool, ring_status
    from tests.support.profile_observations import observation

    status, ring = ring_status(curve)
    obs = replace(observation(curve[32]), t_end_s=NOW)
    written = plan.plan(gathered(plan.PoolWindow("server", live_pool(), plan.OBSERVED, observation=obs), ring),
                        status, SPEC, NOW).status
    obj = copy.deepcopy(llmdeployment(ROOT / "examples" / "colocated.yaml"))
    obj["metadata"] = {"name": "status-keys", "namespace": NS}
    admin.create(LLMD, obj)
    earlier = {"calibration": {**written["calibration"], "mapePct": 3.2, "nPoints": 14},
               "recommendation": {**written["recommendation"], "kvGiB": 47.5},
               "workload": {**written["workload"], "inputLengthCV": 0.5}}
    admin.patch(LLMD, NS, "status-keys", {"status": earlier}, sub="status")
    stored = admin.patch(LLMD, NS, "status-keys", {"status": written}, sub="status")["status"]
    expected = json.loads(json.dumps(written), object_hook=lambda d: {k: v for k, v in d.items() if v is not None})
    assert stored == expected
