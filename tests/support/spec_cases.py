"""Spec cases judged alike by kube-apiserver (tests/kube/test_spec_cases.py) and by the
operator's parser (tests/unit/test_control_spec.py): the field each malformed spec is refused on."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

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


def _many(n):
    return [f"--opt-{i}" for i in range(n)]


# an inline model outside the catalog, a MoE and an inline accelerator (spec.model.shape, spec.accelerator.shape)
SHAPE = {"hiddenSize": 5120, "numLayers": 48, "numAttentionHeads": 40, "numKeyValueHeads": 8,
         "intermediateSize": 13824, "vocabSize": 100352}
MOE = {"hiddenSize": 4096, "numLayers": 32, "numAttentionHeads": 32, "numKeyValueHeads": 8,
       "intermediateSize": 14336, "vocabSize": 32000, "numExperts": 8, "numExpertsPerToken": 2}
GPU_SHAPE = {"name": "tpu-ish", "memoryGiB": 94.0, "bandwidthGBps": 3900, "peakDenseTFLOPS": 835}

# (spec edits, the field both the API server and parse_spec name)
MALFORMED = [
    ({"model.architecture": "llama-3.1-8b", "model.shape": SHAPE}, "spec.model"),
    ({"model.shape": SHAPE, "model.configMapRef": {"name": "cfg"}}, "spec.model"),
    ({"model.shape": {**SHAPE, "numKeyValueHeads": 7}}, "spec.model.shape.numKeyValueHeads"),
    ({"model.shape": {**SHAPE, "numExperts": 8}}, "spec.model.shape.numExpertsPerToken"),
    ({"model.shape": {**MOE, "numExpertsPerToken": 9}}, "spec.model.shape.numExpertsPerToken"),
    ({"model.shape": {**SHAPE, "numExpertsPerToken": 2}}, "spec.model.shape.numExperts"),
    ({"model.shape": {**MOE, "numDenseLayers": 32}}, "spec.model.shape.numDenseLayers"),
    ({"model.shape": {**SHAPE, "hiddenSize": 16}}, "spec.model.shape.headDim"),
    ({"model.shape": {**SHAPE, "hiddenSize": 0}}, "spec.model.shape.hiddenSize"),
    ({"model.shape": {k: v for k, v in SHAPE.items() if k != "vocabSize"}}, "spec.model.shape.vocabSize"),
    ({"model.shape": {**SHAPE, "dtypeBytes": 3}}, "spec.model.shape.dtypeBytes"),
    ({"model.configMapRef": {"name": "Not_A_Name"}}, "spec.model.configMapRef.name"),
    ({"accelerator": {}}, "spec.accelerator"),
    ({"accelerator.shape": GPU_SHAPE}, "spec.accelerator"),  # and type: both
    ({"accelerator": {"shape": {**GPU_SHAPE, "memoryGiB": 0}}}, "spec.accelerator.shape.memoryGiB"),
    ({"accelerator": {"shape": {"memoryGiB": 80, "bandwidthGBps": 2000}}}, "spec.accelerator.shape.peakDenseTFLOPS"),
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
    # tensor parallelism is spec.engine.tensorParallelSize: every spelling vLLM 0.32's argparse takes
    ({"engine.extraArgs": ["--max-model-len=8192", "--tensor-parallel-size", "2"]}, "spec.engine.extraArgs[1]"),
    ({"engine.extraArgs": ["--tensor-parallel-size=2"]}, "spec.engine.extraArgs[0]"),
    ({"engine.extraArgs": ["--tensor_parallel_size", "2"]}, "spec.engine.extraArgs[0]"),
    ({"engine.extraArgs": ["--te", "2"]}, "spec.engine.extraArgs[0]"),  # argparse abbreviation
    ({"engine.extraArgs": ["-tp", "2"]}, "spec.engine.extraArgs[0]"),  # vLLM's short alias
    ({"engine.extraArgs": ["-tp=2"]}, "spec.engine.extraArgs[0]"),
    ({"engine.extraArgs": ["-t", "2"]}, "spec.engine.extraArgs[0]"),  # argparse abbreviation of -tp
    ({"engine.command": ["vllm", "serve", "-tp", "4"]}, "spec.engine.command[2]"),
    ({"engine.tensorParallelSize": 2, "accelerator.count": 4}, "spec.engine.tensorParallelSize"),  # GPUs per replica
    ({"engine.tensorParallelSize": 0}, "spec.engine.tensorParallelSize"),
    ({"engine.tensorParallelSize": 65}, "spec.engine.tensorParallelSize"),
    ({"engine.tensorParallelSize": "2"}, "spec.engine.tensorParallelSize"),
    ({"accelerator.resourceName": "nvidia.com/gpu!"}, "spec.accelerator.resourceName"),
    ({"engine.extraArgs": _many(65)}, "spec.engine.extraArgs"),
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
    ({"targetRef": {"name": "vllm-llama"}}, "spec.targetRef"),  # engine and targetRef: exactly one
    ({"rollout": {"maxSurge": 0, "maxUnavailable": "0%"}}, "spec.rollout.maxUnavailable"),  # no pod could move
    ({"rollout": {"maxSurge": "a lot"}}, "spec.rollout.maxSurge"),
    ({"rollout": {"maxUnavailable": -1}}, "spec.rollout.maxUnavailable"),
    ({"placement": {"mechanism": "time-slicing"}}, "spec.placement.resourceName"),  # which resource to request
    ({"placement": {"mechanism": "mps", "resourceName": ""}}, "spec.placement.resourceName"),
    ({"placement": {"mechanism": "hami"}}, "spec.placement.mechanism"),
    ({"placement": {"mechanism": "dra"}}, "spec.placement.resourceClaimName"),  # which claim to share
    ({"placement": {"mechanism": "dra", "resourceClaimName": "Shared_GPU"}}, "spec.placement.resourceClaimName"),
    ({"placement": {"mechanism": "mps", "resourceName": "nvidia.com/gpu.shared", "replicasPerGpu": 1}},
     "spec.placement.replicasPerGpu"),
    ({"placement": {"workload": {"requestsPerSecond": 0, "inputLengthMean": 10, "outputLengthMean": 10}}},
     "spec.placement.workload.requestsPerSecond"),
    ({"placement": {"workload": {"requestsPerSecond": 1, "inputLengthMean": 10}}},
     "spec.placement.workload.outputLengthMean"),
    ({"control.allowDowntime": "yes"}, "spec.control.allowDowntime"),
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
    ({"engine.resources": {"limits": {"nvidia.com/gpu": "one"}}}, "spec.engine.resources.limits[nvidia.com/gpu]"),
    # a metrics URL must name the pod's own IP: no spec knows it (the operator would ignore it)
    ({"engine.podAnnotations": {"kneecap.io/metrics-url": "http://10.0.0.9:9000/metrics"}}, "spec.engine.podAnnotations"),
    ({"engine.podTemplate": {"metadata": {"annotations": {"kneecap.io/metrics-url": "http://metadata/x"}}}},
     "spec.engine.podTemplate.metadata.annotations"),
    ({"engine.resources": {"requests": {"memory": "16 gigs"}}}, "spec.engine.resources.requests[memory]"),
    ({"engine.shmSize": "lots"}, "spec.engine.shmSize"),
    ({"engine.modelCache": {"mountPath": "/cache"}}, "spec.engine.modelCache.claimName"),
    ({"engine.modelCache": {"claimName": "w", "mountPath": "cache"}}, "spec.engine.modelCache.mountPath"),
]
WELL_FORMED = [
    {"engine.extraArgs": ["--max-model-len", "4096", "--enable-prefix-caching", "-pp", "2", "-tpx", "--tensorizer", "--"]},
    {"engine.tensorParallelSize": 2, "accelerator.count": 2},
    {"engine.tensorParallelSize": 8, "accelerator.resourceName": "gpu.example.com/h100"},
    {"accelerator.resourceName": "", "engine.extraArgs": ["--arch=llama-3.1-8b"]},  # a CPU-only engine (the twin)
    {"engine.extraArgs": ["--hf-token=x", "--port-range-is-not-a-flag", "--served-model-name", "m"]},
    {"engine.extraArgs": ["--gpu=h100-80gb", "--max-num-batched-tokens=8192", "--kv-cache-dtype=fp8", "--h", "--p"]},
    {"engine.extraArgs": _many(64)},
    {"engine.command": ["python", "-m", "vllm.entrypoints.openai.api_server"]},
    {"control.minObservations": 24, "control.maxObservationAge": "90s"},
    {"model.name": "/models/llama-3.1-8b"},
    {"model.name": "acme/house-model-20b", "model.shape": SHAPE},
    {"model.name": "acme/house-moe", "model.shape": MOE, "accelerator": {"shape": GPU_SHAPE, "costPerHour": 2.5}},
    {"model.architecture": "qwen3-30b-a3b", "accelerator.type": "mi300x"},
    {"model.architecture": "Qwen/Qwen3-235B-A22B", "accelerator": {"type": "b200", "count": 8}},
    {"rollout": {"maxSurge": "25%", "maxUnavailable": 0}, "control.allowDowntime": True},
    {"placement": {"mechanism": "time-slicing", "resourceName": "nvidia.com/gpu.shared", "replicasPerGpu": 4,
                   "workload": {"requestsPerSecond": 0.5, "inputLengthMean": 512, "outputLengthMean": 128}}},
    {"placement": {"mechanism": "none"}},
    {"placement": {"mechanism": "dra", "resourceClaimName": "shared-gpu-0"}},
    {"engine": yaml.safe_load((ROOT / "examples" / "shaped-pods.yaml").read_text())["spec"]["engine"]},
    {"engine.podTemplate": {"metadata": {"labels": {"app.kubernetes.io/part-of": "chat"}}},
     "engine.resources": {"limits": {"nvidia.com/gpu": 1, "memory": "64Gi"}}, "engine.shmSize": 1073741824},
]


def edit(edits: dict) -> dict:
    raw = copy.deepcopy(BASE)
    for path, value in edits.items():
        raw = with_(path, value, raw)
    return raw


# spec.targetRef: existing Deployments instead of spec.engine (spec, the field rejected or None)
TARGET_BASE = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "accelerator": {"type": "h100-80gb"}}
PD = {"mode": "disaggregated", "kvTransfer": {}}
TARGET_SPECS = [
    ({"targetRef": {"name": "vllm-llama"}}, None),
    ({"targetRef": {"name": "vllm-llama", "container": "server", "kind": "Deployment", "apiVersion": "apps/v1"},
      "control": {"mode": "enforce"}, "batching": {"maxMaxNumSeqs": 4}}, None),  # no engine.maxNumSeqs to bound
    ({"targetRef": {"prefill": {"name": "llama-prefill"}, "decode": {"name": "llama-decode"}}, "topology": PD}, None),
    ({}, "spec.targetRef"),  # neither engine nor targetRef
    ({"targetRef": {"prefill": {"name": "p"}, "decode": {"name": "d"}}}, "spec.targetRef"),  # colocated takes name
    ({"targetRef": {"name": "vllm-llama"}, "topology": PD}, "spec.targetRef"),  # disaggregated takes prefill, decode
    ({"targetRef": {"name": "a", "decode": {"name": "d"}}}, "spec.targetRef"),
    ({"targetRef": {"prefill": {"name": "p"}, "decode": {"name": "p"}}, "topology": PD},
     "spec.targetRef.decode.name"),
    ({"targetRef": {"prefill": {"container": "vllm"}, "decode": {"name": "d"}}, "topology": PD},
     "spec.targetRef.prefill.name"),
    ({"targetRef": {"name": "Not_A_Name"}}, "spec.targetRef.name"),
    ({"targetRef": {"name": "a", "kind": "StatefulSet"}}, "spec.targetRef.kind"),
    ({"targetRef": {"name": "a", "apiVersion": "apps/v1beta1"}}, "spec.targetRef.apiVersion"),
    ({"targetRef": {"prefill": {"name": "p"}, "decode": {"name": "d"}}, "topology": {"mode": "disaggregated"}},
     "spec.topology.kvTransfer"),  # the KV link's bandwidth is SARA's input, adopted or not
]

# metadata.name: a DNS-1035 label of at most 55 characters (the Service names derived from it fit 63)
NAMES = [("llama", True), ("a" * 55, True), ("a-1", True), ("a" * 56, False), ("Llama", False), ("has.dot", False),
         ("9lives", False), ("end-", False)]
