"""Credentials that cannot be had: a clear error naming what was looked for (no API needed).
Logging in and rotation against the real kube-apiserver: tests/kube/test_auth.py."""

from __future__ import annotations

import pytest
import yaml

from kneecap.control.auth import Credentials, CredentialsError


def test_no_credentials_is_a_clear_error(tmp_path, monkeypatch):
    for var in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(CredentialsError) as err:
        Credentials.from_environment(kubeconfig=str(tmp_path / "missing"))
    assert "not in a cluster" in str(err.value) and "missing" in str(err.value)
    bad = tmp_path / "kubeconfig"
    bad.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": "nope",
                                   "clusters": [], "users": [], "contexts": []}))
    with pytest.raises(CredentialsError) as err:
        Credentials.from_kubeconfig(str(bad))
    assert "nope" in str(err.value)
