"""spec.model.configMapRef read the way the operator reads it: from an API (the emulated one of
kneecap.emulation.kubeapi, served on a loopback port by KubeAPIThread), then parsed. Spec parsing
itself: tests/unit/test_control_spec.py."""

from __future__ import annotations

import pytest

from kneecap.control.spec import ConfigMapRef
from tests.support.spec_cases import edit

LLAMA_32_3B_CONFIG = {  # meta-llama/Llama-3.2-3B config.json (fields that matter)
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 3072, "num_hidden_layers": 28,
    "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 8192,
    "vocab_size": 128256, "hidden_act": "silu", "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
    "tie_word_embeddings": True,
}


def test_config_map_reference_read_through_the_operator_parsing_path():
    """The operator reads spec.model.configMapRef from the (faithful emulated) API, then parses:
    the shape equals the catalog's; a missing ConfigMap, a missing key and bad JSON are
    InvalidSpec naming the field."""
    import asyncio
    import json
    import logging

    from kneecap.control import lifecycle
    from kneecap.control.kube import KubeClient
    from kneecap.control.metrics import OperatorMetrics
    from kneecap.emulation.kubeapi import KubeAPIThread
    from kneecap.model.arch import get_arch

    def body(ref):
        return {"metadata": {"name": "house", "namespace": "m", "generation": 1},
                "spec": edit({"model.name": "acme/house-3b", "model.configMapRef": ref})}

    async def parse(url, b):
        kube = KubeClient(url)
        status: dict = {}
        try:
            spec = await lifecycle.parse(lifecycle.Operator(kube, OperatorMetrics()), b,
                                         lifecycle.Sink(status, lambda *event: None, logging.getLogger("t")),
                                         emit=False)
        finally:
            await kube.close()
        return spec, status

    with KubeAPIThread() as api:
        api.add_namespace("m")
        api.create("v1/configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                     "metadata": {"name": "house-config", "namespace": "m"},
                                     "data": {"config.json": json.dumps(LLAMA_32_3B_CONFIG), "bad.json": "{nope"}})
        spec, _ = asyncio.run(parse(api.url, body({"name": "house-config"})))
        a, ref = spec.model.architecture, get_arch("llama-3.2-3b")
        assert a.key == "house-3b" and spec.model.config_map_ref == ConfigMapRef("house-config", "config.json")
        assert (a.layers, a.hidden, a.q_heads, a.kv_heads, a.head_dim, a.ffn, a.vocab, a.tied, a.dtype_bytes) == \
            (ref.layers, ref.hidden, ref.q_heads, ref.kv_heads, ref.head_dim, ref.ffn, ref.vocab, ref.tied, ref.dtype_bytes)
        assert a.kv_bytes_per_token == ref.kv_bytes_per_token == 114_688
        assert a.params == pytest.approx(ref.params, rel=1e-3)
        for ref_spec, field, needle in [
            ({"name": "absent"}, "spec.model.configMapRef.name", "'absent' not found"),
            ({"name": "house-config", "key": "other.json"}, "spec.model.configMapRef.key", "keys: bad.json, config.json"),
            ({"name": "house-config", "key": "bad.json"}, "spec.model.configMapRef.key", "not valid JSON"),
        ]:
            spec, status = asyncio.run(parse(api.url, body(ref_spec)))
            assert spec is None and status["invalidField"] == field
            (ready,) = [c for c in status["conditions"] if c["type"] == "Ready"]
            assert ready["reason"] == "InvalidSpec" and needle in ready["message"]
