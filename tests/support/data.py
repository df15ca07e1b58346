"""Where the repository keeps the data and fixtures the tests read."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROFILES_CSV = ROOT / "data" / "real-h100" / "profiles.csv"  # real vLLM runs on an H100 (data/README.md)
AZURE_CONVERSATION_CSV = ROOT / "data" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"  # CC-BY 4.0
VLLM_CAPTURES = ROOT / "tests" / "fixtures" / "vllm-metrics"  # real /metrics bodies of vLLM 0.32 (CPU)


def read_capture(name: str) -> str:
    """One real vLLM /metrics capture, by file name."""
    return (VLLM_CAPTURES / name).read_text()
