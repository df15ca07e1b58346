"""The real-vLLM test support fails loudly, with the fix, when .venv-vllm is missing."""

from __future__ import annotations

import pytest

from tests.support import vllm_server


def test_missing_vllm_venv_says_how_to_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(vllm_server, "VLLM_PYTHON", tmp_path / "nope" / "python")
    with pytest.raises(vllm_server.VllmUnavailable, match=r"run `bash scripts/setup-vllm.sh`"):
        vllm_server.check_vllm_python()


def test_broken_vllm_venv_says_how_to_fix(monkeypatch, tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(vllm_server, "VLLM_PYTHON", fake)
    with pytest.raises(vllm_server.VllmUnavailable, match="cannot import vllm"):
        vllm_server.check_vllm_python()


def test_free_port_is_bindable():
    import socket

    port = vllm_server.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
