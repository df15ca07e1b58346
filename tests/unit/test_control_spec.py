"""Spec parsing: defaults come from the CRD, errors name the field path."""

from __future__ import annotations

import copy

import pytest
import yaml

from kneecap.control import spec as S
from kneecap.errors import InputError

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
    ("topology.replicas", {"min": 5, "max": 2}, "spec.topology.replicas.min", "must be ≤ max (got 5 > 2)"),
    ("topology.decode", {"min": 3, "max": 1}, "spec.topology.decode.min", "got 3 > 1"),
    ("topology.mode", "split", "spec.topology.mode", "expected one of"),
    ("topology.mode", "disaggregated", "spec.topology.kvTransfer", "required when"),
    ("engine.gpuMemoryUtilization", 1.5, "spec.engine.gpuMemoryUtilization", "≤ 1"),
    ("engine.gpuMemoryUtilization", 0, "spec.engine.gpuMemoryUtilization", "> 0"),
    ("engine.maxNumSeqs", "lots", "spec.engine.maxNumSeqs", "expected integer"),
    ("engine.maxNumSeqs", 2048, "spec.engine.maxNumSeqs", "within [1, 1024]"),
    ("engine.port", 70000, "spec.engine.port", "≤ 65535"),
    ("control.mode", "yolo", "spec.control.mode", "expected one of"),
    ("control.interval", "soon", "spec.control.interval", "expected to match"),
    ("control.minObservations", 0, "spec.control.minObservations", "≥ 1"),
    ("batching", {"minMaxNumSeqs": 64, "maxMaxNumSeqs": 8}, "spec.batching.minMaxNumSeqs", "got 64 > 8"),
    ("slo.quantile", 1.0, "spec.slo.quantile", "< 1"),
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


def test_every_cel_rule_has_a_python_check():
    """Each x-kubernetes-validations rule in the CRD is mirrored by a check that names a field."""
    schema = S.spec_schema()
    rules = [r["message"] for r in schema.get("x-kubernetes-validations", [])]
    rules += [r["message"] for r in schema["properties"]["topology"]["x-kubernetes-validations"]]
    rules += [r["message"] for r in schema["properties"]["batching"]["x-kubernetes-validations"]]
    assert len(rules) == 6
    bad = {
        "kvTransfer": with_("topology.mode", "disaggregated"),
        "maxNumSeqs": with_("engine.maxNumSeqs", 2000),
        "replicas.min": with_("topology.replicas", {"min": 3, "max": 2}),
        "prefill.min": with_("topology.prefill", {"min": 3, "max": 2}),
        "decode.min": with_("topology.decode", {"min": 3, "max": 2}),
        "minMaxNumSeqs": with_("batching", {"minMaxNumSeqs": 9, "maxMaxNumSeqs": 8, }, with_("engine.maxNumSeqs", 8)),
    }
    for msg in rules:
        (key,) = [k for k in bad if msg.split()[0].endswith(k)]
        with pytest.raises(InputError) as exc:
            S.parse_spec(bad[key])
        assert exc.value.field == msg.split()[0]


def test_max_observation_age_defaults_to_three_windows_and_parses_a_duration():
    spec = S.parse_spec({**BASE, "control": {"window": "2m"}})
    assert spec.control.max_observation_age_s == 360.0
    spec = S.parse_spec({**BASE, "control": {"window": "2m", "maxObservationAge": "15m"}})
    assert spec.control.max_observation_age_s == 900.0
    with pytest.raises(InputError) as e:
        S.parse_spec({**BASE, "control": {"maxObservationAge": "soon"}})
    assert e.value.field == "spec.control.maxObservationAge"
