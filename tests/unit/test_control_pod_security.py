"""The vLLM pods kneecap creates are admitted in a Pod Security "restricted" namespace and carry
no API token; the rendered Deployments are valid for the current Kubernetes (kubernetes-validate)."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kneecap.control import manifests as M
from kneecap.control.spec import parse_spec
from kneecap.errors import InputError
from tests.support.pod_security import restricted_violations

from tests.support.examples import EXAMPLES as ALL_EXAMPLES, llmdeployment

ROOT = Path(__file__).resolve().parents[2]
# the examples whose pods kneecap makes (an adopt example's pods are the user's Deployment's)
EXAMPLES = [p for p in ALL_EXAMPLES if "engine" in llmdeployment(p)["spec"]]
K8S_VERSION = "1.37.0"


def rendered(example: Path) -> list[dict]:
    doc = llmdeployment(example)
    owner = {**doc, "metadata": {**doc["metadata"], "uid": "4b7e0d0e-0000-4000-8000-000000000001"}}
    spec = parse_spec(doc["spec"])
    return [M.deployment(owner, spec, pool, M.initial_settings(spec, pool.role))
            for pool in M.pools(doc["metadata"]["name"], spec)]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_examples_pods_pass_the_restricted_profile(example):
    for d in rendered(example):
        pod = d["spec"]["template"]["spec"]
        assert restricted_violations(pod) == []
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsUser"] == M.RUN_AS_USER != 0
        (c,) = pod["containers"]
        # vLLM's caches (HF, vLLM, Triton, Inductor) go under a writable $HOME
        assert {"name": "HOME", "value": M.HOME} in c["env"]
        assert c["volumeMounts"][0] == {"name": "home", "mountPath": M.HOME}
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
    (pool,) = M.pools("llama-70b", spec)
    root = M.pod_spec(spec, pool.role, M.initial_settings(spec, pool.role))
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
    (d,) = [M.deployment({**doc, "metadata": {**doc["metadata"], "uid": "u"}}, spec, pool,
                         M.initial_settings(spec, pool.role))
            for pool in M.pools(doc["metadata"]["name"], spec)]
    (c,) = d["spec"]["template"]["spec"]["containers"]
    assert [e["name"] for e in c["env"]] == ["HOME", "HF_HOME"] and c["env"][0]["value"] == "/data"
    assert c["args"] == [spec.model.name, f"--port={spec.engine.port}", f"--max-num-seqs={spec.engine.max_num_seqs}",
                         f"--gpu-memory-utilization={spec.engine.gpu_memory_utilization:g}",
                         "--max-model-len=8192", "--enforce-eager"]


def test_rendered_deployments_validate_strict_for_current_kubernetes(tmp_path):
    exe = Path(sys.executable).parent / "kubernetes-validate"
    if not exe.exists():
        pytest.fail("kubernetes-validate is not installed in the venv: run `bash scripts/setup.sh` (test extra)")
    docs = [d for example in EXAMPLES for d in rendered(example)]
    path = tmp_path / "pools.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    p = subprocess.run([str(exe), "--strict", "-k", K8S_VERSION, str(path)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count(" passed for resource ") == len(docs) >= len(EXAMPLES), p.stdout
