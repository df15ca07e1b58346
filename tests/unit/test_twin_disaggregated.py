"""The P/D proxy's request bodies follow vLLM's protocol: a prefill request (max_tokens 1,
kv_transfer_params asking for a remote decode), then the decode request carrying the KV the
prefill answer names. Twins serving them through the P/D router:
tests/integration/test_twin_disaggregated_serving.py."""

from __future__ import annotations

import pytest

from kneecap.sim import kv_transfer as kvt


def test_proxy_bodies_follow_vllms_protocol():
    body = {"model": "m", "prompt": "p", "max_tokens": 64, "stream": True, "stream_options": {"include_usage": True},
            "min_tokens": 4}
    pre = kvt.prefill_request(body)
    assert pre == {"model": "m", "prompt": "p", "max_tokens": 1, "stream": False,
                   "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False,
                                          "remote_engine_id": None, "remote_block_ids": None, "remote_host": None,
                                          "remote_port": None}}
    params = {"do_remote_prefill": True, "remote_request_id": "r", "remote_host": "h", "remote_port": 1}
    assert kvt.decode_request(body, {"kv_transfer_params": params}) == {**body, "kv_transfer_params": params}
    with pytest.raises(Exception, match="names no KV"):
        kvt.decode_request(body, {"kv_transfer_params": None})
    assert kvt.kv_role('{"kv_connector":"NixlConnector","kv_role":"kv_producer"}') == "kv_producer"
    assert kvt.kv_role(None) is None
