"""LLMDeployment spec: defaults and validation from the CRD schema, parsed into frozen dataclasses.

The CRD (crds/llmdeployment.yaml) is the single source of truth: defaults, types, enums and
bounds are read from its openAPIV3Schema, so the Python side cannot drift from what the API
server enforces. Cross-field rules (the CRD's x-kubernetes-validations) are re-checked here
with messages that name the field path, because the operator must also reject specs that
reached it without an API server's validation (kmock, old CRD versions).
"""

from __future__ import annotations

import copy
import functools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from kneecap.errors import InputError

GROUP = "kneecap.io"
VERSION = "v1alpha1"
PLURAL = "llmdeployments"
KIND = "LLMDeployment"

# The CRD lives at the repository top level (DESIGN §2); KNEECAP_CRD overrides (e.g. in an image).
CRD_PATH = Path(os.environ.get("KNEECAP_CRD", Path(__file__).resolve().parents[3] / "crds" / "llmdeployment.yaml"))

_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)$")
_UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


@functools.cache
def load_crd(path: Path = CRD_PATH) -> dict:
    """The parsed CRD document."""
    with open(path) as f:
        return yaml.safe_load(f)


def spec_schema() -> dict:
    """openAPIV3Schema of `.spec` for the served version."""
    (version,) = [v for v in load_crd()["spec"]["versions"] if v["name"] == VERSION]
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]


def parse_duration_s(text: str, path: str) -> float:
    """'30s', '5m', '1.5h', '500ms' -> seconds."""
    m = _DURATION.match(str(text))
    if not m:
        raise InputError(path, f"expected a duration like 30s, 5m, 1h, got {text!r}")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


# ---------------------------------------------------------------- schema defaulting + validation

def _type_ok(value: Any, typ: str) -> bool:
    if typ == "object":
        return isinstance(value, Mapping)
    if typ == "array":
        return isinstance(value, list)
    if typ == "string":
        return isinstance(value, str)
    if typ == "boolean":
        return isinstance(value, bool)
    if typ == "integer":
        return isinstance(value, int) and not isinstance(value, bool) or (isinstance(value, float) and value.is_integer())
    if typ == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return True


def apply_schema(value: Any, schema: Mapping, path: str) -> Any:
    """Default and validate `value` against a structural schema, as the API server would.

    Returns a defaulted deep copy; raises InputError naming the first offending field path.
    """
    typ = schema.get("type")
    if typ and not _type_ok(value, typ):
        raise InputError(path, f"expected {typ}, got {type(value).__name__} {value!r}")
    if "enum" in schema and value not in schema["enum"]:
        raise InputError(path, f"expected one of {schema['enum']}, got {value!r}")
    if typ in ("integer", "number"):
        if typ == "integer":
            value = int(value)
        lo, hi = schema.get("minimum"), schema.get("maximum")
        if lo is not None:
            if schema.get("exclusiveMinimum") and not value > lo:
                raise InputError(path, f"must be > {lo} (got {value})")
            if not value >= lo:
                raise InputError(path, f"must be ≥ {lo} (got {value})")
        if hi is not None:
            if schema.get("exclusiveMaximum") and not value < hi:
                raise InputError(path, f"must be < {hi} (got {value})")
            if not value <= hi:
                raise InputError(path, f"must be ≤ {hi} (got {value})")
    if typ == "string":
        if len(value) < schema.get("minLength", 0):
            raise InputError(path, "must not be empty")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            raise InputError(path, f"expected to match {schema['pattern']}, got {value!r}")
    if typ == "array" and "items" in schema:
        return [apply_schema(v, schema["items"], f"{path}[{i}]") for i, v in enumerate(value)]
    if typ == "object":
        props = schema.get("properties")
        if props is None:
            return copy.deepcopy(dict(value))
        out = {}
        for key in value:
            if key not in props and not schema.get("x-kubernetes-preserve-unknown-fields"):
                raise InputError(f"{path}.{key}", f"unknown field (known: {', '.join(props)})")
        for key in schema.get("required", []):
            if key not in value:
                raise InputError(f"{path}.{key}", "required")
        for key, sub in props.items():
            if key in value:
                out[key] = apply_schema(value[key], sub, f"{path}.{key}")
            elif "default" in sub:
                out[key] = apply_schema(copy.deepcopy(sub["default"]), sub, f"{path}.{key}")
        return out
    return value


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
    max_observation_age_s: float  # spec.control.maxObservationAge, default 3 windows



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


def _check_cross_fields(s: Mapping) -> None:
    """The CRD's x-kubernetes-validations, with messages naming the field path."""
    topo = s["topology"]
    for pool in ("replicas", "prefill", "decode"):
        b = topo[pool]
        if b["min"] > b["max"]:
            raise InputError(f"spec.topology.{pool}.min", f"must be ≤ max (got {b['min']} > {b['max']})")
    if topo["mode"] == "disaggregated" and "kvTransfer" not in topo:
        raise InputError("spec.topology.kvTransfer", "required when spec.topology.mode is disaggregated")
    bat = s["batching"]
    if bat["minMaxNumSeqs"] > bat["maxMaxNumSeqs"]:
        raise InputError("spec.batching.minMaxNumSeqs",
                         f"must be ≤ maxMaxNumSeqs (got {bat['minMaxNumSeqs']} > {bat['maxMaxNumSeqs']})")
    mns = s["engine"]["maxNumSeqs"]
    if not bat["minMaxNumSeqs"] <= mns <= bat["maxMaxNumSeqs"]:
        raise InputError("spec.engine.maxNumSeqs",
                         f"must lie within [{bat['minMaxNumSeqs']}, {bat['maxMaxNumSeqs']}] (got {mns})")


def parse_spec(raw: Mapping | None) -> LLMDeploymentSpec:
    """Default, validate and parse `.spec` of an LLMDeployment. Raises InputError(field path)."""
    if raw is None:
        raise InputError("spec", "required")
    s = apply_schema(raw, spec_schema(), "spec")
    _check_cross_fields(s)
    arch_key = _check_catalogs(s)
    c, e, t = s["control"], s["engine"], s["topology"]
    kv = t.get("kvTransfer")
    return LLMDeploymentSpec(
        model=ModelSpec(s["model"]["name"], arch_key, s["model"].get("servedModelName")),
        accelerator=AcceleratorSpec(s["accelerator"]["type"], s["accelerator"]["count"],
                                    float(s["accelerator"]["costPerHour"])),
        engine=EngineSpec(
            image=e["image"], port=e["port"], max_num_seqs=e["maxNumSeqs"],
            gpu_memory_utilization=float(e["gpuMemoryUtilization"]), memory_knob=e["memoryKnob"],
            command=tuple(e["command"]), extra_args=tuple(e["extraArgs"]), env=tuple(e["env"]),
            resources=e["resources"], pod_annotations=e["podAnnotations"]),
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
            window_s=parse_duration_s(c["window"], "spec.control.window"),
            cooldown_s=parse_duration_s(c["cooldown"], "spec.control.cooldown"),
            min_improvement=float(c["minImprovement"]), min_observations=c["minObservations"],
            max_step_factor=float(c["maxStepFactor"]), hysteresis=float(c["hysteresis"]),
            observation_history=c["observationHistory"], max_fit_error=float(c["maxFitError"]),
            max_observation_age_s=(parse_duration_s(c["maxObservationAge"], "spec.control.maxObservationAge")
                                   if "maxObservationAge" in c
                                   else 3.0 * parse_duration_s(c["window"], "spec.control.window"))),
    )
