"""Shared fixtures: the repository's data files and the measured curve ``curve`` read from one,
and a real vLLM server (CPU build) on a tiny local Llama, one per session (tests/integration and
tests/kube share it).

One server serves every real-vLLM check: ``--max-num-seqs 4`` caps the batch and
``--num-gpu-blocks-override 8`` (8 blocks of 128 tokens) saturates the KV cache once four
sequences of a few hundred tokens run, so preemptions show. Missing ``.venv-vllm`` is a
failure, not a skip: CI must run these tests.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.data import PROFILES_CSV
from tests.support.profile_observations import curve_rows
from tests.support.vllm_server import VllmServer, VllmUnavailable, build_tiny_llama, check_vllm_python, start_server

pytest_plugins = ["tests.support.memory_guard"]  # a ballooning test stops the session with its stacks


@pytest.fixture(scope="session")
def profiles_csv() -> Path:
    return PROFILES_CSV


@pytest.fixture(scope="module")
def curve(profiles_csv: Path) -> dict[int, dict]:
    """The measured Llama-2-7B curve of tests/support/profile_observations.py, rows by batch cap."""
    return curve_rows(profiles_csv)


MAX_NUM_SEQS = 4
NUM_GPU_BLOCKS = 8
BLOCK_SIZE = 128  # vLLM's CPU backend block size
MAX_MODEL_LEN = 512


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        check_vllm_python()
    except VllmUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "model")


@pytest.fixture(scope="session")
def vllm_server(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    log_path = tmp_path_factory.mktemp("vllm-log") / "vllm-server.log"
    t0 = time.monotonic()
    server: VllmServer = start_server(
        tiny_llama_dir,
        log_path,
        [
            "--max-num-seqs", str(MAX_NUM_SEQS),
            "--num-gpu-blocks-override", str(NUM_GPU_BLOCKS),
            "--max-model-len", str(MAX_MODEL_LEN),
            "--seed", "0",
        ],
    )
    server.startup_s = time.monotonic() - t0  # type: ignore[attr-defined]
    print(f"\nvLLM server up in {server.startup_s:.1f} s at {server.base_url} (log {log_path})")  # type: ignore[attr-defined]
    yield server
    server.stop()
