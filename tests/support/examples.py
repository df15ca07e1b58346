"""The shipped examples (examples/*.yaml): each holds one LLMDeployment, and an adopt example
also the Deployments it targets (spec.targetRef), as a user would apply them. Not
examples/fleet.yaml: the input of `kneecap pack`, no Kubernetes object (tests/unit/test_pack.py)."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "examples" / "fleet.yaml"
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.yaml") if p != FLEET)


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def llmdeployment(path: Path) -> dict:
    """The example's LLMDeployment."""
    (doc,) = [d for d in documents(path) if d["kind"] == "LLMDeployment"]
    return doc


def others(path: Path) -> list[dict]:
    """What the example applies besides the LLMDeployment (an adopt example's Deployments)."""
    return [d for d in documents(path) if d["kind"] != "LLMDeployment"]


def kneecap_pod_examples() -> list[Path]:
    """The examples whose pods kneecap makes (an adopt example's pods are the user's Deployment's)."""
    return [p for p in EXAMPLES if "engine" in llmdeployment(p)["spec"]]


def rendered_deployments(path: Path) -> list[dict]:
    """The Deployments kneecap renders for the example's pools, with their initial settings."""
    from kneecap.control import manifests
    from kneecap.control.spec import parse_spec

    doc = llmdeployment(path)
    owner = {**doc, "metadata": {**doc["metadata"], "uid": "4b7e0d0e-0000-4000-8000-000000000001"}}
    spec = parse_spec(doc["spec"])
    return [manifests.deployment(owner, spec, pool, manifests.initial_settings(spec, pool.role))
            for pool in manifests.pools(doc["metadata"]["name"], spec)]


def colocated(name: str, namespace: str, *, window: str | None = None, **spec) -> dict:
    """examples/colocated.yaml as `name` in `namespace`, ticking every second (and windows of
    `window`), each keyword merged into its spec section (a dict) or replacing it."""
    obj = copy.deepcopy(llmdeployment(ROOT / "examples" / "colocated.yaml"))
    obj["metadata"] = {"name": name, "namespace": namespace}
    obj["spec"]["control"]["interval"] = "1s"
    if window is not None:
        obj["spec"]["control"]["window"] = window
    for key, value in spec.items():
        obj["spec"][key] = {**obj["spec"].get(key, {}), **value} if isinstance(value, dict) else value
    return obj


def status_of(client, resource: str, namespace: str, name: str) -> dict:
    """The stored object's status ({} when it or its status is absent)."""
    return (client.get(resource, namespace, name) or {}).get("status") or {}


def condition(status: dict, type_: str) -> dict:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})
