"""The real-vLLM test support fails loudly, with the fix, when .venv-vllm is missing (a venv that
is there but broken, and the free port: tests/integration/test_vllm_server_support.py)."""

from __future__ import annotations

import pytest

from tests.support import vllm_server


def test_missing_vllm_venv_says_how_to_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(vllm_server, "VLLM_PYTHON", tmp_path / "nope" / "python")
    with pytest.raises(vllm_server.VllmUnavailable, match=r"run `bash scripts/setup-vllm.sh`"):
        vllm_server.check_vllm_python()
