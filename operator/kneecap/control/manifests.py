"""Pure builders of the objects an LLMDeployment owns: one Deployment and one Service per pool.

Names: ``<name>`` when colocated, ``<name>-prefill`` / ``<name>-decode`` when disaggregated
(DESIGN §3). No I/O here; the reconcile module sends what these return.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kneecap.control import vllm_args
from kneecap.control.drift import without_empty
from kneecap.control.spec import GROUP, KIND, VERSION, LLMDeploymentSpec

MANAGER = "kneecap"
CONTAINER = "vllm"
ROLE_LABEL = "kneecap.io/role"
INSTANCE_LABEL = "app.kubernetes.io/instance"
MANAGER_LABEL = "app.kubernetes.io/managed-by"
METRICS_URL_ANNOTATION = "kneecap.io/metrics-url"
MAX_NUM_SEQS = "--max-num-seqs"
GPU_MEMORY_UTILIZATION = "--gpu-memory-utilization"
KV_CACHE_MEMORY_BYTES = "--kv-cache-memory-bytes"
KV_TRANSFER_CONFIG = "--kv-transfer-config"
TENSOR_PARALLEL_SIZE = "--tensor-parallel-size"  # vLLM's short spelling: -tp
# vLLM flags the operator owns (the control loop's knobs, where the pod listens, the pool's KV
# role, the GPUs a replica shards over); the rest of the argv belongs to the user (extraArgs),
# which cannot override these.
MANAGED_FLAGS = (MAX_NUM_SEQS, GPU_MEMORY_UTILIZATION, KV_CACHE_MEMORY_BYTES, "--port", "--host",
                 KV_TRANSFER_CONFIG, TENSOR_PARALLEL_SIZE)
# Pods run as this non-root user (the Pod Security "restricted" profile); vLLM images from
# v0.8.2 run as any UID given a writable $HOME for their caches (HF, vLLM, Triton, Inductor).
RUN_AS_USER = 1000
VLLM_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization
HOME = "/home/vllm"
SHM = "/dev/shm"
# A model load (download, weights to GPU, CUDA-graph capture) can take many minutes: the startup
# probe allows 30 (180 x 10 s) before the kubelet restarts the container; liveness then restarts a
# container whose /health has not answered for a minute.
STARTUP_PERIOD_S, STARTUP_FAILURES = 10, 180
LIVENESS_PERIOD_S, LIVENESS_TIMEOUT_S, LIVENESS_FAILURES = 10, 5, 6


@dataclass(frozen=True)
class Pool:
    """One pool of identical vLLM pods: role 'server' (colocated), 'prefill' or 'decode'."""

    role: str
    name: str


@dataclass(frozen=True)
class EngineSettings:
    """The values the operator manages for one pool."""

    max_num_seqs: int
    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | None = None
    replicas: int = 1


def pool_name(name: str, role: str) -> str:
    """The pool's Deployment and Service name: the LLMDeployment's, suffixed by the role when disaggregated."""
    return name if role == "server" else f"{name}-{role}"


def pools(name: str, spec: LLMDeploymentSpec) -> list[Pool]:
    if spec.adopted:  # spec.targetRef: the user's Deployments, under their own names
        return [Pool(t.role, t.name) for t in spec.targets]
    roles = ("prefill", "decode") if spec.disaggregated else ("server",)
    return [Pool(role, pool_name(name, role)) for role in roles]


def pool_bounds(spec: LLMDeploymentSpec, role: str):
    t = spec.topology
    return {"server": t.replicas, "prefill": t.prefill, "decode": t.decode}[role]


def initial_settings(spec: LLMDeploymentSpec, role: str) -> EngineSettings:
    """Start-up values: the spec's engine flags and the smallest non-zero pool size."""
    b = pool_bounds(spec, role)
    if spec.engine is None:  # an adopted Deployment: vLLM's own defaults stand for the flags its argv lacks
        from kneecap.model.memory import vllm_default_limits

        seqs, _ = vllm_default_limits(spec.accelerator.gpu, True, 2048)
        return EngineSettings(seqs, VLLM_GPU_MEMORY_UTILIZATION, None, replicas=b.clamp(max(b.min, 1)))
    return EngineSettings(spec.engine.max_num_seqs, spec.engine.gpu_memory_utilization, None,
                          replicas=b.clamp(max(b.min, 1)))


def labels(name: str, role: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "vllm",
        INSTANCE_LABEL: name,
        "app.kubernetes.io/component": role,
        MANAGER_LABEL: MANAGER,
        ROLE_LABEL: role,
    }


def selector(name: str, role: str) -> dict[str, str]:
    return {INSTANCE_LABEL: name, ROLE_LABEL: role}


def pool_selector(name: str, role: str) -> str:
    """Label selector (API query form) of a pool's pods."""
    return ",".join(f"{k}={v}" for k, v in selector(name, role).items())


def owned_selector(name: str) -> str:
    """Label selector of the objects kneecap made for the LLMDeployment `name`."""
    return f"{INSTANCE_LABEL}={name},{MANAGER_LABEL}={MANAGER}"


def owner_reference(owner: dict) -> dict:
    """Controller owner reference to the LLMDeployment (what kopf.adopt sets, made explicit)."""
    meta = owner["metadata"]
    return {
        "apiVersion": owner.get("apiVersion", f"{GROUP}/{VERSION}"),
        "kind": owner.get("kind", KIND),
        "name": meta["name"],
        "uid": meta.get("uid", ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def kv_transfer_config(spec: LLMDeploymentSpec, role: str) -> str | None:
    """vLLM --kv-transfer-config JSON: prefill produces KV, decode consumes it."""
    if role not in ("prefill", "decode") or spec.topology.kv_transfer is None:
        return None
    kv_role = "kv_producer" if role == "prefill" else "kv_consumer"
    return json.dumps({"kv_connector": spec.topology.kv_transfer.connector, "kv_role": kv_role},
                      separators=(",", ":"))


def vllm_argv_tail(spec: LLMDeploymentSpec, role: str, settings: EngineSettings) -> list[str]:
    """Arguments after `vllm serve`: the model, then canonical --flag=value, then extraArgs
    without any spelling of a managed flag (the operator's values win)."""
    argv = [spec.model.name, f"--port={spec.engine.port}"]
    if spec.model.served_model_name:
        argv.append(f"--served-model-name={spec.model.served_model_name}")
    argv.append(f"{MAX_NUM_SEQS}={settings.max_num_seqs}")
    argv.append(f"{GPU_MEMORY_UTILIZATION}={settings.gpu_memory_utilization:g}")
    if settings.kv_cache_memory_bytes is not None:
        argv.append(f"{KV_CACHE_MEMORY_BYTES}={int(settings.kv_cache_memory_bytes)}")
    if spec.tensor_parallel_size > 1:
        argv.append(f"{TENSOR_PARALLEL_SIZE}={spec.tensor_parallel_size}")
    kv = kv_transfer_config(spec, role)
    if kv is not None:
        argv.append(f"{KV_TRANSFER_CONFIG}={kv}")
    argv.extend(user_args(spec.engine.extra_args))
    return argv


def user_args(extra_args) -> list[str]:
    """extraArgs without the managed flags (``--port 1``, ``--port=1``, ``--max_num_seqs=8``, ``-tp 2``)."""
    out = list(extra_args)
    for flag in MANAGED_FLAGS:
        out = vllm_args.remove_flag(out, flag)
    return out


def resources(spec: LLMDeploymentSpec) -> dict:
    """spec.engine.resources with the replica's GPUs requested (``nvidia.com/gpu: <GPUs per
    replica>`` as a limit; parse_spec refused a different value there). No GPU with
    spec.accelerator.resourceName "" (a CPU-only engine: the twin)."""
    out = {k: dict(v) for k, v in (spec.engine.resources or {}).items()}
    if not spec.accelerator.resource_name:
        return out
    if spec.shared_gpu_share is not None:
        # a shared GPU (spec.placement, enforced by the fleet advice): one slice of the device
        # plugin's shared resource, or the shared ResourceClaim (dra), instead of a whole GPU
        for kind in out.values():
            kind.pop(spec.accelerator.resource_name, None)
        if spec.placement.mechanism == "dra":
            out["claims"] = [{"name": SHARED_CLAIM}]
        else:
            out.setdefault("limits", {})[spec.placement.resource_name] = "1"
        return {k: v for k, v in out.items() if v}
    gpus = str(spec.gpus_per_replica)
    out.setdefault("limits", {})[spec.accelerator.resource_name] = gpus
    if spec.accelerator.resource_name in out.get("requests", {}):
        out["requests"][spec.accelerator.resource_name] = gpus
    return out


def probes(spec: LLMDeploymentSpec) -> dict:
    """The vLLM container's probes: spec.engine's where given, else GETs of /health that let a
    long model load finish (startup) and restart a hung server (liveness)."""
    health = {"path": "/health", "port": spec.engine.port}
    e = spec.engine
    return {
        "startupProbe": e.startup_probe or {"httpGet": dict(health), "periodSeconds": STARTUP_PERIOD_S,
                                            "failureThreshold": STARTUP_FAILURES},
        "livenessProbe": e.liveness_probe or {"httpGet": dict(health), "periodSeconds": LIVENESS_PERIOD_S,
                                              "timeoutSeconds": LIVENESS_TIMEOUT_S,
                                              "failureThreshold": LIVENESS_FAILURES},
        "readinessProbe": e.readiness_probe or {"httpGet": dict(health), "periodSeconds": 5},
    }


def container(spec: LLMDeploymentSpec, role: str, settings: EngineSettings) -> dict:
    port = spec.engine.port
    c = {
        "name": CONTAINER,
        "image": spec.engine.image,
        "command": list(spec.engine.command),
        "args": vllm_argv_tail(spec, role, settings),
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        **probes(spec),
    }
    user_env = [dict(e) for e in spec.engine.env]
    own = {e.get("name") for e in user_env}
    defaults = [{"name": "HOME", "value": HOME}]
    if spec.engine.model_cache is not None:
        defaults.append({"name": "HF_HOME", "value": spec.engine.model_cache.mount_path})
    c["env"] = [e for e in defaults if e["name"] not in own] + user_env
    c["envFrom"] = [dict(e) for e in spec.engine.env_from]
    c["volumeMounts"] = [{"name": "home", "mountPath": HOME}]
    if spec.engine.shm_size is not None:
        c["volumeMounts"].append({"name": "dshm", "mountPath": SHM})
    if (cache := spec.engine.model_cache) is not None:
        c["volumeMounts"].append({"name": "model-cache", "mountPath": cache.mount_path,
                                  **({"readOnly": True} if cache.read_only else {})})
    c["volumeMounts"] += [dict(m) for m in spec.engine.volume_mounts]
    c["resources"] = resources(spec)
    # restricted Pod Security profile: no privilege escalation, no capabilities
    c["securityContext"] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    return c


def volumes(spec: LLMDeploymentSpec) -> list[dict]:
    """kneecap's volumes ($HOME, /dev/shm, the model cache), then spec.engine.podTemplate's."""
    out: list[dict] = [{"name": "home", "emptyDir": {}}]
    if spec.engine.shm_size is not None:
        out.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.engine.shm_size}})
    if (cache := spec.engine.model_cache) is not None:
        out.append({"name": "model-cache",
                    "persistentVolumeClaim": {"claimName": cache.claim_name,
                                              **({"readOnly": True} if cache.read_only else {})}})
    return out + [dict(v) for v in (spec.engine.pod_template.get("spec") or {}).get("volumes", ())]


def pod_spec(spec: LLMDeploymentSpec, role: str, settings: EngineSettings) -> dict:
    """The pool's pod: spec.engine.podTemplate's fields (tolerations, nodeSelector, affinity,
    pull secrets, service account, runtime and priority class) around kneecap's container and
    volumes. Non-root with the runtime's default seccomp profile unless the template's
    securityContext says otherwise (its keys replace kneecap's); no API token (vLLM never calls
    the Kubernetes API); a writable $HOME for vLLM's caches."""
    user = dict(spec.engine.pod_template.get("spec") or {})
    if spec.shared_gpu_share is not None and spec.placement.mechanism == "dra":  # the shared GPU's claim
        user["resourceClaims"] = [*user.get("resourceClaims", ()), {
            "name": SHARED_CLAIM, "resourceClaimName": spec.placement.resource_claim_name}]
    security = {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER,
                "fsGroup": RUN_AS_USER, "seccompProfile": {"type": "RuntimeDefault"}}
    return {
        **user,
        "automountServiceAccountToken": False,
        "securityContext": {**security, **(user.get("securityContext") or {})},
        "containers": [container(spec, role, settings)],
        "volumes": volumes(spec),
    }


# pod fields only spec.engine.podTemplate sets (and `serviceAccount`, the deprecated mirror the API
# server copies serviceAccountName from); container fields only spec.engine sets
TEMPLATE_POD_FIELDS = ("tolerations", "nodeSelector", "affinity", "imagePullSecrets", "serviceAccountName",
                       "serviceAccount", "runtimeClassName", "priorityClassName", "resourceClaims")
SHARED_CLAIM = "kneecap-shared-gpu"  # the pod's name of the shared GPU's ResourceClaim (spec.placement dra)
TEMPLATE_CONTAINER_FIELDS = ("envFrom",)


def removed_template_fields(desired: dict, live: dict) -> dict:
    """Pod-spec fields the live Deployment's template has and the desired one no longer does, as
    merge-patch nulls (a merge patch keeps what it does not name); {} when none. A container
    field dropped is returned as the desired container list (lists are replaced whole)."""
    want_pod, live_pod = desired["spec"]["template"]["spec"], live["spec"]["template"]["spec"]
    out: dict = {k: None for k in TEMPLATE_POD_FIELDS if k in live_pod and k not in want_pod
                 and not (k == "serviceAccount" and "serviceAccountName" in want_pod)}  # the API's mirror
    want_c, live_c = vllm_container(desired), vllm_container(live)
    if any(k in live_c and k not in want_c for k in TEMPLATE_CONTAINER_FIELDS):
        out["containers"] = want_pod["containers"]
    return out


def pod_metadata(spec: LLMDeploymentSpec, name: str, role: str) -> dict:
    """The template's labels (kneecap's win) and annotations (spec.engine.podAnnotations win)."""
    meta = spec.engine.pod_template.get("metadata") or {}
    return {"labels": {**(meta.get("labels") or {}), **labels(name, role)},
            "annotations": {**(meta.get("annotations") or {}), **spec.engine.pod_annotations}}


def shared_settings(spec: LLMDeploymentSpec, settings: EngineSettings) -> EngineSettings:
    """``settings`` with --gpu-memory-utilization at most the shared GPU's share
    (spec.shared_gpu_share, see kneecap.control.fleet.effective_spec)."""
    share = spec.shared_gpu_share
    if share is None or settings.gpu_memory_utilization <= share:
        return settings
    return EngineSettings(settings.max_num_seqs, share, settings.kv_cache_memory_bytes, settings.replicas)


def deployment(owner: dict, spec: LLMDeploymentSpec, pool: Pool, settings: EngineSettings) -> dict:
    """apps/v1 Deployment for one pool (on a shared GPU: the shared resource, the share's memory)."""
    settings = shared_settings(spec, settings)
    name = owner["metadata"]["name"]
    lab = labels(name, pool.role)
    # no empty fields: the API server drops them, and drift checks compare what it stores
    return without_empty({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": pool.name,
            "namespace": owner["metadata"].get("namespace"),
            "labels": lab,
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": {
            "replicas": int(settings.replicas),
            "selector": {"matchLabels": selector(name, pool.role)},
            # a flag change replaces pods as spec.rollout says (default: one at a time, no spare GPU)
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": spec.rollout.max_surge,
                                                                    "maxUnavailable": spec.rollout.max_unavailable}},
            "template": {
                "metadata": pod_metadata(spec, name, pool.role),
                "spec": pod_spec(spec, pool.role, settings),
            },
        },
    })


def service(owner: dict, spec: LLMDeploymentSpec, pool: Pool) -> dict:
    """v1 Service for one pool (OpenAI API and /metrics on the engine port)."""
    name = owner["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": pool.name,
            "namespace": owner["metadata"].get("namespace"),
            "labels": labels(name, pool.role),
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": {
            "selector": selector(name, pool.role),
            "ports": [{"name": "http", "port": spec.engine.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def vllm_container(deploy: dict) -> dict:
    """The vLLM container of a Deployment (by name, else the first)."""
    cs = deploy["spec"]["template"]["spec"]["containers"]
    return next((c for c in cs if c.get("name") == CONTAINER), cs[0])


def live_settings(deploy: dict, fallback: EngineSettings, container: dict | None = None) -> EngineSettings:
    """Managed values as they are live in a Deployment's vLLM container (default
    `vllm_container`); fallback for flags it does not carry."""
    c = container if container is not None else vllm_container(deploy)
    mns = vllm_args.container_flag(c, MAX_NUM_SEQS)
    gmu = vllm_args.container_flag(c, GPU_MEMORY_UTILIZATION)
    kvb = vllm_args.container_flag(c, KV_CACHE_MEMORY_BYTES)
    return EngineSettings(
        max_num_seqs=int(mns) if mns is not None else fallback.max_num_seqs,
        gpu_memory_utilization=float(gmu) if gmu is not None else fallback.gpu_memory_utilization,
        kv_cache_memory_bytes=int(kvb) if kvb is not None else fallback.kv_cache_memory_bytes,
        replicas=int(deploy["spec"].get("replicas", fallback.replicas)),
    )


def with_settings(deploy: dict, settings: EngineSettings, *, set_replicas: bool = True) -> dict:
    """Patch body that moves a live Deployment's managed flags (and replicas) to `settings`.

    Keeps the container's argv shape; only the managed flags change. Returns a merge patch.
    """
    cs = deploy["spec"]["template"]["spec"]["containers"]
    idx = next((i for i, c in enumerate(cs) if c.get("name") == CONTAINER), 0)
    c = vllm_args.set_container_flag(cs[idx], MAX_NUM_SEQS, settings.max_num_seqs)
    c = vllm_args.set_container_flag(c, GPU_MEMORY_UTILIZATION, f"{settings.gpu_memory_utilization:g}")
    if settings.kv_cache_memory_bytes is not None:
        c = vllm_args.set_container_flag(c, KV_CACHE_MEMORY_BYTES, int(settings.kv_cache_memory_bytes))
    containers = [dict(x) for x in cs]
    containers[idx] = c
    patch: dict = {"spec": {"template": {"spec": {"containers": containers}}}}
    if set_replicas:
        patch["spec"]["replicas"] = int(settings.replicas)
    return patch
