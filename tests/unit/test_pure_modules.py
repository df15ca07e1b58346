"""Every module documented as pure (all of `kneecap.model`, and each module whose docstring's
first paragraph says "pure") holds no module-level mutable state: its tables are read-only
(`MappingProxyType`, `frozenset`, tuples), and it keeps no cache or store of its own; state a
tick needs (the reuse of GAUSS runs) is passed in by the loop that owns it."""

from __future__ import annotations

import __future__
import dataclasses
import importlib
import logging
import pkgutil
import re
import types
from collections import deque

import numpy as np
import pytest

import kneecap

PURE = re.compile(r"\bpure\b", re.I)
IMMUTABLE = (str, bytes, int, float, complex, bool, type(None), range, frozenset, re.Pattern, types.MappingProxyType,
             types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, logging.Logger)


def _pure_modules() -> list[types.ModuleType]:
    found = []
    for info in pkgutil.walk_packages(kneecap.__path__, "kneecap."):
        if info.name == "kneecap.__main__":
            continue
        module = importlib.import_module(info.name)
        summary = (module.__doc__ or "").split("\n\n")[0]
        if info.name.startswith("kneecap.model") or PURE.search(summary):
            found.append(module)
    return found


def _mutable(value) -> bool:
    if isinstance(value, tuple):
        return any(_mutable(v) for v in value)
    if isinstance(value, IMMUTABLE) or value is __future__.annotations or type(value) is object:  # a sentinel
        return False
    if hasattr(value, "cache_info") or isinstance(value, (dict, list, set, bytearray, deque)):
        return True
    if isinstance(value, np.ndarray):
        return value.flags.writeable
    if dataclasses.is_dataclass(value):
        return not value.__dataclass_params__.frozen or any(_mutable(getattr(value, f.name))
                                                            for f in dataclasses.fields(value))
    return not callable(value)  # any other object may hold state


MODULES = _pure_modules()


def test_the_pure_modules_are_found():
    names = {m.__name__ for m in MODULES}
    gauss = {f"kneecap.model.gauss.{m}" for m in ("admission", "api", "engine", "errors", "limits", "mean_field",
                                                   "queues", "results", "search", "service", "tbt", "workload")}
    assert {"kneecap.model.gauss", "kneecap.model.slim", "kneecap.control.decide", "kneecap.control.plan",
            "kneecap.control.policy", "kneecap.control.status", "kneecap.observe.observation",
            "kneecap.observe.vllm_metric_names", "kneecap.control.tick", "kneecap.control.status_codec",
            "kneecap.control.replica_stabilisation", "kneecap.control.plan_metrics", "kneecap.control.slo",
            "kneecap.observe.histogram", "kneecap.observe.window"} | gauss <= names


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_a_pure_module_holds_no_mutable_state(module):
    # a function or class imported from elsewhere is checked where it is defined (naming's
    # memo of its pure status_key included); every other
    # global (an instance of another module's class included) is this module's state
    imported = lambda v: callable(v) and getattr(v, "__module__", module.__name__) != module.__name__  # noqa: E731
    mutable = sorted(k for k, v in vars(module).items() if not k.startswith("__") and not imported(v) and _mutable(v))
    assert mutable == [], f"{module.__name__} holds module-level mutable state: {mutable}"


def test_the_checker_sees_a_cache_and_a_table():
    import functools

    from kneecap.control.gauss_reuse import GaussRuns

    assert _mutable({}) and _mutable([1]) and _mutable(functools.lru_cache(maxsize=8)(abs)) and _mutable(GaussRuns())
    assert _mutable(np.zeros(3)) and not _mutable(types.MappingProxyType({"a": 1})) and not _mutable(frozenset())
