"""The vLLM pods kneecap creates are admitted in a Pod Security "restricted" namespace and carry
no API token. kubernetes-validate on the rendered Deployments:
tests/integration/test_control_pod_security_validate.py."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import yaml

from kneecap.control import manifests
from kneecap.control.spec import parse_spec
from kneecap.errors import InputError
from tests.support.examples import kneecap_pod_examples, llmdeployment, rendered_deployments as rendered
from tests.support.pod_security import restricted_violations

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = kneecap_pod_examples()


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_examples_pods_pass_the_restricted_profile(example):
    for d in rendered(example):
        pod = d["spec"]["template"]["spec"]
        assert restricted_violations(pod) == []
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsUser"] == manifests.RUN_AS_USER != 0
        (c,) = pod["containers"]
        # vLLM's caches (HF, vLLM, Triton, Inductor) go under a writable $HOME
        assert {"name": "HOME", "value": manifests.HOME} in c["env"]
        assert c["volumeMounts"][0] == {"name": "home", "mountPath": manifests.HOME}
        assert pod["volumes"][0] == {"name": "home", "emptyDir": {}}


def test_a_template_security_context_replaces_only_the_keys_it_gives():
    """fsGroup from the template keeps the restricted profile; runAsUser 0 from it is the user's
    (explicit) choice, and the checker says what it breaks."""
    doc = yaml.safe_load((ROOT / "examples" / "shaped-pods.yaml").read_text())
    (d,) = rendered(ROOT / "examples" / "shaped-pods.yaml")
    pod = d["spec"]["template"]["spec"]
    assert pod["securityContext"]["fsGroup"] == doc["spec"]["engine"]["podTemplate"]["spec"]["securityContext"]["fsGroup"]
    assert pod["securityContext"]["runAsNonRoot"] is True and restricted_violations(pod) == []
    doc["spec"]["engine"]["podTemplate"]["spec"]["securityContext"] = {"runAsUser": 0, "runAsNonRoot": False}
    spec = parse_spec(doc["spec"])
    (pool,) = manifests.pools("llama-70b", spec)
    root = manifests.pod_spec(spec, pool.role, manifests.initial_settings(spec, pool.role))
    assert any("runAsUser must not be 0" in v for v in restricted_violations(root))


def test_the_checker_catches_each_relaxation():
    (d,) = rendered(EXAMPLES[0])
    pod = d["spec"]["template"]["spec"]
    cases = {
        "runAsNonRoot must be true": lambda p: (p["securityContext"].pop("runAsNonRoot"),
                                                p["containers"][0]["securityContext"].pop("runAsNonRoot")),
        "allowPrivilegeEscalation must be false": lambda p: p["containers"][0]["securityContext"].pop(
            "allowPrivilegeEscalation"),
        "drop must include ALL": lambda p: p["containers"][0]["securityContext"]["capabilities"].update(drop=[]),
        "capability SYS_ADMIN may not be added": lambda p: p["containers"][0]["securityContext"]["capabilities"]
        .update(add=["SYS_ADMIN"]),
        "seccompProfile.type must be RuntimeDefault": lambda p: (
            p["securityContext"].pop("seccompProfile"), p["containers"][0]["securityContext"].pop("seccompProfile")),
        "type hostPath is not allowed": lambda p: p["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
        "hostNetwork must be unset": lambda p: p.update(hostNetwork=True),
        "runAsUser must not be 0": lambda p: p["securityContext"].update(runAsUser=0),
    }
    for message, relax in cases.items():
        bad = copy.deepcopy(pod)
        relax(bad)
        assert any(message in v for v in restricted_violations(bad)), message


def test_user_env_overrides_home_and_extra_args_cannot_override_managed_flags():
    """parse_spec rejects managed flags in extraArgs (the CRD's rule); the builder drops them as
    well (defence in depth: a spec parsed elsewhere still cannot override a managed flag)."""
    doc = llmdeployment(EXAMPLES[0])
    doc["spec"]["engine"]["env"] = [{"name": "HOME", "value": "/data"}, {"name": "HF_HOME", "value": "/data/hf"}]
    hostile = ("--max-model-len=8192", "--max-num-seqs", "4", "--port=9999", "--max_num_seqs=2", "--host=0.0.0.0",
               "--gpu-memory-utilization=0.99", "--kv-transfer-config={}", "--enforce-eager")
    doc["spec"]["engine"]["extraArgs"] = list(hostile)
    with pytest.raises(InputError) as exc:
        parse_spec(doc["spec"])
    assert exc.value.field == "spec.engine.extraArgs[1]"
    doc["spec"]["engine"]["extraArgs"] = []
    spec = parse_spec(doc["spec"])
    spec = dataclasses.replace(spec, engine=dataclasses.replace(spec.engine, extra_args=hostile))
    (d,) = [manifests.deployment({**doc, "metadata": {**doc["metadata"], "uid": "u"}}, spec, pool,
                                 manifests.initial_settings(spec, pool.role))
            for pool in manifests.pools(doc["metadata"]["name"], spec)]
    (c,) = d["spec"]["template"]["spec"]["containers"]
    assert [e["name"] for e in c["env"]] == ["HOME", "HF_HOME"] and c["env"][0]["value"] == "/data"
    assert c["args"] == [spec.model.name, f"--port={spec.engine.port}", f"--max-num-seqs={spec.engine.max_num_seqs}",
                         f"--gpu-memory-utilization={spec.engine.gpu_memory_utilization:g}",
                         "--max-model-len=8192", "--enforce-eager"]
