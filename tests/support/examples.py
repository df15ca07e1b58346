"""The shipped examples (examples/*.yaml): each holds one LLMDeployment, and an adopt example
also the Deployments it targets (spec.targetRef), as a user would apply them."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def llmdeployment(path: Path) -> dict:
    """The example's LLMDeployment."""
    (doc,) = [d for d in documents(path) if d["kind"] == "LLMDeployment"]
    return doc


def others(path: Path) -> list[dict]:
    """What the example applies besides the LLMDeployment (an adopt example's Deployments)."""
    return [d for d in documents(path) if d["kind"] != "LLMDeployment"]
