"""Existing Deployments kneecap tunes (spec.targetRef). Pure.

Which container runs vLLM, what its live flags are, whether kneecap may write to it at all
(a Deployment controlled by another controller is advised only: a reconciler such as
production-stack's, KServe's or LeaderWorkerSet's would undo a patch and restart the pods
again), and the patch that moves only the managed flags: a strategic merge patch that names
the container and carries only the argv field it changes (``args`` or ``command``), so every
other field of the user's pod template, and every other argument as it is written, stays.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from kneecap.control import manifests, vllm_args

VLLM_PORT_DEFAULT = 8000  # `vllm serve` listens here without --port
STRATEGIC = "application/strategic-merge-patch+json"
# the flags kneecap writes in an adopted container (not --port, --host or the KV role: those are the user's)
TUNED_FLAGS = (manifests.MAX_NUM_SEQS, manifests.GPU_MEMORY_UTILIZATION, manifests.KV_CACHE_MEMORY_BYTES)


@dataclass(frozen=True)
class Adoption:
    """What kneecap knows of one adopted Deployment beyond its settings."""

    container: str  # the vLLM container's name
    port: int  # where its pods serve /metrics
    controller: str | None = None  # "Kind/name" of the controller that is not kneecap
    unpatchable: str | None = None  # why kneecap cannot rewrite the argv, if it cannot
    tensor_parallel_size: int | None = None  # its argv's --tensor-parallel-size (None: not a number it can read)

    @property
    def advise_only(self) -> bool:
        return self.controller is not None or self.unpatchable is not None

    @property
    def why_advise_only(self) -> str:
        if self.controller is not None:
            return f"controlled by {self.controller}: kneecap advises only, it never fights another controller"
        return self.unpatchable or ""


def _containers(deploy: dict) -> list[dict]:
    return ((deploy.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []


def runs_vllm(container: dict) -> bool:
    """The container's argv starts vLLM (`vllm serve`, `python -m vllm.entrypoints...`, a script calling it)."""
    return any(tok == "vllm" or tok.endswith("/vllm") or tok.startswith("vllm.entrypoints")
               for tok in vllm_args.read_argv(container).argv)


def find_container(deploy: dict, name: str | None) -> dict | None:
    """The vLLM container: `name` (None if absent), else the one named vllm, else the first
    whose argv runs vLLM, else the first."""
    cs = _containers(deploy)
    if name is not None:
        return next((c for c in cs if c.get("name") == name), None)
    return (next((c for c in cs if c.get("name") == manifests.CONTAINER), None)
            or next((c for c in cs if runs_vllm(c)), None) or (cs[0] if cs else None))


def controller_of(deploy: dict) -> str | None:
    """'Kind/name' of the Deployment's controller (an ownerReference with controller: true).
    kneecap never sets one on a Deployment it adopts, so any controller is someone else."""
    ref = next((r for r in (deploy.get("metadata") or {}).get("ownerReferences") or [] if r.get("controller")), None)
    return None if ref is None else f"{ref.get('kind', '?')}/{ref.get('name', '?')}"


def port_of(container: dict) -> int:
    """The port vLLM listens on: its --port, else vLLM's default."""
    raw = vllm_args.container_flag(container, "--port")
    try:
        return int(raw) if raw is not None else VLLM_PORT_DEFAULT
    except ValueError:
        return VLLM_PORT_DEFAULT


def tensor_parallel_of(container: dict) -> int | None:
    """The GPUs vLLM shards over: --tensor-parallel-size N, =N or -tp N in the argv, vLLM's
    default 1 without it; None when the value is no positive integer (e.g. ``$(TP)``)."""
    raw = vllm_args.container_flag(container, manifests.TENSOR_PARALLEL_SIZE)
    if raw is None:
        return 1
    try:
        tp = int(raw)
    except ValueError:
        return None
    return tp if tp >= 1 else None


def adoption(deploy: dict, container: dict) -> Adoption:
    shape = vllm_args.read_argv(container).shape
    return Adoption(container["name"], port_of(container), controller_of(deploy),
                    unpatchable=("its vLLM argv is a shell script (sh -c): kneecap advises only, it does not "
                                 "rewrite scripts" if shape == "shell" else None),
                    tensor_parallel_size=tensor_parallel_of(container))


def settings_patch(deploy: dict, container_name: str, settings: manifests.EngineSettings, *,
                   set_replicas: bool) -> dict:
    """Strategic merge patch moving the container's managed flags (and replicas) to `settings`.

    The container is matched by name (the merge key of `containers`); only the argv lists
    that change (``args``, ``command`` or both, atomic lists) are sent; each flag keeps its
    spelling and place (``--max_num_seqs 256`` -> ``--max_num_seqs 64``), a flag the argv
    lacks is appended as ``--flag=value``."""
    c = find_container(deploy, container_name)
    if c is None:
        raise ValueError(f"no container {container_name!r} in Deployment {deploy['metadata']['name']}")
    new = vllm_args.set_container_flag(c, manifests.MAX_NUM_SEQS, settings.max_num_seqs, keep_spelling=True)
    if settings.kv_cache_memory_bytes is not None:
        new = vllm_args.set_container_flag(new, manifests.KV_CACHE_MEMORY_BYTES, int(settings.kv_cache_memory_bytes),
                                           keep_spelling=True)
    else:
        new = vllm_args.set_container_flag(new, manifests.GPU_MEMORY_UTILIZATION,
                                           f"{settings.gpu_memory_utilization:g}", keep_spelling=True)
    changed = {k: new[k] for k in ("command", "args") if new.get(k) != c.get(k)}
    patch: dict = {"spec": {"template": {"spec": {"containers": [{"name": container_name, **changed}]}}}}
    if set_replicas:
        patch["spec"]["replicas"] = int(settings.replicas)
    return patch


def without_tuned_flags(template: dict, container_name: str) -> dict:
    """A copy of a pod template with the flags kneecap tunes taken out of the container's argv:
    what must stay identical when kneecap adopts the Deployment."""
    out = copy.deepcopy(template)
    for c in out.get("spec", {}).get("containers") or []:
        if c.get("name") != container_name:
            continue
        for key in ("command", "args"):
            if c.get(key):
                for flag in TUNED_FLAGS:
                    c[key] = vllm_args.remove_flag(c[key], flag)
    return out


def changed_paths(before, after, path: str = "") -> list[str]:
    """Every path where two JSON values differ (both ways: a field added or removed counts)."""
    if isinstance(before, dict) and isinstance(after, dict):
        return [p for k in sorted(set(before) | set(after), key=str)
                for p in changed_paths(before.get(k), after.get(k), f"{path}.{k}")]
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [p for i, (b, a) in enumerate(zip(before, after)) for p in changed_paths(b, a, f"{path}[{i}]")]
    return [] if before == after else [path or "."]
