"""Spec parsing: defaults come from the CRD, errors name the field path."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from kneecap.control import spec as S
from kneecap.errors import InputError

ROOT = Path(__file__).resolve().parents[2]

BASE = {
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
    "accelerator": {"type": "h100-80gb"},
    "engine": {"image": "vllm/vllm-openai:v0.11.0"},
}


def with_(path: str, value, base=BASE):
    raw = copy.deepcopy(base)
    node = raw
    keys = path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return raw


def test_crd_identity():
    crd = S.load_crd()
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["spec"]["group"] == "kneecap.io"
    assert crd["spec"]["names"]["plural"] == "llmdeployments"
    assert crd["spec"]["names"]["shortNames"] == ["llmd"]
    assert crd["spec"]["scope"] == "Namespaced"
    (v,) = crd["spec"]["versions"]
    assert v["name"] == "v1alpha1" and v["subresources"] == {"status": {}}
    cols = {c["name"] for c in v["additionalPrinterColumns"]}
    assert {"Mode", "Cap", "Applied", "Memory", "Replicas", "SLO", "Phase"} <= cols


def test_defaults_come_from_the_crd():
    s = S.parse_spec(BASE)
    schema = S.spec_schema()["properties"]
    assert s.engine.max_num_seqs == schema["engine"]["properties"]["maxNumSeqs"]["default"] == 256
    assert s.engine.gpu_memory_utilization == schema["engine"]["properties"]["gpuMemoryUtilization"]["default"]
    assert s.engine.port == 8000
    assert s.engine.command == ("vllm", "serve")
    assert s.control.mode == "advise"
    assert s.control.interval_s == 30.0 and s.control.window_s == 300.0 and s.control.cooldown_s == 900.0
    assert s.control.min_improvement == schema["control"]["properties"]["minImprovement"]["default"]
    assert s.topology.mode == "colocated"
    assert s.topology.replicas == S.PoolBounds(1, 8)
    assert s.topology.kv_transfer is None
    assert s.slo.quantile == 0.95 and s.slo.e2e_s is None
    assert s.batching == S.BatchingSpec(0.1, 1, 1024)
    assert s.model.architecture == "llama-3.1-8b"  # guessed from the model name


def test_changing_a_crd_default_changes_the_parse(tmp_path, monkeypatch):
    crd = copy.deepcopy(S.load_crd())
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["engine"][
        "properties"]["maxNumSeqs"]["default"] = 64
    p = tmp_path / "crd.yaml"
    p.write_text(yaml.safe_dump(crd))
    monkeypatch.setattr(S, "load_crd", lambda path=p: yaml.safe_load(open(p)))
    assert S.parse_spec(BASE).engine.max_num_seqs == 64


def test_full_example_parses():
    raw = {
        **BASE,
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "architecture": "llama-3.1-8b"},
        "accelerator": {"type": "h100-80gb", "count": 1, "costPerHour": 5.0},
        "engine": {"image": "vllm/vllm-openai:v0.11.0", "port": 8000, "maxNumSeqs": 256,
                   "gpuMemoryUtilization": 0.9, "memoryKnob": "gpuMemoryUtilization",
                   "extraArgs": ["--max-model-len=8192"], "resources": {"limits": {"nvidia.com/gpu": 1}}},
        "topology": {"mode": "disaggregated", "replicas": {"min": 1, "max": 8}, "prefill": {"min": 1, "max": 8},
                     "decode": {"min": 1, "max": 8},
                     "kvTransfer": {"connector": "NixlConnector", "bandwidthGiBps": 25, "costPerGiBpsHour": 0.1}},
        "slo": {"quantile": 0.95, "ttftSeconds": 0.5, "tpotSeconds": 0.04, "e2eSeconds": 30},
        "batching": {"efficiencyFloor": 0.1, "minMaxNumSeqs": 1, "maxMaxNumSeqs": 1024},
        "budget": {"maxCostPerHour": 40},
        "control": {"mode": "enforce", "interval": "30s", "window": "5m", "cooldown": "15m",
                    "minImprovement": 0.05, "minObservations": 3},
    }
    s = S.parse_spec(raw)
    assert s.disaggregated and s.enforce
    assert s.topology.kv_transfer == S.KVTransferSpec("NixlConnector", 25.0, 0.1)
    assert s.slo.ttft_s == 0.5 and s.max_cost_per_hour == 40
    assert s.engine.extra_args == ("--max-model-len=8192",)


@pytest.mark.parametrize("path,value,field,needle", [
    ("topology.replicas", {"min": 5, "max": 2}, "spec.topology.replicas.min", "must be <= max (got 5 > 2)"),
    ("topology.decode", {"min": 3, "max": 1}, "spec.topology.decode.min", "got 3 > 1"),
    ("topology.mode", "split", "spec.topology.mode", 'Unsupported value: "split": supported values: "colocated", "disaggregated"'),
    ("topology.mode", "disaggregated", "spec.topology.kvTransfer", "required when"),
    ("engine.gpuMemoryUtilization", 1.5, "spec.engine.gpuMemoryUtilization", "should be less than or equal to 1"),
    ("engine.gpuMemoryUtilization", 0, "spec.engine.gpuMemoryUtilization", "should be greater than 0"),
    ("engine.maxNumSeqs", "lots", "spec.engine.maxNumSeqs", "must be of type integer"),
    ("engine.maxNumSeqs", 2048, "spec.engine.maxNumSeqs", "= [1, 1024] (got 2048)"),
    ("engine.port", 70000, "spec.engine.port", "Invalid value: 70000: spec.engine.port in body should be less than or equal to 65535"),
    ("control.mode", "yolo", "spec.control.mode", "Unsupported value"),
    ("control.interval", "soon", "spec.control.interval", "should match"),
    ("control.minObservations", 0, "spec.control.minObservations", "should be greater than or equal to 1"),
    ("batching", {"minMaxNumSeqs": 64, "maxMaxNumSeqs": 8}, "spec.batching.minMaxNumSeqs", "got 64 > 8"),
    ("slo.quantile", 1.0, "spec.slo.quantile", "should be less than 1"),
    ("model.architecture", "gpt-9", "spec.model.architecture", "gpt-9"),
    ("accelerator.type", "tpu-v9", "spec.accelerator.type", "tpu-v9"),
    ("engine.bogus", 1, "spec.engine.bogus", "unknown field"),
])
def test_errors_name_the_field(path, value, field, needle):
    with pytest.raises(InputError) as exc:
        S.parse_spec(with_(path, value))
    assert exc.value.field == field
    assert needle in str(exc.value)
    assert str(exc.value).startswith(field + ":")


def test_missing_required():
    raw = copy.deepcopy(BASE)
    del raw["engine"]["image"]
    with pytest.raises(InputError) as exc:
        S.parse_spec(raw)
    assert exc.value.field == "spec.engine.image"
    with pytest.raises(InputError) as exc:
        S.parse_spec({**BASE, "model": {"name": "my-own-model"}})
    assert exc.value.field == "spec.model.architecture"


@pytest.mark.parametrize("text,seconds", [("30s", 30), ("5m", 300), ("1.5h", 5400), ("500ms", 0.5)])
def test_durations(text, seconds):
    assert S.parse_duration_s(text, "x") == pytest.approx(seconds)


def _cel_fields(schema: dict, path: str = "spec") -> set[str]:
    """The field each x-kubernetes-validations rule of the CRD reports (its node plus fieldPath)."""
    out = {path + r.get("fieldPath", "") for r in schema.get("x-kubernetes-validations", [])}
    for key, sub in (schema.get("properties") or {}).items():
        out |= _cel_fields(sub, f"{path}.{key}")
    if "items" in schema:
        out |= _cel_fields(schema["items"], f"{path}[]")
    return out


def _many(n):
    return [f"--opt-{i}" for i in range(n)]


# (spec edits, the field both the API server and parse_spec name)
MALFORMED = [
    ({"engine.extraArgs": ["--max-model-len=8192", "--max-num-seqs=8"]}, "spec.engine.extraArgs[1]"),
    ({"engine.extraArgs": ["--max_num_seqs", "8"]}, "spec.engine.extraArgs[0]"),
    ({"engine.extraArgs": ["--max-num-se", "8"]}, "spec.engine.extraArgs[0]"),  # argparse abbreviation
    ({"engine.extraArgs": ["--gpu_mem=0.5"]}, "spec.engine.extraArgs[0]"),
    ({"engine.extraArgs": ["--device-memory-utilization=0.5"]}, "spec.engine.extraArgs[0]"),  # vLLM's alias
    ({"engine.extraArgs": ["--kv-cache-memory-bytes=8G"]}, "spec.engine.extraArgs[0]"),
    ({"engine.extraArgs": ["--port", "9000"]}, "spec.engine.extraArgs[0]"),
    ({"engine.extraArgs": ["--host=0.0.0.0"]}, "spec.engine.extraArgs[0]"),
    ({"engine.extraArgs": ["--ho=0.0.0.0"]}, "spec.engine.extraArgs[0]"),
    ({"engine.extraArgs": ["--por=9000"]}, "spec.engine.extraArgs[0]"),
    ({"engine.extraArgs": ["--kv-cache-mem=1G"]}, "spec.engine.extraArgs[0]"),
    ({"engine.extraArgs": ["--kv-transfer-config.kv_connector", "X"]}, "spec.engine.extraArgs[0]"),
    ({"engine.extraArgs": _many(129)}, "spec.engine.extraArgs"),
    ({"engine.extraArgs": ["x" * 4097]}, "spec.engine.extraArgs[0]"),
    ({"engine.command": ["vllm", "serve", "--max-num-seqs=4"]}, "spec.engine.command[2]"),
    ({"model.name": "--help"}, "spec.model.name"),
    ({"control.minObservations": 30}, "spec.control.minObservations"),
    ({"control.maxObservationAge": "soon"}, "spec.control.maxObservationAge"),
    ({"topology.replicas": {"min": 5, "max": 2}}, "spec.topology.replicas.min"),
    ({"topology.prefill": {"min": 3, "max": 2}}, "spec.topology.prefill.min"),
    ({"topology.decode": {"min": 3, "max": 2}}, "spec.topology.decode.min"),
    ({"topology.mode": "disaggregated"}, "spec.topology.kvTransfer"),
    ({"engine.maxNumSeqs": 2000}, "spec.engine.maxNumSeqs"),
    ({"batching": {"minMaxNumSeqs": 9, "maxMaxNumSeqs": 8}, "engine.maxNumSeqs": 8}, "spec.batching.minMaxNumSeqs"),
    ({"engine.port": 0}, "spec.engine.port"),
    # pod shaping: kneecap's labels, volumes and mounts stay kneecap's; Kubernetes types are typed
    ({"engine.podTemplate": {"metadata": {"labels": {"team": "a", "kneecap.io/role": "server"}}}},
     "spec.engine.podTemplate.metadata.labels"),
    ({"engine.podTemplate": {"metadata": {"labels": {"app.kubernetes.io/instance": "other"}}}},
     "spec.engine.podTemplate.metadata.labels"),
    ({"engine.podTemplate": {"metadata": {"labels": {"team": "x" * 64}}}}, "spec.engine.podTemplate.metadata.labels.team"),
    ({"engine.podTemplate": {"spec": {"volumes": [{"name": "home", "emptyDir": {}}]}}},
     "spec.engine.podTemplate.spec.volumes[0].name"),
    ({"engine.volumeMounts": [{"name": "weights", "mountPath": "/w"}]}, "spec.engine.volumeMounts"),
    ({"engine.volumeMounts": [{"name": "w", "mountPath": "/dev/shm"}],
      "engine.podTemplate": {"spec": {"volumes": [{"name": "w", "emptyDir": {}}]}}}, "spec.engine.volumeMounts"),
    ({"engine.volumeMounts": [{"name": "w", "mountPath": "/home/vllm"}],
      "engine.podTemplate": {"spec": {"volumes": [{"name": "w", "emptyDir": {}}]}}},
     "spec.engine.volumeMounts[0].mountPath"),
    ({"engine.podTemplate": {"spec": {"tolerations": [{"key": "nvidia.com/gpu", "tolerationSeconds": "soon"}]}}},
     "spec.engine.podTemplate.spec.tolerations[0].tolerationSeconds"),
    ({"engine.podTemplate": {"spec": {"tolerations": [{"operator": "Exists"}] * 65}}},
     "spec.engine.podTemplate.spec.tolerations"),
    ({"engine.podTemplate": {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": "gpu"}}}}}},
     "spec.engine.podTemplate.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"),
    ({"engine.podTemplate": {"spec": {"volumes": [{"name": "w", "persistentVolumeClaim": {}}]}}},
     "spec.engine.podTemplate.spec.volumes[0].persistentVolumeClaim.claimName"),
    ({"engine.podTemplate": {"spec": {"securityContext": {"runAsUser": "root"}}}},
     "spec.engine.podTemplate.spec.securityContext.runAsUser"),
    ({"engine.podTemplate": {"spec": {"serviceAccountName": ["vllm"]}}}, "spec.engine.podTemplate.spec.serviceAccountName"),
    ({"engine.startupProbe": {"httpGet": {"path": "/health"}}}, "spec.engine.startupProbe.httpGet.port"),
    ({"engine.livenessProbe": {"failureThreshold": "many"}}, "spec.engine.livenessProbe.failureThreshold"),
    ({"engine.env": [{"value": "x"}]}, "spec.engine.env[0].name"),
    ({"engine.envFrom": [{"secretRef": "hf-token"}]}, "spec.engine.envFrom[0].secretRef"),
    ({"engine.resources": {"limits": {"nvidia.com/gpu": [1]}}}, "spec.engine.resources.limits.nvidia.com/gpu"),
    ({"engine.shmSize": "lots"}, "spec.engine.shmSize"),
    ({"engine.modelCache": {"mountPath": "/cache"}}, "spec.engine.modelCache.claimName"),
    ({"engine.modelCache": {"claimName": "w", "mountPath": "cache"}}, "spec.engine.modelCache.mountPath"),
]
WELL_FORMED = [
    {"engine.extraArgs": ["--max-model-len", "4096", "--enable-prefix-caching", "-tp", "2", "--"]},
    {"engine.extraArgs": ["--hf-token=x", "--port-range-is-not-a-flag", "--served-model-name", "m"]},
    {"engine.extraArgs": ["--gpu=h100-80gb", "--max-num-batched-tokens=8192", "--kv-cache-dtype=fp8", "--h", "--p"]},
    {"engine.extraArgs": _many(128)},
    {"engine.command": ["python", "-m", "vllm.entrypoints.openai.api_server"]},
    {"control.minObservations": 24, "control.maxObservationAge": "90s"},
    {"model.name": "/models/llama-3.1-8b"},
    {"engine": yaml.safe_load((ROOT / "examples" / "shaped-pods.yaml").read_text())["spec"]["engine"]},
    {"engine.podTemplate": {"metadata": {"labels": {"app.kubernetes.io/part-of": "chat"}}},
     "engine.resources": {"limits": {"nvidia.com/gpu": 1, "memory": "64Gi"}}, "engine.shmSize": 1073741824},
]


def _edit(edits: dict) -> dict:
    raw = copy.deepcopy(BASE)
    for path, value in edits.items():
        raw = with_(path, value, raw)
    return raw


@pytest.fixture(scope="module")
def api():
    from kneecap.demo.kubeapi import KubeAPIThread

    with KubeAPIThread() as k:
        yield k


def _post(api, name: str, spec: dict):
    from kneecap.demo.kubeapi import LLMD

    obj = {"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment",
           "metadata": {"name": name, "namespace": "specs"}, "spec": spec}
    return api.request("POST", api.path(LLMD, "specs"), obj)


@pytest.mark.parametrize("i", range(len(MALFORMED)))
def test_malformed_specs_are_rejected_by_the_api_and_the_parser_alike(api, i):
    edits, field = MALFORMED[i]
    spec = _edit(edits)
    code, body = _post(api, f"bad-{i}", spec)
    assert code == 422, body
    assert field in [c["field"] for c in body["details"]["causes"]], body["message"]
    with pytest.raises(InputError) as exc:
        S.parse_spec(spec)
    assert exc.value.field == field


@pytest.mark.parametrize("i", range(len(WELL_FORMED)))
def test_well_formed_specs_are_accepted_by_both(api, i):
    spec = _edit(WELL_FORMED[i])
    code, body = _post(api, f"good-{i}", spec)
    assert code == 201, body
    S.parse_spec(spec)


def test_every_cel_rule_is_in_the_malformed_table():
    tested = {re.sub(r"\[\d+\]", "[]", f) for _, f in MALFORMED}
    rules = _cel_fields(S.spec_schema())
    assert len(rules) == 13 and rules <= tested, rules - tested


def test_managed_flag_message_names_the_flag():
    with pytest.raises(InputError) as exc:
        S.parse_spec(_edit({"engine.extraArgs": ["--max_num_seqs=4"]}))
    assert str(exc.value).startswith('spec.engine.extraArgs[0]: Invalid value: "string": --max_num_seqs=4 sets a vLLM '
                                     "flag that kneecap manages")
    assert "spec.engine.maxNumSeqs" in str(exc.value)


@pytest.mark.parametrize("name,ok", [("llama", True), ("a" * 55, True), ("a-1", True), ("a" * 56, False),
                                     ("Llama", False), ("has.dot", False), ("9lives", False), ("end-", False)])
def test_check_name_matches_the_api(api, name, ok):
    code, body = _post(api, name, BASE)
    assert (code == 201) == ok, body
    if ok:
        S.check_name(name)
        return
    assert body["details"]["causes"][0]["field"] == "metadata.name"
    with pytest.raises(InputError) as exc:
        S.check_name(name)
    assert exc.value.field == "metadata.name"


def test_max_observation_age_defaults_to_three_windows():
    assert S.parse_spec(BASE).control.max_observation_age_s == 900.0
    assert S.parse_spec(with_("control.window", "1m")).control.max_observation_age_s == 180.0
    assert S.parse_spec(with_("control.maxObservationAge", "90s")).control.max_observation_age_s == 90.0


def test_max_observation_age_defaults_to_three_windows_and_parses_a_duration():
    spec = S.parse_spec({**BASE, "control": {"window": "2m"}})
    assert spec.control.max_observation_age_s == 360.0
    spec = S.parse_spec({**BASE, "control": {"window": "2m", "maxObservationAge": "15m"}})
    assert spec.control.max_observation_age_s == 900.0
    with pytest.raises(InputError) as e:
        S.parse_spec({**BASE, "control": {"maxObservationAge": "soon"}})
    assert e.value.field == "spec.control.maxObservationAge"


def test_pod_shaping_fields_parse():
    doc = yaml.safe_load((ROOT / "examples" / "shaped-pods.yaml").read_text())
    e = S.parse_spec(doc["spec"]).engine
    assert e.shm_size == "16Gi" and e.model_cache == S.ModelCacheSpec("llama-70b-weights", "/model-cache", False)
    assert e.startup_probe["failureThreshold"] == 240 and e.readiness_probe is None
    assert e.env_from == ({"secretRef": {"name": "hf-token"}},)
    assert e.pod_template["spec"]["runtimeClassName"] == "nvidia"
    assert [m["name"] for m in e.volume_mounts] == ["chat-templates"]
    # the defaults: no shaping, an empty template
    bare = S.parse_spec(BASE).engine
    assert bare.pod_template == {"metadata": {}, "spec": {}} and bare.shm_size is None and bare.model_cache is None


def test_pod_shaping_errors_name_the_offending_key():
    with pytest.raises(InputError) as exc:
        S.parse_spec(_edit({"engine.podTemplate": {"metadata": {"labels": {"app.kubernetes.io/managed-by": "me"}}}}))
    assert "sets app.kubernetes.io/managed-by, a label that kneecap manages" in str(exc.value)
    with pytest.raises(InputError) as exc:
        S.parse_spec(_edit({"engine.volumeMounts": [{"name": "weights", "mountPath": "/w"}]}))
    assert "mounts weights, which is not a volume of spec.engine.podTemplate.spec.volumes" in str(exc.value)
    with pytest.raises(InputError) as exc:
        S.parse_spec(_edit({"engine.podTemplate": {"spec": {"volumes": [{"name": "dshm", "emptyDir": {}}]}}}))
    assert "volume name dshm is reserved by kneecap" in str(exc.value)
