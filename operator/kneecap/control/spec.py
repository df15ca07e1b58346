"""LLMDeployment spec: defaults and validation from the CRD schema, parsed into frozen dataclasses.

The CRD (crds/llmdeployment.yaml) is the single source of truth: defaults, types, enums and
bounds are read from its openAPIV3Schema, so the Python side cannot drift from what the API
server enforces. The CRD's CEL rules (x-kubernetes-validations: cross-field bounds, the flags
kneecap manages) are evaluated here too, naming the same field paths, because the operator must
also reject specs that reached it without an API server's validation (old CRD versions).
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import yaml

from kneecap.control import validation
from kneecap.errors import InputError

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
class ModelSpec:
    name: str
    architecture: str
    served_model_name: str | None


@dataclass(frozen=True)
class AcceleratorSpec:
    type: str
    count: int
    cost_per_hour: float


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


@dataclass(frozen=True)
class LLMDeploymentSpec:
    model: ModelSpec
    accelerator: AcceleratorSpec
    engine: EngineSpec
    topology: TopologySpec
    slo: SLOSpec
    batching: BatchingSpec
    max_cost_per_hour: float | None
    control: ControlSpec

    @property
    def disaggregated(self) -> bool:
        return self.topology.mode == "disaggregated"

    @property
    def enforce(self) -> bool:
        return self.control.mode == "enforce"


# ---------------------------------------------------------------- parsing

def guess_architecture(model_name: str) -> str | None:
    """Catalog key contained in a model name ('meta-llama/Llama-3.1-8B-Instruct' -> 'llama-3.1-8b')."""
    from kneecap.model.arch import CATALOG

    norm = model_name.lower().rsplit("/", 1)[-1].replace("_", "-")
    hits = [k for k in CATALOG if k in norm]
    return max(hits, key=len) if hits else None


def _check_catalogs(spec: Mapping) -> str:
    from kneecap.model.arch import get_arch
    from kneecap.model.hardware import get_gpu

    arch_key = spec["model"].get("architecture") or guess_architecture(spec["model"]["name"])
    if arch_key is None:
        raise InputError("spec.model.architecture",
                         f"required: no catalog key found in model name {spec['model']['name']!r}")
    try:
        get_arch(arch_key)
    except InputError as exc:
        raise InputError("spec.model.architecture", str(exc).split(": ", 1)[-1]) from None
    try:
        get_gpu(spec["accelerator"]["type"])
    except InputError as exc:
        raise InputError("spec.accelerator.type", str(exc).split(": ", 1)[-1]) from None
    return arch_key


def parse_spec(raw: Mapping | None) -> LLMDeploymentSpec:
    """Default, validate and parse `.spec` of an LLMDeployment. Raises InputError(field path)."""
    if raw is None:
        raise InputError("spec", "required")
    s = apply_schema(raw, spec_schema(), "spec")
    arch_key = _check_catalogs(s)
    c, e, t = s["control"], s["engine"], s["topology"]
    window_s = parse_duration_s(c["window"], "spec.control.window")
    kv = t.get("kvTransfer")
    return LLMDeploymentSpec(
        model=ModelSpec(s["model"]["name"], arch_key, s["model"].get("servedModelName")),
        accelerator=AcceleratorSpec(s["accelerator"]["type"], s["accelerator"]["count"],
                                    float(s["accelerator"]["costPerHour"])),
        engine=EngineSpec(
            image=e["image"], port=e["port"], max_num_seqs=e["maxNumSeqs"],
            gpu_memory_utilization=float(e["gpuMemoryUtilization"]), memory_knob=e["memoryKnob"],
            command=tuple(e["command"]), extra_args=tuple(e["extraArgs"]), env=tuple(e["env"]),
            resources=e["resources"], pod_annotations=e["podAnnotations"],
            env_from=tuple(e.get("envFrom", ())), volume_mounts=tuple(e.get("volumeMounts", ())),
            startup_probe=e.get("startupProbe"), liveness_probe=e.get("livenessProbe"),
            readiness_probe=e.get("readinessProbe"), pod_template=e["podTemplate"],
            shm_size=None if e.get("shmSize") is None else str(e["shmSize"]),
            model_cache=None if "modelCache" not in e else ModelCacheSpec(
                e["modelCache"]["claimName"], e["modelCache"]["mountPath"], e["modelCache"]["readOnly"])),
        topology=TopologySpec(
            mode=t["mode"], replicas_managed_by=t["replicasManagedBy"],
            replicas=PoolBounds(**t["replicas"]), prefill=PoolBounds(**t["prefill"]),
            decode=PoolBounds(**t["decode"]),
            kv_transfer=None if kv is None else KVTransferSpec(
                kv["connector"], float(kv["bandwidthGiBps"]), float(kv["costPerGiBpsHour"]))),
        slo=SLOSpec(float(s["slo"]["quantile"]), s["slo"].get("ttftSeconds"), s["slo"].get("tpotSeconds"),
                    s["slo"].get("e2eSeconds")),
        batching=BatchingSpec(float(s["batching"]["efficiencyFloor"]), s["batching"]["minMaxNumSeqs"],
                              s["batching"]["maxMaxNumSeqs"]),
        max_cost_per_hour=s["budget"].get("maxCostPerHour"),
        control=ControlSpec(
            mode=c["mode"], interval_s=parse_duration_s(c["interval"], "spec.control.interval"),
            window_s=window_s,
            cooldown_s=parse_duration_s(c["cooldown"], "spec.control.cooldown"),
            min_improvement=float(c["minImprovement"]), min_observations=c["minObservations"],
            max_step_factor=float(c["maxStepFactor"]), hysteresis=float(c["hysteresis"]),
            observation_history=c["observationHistory"], max_fit_error=float(c["maxFitError"]),
            max_observation_age_s=(parse_duration_s(c["maxObservationAge"], "spec.control.maxObservationAge")
                                   if "maxObservationAge" in c else 3 * window_s)),
    )
