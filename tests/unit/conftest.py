"""Fixtures shared by the unit tests."""

from __future__ import annotations

import kopf
import pytest


@pytest.fixture()
def no_kopf_events(monkeypatch):
    """kopf.event and kopf.warn recorded (their keyword arguments) instead of posted to an API."""
    posted = []
    monkeypatch.setattr(kopf, "event", lambda body, **kw: posted.append(kw))
    monkeypatch.setattr(kopf, "warn", lambda body, **kw: posted.append(kw))
    return posted
