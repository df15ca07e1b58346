"""LLMDeployment specs the unit tests and the embedded demo's test build from."""

from __future__ import annotations

NS = "serving"
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
