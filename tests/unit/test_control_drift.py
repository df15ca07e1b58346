"""Semantic drift and canonical quantities: a live object as kube-apiserver stores it is in sync."""

from __future__ import annotations

from decimal import Decimal

import pytest

from kneecap.control.drift import differences, in_sync, normalised, without_empty
from kneecap.control.quantity import canonical_quantity, parse_quantity


@pytest.mark.parametrize("written, stored", [
    (1, "1"), ("1", "1"), (0.5, "500m"), ("0.5", "500m"), ("1000m", "1"), ("1024Mi", "1Gi"),
    ("1536Mi", "1536Mi"), ("0.5Gi", "512Mi"), ("1.5Ki", "1536"), ("0.5Ki", "512"), ("2000", "2k"),
    ("1500", "1500"), ("1000000", "1M"), ("0.1", "100m"), ("1e3", "1e3"), ("12e6", "12e6"),
    ("0", "0"), ("0.0000000001", "1n"), (2.5, "2500m"), ("-0.5", "-500m"), ("80Gi", "80Gi"),
])
def test_canonical_quantity_is_what_apimachinery_stores(written, stored):
    assert canonical_quantity(written) == stored
    assert parse_quantity(stored) == parse_quantity(written)


def test_parse_quantity_values_and_errors():
    assert parse_quantity("500m") == Decimal("0.5")
    assert parse_quantity("1Gi") == 1024**3
    with pytest.raises(ValueError, match="expected a quantity like 1, 500m, 2Gi, got '1 GB'"):
        parse_quantity("1 GB")
    with pytest.raises(ValueError):
        canonical_quantity(True)


CONTAINER = {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "args": ["m", "--max-num-seqs=8"],
             "env": [], "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": 0.5, "memory": "1024Mi"}}}
STORED = {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "args": ["m", "--max-num-seqs=8"],
          "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "500m", "memory": "1Gi"}},
          "imagePullPolicy": "IfNotPresent", "terminationMessagePath": "/dev/termination-log"}


@pytest.mark.parametrize("want, live, diff", [
    # what the API server does to a manifest: canonical quantities, empties dropped, defaults added
    ({"containers": [CONTAINER], "metadata": {"annotations": {}}}, {"containers": [STORED]}, []),
    # a real change is still one
    ({"containers": [CONTAINER]}, {"containers": [{**STORED, "args": ["m", "--max-num-seqs=16"]}]},
     [".containers[0].args[1]"]),
    ({"containers": [CONTAINER]},
     {"containers": [{**STORED, "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "500m", "memory": "1Gi"}}}]},
     [".containers[0].resources.limits.nvidia.com/gpu"]),
    ({"containers": [CONTAINER]}, {"containers": [STORED, {"name": "sidecar"}]}, [".containers"]),
    ({"replicas": 2}, {}, [".replicas"]),
    ({"replicas": 2}, {"replicas": 2, "revisionHistoryLimit": 10}, []),
    # an empty string is a value at a list position, not at a map key
    ({"args": ["", "x"], "env": [{"name": "A", "value": ""}]}, {"args": ["", "x"], "env": [{"name": "A"}]}, []),
    ({"volumes": [{"name": "home", "emptyDir": {}}]}, {"volumes": [{"name": "home"}]}, [".volumes[0].emptyDir"]),
])
def test_differences(want, live, diff):
    assert differences(want, live) == diff
    assert in_sync(want, live) == (not diff)


def test_without_empty_keeps_meaningful_empties_and_quantities_only_under_resources():
    assert without_empty({"a": {}, "b": [], "c": "", "d": None, "e": {"f": {}}, "emptyDir": {}, "g": [""]}) == \
        {"emptyDir": {}, "g": [""]}
    # "1" elsewhere is not a quantity: args and ports are compared as written
    assert normalised({"args": ["1000m"], "resources": {"requests": {"cpu": "1000m"}}}) == \
        {"args": ["1000m"], "resources": {"requests": {"cpu": "1"}}}


def test_omitempty_zeros_and_size_limits_compare_as_the_api_stores_them():
    want = {"volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16384Mi"}}],
            "volumeMounts": [{"name": "w", "mountPath": "/w", "readOnly": False}],
            "startupProbe": {"initialDelaySeconds": 0, "periodSeconds": 10}}
    live = {"volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}],
            "volumeMounts": [{"name": "w", "mountPath": "/w"}],
            "startupProbe": {"periodSeconds": 10, "timeoutSeconds": 1}}
    assert differences(want, live) == []
    live["volumes"][0]["emptyDir"]["sizeLimit"] = "8Gi"
    want["volumeMounts"][0]["readOnly"] = True
    assert differences(want, live) == [".volumes[0].emptyDir.sizeLimit", ".volumeMounts[0].readOnly"]
