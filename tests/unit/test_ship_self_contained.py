"""A clone holds everything its README, tests and benchmarks read: the data, the vLLM captures
and the design; no file points outside the repository (to a `shared/` folder beside it)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIP = {".git", ".venv", ".venv-core", ".venv-vllm", ".tools", "__pycache__", "build", "dist", ".artifacts", ".pytest_cache"}
TEXT = {".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".json", ".cfg", ".ini", ".tpl", ".txt"}
OUTSIDE = re.compile(r"\.\./" + r"shared\b|\b" + r"shared/(?:data|fixtures|design|seeds)\b|KNEECAP_" + "SHARED")


def _text_files():
    for p in ROOT.rglob("*"):
        rel = p.relative_to(ROOT)
        if any(part in SKIP or part.endswith(".egg-info") for part in rel.parts) or not p.is_file():
            continue
        if p.suffix in TEXT or p.name in ("Dockerfile", ".dockerignore", ".gitignore", "run"):
            yield rel, p


def test_nothing_points_outside_the_repository():
    hits = [f"{rel}:{n}: {line.strip()}" for rel, p in _text_files()
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if OUTSIDE.search(line)]
    assert hits == []


def test_the_data_and_fixtures_are_in_the_repository():
    for rel in ("data/real-h100/profiles.csv", "data/real-h100/offline.csv", "data/real-h100/README.md",
                "data/azure-llm-2023/AzureLLMInferenceTrace_conv.csv", "data/azure-llm-2023/README.md",
                "data/README.md", "tests/fixtures/vllm-metrics/README.md", "docs/design.md",
                "data/gpu-latency/README.md", "data/gpu-latency/llmd_benchmark_points.csv",
                "data/gpu-latency/llmservingsim_points.csv", "data/gpu-latency/licenses/llm-d-benchmark-Apache-2.0.txt",
                "data/gpu-latency/licenses/LLMServingSim-MIT.txt"):
        assert (ROOT / rel).is_file(), rel
    assert len((ROOT / "data/real-h100/profiles.csv").read_text().splitlines()) == 1 + 253
    assert len((ROOT / "data/azure-llm-2023/AzureLLMInferenceTrace_conv.csv").read_text().splitlines()) == 1 + 19366
    captures = sorted((ROOT / "tests/fixtures/vllm-metrics").glob("*.txt"))
    assert [p.name for p in captures] == ["vllm-0.32-cpu-20req.txt", "vllm-0.32-cpu-kv-saturated.txt",
                                          "vllm-0.32-cpu-run4.txt"]
    # the trace's licence asks for its attribution next to the copy
    terms = (ROOT / "data/README.md").read_text()
    assert "CC-BY 4.0" in terms and "Splitwise" in terms and "2503.08311" in terms


def test_readme_links_resolve():
    for doc in (ROOT / "README.md", ROOT / "data" / "README.md", ROOT / "docs" / "design.md"):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if not target.startswith("http"):
                assert (doc.parent / target).exists(), f"{doc.relative_to(ROOT)}: broken link {target}"
