"""vLLM argv in three shapes, and the pure Deployment/Service builders."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from kneecap.control import manifests, vllm_args
from kneecap.control.spec import parse_spec, spec_schema

ROOT = Path(__file__).resolve().parents[2]

OWNER = {"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment",
         "metadata": {"name": "llama", "namespace": "serving", "uid": "u-123"}}
BASE = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "accelerator": {"type": "h100-80gb"},
        "engine": {"image": "vllm/vllm-openai:v0.11.0", "extraArgs": ["--max-model-len=8192"],
                   "podAnnotations": {"prometheus.io/scrape": "true"}}}
DISAGG = {**BASE, "topology": {"mode": "disaggregated", "prefill": {"min": 2, "max": 4},
                               "decode": {"min": 1, "max": 8}, "kvTransfer": {"connector": "NixlConnector"}}}


@pytest.mark.parametrize("argv,value", [
    (["m", "--max-num-seqs", "8"], "8"),
    (["m", "--max-num-seqs=8"], "8"),
    (["m", "--max_num_seqs", "8"], "8"),
    (["m", "--max_num_seqs=8", "--enforce-eager"], "8"),
    (["m", "--max-num-seqs=4", "--max_num_seqs", "16"], "16"),  # last wins, as argparse
    (["m", "--enforce-eager"], None),
])
def test_get_flag_spellings(argv, value):
    assert vllm_args.get_flag(argv, "--max-num-seqs") == value
    assert vllm_args.get_flag(argv, "max_num_seqs") == value


def test_set_flag_canonical_in_place():
    argv = ["m", "--max_num_seqs", "8", "--enforce-eager", "--max-num-seqs=4", "--port=8000"]
    out = vllm_args.set_flag(argv, "--max-num-seqs", 32)
    assert out == ["m", "--max-num-seqs=32", "--enforce-eager", "--port=8000"]
    assert vllm_args.set_flag(["m"], "--gpu-memory-utilization", 0.5) == ["m", "--gpu-memory-utilization=0.5"]
    assert vllm_args.remove_flag(out, "max-num-seqs") == ["m", "--enforce-eager", "--port=8000"]


SHAPES = [
    ("args", {"command": ["vllm", "serve"], "args": ["m", "--max-num-seqs", "8"]}),
    ("command", {"command": ["vllm", "serve", "m", "--max_num_seqs=8"]}),
    ("shell", {"command": ["sh", "-c", "vllm serve m --max-num-seqs 8 --enforce-eager"]}),
    ("shell", {"command": ["/bin/bash", "-c"], "args": ["vllm serve m --max_num_seqs=8"]}),
    ("shell", {"command": ["sh"], "args": ["-c", "vllm serve m --max-num-seqs 8"]}),
]


@pytest.mark.parametrize("shape,container", SHAPES)
def test_three_shapes_read_and_write(shape, container):
    assert vllm_args.read_argv(container).shape == shape
    assert vllm_args.container_flag(container, "--max-num-seqs") == "8"
    out = vllm_args.set_container_flag(container, "--max-num-seqs", 64)
    assert vllm_args.read_argv(out).shape == shape
    assert vllm_args.container_flag(out, "--max-num-seqs") == "64"
    argv = vllm_args.read_argv(out).argv
    assert "--max-num-seqs=64" in argv and "8" not in argv
    assert argv[:3] == ["vllm", "serve", "m"]
    assert container["command"][0] == out["command"][0]  # input untouched, shape kept
    assert vllm_args.container_flag(container, "--max-num-seqs") == "8"


def test_shell_write_is_one_string():
    c = {"command": ["sh", "-c", "vllm serve m --max-num-seqs 8 --kv-transfer-config '{\"a\": 1}'"]}
    out = vllm_args.set_container_flag(c, "--max-num-seqs", 2)
    assert len(out["command"]) == 3
    assert vllm_args.container_flag(out, "--kv-transfer-config") == '{"a": 1}'


def test_colocated_objects():
    spec = parse_spec(BASE)
    (pool,) = manifests.pools("llama", spec)
    assert pool == manifests.Pool("server", "llama")
    d = manifests.deployment(OWNER, spec, pool, manifests.initial_settings(spec, "server"))
    assert d["metadata"]["name"] == "llama" and d["metadata"]["namespace"] == "serving"
    assert d["metadata"]["ownerReferences"] == [{"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment",
                                                 "name": "llama", "uid": "u-123", "controller": True,
                                                 "blockOwnerDeletion": True}]
    lab = d["metadata"]["labels"]
    assert lab == {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": "llama",
                   "app.kubernetes.io/component": "server", "app.kubernetes.io/managed-by": "kneecap",
                   "kneecap.io/role": "server"}
    assert d["spec"]["replicas"] == 1
    tmpl = d["spec"]["template"]
    assert set(d["spec"]["selector"]["matchLabels"].items()) <= set(tmpl["metadata"]["labels"].items())
    assert tmpl["metadata"]["annotations"] == {"prometheus.io/scrape": "true"}
    c = tmpl["spec"]["containers"][0]
    assert c["command"] == ["vllm", "serve"]
    assert c["args"] == ["meta-llama/Llama-3.1-8B-Instruct", "--port=8000", "--max-num-seqs=256",
                         "--gpu-memory-utilization=0.9", "--max-model-len=8192"]
    s = manifests.service(OWNER, spec, pool)
    assert s["spec"]["selector"] == d["spec"]["selector"]["matchLabels"]
    assert s["spec"]["ports"][0]["port"] == 8000
    assert s["metadata"]["ownerReferences"][0]["uid"] == "u-123"


def test_disaggregated_objects_and_kv_transfer():
    spec = parse_spec(DISAGG)
    ps = manifests.pools("llama", spec)
    assert [p.name for p in ps] == ["llama-prefill", "llama-decode"]
    by_role = {}
    for p in ps:
        d = manifests.deployment(OWNER, spec, p, manifests.initial_settings(spec, p.role))
        by_role[p.role] = d
        assert d["metadata"]["labels"]["kneecap.io/role"] == p.role
        assert d["metadata"]["labels"]["app.kubernetes.io/component"] == p.role
    assert by_role["prefill"]["spec"]["replicas"] == 2
    assert by_role["decode"]["spec"]["replicas"] == 1
    for role, kv_role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
        c = manifests.vllm_container(by_role[role])
        cfg = json.loads(vllm_args.container_flag(c, "--kv-transfer-config"))
        assert cfg == {"kv_connector": "NixlConnector", "kv_role": kv_role}
    assert manifests.kv_transfer_config(parse_spec(BASE), "server") is None


def test_live_settings_roundtrip_through_any_shape():
    spec = parse_spec(BASE)
    d = manifests.deployment(OWNER, spec, manifests.Pool("server", "llama"),
                             manifests.EngineSettings(64, 0.5, replicas=3))
    live = manifests.live_settings(d, manifests.initial_settings(spec, "server"))
    assert live == manifests.EngineSettings(64, 0.5, None, 3)
    # a person rewrote the container as one shell string with underscore flags
    d["spec"]["template"]["spec"]["containers"][0] = {
        "name": "vllm", "image": "x", "command": ["sh", "-c", "vllm serve m --max_num_seqs 12 --gpu_memory_utilization 0.7"]}
    assert (manifests.live_settings(d, manifests.initial_settings(spec, "server"))
            == manifests.EngineSettings(12, 0.7, None, 3))
    patch = manifests.with_settings(d, manifests.EngineSettings(24, 0.35, replicas=2))
    c = patch["spec"]["template"]["spec"]["containers"][0]
    assert vllm_args.read_argv(c).shape == "shell"
    assert vllm_args.read_argv(c).argv == ["vllm", "serve", "m", "--max-num-seqs=24", "--gpu-memory-utilization=0.35"]
    assert patch["spec"]["replicas"] == 2
    assert "replicas" not in manifests.with_settings(d, manifests.EngineSettings(24, 0.35), set_replicas=False)["spec"]


def test_kv_cache_bytes_knob_and_tensor_parallel():
    spec = parse_spec({**BASE, "accelerator": {"type": "h100-80gb", "count": 2}})  # count alone: TP 2, as before
    c = manifests.container(spec, "server", manifests.EngineSettings(8, 0.9, kv_cache_memory_bytes=2 * 1024**3))
    assert "--kv-cache-memory-bytes=2147483648" in c["args"]
    assert "--tensor-parallel-size=2" in c["args"]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": "2"}}


def test_a_tp2_70b_example_renders_the_flag_and_requests_two_gpus():
    """examples/llama-70b-tp2.yaml: spec.engine.tensorParallelSize 2 is the argv's only TP flag
    and each pool's pod requests nvidia.com/gpu: 2 (the apiserver copies the limit to requests)."""
    doc = yaml.safe_load((ROOT / "examples" / "llama-70b-tp2.yaml").read_text())
    spec = parse_spec(doc["spec"])
    assert (spec.tensor_parallel_size, spec.gpus_per_replica, spec.model.architecture.key) == (2, 2, "llama-3.3-70b")
    (pool,) = manifests.pools("llama-70b-tp2", spec)
    d = manifests.deployment(OWNER, spec, pool, manifests.initial_settings(spec, pool.role))
    (c,) = d["spec"]["template"]["spec"]["containers"]
    assert [a for a in c["args"] if "tensor" in a or a.startswith("-tp")] == ["--tensor-parallel-size=2"]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": "2"}}
    kubernetes_validate.validate(d, "1.32", strict=True)
    # the user's other resources stay; the GPU limit is the replica's, on AMD as amd.com/gpu
    amd = parse_spec({**BASE, "accelerator": {"type": "mi300x"}, "engine": {
        **BASE["engine"], "tensorParallelSize": 4, "resources": {"requests": {"cpu": "8", "amd.com/gpu": 4}}}})
    c = manifests.container(amd, "server", manifests.initial_settings(amd, "server"))
    assert c["resources"] == {"requests": {"cpu": "8", "amd.com/gpu": "4"}, "limits": {"amd.com/gpu": "4"}}
    assert "--tensor-parallel-size=4" in c["args"]


def test_one_gpu_writes_no_tp_flag_and_requests_one_gpu():
    c = manifests.container(parse_spec(BASE), "server", manifests.initial_settings(parse_spec(BASE), "server"))
    assert not any("tensor" in a for a in c["args"]) and c["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    twin = yaml.safe_load((ROOT / "examples" / "twin.yaml").read_text())["spec"]
    spec = parse_spec(twin)  # resourceName "": a CPU-only engine requests no GPU
    c = manifests.container(spec, "server", manifests.initial_settings(spec, "server"))
    assert c["resources"] == twin["engine"]["resources"] and spec.gpus_per_replica == 1


@pytest.mark.parametrize("argv,value", [(["m", "-tp", "4"], "4"), (["m", "-tp=2"], "2"),
                                        (["m", "--tensor_parallel_size", "8"], "8"), (["m", "-tpx", "2"], None)])
def test_the_short_tp_alias_is_read_and_removed(argv, value):
    assert vllm_args.get_flag(argv, manifests.TENSOR_PARALLEL_SIZE) == value
    if value is not None:
        assert vllm_args.remove_flag(argv, manifests.TENSOR_PARALLEL_SIZE) == ["m"]
        assert vllm_args.set_flag(argv, manifests.TENSOR_PARALLEL_SIZE, 2) == ["m", "--tensor-parallel-size=2"]


@pytest.mark.parametrize("raw", [BASE, DISAGG], ids=["colocated", "disaggregated"])
def test_rendered_objects_validate_against_the_kubernetes_schema(raw):
    spec = parse_spec(raw)
    for pool in manifests.pools("llama", spec):
        for obj in (manifests.deployment(OWNER, spec, pool, manifests.initial_settings(spec, pool.role)),
                    manifests.service(OWNER, spec, pool)):
            kubernetes_validate.validate(obj, "1.32", strict=True)
    bad = manifests.deployment(OWNER, spec, manifests.pools("llama", spec)[0],
                               manifests.initial_settings(spec, "server"))
    bad["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.32", strict=True)


SHAPED = yaml.safe_load((ROOT / "examples" / "shaped-pods.yaml").read_text())


def test_the_shaped_example_uses_every_pod_shaping_field():
    engine = spec_schema()["properties"]["engine"]["properties"]
    pod_fields = set(engine["podTemplate"]["properties"]["spec"]["properties"])
    used = SHAPED["spec"]["engine"]
    assert set(used["podTemplate"]["spec"]) == pod_fields
    assert set(used["podTemplate"]["metadata"]) == {"labels", "annotations"}
    container_fields = {"env", "envFrom", "resources", "volumeMounts", "startupProbe", "livenessProbe", "shmSize",
                        "modelCache"}
    assert container_fields <= set(used) and container_fields <= set(engine)


def test_pod_template_is_merged_around_the_managed_container():
    spec = parse_spec(SHAPED["spec"])
    (pool,) = manifests.pools("llama-70b", spec)
    owner = {**SHAPED, "metadata": {**SHAPED["metadata"], "uid": "u-1"}}
    d = manifests.deployment(owner, spec, pool, manifests.initial_settings(spec, pool.role))
    kubernetes_validate.validate(d, "1.37.0", strict=True)
    tmpl, user = d["spec"]["template"], SHAPED["spec"]["engine"]["podTemplate"]
    pod = tmpl["spec"]
    for key in ("tolerations", "nodeSelector", "affinity", "imagePullSecrets", "serviceAccountName",
                "runtimeClassName", "priorityClassName"):
        assert pod[key] == user["spec"][key], key
    assert pod["automountServiceAccountToken"] is False  # a service account does not bring its token
    assert tmpl["metadata"]["labels"] == {**user["metadata"]["labels"], **manifests.labels("llama-70b", "server")}
    assert tmpl["metadata"]["annotations"] == {**user["metadata"]["annotations"], "prometheus.io/scrape": "true"}
    assert [v["name"] for v in pod["volumes"]] == ["home", "dshm", "model-cache", "chat-templates"]
    assert pod["volumes"][1] == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}
    assert pod["volumes"][2] == {"name": "model-cache", "persistentVolumeClaim": {"claimName": "llama-70b-weights"}}
    (c,) = pod["containers"]
    assert [(m["name"], m["mountPath"]) for m in c["volumeMounts"]] == [
        ("home", manifests.HOME), ("dshm", "/dev/shm"), ("model-cache", "/model-cache"),
        ("chat-templates", "/etc/vllm/templates")]
    assert {"name": "HF_HOME", "value": "/model-cache"} in c["env"]  # the weights land on the PVC
    assert c["envFrom"] == [{"secretRef": {"name": "hf-token"}}]
    assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] == 3600
    assert c["livenessProbe"] == SHAPED["spec"]["engine"]["livenessProbe"]
    assert c["readinessProbe"] == {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 5}


def test_default_probes_allow_a_30_minute_model_load():
    c = manifests.container(parse_spec(BASE), "server", manifests.EngineSettings(8, 0.9))
    startup, liveness = c["startupProbe"], c["livenessProbe"]
    assert startup["httpGet"] == liveness["httpGet"] == {"path": "/health", "port": 8000}
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 30 * 60
    # liveness only counts after the startup probe succeeded; then a minute without /health restarts
    assert liveness["periodSeconds"] * liveness["failureThreshold"] == 60 and liveness["timeoutSeconds"] == 5
    assert "HF_HOME" not in {e["name"] for e in c["env"]} and [m["name"] for m in c["volumeMounts"]] == ["home"]


def test_a_template_that_skipped_validation_still_cannot_take_the_pool_labels():
    """Defence in depth (as for extraArgs): a spec parsed elsewhere cannot move the pods out of the
    pool's selector or claim another manager."""
    spec = parse_spec(BASE)
    hostile = {"metadata": {"labels": {manifests.ROLE_LABEL: "decode", manifests.MANAGER_LABEL: "helm", "team": "a"}},
               "spec": {}}
    spec = dataclasses.replace(spec, engine=dataclasses.replace(spec.engine, pod_template=hostile))
    d = manifests.deployment(OWNER, spec, manifests.Pool("server", "llama"), manifests.initial_settings(spec, "server"))
    labels = d["spec"]["template"]["metadata"]["labels"]
    assert labels == {**manifests.labels("llama", "server"), "team": "a"}
    assert set(d["spec"]["selector"]["matchLabels"].items()) <= set(labels.items())


def test_the_api_servers_service_account_mirror_is_not_a_removed_field():
    """kube-apiserver copies serviceAccountName into the deprecated serviceAccount: while the spec
    still names the account that mirror is not a field to remove (a patch every tick), and it
    goes with serviceAccountName when the spec drops it."""
    raw = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "shaped-pods.yaml").read_text())
    owner = {"metadata": {"name": "llama-70b", "namespace": "serving", "uid": "u1"}, **raw}
    spec = parse_spec(raw["spec"])
    (pool,) = manifests.pools("llama-70b", spec)
    desired = manifests.deployment(owner, spec, pool, manifests.initial_settings(spec, pool.role))
    live = json.loads(json.dumps(desired))
    live["spec"]["template"]["spec"]["serviceAccount"] = "vllm"  # as the API server stores it
    assert manifests.removed_template_fields(desired, live) == {}
    raw["spec"]["engine"]["podTemplate"]["spec"].pop("serviceAccountName")
    spec = parse_spec(raw["spec"])
    dropped = manifests.deployment(owner, spec, pool, manifests.initial_settings(spec, pool.role))
    assert manifests.removed_template_fields(dropped, live) == {"serviceAccountName": None, "serviceAccount": None}
