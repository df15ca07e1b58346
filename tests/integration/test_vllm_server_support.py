"""The real-vLLM test support (tests/support/vllm_server.py) as it runs: an interpreter that
cannot import vllm is reported with the fix (the probe runs it), and a free port is bindable.
A missing .venv-vllm: tests/unit/test_observe_vllm_support.py."""

from __future__ import annotations

import socket

import pytest

from tests.support import vllm_server


def test_broken_vllm_venv_says_how_to_fix(monkeypatch, tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(vllm_server, "VLLM_PYTHON", fake)
    with pytest.raises(vllm_server.VllmUnavailable, match="cannot import vllm"):
        vllm_server.check_vllm_python()


def test_free_port_is_bindable():
    port = vllm_server.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
