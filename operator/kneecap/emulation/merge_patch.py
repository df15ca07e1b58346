"""JSON merge patch (RFC 7386), as kube-apiserver applies `application/merge-patch+json`.

Shared by the in-memory API of virtual time (:mod:`kneecap.emulation.store`) and the demo's
HTTP API (:mod:`kneecap.emulation.kubeapi`); nothing of the demo's extras (kmock) is needed for it."""

from __future__ import annotations

import copy
from typing import Any


def merge_patch(target: Any, patch: Any) -> Any:
    """`patch` merged into a copy of `target` (RFC 7386 §2): null deletes a key, objects merge,
    anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out
