"""Run the kneecap operator (kopf.testing.KopfRunner) against the emulated API in a test."""

from __future__ import annotations

import time

import kopf
from kopf.testing import KopfRunner

from kneecap.control.handlers import OperatorConfig, build_registry

NS = "serving"
DEPLOY = "apps/v1/deployments"
SERVICE = "v1/services"
# the smallest spec a real API server (and parse_spec) accepts
MINIMAL_SPEC = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "accelerator": {"type": "h100-80gb"},
                "engine": {"image": "vllm/vllm-openai:v0.11.0"}}


def llmd(name: str, model: str = "meta-llama/Llama-3.1-8B-Instruct", gpu: str = "h100-80gb", **spec_over) -> dict:
    spec = {"model": {"name": model}, "accelerator": {"type": gpu},
            "engine": {"image": "vllm/vllm-openai:v0.11.0", "extraArgs": ["--max-model-len=8192"]},
            "control": {"interval": "1s", "window": "1s"}}
    for k, v in spec_over.items():
        spec[k] = {**spec.get(k, {}), **v} if isinstance(v, dict) else v
    return {"apiVersion": "kneecap.io/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}


def wait_for(fn, timeout_s: float = 15.0, what: str = "condition", every_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last: {last!r}")


def operator(kube, config: OperatorConfig | None = None, **cfg) -> KopfRunner:
    """A KopfRunner for `kneecap run --namespace serving` against `kube` (a KubeAPIThread)."""
    config = config or OperatorConfig(tick_s=0.2, **cfg)
    config.connection = kopf.ConnectionInfo(server=kube.url)
    settings = kopf.OperatorSettings()
    settings.watching.server_timeout = 10
    return KopfRunner(["run", "--standalone", "--namespace", NS, "--verbose"],
                      registry=build_registry(config), settings=settings, timeout=30)


def events(kube, reason: str | None = None, name: str | None = None) -> list[dict]:
    evs = kube.list("v1/events", NS)
    return [e for e in evs if (reason is None or e.get("reason") == reason)
            and (name is None or e.get("involvedObject", {}).get("name") == name)]


def status(kube, name: str) -> dict:
    from tests.support.kmock_api import LLMD
    obj = kube.get(LLMD, NS, name)
    return (obj or {}).get("status") or {}


def condition(st: dict, type_: str) -> dict:
    return next((c for c in st.get("conditions") or [] if c["type"] == type_), {})
