"""The tick planner's inputs for one enforce-mode LLMDeployment ("llm" in "serving"): its raw
and parsed spec, owner, live pool as manifests.py builds it, a status whose ring holds three
measured windows, and what the tick gathered (shared by tests/unit/test_control_*.py)."""

from __future__ import annotations

from dataclasses import replace

from kneecap.control import applied, manifests, plan, reconcile, status as status_fields, status_codec
from kneecap.control.spec import parse_spec
from tests.support.profile_observations import observation

NOW = 1_800_000_000.0
RAW = {"model": {"name": "meta-llama/Llama-2-7b-hf"}, "accelerator": {"type": "h100-64gb"},
       "engine": {"image": "vllm", "maxNumSeqs": 32},
       # one replica: a restart is downtime, allowed here (the restart table holds it by default)
       "control": {"mode": "enforce", "interval": "30s", "window": "60s", "cooldown": "600s", "minObservations": 3,
                   "allowDowntime": True}}
SPEC = parse_spec(RAW)
OWNER = {"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment",
         "metadata": {"name": "llm", "namespace": "serving", "uid": "u1", "generation": 2}}
LABELS = ("serving", "llm")


def live_pool(annotation: dict | None = None, ready: int = 1) -> reconcile.PoolState:
    (pool,) = manifests.pools("llm", SPEC)
    settings = manifests.EngineSettings(32, 0.9, None, 1)
    deploy = manifests.deployment(OWNER, SPEC, pool, settings)
    deploy["metadata"]["generation"] = 1
    deploy["status"] = {"observedGeneration": 1, "readyReplicas": ready, "updatedReplicas": 1}
    if annotation:
        deploy["metadata"].update(applied.annotation_patch(annotation)["metadata"])
    return reconcile.PoolState(pool, deploy, settings, reconcile.Ownership("kneecap"))


def ring_status(curve) -> tuple[dict, tuple]:
    """A status whose ring holds three windows (caps 8, 16, 32) ending one interval ago."""
    obs = [replace(observation(curve[c]), t_end_s=NOW - 30.0 * (3 - i)) for i, c in enumerate((8, 16, 32))]
    entries = [{"pool": "server", **status_fields.ring_entry(o)} for o in obs]
    status = {"observations": entries,
              "workload": {"pool": "server", **status_fields.rounded(plan.obs_pool.to_status(obs[-1]))},
              "lastWindow": {"pool": "server", "outcome": plan.OBSERVED, "time": status_fields.iso(NOW - 30),
                             "usableTime": status_fields.iso(NOW - 30)}}
    return status, status_codec.parse_ring(entries, "server")


def gathered(window: plan.PoolWindow, ring=(), **kw) -> plan.TickInput:
    return plan.TickInput("serving", "llm", 2, (window,), ring, **kw)


def cond(status: dict, type_: str) -> dict:
    """The condition ``type_`` of a status, {} when it has none."""
    return status_fields.get_condition(status["conditions"], type_) or {}
