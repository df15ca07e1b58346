"""LLMDeployment spec: defaults and validation from the CRD schema, parsed into frozen dataclasses.

The CRD (crds/llmdeployment.yaml) is the single source of truth: defaults, types, enums and
bounds are read from its openAPIV3Schema, so the Python side cannot drift from what the API
server enforces. The CRD's CEL rules (x-kubernetes-validations: cross-field bounds, the flags
kneecap manages) are evaluated here too, naming the same field paths, because the operator must
also reject specs that reached it without an API server's validation (old CRD versions).
"""

from __future__ import annotations

import functools
import math
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import yaml

from kneecap.control import validation
from kneecap.control.quantity import canonical_quantity
from kneecap.errors import InputError
from kneecap.model.arch import CATALOG, ModelArch, get_arch, params_from_shape
from kneecap.model.hardware import GPU, get_gpu

GROUP = "kneecap.io"
VERSION = "v1alpha1"
PLURAL = "llmdeployments"
KIND = "LLMDeployment"

# The package carries a byte copy of crds/llmdeployment.yaml (scripts/sync-crd.sh), so an installed
# wheel finds it; KNEECAP_CRD overrides (another CRD revision, a mounted file).
CRD_PATH = Path(os.environ.get("KNEECAP_CRD") or str(resources.files("kneecap") / "crds" / "llmdeployment.yaml"))

_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)$")
_UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


@functools.cache
def load_crd(path: Path = CRD_PATH) -> dict:
    """The parsed CRD document."""
    with open(path) as f:
        return yaml.safe_load(f)


def resource_schema() -> dict:
    """openAPIV3Schema of the served version (the whole object)."""
    (version,) = [v for v in load_crd()["spec"]["versions"] if v["name"] == VERSION]
    return version["schema"]["openAPIV3Schema"]


def spec_schema() -> dict:
    """openAPIV3Schema of `.spec` for the served version."""
    return resource_schema()["properties"]["spec"]


def parse_duration_s(text: str, path: str) -> float:
    """'30s', '5m', '1.5h', '500ms' -> seconds."""
    m = _DURATION.match(str(text))
    if not m:
        raise InputError(path, f"expected a duration like 30s, 5m, 1h, got {text!r}")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


# ---------------------------------------------------------------- schema defaulting + validation

def apply_schema(value: Any, schema: Mapping, path: str) -> Any:
    """Default and validate `value` against a structural schema and its CEL rules, as the API server would.

    Unknown fields are an error here (a typo the API server would have pruned silently).
    Returns a defaulted deep copy; raises InputError naming the first offending field path.
    """
    out, causes, _ = validation.check(value, schema, path, unknown="reject")
    if causes:
        raise InputError(causes[0].field, causes[0].message)
    return out


def metadata_schema() -> dict:
    """openAPIV3Schema of `.metadata` (the CRD restricts `name` only)."""
    return resource_schema()["properties"]["metadata"]


def check_name(name: str) -> None:
    """InputError('metadata.name') unless the derived Service names (`<name>-prefill`...) are valid DNS-1035 labels."""
    apply_schema(name, metadata_schema()["properties"]["name"], "metadata.name")


# ---------------------------------------------------------------- dataclasses

@dataclass(frozen=True)
class PoolBounds:
    min: int
    max: int

    def clamp(self, n: int) -> int:
        return max(self.min, min(self.max, int(n)))


@dataclass(frozen=True)
class KVTransferSpec:
    connector: str
    bandwidth_gib_s: float
    cost_per_gib_s_hour: float


@dataclass(frozen=True)
class ConfigMapRef:
    name: str
    key: str


@dataclass(frozen=True)
class ModelSpec:
    name: str
    architecture: ModelArch  # the catalog entry, the inline shape, or the ConfigMap's config.json
    served_model_name: str | None
    config_map_ref: ConfigMapRef | None = None


# the extended resource of the AMD catalog GPUs' device plugin; every other GPU is NVIDIA's
AMD_GPU_RESOURCE, NVIDIA_GPU_RESOURCE = "amd.com/gpu", "nvidia.com/gpu"
AMD_GPUS = frozenset({"mi300x"})


@dataclass(frozen=True)
class AcceleratorSpec:
    type: str  # the catalog key, or the inline shape's name
    count: int | None  # GPUs per replica as spec.accelerator.count gives it (None: not given)
    cost_per_hour: float  # $/h of one GPU
    gpu: GPU  # the catalog entry or the inline shape
    resource_name: str = NVIDIA_GPU_RESOURCE  # the extended resource a pod requests its GPUs as ("": none)
    gpus: int | None = None  # GPUs per replica resolved (_gpus_per_replica); None: adopted, see LLMDeploymentSpec


@dataclass(frozen=True)
class ModelCacheSpec:
    """A PersistentVolumeClaim mounted as the Hugging Face cache."""

    claim_name: str
    mount_path: str
    read_only: bool


@dataclass(frozen=True)
class EngineSpec:
    image: str
    port: int
    max_num_seqs: int
    gpu_memory_utilization: float
    memory_knob: str  # "gpuMemoryUtilization" | "kvCacheMemoryBytes"
    tensor_parallel_size: int  # spec.engine.tensorParallelSize, else spec.accelerator.count, else 1
    command: tuple[str, ...]
    extra_args: tuple[str, ...]
    env: tuple[dict, ...] = field(default=(), compare=False)
    resources: dict = field(default_factory=dict, compare=False)
    pod_annotations: dict = field(default_factory=dict, compare=False)
    # the managed container's other Kubernetes fields and the pod around it (core/v1 shapes,
    # validated by the CRD's generated schema); probes None take the builder's defaults
    env_from: tuple[dict, ...] = field(default=(), compare=False)
    volume_mounts: tuple[dict, ...] = field(default=(), compare=False)
    startup_probe: dict | None = field(default=None, compare=False)
    liveness_probe: dict | None = field(default=None, compare=False)
    readiness_probe: dict | None = field(default=None, compare=False)
    pod_template: dict = field(default_factory=dict, compare=False)
    shm_size: str | None = None
    model_cache: ModelCacheSpec | None = None


@dataclass(frozen=True)
class TargetRef:
    """One existing Deployment kneecap tunes (spec.targetRef): the pool it is, and its vLLM container."""

    role: str  # "server" | "prefill" | "decode"
    name: str
    container: str | None  # None: the one named vllm, else the first that runs vLLM, else the first


@dataclass(frozen=True)
class TopologySpec:
    mode: str  # "colocated" | "disaggregated"
    replicas_managed_by: str  # "kneecap" | "external"
    replicas: PoolBounds
    prefill: PoolBounds
    decode: PoolBounds
    kv_transfer: KVTransferSpec | None


@dataclass(frozen=True)
class SLOSpec:
    quantile: float
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None


@dataclass(frozen=True)
class BatchingSpec:
    efficiency_floor: float
    min_max_num_seqs: int
    max_max_num_seqs: int
    max_gpu_memory_utilization: float = 0.95


@dataclass(frozen=True)
class ControlSpec:
    mode: str  # "advise" | "enforce"
    interval_s: float
    window_s: float
    cooldown_s: float
    min_improvement: float
    min_observations: int
    max_step_factor: float
    hysteresis: float
    observation_history: int
    max_fit_error: float
    max_observation_age_s: float  # spec.control.maxObservationAge, else 3 x window_s
    allow_downtime: bool = False  # apply a restart that leaves the pool without a Ready pod
    released_memory_value: float = 1.0  # a released memory fraction's worth against a restart (restart.py)
    rate_headroom: float = 1.1  # colocated pools are sized for this multiple of the observed rate (decide.py)
    scale_down_deviations: float = 1.0  # std. deviations of the work a scale-down keeps (replica_stabilisation)


@dataclass(frozen=True)
class RolloutSpec:
    """The RollingUpdate of the Deployments kneecap owns (int or percentage, as Kubernetes takes them)."""

    max_surge: int | str = 0
    max_unavailable: int | str = 1


@dataclass(frozen=True)
class DeclaredWorkload:
    """spec.placement.workload: the load expected, for the fleet advice before a window is observed."""

    requests_per_second: float  # the whole deployment's
    input_length_mean: float  # tokens
    input_length_cv: float
    output_length_mean: float  # tokens
    output_length_cv: float


# spec.placement.mechanism values that share a GPU: an extended resource of the NVIDIA device plugin
# (time-slicing, mps), or a ResourceClaim several pods reference (dra)
SHARED_RESOURCE_MECHANISMS = frozenset({"time-slicing", "mps"})
SHARING_MECHANISMS = SHARED_RESOURCE_MECHANISMS | {"dra"}


@dataclass(frozen=True)
class PlacementSpec:
    """spec.placement: whether kneecap may co-locate this deployment's engines (docs/placement.md)."""

    mechanism: str = "none"  # "none" | "time-slicing" | "mps" | "dra"
    resource_name: str | None = None  # the shared resource (e.g. nvidia.com/gpu.shared) of time-slicing, mps
    resource_claim_name: str | None = None  # dra: the ResourceClaim the sharing pods reference
    replicas_per_gpu: int = 2  # the device plugin's replicas: pods one GPU is advertised to
    workload: DeclaredWorkload | None = None

    @property
    def shares(self) -> bool:
        """A sharing mechanism is named: co-location may be enforced."""
        return self.mechanism in SHARING_MECHANISMS


@dataclass(frozen=True)
class LLMDeploymentSpec:
    model: ModelSpec
    accelerator: AcceleratorSpec
    engine: EngineSpec | None  # None when targetRef is set: kneecap runs no pods of its own
    topology: TopologySpec
    slo: SLOSpec
    batching: BatchingSpec
    max_cost_per_hour: float | None
    control: ControlSpec
    targets: tuple[TargetRef, ...] = ()  # spec.targetRef, one per pool (empty: kneecap owns the pools)
    # the memory flag an adopted Deployment's argv uses (set per tick from the live argv; None: the utilisation)
    target_memory_knob: str | None = None
    # the --tensor-parallel-size an adopted Deployment's argv sets (set per tick from the live argv)
    target_tensor_parallel_size: int | None = None
    rollout: RolloutSpec = field(default_factory=RolloutSpec)
    placement: PlacementSpec = field(default_factory=PlacementSpec)
    # the --gpu-memory-utilization of an engine on a shared GPU, set per tick from status.placement
    # when spec.placement names a mechanism and the fleet advice shares this deployment's GPU
    # (kneecap.control.fleet.effective_spec); None: the engine has whole GPUs
    shared_gpu_share: float | None = None

    @property
    def tensor_parallel_size(self) -> int:
        """GPUs one replica shards the model over: spec.engine's, or what an adopted Deployment's
        argv says (vLLM's default 1 without the flag), else spec.accelerator.count."""
        if self.engine is not None:
            return self.engine.tensor_parallel_size
        return self.target_tensor_parallel_size or self.accelerator.count or 1

    @property
    def gpus_per_replica(self) -> int:
        """GPUs one replica (pod) holds and is costed for: spec.accelerator.count, else (kneecap's
        pods) the GPU limit spec.engine.resources sets, else the TP size."""
        return self.accelerator.gpus or self.accelerator.count or self.tensor_parallel_size

    @property
    def adopted(self) -> bool:
        """kneecap tunes existing Deployments (spec.targetRef) and owns no pods."""
        return bool(self.targets)

    @property
    def memory_knob(self) -> str:
        """The memory flag kneecap moves: spec.engine.memoryKnob, or for an adopted Deployment the
        one its argv sets (--kv-cache-memory-bytes overrides the utilisation in vLLM)."""
        if self.engine is not None:
            return self.engine.memory_knob
        return self.target_memory_knob or "gpuMemoryUtilization"

    @property
    def disaggregated(self) -> bool:
        return self.topology.mode == "disaggregated"

    @property
    def enforce(self) -> bool:
        return self.control.mode == "enforce"


# ---------------------------------------------------------------- parsing

def guess_architecture(model_name: str) -> str | None:
    """Catalog key contained in a model name ('meta-llama/Llama-3.1-8B-Instruct' -> 'llama-3.1-8b')."""
    norm = model_name.lower().rsplit("/", 1)[-1].replace("_", "-")
    hits = [k for k in CATALOG if k in norm]
    return max(hits, key=len) if hits else None


def config_map_ref(raw: Mapping | None) -> ConfigMapRef | None:
    """`spec.model.configMapRef` of a raw spec, read before parsing: the caller fetches that
    ConfigMap and hands it to :func:`parse_spec` (parsing itself does no I/O)."""
    ref = ((raw or {}).get("model") or {}).get("configMapRef") if isinstance(raw, Mapping) else None
    if not isinstance(ref, Mapping) or not isinstance(ref.get("name"), str):
        return None
    key = ref.get("key")
    return ConfigMapRef(ref["name"], key if isinstance(key, str) and key else "config.json")


def _shape_arch(name: str, shape: Mapping) -> ModelArch:
    """`spec.model.shape` (validated and defaulted by the schema) as a ModelArch; the parameter
    count from the shape unless `parameterCount` gives the published one."""
    path = "spec.model.shape"
    hidden, layers, heads = shape["hiddenSize"], shape["numLayers"], shape["numAttentionHeads"]
    kv_heads = shape.get("numKeyValueHeads", heads)
    head_dim = shape.get("headDim") or hidden // heads
    if head_dim < 1:
        raise InputError(f"{path}.headDim", f"required when hiddenSize ({hidden}) < numAttentionHeads ({heads})")
    experts = shape["numExperts"]
    moe_ffn = shape.get("moeIntermediateSize", shape["intermediateSize"]) if experts else 0
    params = shape.get("parameterCount") or params_from_shape(
        layers, hidden, kv_heads * head_dim, shape["intermediateSize"], shape["gatedMLP"], shape["vocabSize"],
        shape["tieWordEmbeddings"], q_dim=heads * head_dim, num_experts=experts, moe_ffn=moe_ffn,
        shared_expert_ffn=shape.get("sharedExpertIntermediateSize", 0), dense_layers=shape.get("numDenseLayers", 0))
    try:
        return ModelArch(
            name.lower().rstrip("/").rsplit("/", 1)[-1], layers, hidden, heads, kv_heads, head_dim,
            shape["intermediateSize"], shape["gatedMLP"], shape["vocabSize"], float(params),
            dtype_bytes=shape["dtypeBytes"], max_position=shape.get("maxPositionEmbeddings"),
            tied_embeddings=shape["tieWordEmbeddings"], num_experts=experts,
            experts_per_token=shape.get("numExpertsPerToken", 0), moe_ffn=moe_ffn,
            shared_expert_ffn=shape.get("sharedExpertIntermediateSize", 0),
            dense_layers=shape.get("numDenseLayers", 0), kv_latent_dim=shape.get("kvLatentDim", 0),
            weight_dtype_bytes=shape.get("weightBytesPerParam"), source=path)
    except InputError as exc:  # arch.<field> -> the spec field
        raise InputError(f"{path}.{_SHAPE_FIELD.get(exc.field, exc.field)}", str(exc).split(": ", 1)[-1]) from None


_SHAPE_FIELD = {"arch.kv_heads": "numKeyValueHeads", "arch.experts_per_token": "numExpertsPerToken",
                "arch.num_experts": "numExperts", "arch.dense_layers": "numDenseLayers",
                "arch.weight_dtype_bytes": "weightBytesPerParam", "arch.params": "parameterCount"}


def _config_map_arch(name: str, ref: ConfigMapRef, config_map: Mapping | None) -> ModelArch:
    """The model's shape from the `config.json` that the referenced ConfigMap holds."""
    from kneecap.observe.hf_config import arch_from_config_map

    if config_map is None:
        raise InputError("spec.model.configMapRef.name", f"ConfigMap {ref.name!r} not found in the namespace")
    return arch_from_config_map(config_map, ref.key, "spec.model.configMapRef",
                                name.lower().rstrip("/").rsplit("/", 1)[-1])


def _model_arch(model: Mapping, config_map: Mapping | None) -> ModelArch:
    """Exactly one source of the model's shape (the CRD's CEL rule): catalog key, inline shape,
    ConfigMap, or (none given) a catalog key guessed from the model name."""
    if "shape" in model:
        return _shape_arch(model["name"], model["shape"])
    if "configMapRef" in model:
        return _config_map_arch(model["name"], config_map_ref({"model": model}), config_map)
    key = model.get("architecture") or guess_architecture(model["name"])
    if key is None:
        raise InputError("spec.model.architecture",
                         f"required: no catalog key found in model name {model['name']!r}; set "
                         f"spec.model.architecture (one of {', '.join(sorted(CATALOG))}), spec.model.shape "
                         f"or spec.model.configMapRef")
    try:
        return get_arch(key)
    except InputError as exc:
        raise InputError("spec.model.architecture", str(exc).split(": ", 1)[-1]) from None


def _accelerator_gpu(acc: Mapping) -> GPU:
    """The catalog GPU (`type`) or the inline one (`shape`); costPerHour, when set, overrides."""
    cost = acc.get("costPerHour")
    if "shape" in acc:
        sh = acc["shape"]
        return GPU(sh.get("name") or "custom", sh.get("name") or "custom accelerator",
                   float(sh["peakDenseTFLOPS"]) * 1e12, float(sh["bandwidthGBps"]) * 1e9, float(sh["memoryGiB"]),
                   float(cost or 0.0), source="spec.accelerator.shape")
    try:
        return get_gpu(acc["type"], cost_per_hour=float(cost) if cost else None)
    except InputError as exc:
        raise InputError("spec.accelerator.type", str(exc).split(": ", 1)[-1]) from None


def _gpu_resource_name(acc: Mapping, gpu: GPU) -> str:
    """spec.accelerator.resourceName ("": none), else the device plugin's resource for the GPU's vendor."""
    if "resourceName" in acc:
        return acc["resourceName"]
    return AMD_GPU_RESOURCE if acc.get("type") in AMD_GPUS or gpu.key in AMD_GPUS else NVIDIA_GPU_RESOURCE


def _tensor_parallel_size(s: Mapping) -> int:
    """spec.engine.tensorParallelSize, else spec.accelerator.count (GPUs per replica), else 1; the
    two given and different is the CRD's rule, checked by apply_schema before this."""
    e = s.get("engine") or {}
    return int(e.get("tensorParallelSize") or s["accelerator"].get("count") or 1)


def _gpus_per_replica(s: Mapping, resource: str, tp: int) -> int:
    """GPUs per replica of kneecap's pods: spec.accelerator.count, else the TP size when
    spec.engine.tensorParallelSize is given, else the GPU limit spec.engine.resources sets (as
    before the TP field: the pod's GPUs, TP 1 unless count says otherwise), else the TP size.
    spec.engine.resources naming the GPU resource with another number is refused, naming both."""
    resources = s["engine"].get("resources") or {}
    given = {k: (resources.get(k) or {}).get(resource) for k in ("limits", "requests")}
    given = {k: v for k, v in given.items() if v is not None}
    explicit = s["accelerator"].get("count") or s["engine"].get("tensorParallelSize")
    for kind, value in given.items():
        q = canonical_quantity(value)
        if not q.isdigit() or int(q) < 1:
            raise InputError(f"spec.engine.resources.{kind}[{resource}]", f"expected a whole number of GPUs, got {value}")
        if explicit is None:
            explicit = int(q)
        elif int(q) != explicit:
            raise InputError(f"spec.engine.resources.{kind}[{resource}]",
                             f"{value} differs from the {explicit} GPU(s) per replica that spec.accelerator.count / "
                             f"spec.engine.tensorParallelSize set: kneecap requests {resource}: {explicit} itself; "
                             f"drop it or make them equal")
    return int(explicit or tp)


def _targets(ref: Mapping | None) -> tuple[TargetRef, ...]:
    """spec.targetRef (validated: name, or prefill and decode) as one TargetRef per pool."""
    if ref is None:
        return ()
    if "name" in ref:
        return (TargetRef("server", ref["name"], ref.get("container")),)
    return tuple(TargetRef(role, ref[role]["name"], ref[role].get("container")) for role in ("prefill", "decode"))


def _finite(value: Any, path: str) -> None:
    """NaN and ±inf (YAML's .nan/.inf; JSON has neither) are no number a field takes."""
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(path, f"expected a finite number, got {value}")
    if isinstance(value, Mapping):
        for k, v in value.items():
            _finite(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _finite(v, f"{path}[{i}]")


def parse_spec(raw: Mapping | None, config_map: Mapping | None = None) -> LLMDeploymentSpec:
    """Default, validate and parse `.spec` of an LLMDeployment. Raises InputError(field path).

    ``config_map``: the ConfigMap `spec.model.configMapRef` names, as the API returned it (None:
    not found); see :func:`config_map_ref`."""
    if raw is None:
        raise InputError("spec", "required")
    _finite(raw, "spec")
    s = apply_schema(raw, spec_schema(), "spec")
    arch = _model_arch(s["model"], config_map)
    gpu = _accelerator_gpu(s["accelerator"])
    c, e, t = s["control"], s.get("engine"), s["topology"]
    tp, resource = _tensor_parallel_size(s), _gpu_resource_name(s["accelerator"], gpu)
    gpus = None if e is None else _gpus_per_replica(s, resource, tp)
    window_s = parse_duration_s(c["window"], "spec.control.window")
    kv = t.get("kvTransfer")
    return LLMDeploymentSpec(
        model=ModelSpec(s["model"]["name"], arch, s["model"].get("servedModelName"),
                        config_map_ref(s) if "configMapRef" in s["model"] else None),
        accelerator=AcceleratorSpec(gpu.key, s["accelerator"].get("count"), float(s["accelerator"]["costPerHour"]), gpu,
                                    resource, gpus),
        engine=None if e is None else EngineSpec(
            image=e["image"], port=e["port"], max_num_seqs=e["maxNumSeqs"],
            gpu_memory_utilization=float(e["gpuMemoryUtilization"]), memory_knob=e["memoryKnob"],
            tensor_parallel_size=tp,
            command=tuple(e["command"]), extra_args=tuple(e["extraArgs"]), env=tuple(e["env"]),
            resources=e["resources"], pod_annotations=e["podAnnotations"],
            env_from=tuple(e.get("envFrom", ())), volume_mounts=tuple(e.get("volumeMounts", ())),
            startup_probe=e.get("startupProbe"), liveness_probe=e.get("livenessProbe"),
            readiness_probe=e.get("readinessProbe"), pod_template=e["podTemplate"],
            shm_size=None if e.get("shmSize") is None else str(e["shmSize"]),
            model_cache=None if "modelCache" not in e else ModelCacheSpec(
                e["modelCache"]["claimName"], e["modelCache"]["mountPath"], e["modelCache"]["readOnly"])),
        targets=_targets(s.get("targetRef")),
        topology=TopologySpec(
            mode=t["mode"], replicas_managed_by=t["replicasManagedBy"],
            replicas=PoolBounds(**t["replicas"]), prefill=PoolBounds(**t["prefill"]),
            decode=PoolBounds(**t["decode"]),
            kv_transfer=None if kv is None else KVTransferSpec(
                kv["connector"], float(kv["bandwidthGiBps"]), float(kv["costPerGiBpsHour"]))),
        slo=SLOSpec(float(s["slo"]["quantile"]), s["slo"].get("ttftSeconds"), s["slo"].get("tpotSeconds"),
                    s["slo"].get("e2eSeconds")),
        batching=BatchingSpec(float(s["batching"]["efficiencyFloor"]), s["batching"]["minMaxNumSeqs"],
                              s["batching"]["maxMaxNumSeqs"], float(s["batching"]["maxGpuMemoryUtilization"])),
        max_cost_per_hour=s["budget"].get("maxCostPerHour"),
        control=ControlSpec(
            mode=c["mode"], interval_s=parse_duration_s(c["interval"], "spec.control.interval"),
            window_s=window_s,
            cooldown_s=parse_duration_s(c["cooldown"], "spec.control.cooldown"),
            min_improvement=float(c["minImprovement"]), min_observations=c["minObservations"],
            max_step_factor=float(c["maxStepFactor"]), hysteresis=float(c["hysteresis"]),
            observation_history=c["observationHistory"], max_fit_error=float(c["maxFitError"]),
            max_observation_age_s=(parse_duration_s(c["maxObservationAge"], "spec.control.maxObservationAge")
                                   if "maxObservationAge" in c else 3 * window_s),
            allow_downtime=bool(c["allowDowntime"]), released_memory_value=float(c["releasedMemoryValue"]),
            rate_headroom=float(c["rateHeadroom"]), scale_down_deviations=float(c["scaleDownDeviations"])),
        rollout=RolloutSpec(s["rollout"]["maxSurge"], s["rollout"]["maxUnavailable"]),
        placement=_placement(s["placement"]),
    )


def _placement(p: Mapping) -> PlacementSpec:
    """spec.placement (validated and defaulted by the schema; its CEL rule requires resourceName
    with a sharing mechanism)."""
    w = p.get("workload")
    return PlacementSpec(
        mechanism=p["mechanism"], resource_name=p.get("resourceName") or None,
        resource_claim_name=p.get("resourceClaimName") or None, replicas_per_gpu=p["replicasPerGpu"],
        workload=None if w is None else DeclaredWorkload(
            float(w["requestsPerSecond"]), float(w["inputLengthMean"]), float(w["inputLengthCoefficientOfVariation"]),
            float(w["outputLengthMean"]), float(w["outputLengthCoefficientOfVariation"])))
