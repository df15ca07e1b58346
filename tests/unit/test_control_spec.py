"""Spec parsing: defaults come from the CRD, errors name the field path."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from kneecap.control import spec as spec_module
from kneecap.errors import InputError
from tests.support.spec_cases import (BASE, GPU_SHAPE, MALFORMED, NAMES, PD, ROOT, SHAPE, TARGET_BASE, TARGET_SPECS,
                                      WELL_FORMED, edit, with_)

def test_crd_identity():
    crd = spec_module.load_crd()
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
    s = spec_module.parse_spec(BASE)
    schema = spec_module.spec_schema()["properties"]
    assert s.engine.max_num_seqs == schema["engine"]["properties"]["maxNumSeqs"]["default"] == 256
    assert s.engine.gpu_memory_utilization == schema["engine"]["properties"]["gpuMemoryUtilization"]["default"]
    assert s.engine.port == 8000
    assert s.engine.command == ("vllm", "serve")
    assert s.control.mode == "advise"
    assert s.control.interval_s == 30.0 and s.control.window_s == 300.0 and s.control.cooldown_s == 900.0
    assert s.control.min_improvement == schema["control"]["properties"]["minImprovement"]["default"]
    assert s.topology.mode == "colocated"
    assert s.topology.replicas == spec_module.PoolBounds(1, 8)
    assert s.topology.kv_transfer is None
    assert s.slo.quantile == 0.95 and s.slo.e2e_s is None
    assert s.batching == spec_module.BatchingSpec(0.1, 1, 1024)
    assert s.model.architecture.key == "llama-3.1-8b"  # guessed from the model name


def test_changing_a_crd_default_changes_the_parse(tmp_path, monkeypatch):
    crd = copy.deepcopy(spec_module.load_crd())
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["engine"][
        "properties"]["maxNumSeqs"]["default"] = 64
    p = tmp_path / "crd.yaml"
    p.write_text(yaml.safe_dump(crd))
    monkeypatch.setattr(spec_module, "load_crd", lambda path=p: yaml.safe_load(open(p)))
    assert spec_module.parse_spec(BASE).engine.max_num_seqs == 64


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
    s = spec_module.parse_spec(raw)
    assert s.disaggregated and s.enforce
    assert s.topology.kv_transfer == spec_module.KVTransferSpec("NixlConnector", 25.0, 0.1)
    assert s.slo.ttft_s == 0.5 and s.max_cost_per_hour == 40
    assert s.engine.extra_args == ("--max-model-len=8192",)


@pytest.mark.parametrize("path,value,field,needle", [
    ("topology.replicas", {"min": 5, "max": 2}, "spec.topology.replicas.min", "spec.topology.replicas.min must be <= max"),
    ("topology.decode", {"min": 3, "max": 1}, "spec.topology.decode.min", "spec.topology.decode.min must be <= max"),
    ("topology.mode", "split", "spec.topology.mode", 'Unsupported value: "split": supported values: "colocated", "disaggregated"'),
    ("topology.mode", "disaggregated", "spec.topology.kvTransfer", "required when"),
    ("engine.gpuMemoryUtilization", 1.5, "spec.engine.gpuMemoryUtilization", "should be less than or equal to 1"),
    ("engine.gpuMemoryUtilization", 0, "spec.engine.gpuMemoryUtilization", "should be greater than 0"),
    ("engine.maxNumSeqs", "lots", "spec.engine.maxNumSeqs", "must be of type integer"),
    ("engine.maxNumSeqs", 2048, "spec.engine.maxNumSeqs", "must lie within [spec.batching.minMaxNumSeqs, spec.batching.maxMaxNumSeqs]"),
    ("engine.port", 70000, "spec.engine.port", "Invalid value: 70000: spec.engine.port in body should be less than or equal to 65535"),
    ("control.mode", "yolo", "spec.control.mode", "Unsupported value"),
    ("control.interval", "soon", "spec.control.interval", "should match"),
    ("control.minObservations", 0, "spec.control.minObservations", "should be greater than or equal to 1"),
    ("batching", {"minMaxNumSeqs": 64, "maxMaxNumSeqs": 8}, "spec.batching.minMaxNumSeqs", "spec.batching.minMaxNumSeqs must be <= maxMaxNumSeqs"),
    ("slo.quantile", 1.0, "spec.slo.quantile", "should be less than 1"),
    ("model.architecture", "gpt-9", "spec.model.architecture", "gpt-9"),
    ("accelerator.type", "tpu-v9", "spec.accelerator.type", "tpu-v9"),
    ("engine.bogus", 1, "spec.engine.bogus", "unknown field"),
])
def test_errors_name_the_field(path, value, field, needle):
    with pytest.raises(InputError) as exc:
        spec_module.parse_spec(with_(path, value))
    assert exc.value.field == field
    assert needle in str(exc.value)
    assert str(exc.value).startswith(field + ":")


def test_missing_required():
    raw = copy.deepcopy(BASE)
    del raw["engine"]["image"]
    with pytest.raises(InputError) as exc:
        spec_module.parse_spec(raw)
    assert exc.value.field == "spec.engine.image"
    with pytest.raises(InputError) as exc:
        spec_module.parse_spec({**BASE, "model": {"name": "my-own-model"}})
    assert exc.value.field == "spec.model.architecture"


@pytest.mark.parametrize("text,seconds", [("30s", 30), ("5m", 300), ("1.5h", 5400), ("500ms", 0.5)])
def test_durations(text, seconds):
    assert spec_module.parse_duration_s(text, "x") == pytest.approx(seconds)


def _cel_fields(schema: dict, path: str = "spec") -> set[str]:
    """The field each x-kubernetes-validations rule of the CRD reports (its node plus fieldPath)."""
    out = {path + r.get("fieldPath", "") for r in schema.get("x-kubernetes-validations", [])}
    for key, sub in (schema.get("properties") or {}).items():
        out |= _cel_fields(sub, f"{path}.{key}")
    if "items" in schema:
        out |= _cel_fields(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        out |= _cel_fields(schema["additionalProperties"], f"{path}[]")
    return out


@pytest.mark.parametrize("i", range(len(MALFORMED)))
def test_malformed_specs_are_refused_naming_the_field(i):
    """The field kube-apiserver names too (tests/kube/test_spec_cases.py)."""
    edits, field = MALFORMED[i]
    with pytest.raises(InputError) as exc:
        spec_module.parse_spec(edit(edits))
    assert exc.value.field == field


@pytest.mark.parametrize("i", range(len(WELL_FORMED)))
def test_well_formed_specs_parse(i):
    spec_module.parse_spec(edit(WELL_FORMED[i]))


@pytest.mark.parametrize("i", range(len(TARGET_SPECS)))
def test_target_ref_specs_are_judged_by_the_parser(i):
    edits, field = TARGET_SPECS[i]
    spec = {**copy.deepcopy(TARGET_BASE), **copy.deepcopy(edits)}
    if field is not None:
        with pytest.raises(InputError) as exc:
            spec_module.parse_spec(spec)
        assert exc.value.field == field
        return
    parsed = spec_module.parse_spec(spec)
    assert parsed.engine is None and parsed.adopted
    roles = [t.role for t in parsed.targets]
    assert roles == (["prefill", "decode"] if parsed.disaggregated else ["server"])


def test_target_ref_parses_each_pool_and_its_container():
    s = spec_module.parse_spec({**TARGET_BASE, "targetRef": {"prefill": {"name": "llama-p", "container": "engine"},
                                                             "decode": {"name": "llama-d"}}, "topology": PD})
    assert s.targets == (spec_module.TargetRef("prefill", "llama-p", "engine"),
                         spec_module.TargetRef("decode", "llama-d", None))
    assert s.memory_knob == "gpuMemoryUtilization"
    assert not spec_module.parse_spec(BASE).adopted


def test_every_cel_rule_is_in_the_malformed_table():
    tested = {re.sub(r"\[[^]]+\]", "[]", f) for _, f in MALFORMED + TARGET_SPECS if f}
    rules = _cel_fields(spec_module.spec_schema())
    assert len(rules) == 31 and rules <= tested, rules - tested


def test_managed_flag_message_names_the_flag():
    with pytest.raises(InputError) as exc:
        spec_module.parse_spec(edit({"engine.extraArgs": ["--max_num_seqs=4"]}))
    assert str(exc.value).startswith('spec.engine.extraArgs[0]: Invalid value: "--max_num_seqs=4": --max_num_seqs=4 '
                                     "sets a vLLM flag that kneecap manages")
    assert "spec.engine.maxNumSeqs" in str(exc.value)


@pytest.mark.parametrize("name,ok", NAMES)
def test_check_name_refuses_what_the_api_refuses(name, ok):
    if ok:
        spec_module.check_name(name)
        return
    with pytest.raises(InputError) as exc:
        spec_module.check_name(name)
    assert exc.value.field == "metadata.name"


def test_max_observation_age_defaults_to_three_windows():
    assert spec_module.parse_spec(BASE).control.max_observation_age_s == 900.0
    assert spec_module.parse_spec(with_("control.window", "1m")).control.max_observation_age_s == 180.0
    assert spec_module.parse_spec(with_("control.maxObservationAge", "90s")).control.max_observation_age_s == 90.0


def test_max_observation_age_defaults_to_three_windows_and_parses_a_duration():
    spec = spec_module.parse_spec({**BASE, "control": {"window": "2m"}})
    assert spec.control.max_observation_age_s == 360.0
    spec = spec_module.parse_spec({**BASE, "control": {"window": "2m", "maxObservationAge": "15m"}})
    assert spec.control.max_observation_age_s == 900.0
    with pytest.raises(InputError) as e:
        spec_module.parse_spec({**BASE, "control": {"maxObservationAge": "soon"}})
    assert e.value.field == "spec.control.maxObservationAge"


# ---------------------------------------------------------------- any model, any GPU


def test_inline_model_outside_the_catalog_parses_to_its_shape():
    s = spec_module.parse_spec(edit({"model.name": "acme/house-model-20b", "model.shape": SHAPE}))
    a = s.model.architecture
    assert a.key == "house-model-20b" and (a.layers, a.hidden, a.kv_heads, a.head_dim) == (48, 5120, 8, 128)
    # hand count: 48 x (Q,O 2·5120² + K,V 2·5120·1024 + MLP 3·5120·13824 + norms 4·5120) + 2 x 100352·5120
    per_layer = 2 * 5120**2 + 2 * 5120 * 1024 + 3 * 5120 * 13824 + 4 * 5120
    assert a.params == 48 * per_layer + 2 * 100352 * 5120
    assert a.kv_bytes_per_token == 2 * 48 * 8 * 128 * 2 and not a.moe


def test_inline_accelerator_and_cost():
    s = spec_module.parse_spec(edit({"accelerator": {"shape": GPU_SHAPE, "costPerHour": 2.5}}))
    g = s.accelerator.gpu
    assert (g.key, g.memory_gib, g.mem_bw_bytes_s, g.peak_flops, g.cost_per_hour) == ("tpu-ish", 94.0, 3.9e12, 835e12, 2.5)
    assert s.accelerator.type == "tpu-ish"
    cat = spec_module.parse_spec(edit({"accelerator.type": "mi300x", "accelerator.costPerHour": 3.0})).accelerator
    assert (cat.gpu.key, cat.gpu.memory_gib, cat.gpu.cost_per_hour) == ("mi300x", 191.98, 3.0)


@pytest.mark.parametrize("path,value,field", [("model.architecture", "qwen9-7b", "spec.model.architecture"),
                                              ("accelerator.type", "tpu-v9", "spec.accelerator.type")])
def test_unknown_catalog_key_names_the_field_and_lists_the_keys(path, value, field):
    from kneecap.model.arch import CATALOG
    from kneecap.model.hardware import GPUS

    with pytest.raises(InputError) as exc:
        spec_module.parse_spec(with_(path, value))
    assert exc.value.field == field
    keys = CATALOG if path.startswith("model") else GPUS
    listed = str(exc.value).split("expected one of ", 1)[1]
    assert listed.split(", ") == sorted(keys)
    assert {"qwen3-30b-a3b", "mixtral-8x7b", "gemma-3-27b"} <= set(listed.split(", ")) or \
        {"b200", "mi300x", "a10g", "l4"} <= set(listed.split(", "))


@pytest.mark.parametrize("name,key", [("Qwen/Qwen3-30B-A3B-Instruct-2507", "qwen3-30b-a3b"),
                                      ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
                                      ("google/gemma-3-27b-it", "gemma-3-27b"), ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
                                      ("meta-llama/Llama-3.3-70B-Instruct", "llama-3.3-70b"),
                                      ("/models/Llama-3.2-1B-Instruct", "llama-3.2-1b")])
def test_current_model_names_guess_their_catalog_key(name, key):
    assert spec_module.parse_spec(with_("model.name", name)).model.architecture.key == key
def test_pod_shaping_fields_parse():
    doc = yaml.safe_load((ROOT / "examples" / "shaped-pods.yaml").read_text())
    e = spec_module.parse_spec(doc["spec"]).engine
    assert e.shm_size == "16Gi"
    assert e.model_cache == spec_module.ModelCacheSpec("llama-70b-weights", "/model-cache", False)
    assert e.startup_probe["failureThreshold"] == 240 and e.readiness_probe is None
    assert e.env_from == ({"secretRef": {"name": "hf-token"}},)
    assert e.pod_template["spec"]["runtimeClassName"] == "nvidia"
    assert [m["name"] for m in e.volume_mounts] == ["chat-templates"]
    # the defaults: no shaping, an empty template
    bare = spec_module.parse_spec(BASE).engine
    assert bare.pod_template == {"metadata": {}, "spec": {}} and bare.shm_size is None and bare.model_cache is None


def test_pod_shaping_errors_name_the_offending_key():
    with pytest.raises(InputError) as exc:
        spec_module.parse_spec(edit({"engine.podTemplate": {"metadata": {"labels": {
            "app.kubernetes.io/managed-by": "me"}}}}))
    assert "sets app.kubernetes.io/managed-by, a label that kneecap manages" in str(exc.value)
    with pytest.raises(InputError) as exc:
        spec_module.parse_spec(edit({"engine.volumeMounts": [{"name": "weights", "mountPath": "/w"}]}))
    assert "every spec.engine.volumeMounts[].name must name a volume of spec.engine.podTemplate.spec.volumes" in str(exc.value)
    with pytest.raises(InputError) as exc:
        spec_module.parse_spec(edit({"engine.podTemplate": {"spec": {"volumes": [{"name": "dshm", "emptyDir": {}}]}}}))
    assert "volume name dshm is reserved by kneecap" in str(exc.value)


# [flag, the shortest abbreviation vLLM 0.32's argparse takes unambiguously]
MANAGED_FLAG_ABBREVIATIONS = [("max-num-seqs", "max-num-se"), ("gpu-memory-utilization", "gpu-"),
                              ("device-memory-utilization", "device-m"), ("kv-cache-memory-bytes", "kv-cache-mem"),
                              ("port", "por"), ("host", "ho"), ("kv-transfer-config", "kv-t")]
# the second rule (the first is near kube-apiserver's cost budget): the TP flag, its alias -tp, -t
TP_FLAG, TP_SHORT = ("tensor-parallel-size", "te"), ("tp", "t")


def test_managed_flag_regex_is_the_flag_table():
    """The CRD's argv rule is one regex (its cost fits kube-apiserver's budget): each flag's
    shortest abbreviation, then its other letters as nested optionals, '-' as '-' or '_'."""
    def letter(c: str) -> str:
        return "[-_]" if c == "-" else re.escape(c)

    def prefixes(flag: str, shortest: str) -> str:
        tail = ""
        for c in reversed(flag[len(shortest):]):
            tail = f"({letter(c)}{tail})?"
        return "".join(letter(c) for c in shortest) + tail

    want = "^--(" + "|".join(prefixes(f, s) for f, s in MANAGED_FLAG_ABBREVIATIONS) + ")([=.]|$)"
    items = spec_module.spec_schema()["properties"]["engine"]["properties"]["extraArgs"]["items"]
    assert items["x-kubernetes-validations"][0]["rule"] == f"!self.matches('{want}')"
    for flag, shortest in MANAGED_FLAG_ABBREVIATIONS:
        for name in (flag, shortest, flag.replace("-", "_")):
            assert re.match(want, f"--{name}=1") and re.match(want, f"--{name}"), name
        assert not re.match(want, f"--{shortest[:-1]}=1") and not re.match(want, f"--{flag}x")
    tp = f"^(--{prefixes(*TP_FLAG)}|-{prefixes(*TP_SHORT)})([=.]|$)"
    assert items["x-kubernetes-validations"][1]["rule"] == f"!self.matches('{tp}')"
    for name in ("--tensor-parallel-size", "--tensor_parallel_size", "--te", "--tensor-p", "-tp", "-t"):
        assert re.match(tp, name) and re.match(tp, f"{name}=2"), name
    for name in ("--t", "--tensorizer", "-tpx", "--tp", "-pp"):
        assert not re.match(tp, name), name


@pytest.mark.parametrize(("path", "value", "field"), [
    ("engine.gpuMemoryUtilization", float("nan"), "spec.engine.gpuMemoryUtilization"),
    ("slo.ttftSeconds", float("inf"), "spec.slo.ttftSeconds"),
    ("accelerator.costPerHour", float("-inf"), "spec.accelerator.costPerHour"),
    ("budget", {"maxCostPerHour": float("nan")}, "spec.budget.maxCostPerHour"),
])
def test_nan_and_infinities_are_refused_wherever_a_number_is_read(path, value, field):
    with pytest.raises(InputError) as exc:
        spec_module.parse_spec(with_(path, value))
    assert exc.value.field == field and "expected a finite number" in str(exc.value)


def test_tensor_parallel_size_and_gpus_per_replica_follow_each_other():
    """spec.engine.tensorParallelSize and spec.accelerator.count (GPUs per replica): either one
    sets both; neither is TP 1 on one GPU; count alone keeps its meaning from before the TP field."""
    tp = spec_module.parse_spec(edit({"engine.tensorParallelSize": 2}))
    assert (tp.tensor_parallel_size, tp.gpus_per_replica, tp.accelerator.count) == (2, 2, None)
    count = spec_module.parse_spec(edit({"accelerator.count": 4}))
    assert (count.tensor_parallel_size, count.gpus_per_replica) == (4, 4)
    bare = spec_module.parse_spec(BASE)
    assert (bare.tensor_parallel_size, bare.gpus_per_replica, bare.accelerator.resource_name) == (1, 1, "nvidia.com/gpu")
    amd = spec_module.parse_spec(edit({"accelerator.type": "mi300x", "engine.tensorParallelSize": 8}))
    assert (amd.accelerator.resource_name, amd.gpus_per_replica) == ("amd.com/gpu", 8)
    with pytest.raises(InputError) as exc:
        spec_module.parse_spec(edit({"engine.tensorParallelSize": 2, "accelerator.count": 4}))
    assert exc.value.field == "spec.engine.tensorParallelSize"
    assert "spec.engine.tensorParallelSize and spec.accelerator.count (GPUs per replica) must be equal" in str(exc.value)


@pytest.mark.parametrize("kind", ["limits", "requests"])
def test_a_gpu_resource_other_than_the_replicas_gpus_is_refused_naming_it(kind):
    with pytest.raises(InputError) as exc:
        spec_module.parse_spec(edit({"engine.tensorParallelSize": 2,
                                     "engine.resources": {kind: {"nvidia.com/gpu": 1}}}))
    assert exc.value.field == f"spec.engine.resources.{kind}[nvidia.com/gpu]"
    assert "1 differs from the 2 GPU(s) per replica that spec.accelerator.count / spec.engine.tensorParallelSize" in str(exc.value)
    same = spec_module.parse_spec(edit({"engine.tensorParallelSize": 2,
                                        "engine.resources": {kind: {"nvidia.com/gpu": "2"}}}))
    assert same.gpus_per_replica == 2
    # without either field the pod's GPU limit stands, at TP 1, as before spec.engine.tensorParallelSize
    legacy = spec_module.parse_spec(edit({"engine.resources": {kind: {"nvidia.com/gpu": 4}}}))
    assert (legacy.gpus_per_replica, legacy.tensor_parallel_size) == (4, 1)
    with pytest.raises(InputError) as exc:
        spec_module.parse_spec(edit({"engine.resources": {kind: {"nvidia.com/gpu": "500m"}}}))
    assert exc.value.field == f"spec.engine.resources.{kind}[nvidia.com/gpu]" and "whole number of GPUs" in str(exc.value)
