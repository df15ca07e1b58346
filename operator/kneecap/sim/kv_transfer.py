"""Disaggregated prefill/decode between twins, with vLLM's request protocol (NixlConnector).

A P/D proxy sends each request first to a prefill instance with ``max_tokens: 1`` and
``kv_transfer_params: {"do_remote_decode": true, ...}``; that instance computes the prompt's KV,
keeps its blocks and answers with ``kv_transfer_params`` naming them (``do_remote_prefill``,
``remote_engine_id``, ``remote_block_ids``, ``remote_host``, ``remote_port``,
``remote_request_id``). The proxy then sends the original request, with those params, to a
decode instance, which reads the blocks from the prefill instance (NIXL; here an HTTP GET of
``/kneecap/kv/<remote_request_id>`` on the prefill twin, which frees them) and decodes without
computing the prompt. A decode twin cannot start a request whose KV it could not read: the
prefill must have finished elsewhere first. Blocks not read within ``HOLD_TIMEOUT_S`` are freed
(vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kneecap.errors import InputError

KV_PATH = "/kneecap/kv/"
HOLD_TIMEOUT_S = 480.0
ROLES = ("kv_producer", "kv_consumer", "kv_both")

# what a P/D proxy sends a prefill instance (vLLM's examples/online_serving/disaggregated_serving proxies)
PREFILL_REQUEST_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                          "remote_block_ids": None, "remote_host": None, "remote_port": None}


def kv_role(kv_transfer_config: str | None) -> str | None:
    """The ``kv_role`` of vLLM's ``--kv-transfer-config`` JSON (None without one)."""
    if not kv_transfer_config:
        return None
    try:
        cfg = json.loads(kv_transfer_config)
    except json.JSONDecodeError as exc:
        raise InputError("kv_transfer_config", f"expected JSON, got {kv_transfer_config!r}: {exc}") from None
    role = cfg.get("kv_role") if isinstance(cfg, dict) else None
    if role not in ROLES:
        raise InputError("kv_transfer_config", f"kv_role must be one of {', '.join(ROLES)}, got {role!r}")
    return role


def prefill_request(body: dict) -> dict:
    """The body a P/D proxy sends the prefill instance: one token, no stream, KV kept for a remote decode."""
    out = {k: v for k, v in body.items() if k not in ("stream_options", "min_tokens")}
    out.update(max_tokens=1, stream=False, kv_transfer_params=dict(PREFILL_REQUEST_PARAMS))
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    return out


def decode_request(body: dict, prefill_response: dict) -> dict:
    """The original body with the prefill instance's ``kv_transfer_params``."""
    params = prefill_response.get("kv_transfer_params")
    if not isinstance(params, dict) or not params.get("do_remote_prefill"):
        raise InputError("kv_transfer_params", "the prefill response names no KV to read (is it a kv_producer?)")
    return {**body, "kv_transfer_params": params}


@dataclass
class HeldKV:
    """A finished prefill's KV blocks, kept until a decode instance reads them."""

    request_id: str
    prompt_tokens: int
    blocks: int
    finish_s: float  # on the twin's exported clock
    held_until_s: float  # on the engine's clock


def remote_source(params: dict) -> str:
    """``http://host:port/kneecap/kv/<id>`` of the KV a decode request names."""
    try:
        host, port, rid = params["remote_host"], int(params["remote_port"]), str(params["remote_request_id"])
    except (KeyError, TypeError, ValueError):
        raise InputError("kv_transfer_params", "do_remote_prefill needs remote_host, remote_port and "
                                               "remote_request_id") from None
    return f"http://{host}:{port}{KV_PATH}{rid}"
